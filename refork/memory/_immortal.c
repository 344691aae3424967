/* Make the mold's heap immortal before fork so that reading objects in a worker
 * writes nothing to the shared pages (CPython 3.12-3.15, GIL, 64-bit, non-debug).
 *
 * Why: every Py_INCREF/Py_DECREF of an inherited object dirties its page (copy on
 * write). Immortal objects (PEP 683) skip those stores. We walk everything reachable
 * from the GC-tracked objects, mark each object immortal exactly as CPython's own
 * _Py_SetImmortalUntracked (Objects/object.c) does in that version, and fill lazily
 * computed hashes (str, bytes; tuples from 3.14) while we are there:
 *
 *   3.12, 3.13  the refcount word = _Py_IMMORTAL_REFCNT (UINT_MAX). Py_INCREF adds in
 *               32 bits and stops at 0xFFFFFFFF; Py_DECREF skips a negative low word.
 *   3.14, 3.15  ob_refcnt = _Py_IMMORTAL_INITIAL_REFCNT (3 << 30) and _Py_IMMORTAL_FLAGS
 *               set in ob_flags. The interpreter's tagged stack references take
 *               immortality from that flag (PyStackRef_FromPyObjectSteal); a reference
 *               it left untagged is then copied and released with _Py_INCREF_MORTAL /
 *               Py_DECREF_MORTAL, which add and subtract without any check. 3 << 30 is
 *               2^30 steps from both edges of the immortal range: with the flag clear and
 *               0xFFFFFFFF, one such copy wrapped the count to 0 and the next pair of
 *               copy/release freed a live object. Untagged references also exist for
 *               objects made immortal while a frame held them (the mold's own stack);
 *               the margin is what keeps those harmless, as it does for CPython.
 *   both        _Py_IsImmortal (a negative low word) is the test; statically allocated
 *               objects are immortal already and are never touched, so their
 *               _Py_STATICALLY_ALLOCATED_FLAG and refcount stay as CPython set them.
 *
 * "Already immortal" doubles as the visited mark, so the walk needs no visited set,
 * and an explicit stack replaces C recursion. Roots (GC-tracked objects) are always
 * traversed, even when already immortal, so that a second pass in a promoted mold
 * reaches new objects stored in containers made immortal by the first pass.
 *
 * Nothing in the walk runs Python code or allocates Python objects, which is what
 * PyUnstable_GC_VisitObjects requires (no changes to the GC lists while visiting).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Exact versions whose object header this file follows (each one read from that version's
 * headers and Objects/object.c); anything else is refused with a reason. */
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x03100000 && SIZEOF_VOID_P == 8 \
    && !defined(Py_GIL_DISABLED) && !defined(Py_DEBUG) && !defined(Py_REF_DEBUG)     \
    && !defined(Py_TRACE_REFS) && !defined(Py_LIMITED_API) && !defined(PYPY_VERSION)
#define REFORK_SUPPORTED 1
#else
#define REFORK_SUPPORTED 0
#endif

static const char *
unsupported_reason(void)
{
#if defined(PYPY_VERSION)
    return "not CPython";
#elif PY_VERSION_HEX < 0x030C0000
    return "Python " Py_STRINGIFY(PY_MAJOR_VERSION) "." Py_STRINGIFY(PY_MINOR_VERSION)
           " (needs CPython 3.12+)";
#elif PY_VERSION_HEX >= 0x03100000
    return "Python " Py_STRINGIFY(PY_MAJOR_VERSION) "." Py_STRINGIFY(PY_MINOR_VERSION)
           " (untested refcount layout; supported: 3.12-3.15)";
#elif defined(Py_GIL_DISABLED)
    return "free-threaded build";
#elif defined(Py_DEBUG) || defined(Py_REF_DEBUG) || defined(Py_TRACE_REFS)
    return "debug build";
#elif SIZEOF_VOID_P != 8
    return "32-bit build";
#else
    return "unsupported build";
#endif
}

#if REFORK_SUPPORTED

/* Runtime check: the headers we compiled against must match the running interpreter. */
static const char *
runtime_mismatch(void)
{
    unsigned long running = (unsigned long)Py_Version & 0xFFFF0000UL;
    unsigned long built = (unsigned long)PY_VERSION_HEX & 0xFFFF0000UL;
    if (running != built) {
        return "extension built for another Python version (reinstall refork)";
    }
    return NULL;
}

