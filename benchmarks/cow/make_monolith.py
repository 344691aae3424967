"""Generate benchmarks/monolith_generated/, a synthetic "big app" for the copy-on-write benchmark.

Deterministic for a given --seed. The package has:
  - mods/mNNN.py: many modules of generated functions (loops, branches, int/float arithmetic,
    string formatting, calls to each other) and classes with methods;
  - data.py: a read-only dataset built at import (RECORDS: id -> tuple, NAMES, BY_NAME);
  - caches.py: lazily filled caches (functools.lru_cache and a dict), grown by requests;
  - app.py: the WSGI app. GET /<anything> runs a pseudo-random subset of functions and dataset
    lookups seeded by the path, so the same path always touches the same code and data.

    python benchmarks/cow/make_monolith.py [--modules 300] [--functions 100] [--records 300000]
"""

from __future__ import annotations

import argparse
import compileall
import random
import shutil
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "monolith_generated"
WORDS = [
    "alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda", "theta", "zeta", "orbit",
    "comet", "nova", "pulsar", "quasar", "river", "stone", "cloud", "ember", "frost", "grove", "harbor",
    "island", "meadow", "summit", "valley", "willow",
]


def gen_function(rng: random.Random, name: str, index: int, arg: str = "x") -> str:
    """One function (or method body, with arg "self.v") of a randomly chosen shape."""
    c = [rng.randint(2, 997) for _ in range(4)]
    f = [round(rng.uniform(0.5, 3.5), 4) for _ in range(3)]
    word = rng.choice(WORDS)
    kind = rng.randrange(7) if index else rng.randrange(6)
    head = f"def {name}(x: int) -> int:\n" if arg == "x" else f"    def {name}(self) -> int:\n"
    ind = "    " if arg == "x" else "        "
    x = arg
    if kind == 0:
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


def gen_module(rng: random.Random, functions: int, classes: int) -> str:
    parts = ['"""Generated module: do not edit."""\n\nfrom .. import data\n\n',
             f"TABLE = {{k: \"{rng.choice(WORDS)}-%d\" % (k * {rng.randint(3, 99)})"
             " for k in range(200)}\n\n"]
    for i in range(functions):
        parts.append("\n" + gen_function(rng, f"f{i}", i) + "\n")
    for j in range(classes):
        parts.append(f"\nclass C{j}:\n    def __init__(self, v: int) -> None:\n        self.v = v\n"
                     f"        self.tag = \"{rng.choice(WORDS)}\"\n")
        for m in range(4):
            parts.append("\n" + gen_function(rng, f"m{m}", 0, arg="self.v"))
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

RECORDS: dict[int, tuple] = {{}}
NAMES: list[str] = []
for _i in range(N):
    _name = f"{{_rng.choice(_first).title()}} {{_rng.choice(_first).title()}} #{{_i}}"
    RECORDS[_i] = (_i, _name, _rng.choice(_cities), _rng.randrange(18, 90), _rng.random() * 1000.0,
                   (_rng.choice(_tags), _rng.choice(_tags)), f"{{_i:08x}}")
    NAMES.append(_name)
BY_NAME: dict[str, int] = {{name: i for i, name in enumerate(NAMES)}}
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
    args = parser.parse_args()

    rng = random.Random(args.seed)
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "mods").mkdir(parents=True)
    (OUT / "__init__.py").write_text('"""Synthetic monolith from benchmarks/cow/make_monolith.py."""\n')
    (OUT / "mods" / "__init__.py").write_text("")
    (OUT / "data.py").write_text(DATA.format(records=args.records, seed=args.seed))
    (OUT / "caches.py").write_text(CACHES)
    (OUT / "app.py").write_text(APP.format(modules=args.modules))
    for i in range(args.modules):
        (OUT / "mods" / f"m{i:03d}.py").write_text(gen_module(rng, args.functions, args.classes))
    compileall.compile_dir(OUT, quiet=1)
    print(f"wrote {OUT} ({args.modules} modules x {args.functions} functions, {args.records} records)")


if __name__ == "__main__":
    main()
