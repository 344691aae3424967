/* Placeholder: replaced by the real immortalizer. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_immortal", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__immortal(void) { return PyModule_Create(&mod); }