static inline int
is_immortal(PyObject *op)
{
    return _Py_IsImmortal(op);
}

/* The header CPython's _Py_SetImmortalUntracked writes, for a mortal object. */
static inline void
set_immortal(PyObject *op)
{
#if PY_VERSION_HEX >= 0x030E0000
    /* CPython assigns ob_flags = _Py_IMMORTAL_FLAGS; or-ing keeps any other bit a future
     * patch release might set on a heap object (there is none on 3.14 and 3.15). */
    op->ob_flags |= _Py_IMMORTAL_FLAGS;
    op->ob_refcnt = (uint32_t)_Py_IMMORTAL_INITIAL_REFCNT;
#else
    op->ob_refcnt = _Py_IMMORTAL_REFCNT;
#endif
}

typedef struct {
    PyObject **items;
    size_t len;
    size_t cap;
    Py_ssize_t count; /* objects made immortal */
    int failed;       /* out of memory */
    PyObject *skip;   /* the caller's list of extra roots: walked, never made immortal */
} Walk;

static int
stack_push(Walk *w, PyObject *op)
{
    if (w->len == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 4096;
        PyObject **items = PyMem_RawRealloc(w->items, cap * sizeof(PyObject *));
        if (items == NULL) {
            w->failed = 1;
            return -1;
        }
        w->items = items;
        w->cap = cap;
    }
    w->items[w->len++] = op;
    return 0;
}

/* Exact tuples whose hash cannot run Python code (3.14 caches tuple hashes). */
static int
tuple_hash_is_safe(PyObject *t, int depth)
{
    if (depth > 8) {
        return 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(t, i);
        if (x == NULL) {
            return 0;
        }
        if (PyUnicode_CheckExact(x) || PyBytes_CheckExact(x) || PyLong_CheckExact(x)
            || PyFloat_CheckExact(x) || x == Py_None || PyBool_Check(x)) {
            continue;
        }
        if (PyTuple_CheckExact(x) && tuple_hash_is_safe(x, depth + 1)) {
            continue;
        }
        return 0;
    }
    return 1;
}

static inline int
is_atomic(PyObject *op)
{
    /* Objects with no references to follow: mark them, never stack them. */
    return PyUnicode_CheckExact(op) || PyBytes_CheckExact(op) || PyLong_CheckExact(op)
           || PyFloat_CheckExact(op) || PyComplex_CheckExact(op);
}

static void scan_code_fields(Walk *w, PyCodeObject *co);

/* Mark one object immortal (if it is not yet) and queue it for traversal. */
static int
mark(Walk *w, PyObject *op)
{
    if (op == NULL || w->failed) {
        return 0;
    }
    if (is_immortal(op)) {
        /* Code objects grow lazily cached fields (co_code, co_varnames...) after they
         * were made immortal; a second pass looks at them again (cheap, not recursive). */
        if (PyCode_Check(op)) {
            scan_code_fields(w, (PyCodeObject *)op);
        }
        return 0;
    }
    set_immortal(op);
    w->count++;
    if (PyUnicode_CheckExact(op) || PyBytes_CheckExact(op)) {
        (void)PyObject_Hash(op); /* cannot fail for exact str/bytes */
        return 0;
    }
    if (is_atomic(op)) {
        return 0;
    }
    return stack_push(w, op);
}

static int
visit_ref(PyObject *op, void *arg)
{
    return mark((Walk *)arg, op);
}

static void
scan_code_fields(Walk *w, PyCodeObject *co)
{
    /* Code objects are not GC-tracked and have no tp_traverse: list their fields. */
    mark(w, co->co_consts);
    mark(w, co->co_names);
    mark(w, co->co_exceptiontable);
    mark(w, co->co_localsplusnames);
    mark(w, co->co_localspluskinds);
    mark(w, co->co_filename);
    mark(w, co->co_name);
    mark(w, co->co_qualname);
    mark(w, co->co_linetable);
    if (co->_co_cached != NULL) {
        mark(w, co->_co_cached->_co_code);
        mark(w, co->_co_cached->_co_varnames);
        mark(w, co->_co_cached->_co_cellvars);
        mark(w, co->_co_cached->_co_freevars);
    }
}

