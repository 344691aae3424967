"""Generate benchmarks/monolith_generated/, a synthetic "big app" for the copy-on-write benchmark.

Deterministic for a given --seed. The package has:
  - mods/mNNN.py: many modules of generated functions (loops, branches, int/float arithmetic,
    string formatting, calls to each other) and classes with methods;
  - data.py: a read-only dataset built at import (RECORDS: id -> tuple, NAMES, BY_NAME);
  - caches.py: lazily filled caches (functools.lru_cache and a dict), grown by requests;
  - app.py: the WSGI app. GET /<anything> runs a pseudo-random subset of functions and dataset
    lookups seeded by the path, so the same path always touches the same code and data.

    python benchmarks/cow/make_monolith.py [--modules 300] [--functions 100] [--records 300000]

--code mixed (the default) mixes int and float arithmetic and uses operations CPython 3.12 never
specializes (%, //, /, **, >>, ^, &, int-vs-float compares). --code specializable generates the same
shapes with only operations 3.12 specializes (int/float + - *, int-vs-int compares, subscripts of
dict/list/tuple, instance attributes, calls of Python functions and of builtins), so that warm code
stops writing to its inline caches. Use --out to keep both side by side:

    python benchmarks/cow/make_monolith.py --code specializable --out benchmarks/monolith_specializable

--freed-at-import MIB makes data.py build about MIB MiB of rows before its dataset and drop them after
it (a loader that keeps only what it built from a big export): memory the import freed, below live
data in the heap.

    python benchmarks/cow/make_monolith.py --freed-at-import 200 --out benchmarks/monolith_freed
"""

from __future__ import annotations

import argparse
import compileall
import random
import shutil
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "monolith_generated"
WORDS = [
    "alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda", "theta", "zeta", "orbit",
    "comet", "nova", "pulsar", "quasar", "river", "stone", "cloud", "ember", "frost", "grove", "harbor",
    "island", "meadow", "summit", "valley", "willow",
]


def gen_function(rng: random.Random, name: str, index: int, arg: str = "x", code: str = "mixed") -> str:
    """One function (or method body, with arg "self.v") of a randomly chosen shape."""
    c = [rng.randint(2, 997) for _ in range(4)]
    f = [round(rng.uniform(0.5, 3.5), 4) for _ in range(3)]
    word = rng.choice(WORDS)
    kind = rng.randrange(7) if index else rng.randrange(6)
    head = f"def {name}(x: int) -> int:\n" if arg == "x" else f"    def {name}(self) -> int:\n"
    ind = "    " if arg == "x" else "        "
    x = arg
    if code == "specializable":
        callee = f"f{rng.randrange(index)}" if kind == 6 else ""
        body = specializable_body(kind, x, c, f, word, callee)
    elif kind == 0:
        body = [f"acc = {c[0]}", f"for k in range({c[1] % 24 + 4}):",
                f"    if ({x} + k) % {c[2] % 7 + 2} == 0:", f"        acc += k * {c[3]}",
                "    else:", f"        acc ^= ({x} >> {c[0] % 5}) + k", "return acc & 0xFFFFFFFF"]
    elif kind == 1:
        body = [f"y = {x} * {f[0]} + {f[1]}", f"for _ in range({c[0] % 12 + 3}):",
                f"    y = y * {f[2]} - y / {f[0] + 1.0} + {c[1]}", f"    if y > {c[2] * 1000}:",
                f"        y = y % {c[3] + 1}", f"return int(y) % {c[1] + 7}"]
    elif kind == 2:
        body = [f"s = f\"{word}-{{{x}:06d}}-{{{x} % {c[0]}}}-{{{x} * {f[0]}:.3f}}\"",
                f"if len(s) > {c[1] % 10 + 18}:", "    s = s.upper()", "else:",
                f"    s = s.replace(\"-\", \"{word[0]}\")",
                f"return len(s) + sum(map(ord, s[:{c[2] % 8 + 2}]))"]
    elif kind == 3:
        body = [f"vals = [v * {c[0]} for v in range({x} % {c[1] % 30 + 5})]",
                f"d = {{v % {c[2] % 9 + 2}: v for v in vals}}",
                f"return sum(d.values()) + len(vals) * {c[3]}"]
    elif kind == 4:
        body = [f"r = {x} % {c[0] % 5 + 3}", "if r == 0:", f"    return {x} * {c[1]}", "elif r == 1:",
                f"    return ({x} + {c[2]}) // 3", "elif r == 2:", f"    return int({x} ** 0.5 * {f[0]})",
                f"return -{x} + {c[3]}"]
    elif kind == 5:
        body = [f"rec = data.RECORDS.get(({x} * {c[0]}) % data.N)", "if rec is None:", "    return 0",
                f"return rec[3] + int(rec[4] * {f[0]}) + len(rec[1]) % {c[1] % 13 + 2}"]
    else:
        callee = f"f{rng.randrange(index)}"
        body = [f"t = {callee}({x} + {c[0]}) if isinstance({x}, int) else 0",
                f"return (t * {c[1]}) % {c[2] + 11}"]
    return head + "".join(f"{ind}{line}\n" for line in body)


