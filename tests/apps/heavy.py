"""Call-heavy code of the preloaded heap: a checksum through classes, closures, generators,
exceptions, properties and containers, the same on every call and every interpreter. Imported
by the mold, so its code objects, functions and tables are part of the heap a worker shares."""

from __future__ import annotations

import functools
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

TABLE = {f"key{i}": (i, str(i) * 3, float(i) / 7) for i in range(200)}
WORDS = tuple(f"w{i % 97}" for i in range(400))


@dataclass(frozen=True)
class Point:
    x: int
    y: int

    @property
    def norm(self) -> int:
        return abs(self.x) + abs(self.y)

    def moved(self, dx: int, dy: int) -> Point:
        return Point(self.x + dx, self.y + dy)


class Shape:
    def area(self) -> int:
        raise NotImplementedError


class Square(Shape):
    def __init__(self, side: int) -> None:
        self.side = side

    def area(self) -> int:
        return self.side * self.side


class Rect(Square):
    def __init__(self, w: int, h: int) -> None:
        super().__init__(w)
        self.h = h

    def area(self) -> int:
        return self.side * self.h


def adder(n: int):
    def add(x: int) -> int:
        return x + n

    return add


ADDERS = [adder(i) for i in range(50)]


def numbers(limit: int):
    for i in range(limit):
        if i % 3 == 0:
            yield i
        else:
            yield from (i, -i)


@functools.cache
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Odd(Exception):
    pass


def parity(n: int) -> int:
    if n % 2:
        raise Odd(n)
    return n


def checksum() -> int:
    total = 0
    p = Point(0, 0)
    for i in range(60):
        p = p.moved(i % 5 - 2, i % 3 - 1)
        total += p.norm
    shapes = [Square(i) if i % 2 else Rect(i, i + 1) for i in range(30)]
    total += sum(s.area() for s in shapes)
    total += sum(f(i) for i, f in enumerate(ADDERS))
    total += sum(numbers(90))
    for i in range(40):
        try:
            total += parity(i)
        except Odd as e:
            total -= e.args[0]
    counts: defaultdict[str, int] = defaultdict(int)
    for w in WORDS:
        counts[w] += 1
    ordered = OrderedDict(sorted(counts.items()))
    total += sum(len(k) * v for k, v in ordered.items())
    total += sum(v[0] for k, v in TABLE.items() if k.endswith("7"))
    total += len({w for w in WORDS if w[1] in "13579"})
    total += fib(80) % 1000003
    return total


EXPECTED = checksum()  # at import: in the mold, before the heap is prepared