/* Follow every reference of one object, including those tp_traverse leaves out. */
static void
traverse(Walk *w, PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    mark(w, (PyObject *)tp);
    if (PyObject_IS_GC(op) && tp->tp_traverse != NULL) {
        tp->tp_traverse(op, visit_ref, w);
    }
    if (PyDict_Check(op)) {
        /* dict_traverse skips the keys of str-keyed (and split) dicts. */
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(op, &pos, &key, &value)) {
            mark(w, key);
            mark(w, value);
        }
    }
    else if (PyCode_Check(op)) {
        scan_code_fields(w, (PyCodeObject *)op);
    }
    else if (PyType_Check(op)) {
        PyTypeObject *t = (PyTypeObject *)op;
        if (t->tp_flags & Py_TPFLAGS_HEAPTYPE) {
            PyHeapTypeObject *ht = (PyHeapTypeObject *)op;
            mark(w, ht->ht_name);
            mark(w, ht->ht_qualname);
            mark(w, ht->ht_slots);
            /* Method caches and specialized code check the version tag; assign it now. */
            (void)PyUnstable_Type_AssignVersionTag(t);
        }
    }
#if PY_VERSION_HEX >= 0x030E0000
    else if (PyTuple_CheckExact(op) && tuple_hash_is_safe(op, 0)) {
        (void)PyObject_Hash(op);
    }
#endif
}

static void
drain(Walk *w)
{
    while (w->len > 0 && !w->failed) {
        PyObject *op = w->items[--w->len];
        traverse(w, op);
    }
}

static int
visit_root(PyObject *op, void *arg)
{
    Walk *w = (Walk *)arg;
    if (op == w->skip) {
        return 1;
    }
    /* Roots are traversed even when already immortal: their contents may be new. */
    if (!is_immortal(op)) {
        set_immortal(op);
        w->count++;
    }
    traverse(w, op);
    drain(w);
    return !w->failed;
}

static PyObject *
immortalize_heap(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *why = runtime_mismatch();
    if (why != NULL) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    if (nargs > 1 || (nargs == 1 && !PyList_CheckExact(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "immortalize_heap([extra_roots: list])");
        return NULL;
    }
    Walk w = {NULL, 0, 0, 0, 0, NULL};
    if (nargs == 1) {
        /* Objects only the running frames refer to (locals of the mold's own call
         * stack) are invisible to the GC's lists: the caller passes them in. */
        PyObject *extra = args[0];
        w.skip = extra;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(extra) && !w.failed; i++) {
            mark(&w, PyList_GET_ITEM(extra, i));
            drain(&w);
        }
    }
    if (!w.failed) {
        PyUnstable_GC_VisitObjects(visit_root, &w);
    }
    PyMem_RawFree(w.items);
    if (w.failed) {
        /* Objects already marked stay immortal: harmless, just never freed. */
        return PyErr_NoMemory();
    }
    return PyLong_FromSsize_t(w.count);
}

static PyObject *
supported(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    const char *why = runtime_mismatch();
    if (why != NULL) {
        return Py_BuildValue("(Os)", Py_False, why);
    }
    return Py_BuildValue("(Os)", Py_True, "");
}

static PyObject *
is_immortal_py(PyObject *module, PyObject *op)
{
    return PyBool_FromLong(is_immortal(op));
}

#else /* !REFORK_SUPPORTED */

static PyObject *
immortalize_heap(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyErr_Format(PyExc_RuntimeError, "immortalization unsupported: %s", unsupported_reason());
    return NULL;
}

static PyObject *
supported(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(Os)", Py_False, unsupported_reason());
}

static PyObject *
is_immortal_py(PyObject *module, PyObject *op)
{
    Py_RETURN_FALSE;
}

#endif /* REFORK_SUPPORTED */

static PyMethodDef methods[] = {
    {"immortalize_heap", (PyCFunction)(void (*)(void))immortalize_heap, METH_FASTCALL,
     "immortalize_heap([extra_roots]): make every object reachable from the GC-tracked\n"
     "heap (and from extra_roots) immortal; return how many were made immortal."},
    {"supported", supported, METH_NOARGS,
     "(True, '') if this interpreter can be immortalized, else (False, reason)."},
    {"is_immortal", is_immortal_py, METH_O, "True if the object's refcount is immortal."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_immortal",
    "Heap immortalizer for copy-on-write friendly pre-fork servers.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__immortal(void)
{
    return PyModule_Create(&moduledef);
}