def specializable_body(kind: int, x: str, c: list[int], f: list[float], word: str, callee: str) -> list[str]:
    """The same 7 shapes as the mixed bodies, with only operations CPython 3.12 specializes.

    Ints stay compact (|v| < 2**30: COMPARE_OP_INT deopts on bigger ones), floats are never mixed
    with ints in one operation (float() / int() convert), str compares are == / != only, and the
    arguments (1..~6000 from app.handle) make every branch run. No %, //, /, **, >>, ^, &. Calls
    are of Python functions and of builtins 3.12 specializes (len, isinstance, sum, round, float,
    map, str methods); not int() (no vectorcall in 3.12) nor min()/max() (METH_VARARGS in 3.12).
    """
    if kind == 0:  # loop with a branch
        return [f"acc = {c[0]}", f"for k in range({c[1] % 24 + 4}):",
                f"    if {x} + k * {c[2] % 50 + 20} > {c[3] + 2000}:", f"        acc += k * {c[3]}",
                "    else:", f"        acc -= k + {c[0] % 5 + 1}", "return acc"]
    if kind == 1:  # float arithmetic, kept bounded
        return [f"y = float({x}) * {f[0]} + {f[1]}", f"for _ in range({c[0] % 12 + 3}):",
                f"    y = y * {f[2]} - y * {round(f[0] / 4, 4)} + {float(c[1])}",
                f"    if y > {float(c[2] * 10)}:", f"        y = y * {round(1 / (f[2] + 1.0), 4)}",
                f"return round(y) + {c[1] + 7}"]
    if kind == 2:  # f-string
        return [f"s = f\"{word}-{{{x}:06d}}-{{{x} - {c[0]}}}-{{float({x}) * {f[0]}:.3f}}\"",
                f"if len(s) > {c[1] % 10 + 18}:", "    s = s.upper()", "else:",
                f"    s = s.replace(\"-\", \"{word[0]}\")",
                f"return len(s) + sum(map(ord, s[:{c[2] % 8 + 2}]))"]
    if kind == 3:  # comprehensions
        return [f"vals = [v * {c[0]} for v in range({c[1] % 30 + 5} if {x} > {c[1] % 30 + 5} else {x})]",
                f"d = {{v - {c[2] % 9 + 2}: v for v in vals if v > {c[0] * 3}}}",
                f"return sum(d.values()) + len(vals) * {c[3]}"]
    if kind == 4:  # several branches
        t1 = c[0] + 500
        t2 = t1 + c[1] + 500
        t3 = t2 + c[2] + 500
        return [f"if {x} < {t1}:", f"    return {x} * {c[1]}", f"elif {x} < {t2}:",
                f"    return ({x} + {c[2]}) - {c[0]}", f"elif {x} < {t3}:",
                f"    return round(float({x}) * {f[0]})", f"return -{x} + {c[3]}"]
    if kind == 5:  # dataset read; the same record as the mixed variant's (x * c0) % N
        return [f"i = {x} * {c[0]}", "while i >= data.N:", "    i -= data.N",
                "rec = data.RECORDS.get(i)", "if rec is None:", "    return 0",
                f"return rec[3] + round(rec[4] * {f[0]}) + len(rec[1]) - {c[1] % 13 + 2}"]
    return [f"t = {callee}({x} + {c[0]}) if isinstance({x}, int) else 0",
            f"return t * {c[1]} if t < {c[2]} else t - {c[3]}"]


def gen_module(rng: random.Random, functions: int, classes: int, code: str = "mixed") -> str:
    parts = ['"""Generated module: do not edit."""\n\nfrom .. import data\n\n',
             f"TABLE = {{k: \"{rng.choice(WORDS)}-%d\" % (k * {rng.randint(3, 99)})"
             " for k in range(200)}\n\n"]
    for i in range(functions):
        parts.append("\n" + gen_function(rng, f"f{i}", i, code=code) + "\n")
    for j in range(classes):
        parts.append(f"\nclass C{j}:\n    def __init__(self, v: int) -> None:\n        self.v = v\n"
                     f"        self.tag = \"{rng.choice(WORDS)}\"\n")
        for m in range(4):
            parts.append("\n" + gen_function(rng, f"m{m}", 0, arg="self.v", code=code))
        parts.append("\n")
    parts.append(f"\nFUNCS = [{', '.join(f'f{i}' for i in range(functions))}]\n")
    parts.append(f"CLASSES = [{', '.join(f'C{j}' for j in range(classes))}]\n")
    return "".join(parts)


DATA = '''"""Read-only dataset, built at import. Deterministic."""

import random

N = {records}
_rng = random.Random({seed})
_syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
_first = ["".join(_rng.choice(_syllables) for _ in range(3)) for _ in range(2000)]
_cities = [f"city-{{i}}" for i in range(500)]
_tags = [f"tag{{i}}" for i in range(64)]

{raw}RECORDS: dict[int, tuple] = {{}}
NAMES: list[str] = []
for _i in range(N):
    _name = f"{{_rng.choice(_first).title()}} {{_rng.choice(_first).title()}} #{{_i}}"
    RECORDS[_i] = (_i, _name, _rng.choice(_cities), _rng.randrange(18, 90), _rng.random() * 1000.0,
                   (_rng.choice(_tags), _rng.choice(_tags)), f"{{_i:08x}}")
    NAMES.append(_name)
BY_NAME: dict[str, int] = {{name: i for i, name in enumerate(NAMES)}}
{drop}'''

# --freed-at-import: rows "parsed from an export" before the dataset and dropped after it, as a loader
# that keeps only what it built from a big file does: freed memory below live data in the heap.
RAW = '''_raw = [{{"id": _i, "text": f"{{_i:08d}}" * 256}} for _i in range({rows})]  # 2 KiB strings
'''
DROP = '''del _raw
'''

CACHES = '''"""Lazily filled caches: they grow as requests come in."""

import functools

from . import data

PAGES: dict[str, bytes] = {}


@functools.lru_cache(maxsize=None)
def describe(rid: int) -> str:
    rec = data.RECORDS[rid]
    return f"{rec[1]} ({rec[3]}) from {rec[2]}, score {rec[4]:.2f}, tags {'/'.join(rec[5])}"
'''

APP = '''"""WSGI app of the generated monolith. Do not edit: regenerate with make_monolith.py."""

import importlib
import random
import zlib

from . import caches, data

MODULES = [importlib.import_module(f"{{__package__}}.mods.m{{i:03d}}") for i in range({modules})]
CALLS, OBJECTS, LOOKUPS = 150, 20, 40


def handle(path: str) -> bytes:
    rng = random.Random(zlib.crc32(path.encode()))
    total = 0
    for _ in range(CALLS):
        mod = MODULES[rng.randrange(len(MODULES))]
        total += mod.FUNCS[rng.randrange(len(mod.FUNCS))](rng.randrange(1, 5000))
    for _ in range(OBJECTS):
        mod = MODULES[rng.randrange(len(MODULES))]
        obj = mod.CLASSES[rng.randrange(len(mod.CLASSES))](rng.randrange(1, 5000))
        total += obj.m0() + obj.m1() + obj.m2() + obj.m3()
    names = []
    for _ in range(LOOKUPS):
        rid = rng.randrange(data.N)
        names.append(caches.describe(rid))
        total += data.BY_NAME[data.RECORDS[rid][1]]
    body = f"{{path}} {{total}} {{len(names)}} {{names[0]}}\\n".encode()
    caches.PAGES[path] = body
    return body


def app(environ: dict, start_response) -> list[bytes]:
    path = environ.get("PATH_INFO") or "/"
    body = b"ok\\n" if path == "/mem" else handle(path)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
'''


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modules", type=int, default=300)
    parser.add_argument("--functions", type=int, default=100, help="functions per module")
    parser.add_argument("--classes", type=int, default=10, help="classes (4 methods each) per module")
    parser.add_argument("--records", type=int, default=300_000, help="dataset records")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--freed-at-import", type=int, default=0, metavar="MIB",
                        help="MiB of rows data.py builds before its dataset and drops after it")
    parser.add_argument("--code", choices=("mixed", "specializable"), default="mixed",
                        help="function bodies: mixed int/float and unspecializable ops (default), or only "
                             "operations CPython 3.12 specializes")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="output directory; its name is the package name (default: %(default)s)")
    args = parser.parse_args()

    out = args.out.resolve()
    if not out.name.isidentifier():
        sys.exit(f"--out {args.out}: the directory name must be a valid package name")
    rng = random.Random(args.seed)
    shutil.rmtree(out, ignore_errors=True)
    (out / "mods").mkdir(parents=True)
    (out / "__init__.py").write_text('"""Synthetic monolith from benchmarks/cow/make_monolith.py."""\n')
    (out / "mods" / "__init__.py").write_text("")
    rows = args.freed_at_import * 512  # rows of about 2 KiB
    raw, drop = (RAW.format(rows=rows), DROP) if rows else ("", "")
    (out / "data.py").write_text(DATA.format(records=args.records, seed=args.seed, raw=raw, drop=drop))
    (out / "caches.py").write_text(CACHES)
    (out / "app.py").write_text(APP.format(modules=args.modules))
    for i in range(args.modules):
        (out / "mods" / f"m{i:03d}.py").write_text(gen_module(rng, args.functions, args.classes, args.code))
    compileall.compile_dir(out, quiet=1)
    freed = f", {args.freed_at_import} MiB freed at import" if rows else ""
    print(f"wrote {out} ({args.modules} modules x {args.functions} functions, {args.records} records, "
          f"--code {args.code}{freed})")


if __name__ == "__main__":
    main()
