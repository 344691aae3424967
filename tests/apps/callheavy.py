"""A call-heavy app: classes, closures, generators, coroutines, exceptions and containers.

`answer(n)` walks all of it and returns a number that depends only on n (no str hashes, which
differ between processes), so a worker's answer can be checked against the test process's own.
`app` serves it over WSGI: GET /<n> answers `answer(n)`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import zlib
from collections import OrderedDict, defaultdict, namedtuple

Point = namedtuple("Point", "x y")


class Colour(enum.Enum):
    RED = 1
    GREEN = 2
    BLUE = 3


class AppError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"app error {code}")
        self.code = code


class NotFound(AppError):
    pass


class Shape:
    sides = 0

    def __init__(self, size: int) -> None:
        self.size = size

    def area(self) -> int:
        return self.size * self.size

    def describe(self) -> str:
        return f"{type(self).__name__}({self.size}, {self.sides})"


class Square(Shape):
    sides = 4

    def area(self) -> int:
        return super().area() + 1


class Triangle(Shape):
    sides = 3

    @property
    def half(self) -> int:
        return self.size // 2

    def area(self) -> int:
        return self.size * self.half


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: int, b: int) -> None:
        self.a = a
        self.b = b

    def total(self) -> int:
        return self.a + self.b


@dataclasses.dataclass(frozen=True)
class Record:
    id: int
    name: str
    tags: tuple[str, ...]
    score: float


def make_adder(k: int):
    def add(x: int) -> int:
        return x + k

    return add


def make_counter():
    count = 0

    def bump(by: int = 1) -> int:
        nonlocal count
        count += by
        return count

    return bump


ADDERS = [make_adder(k) for k in range(64)]
SHAPES = [(Square if i % 2 else Triangle)(i % 17 + 1) for i in range(512)]
SLOTTED = [Slotted(i, i * 2) for i in range(256)]
RECORDS = {
    i: Record(i, f"name-{i:05d}", tuple(f"tag{j}" for j in range(i % 5)), i / 7) for i in range(4000)
}
BY_NAME = {r.name: r.id for r in RECORDS.values()}
TAGS = frozenset(f"tag{j}" for j in range(5))
GROUPS: defaultdict[int, list[int]] = defaultdict(list)
for _i in range(4000):
    GROUPS[_i % 37].append(_i)
ORDERED = OrderedDict((f"k{i}", Point(i, -i)) for i in range(300))
TABLE = [[(r * 31 + c) % 101 for c in range(16)] for r in range(64)]
NESTED = {"a": [1, 2, {"b": (3, 4, {5, 6})}], "c": {"d": [Colour.RED, Colour.BLUE]}}
SHARED_LOG: list[int] = []  # appended to and cleared by every worker
ERRORS: list[BaseException] = []
KEEP: list[object] = []


def crc(text: str) -> int:
    return zlib.crc32(text.encode())


def walk(obj, depth: int = 0) -> int:
    """Recursion over nested containers."""
    if isinstance(obj, dict):
        return sum(walk(v, depth + 1) for v in obj.values()) + len(obj)
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sum(walk(v, depth + 1) for v in obj) + depth
    if isinstance(obj, Colour):
        return obj.value
    return obj if isinstance(obj, int) else 0


def fib_gen(n: int):
    a, b = 0, 1
    for _ in range(n):
        yield a
        a, b = b, a + b


def chained(n: int):
    yield from fib_gen(n)
    yield from (p.x for p in list(ORDERED.values())[:n])


def echo():
    """A generator driven with send() and throw()."""
    total = 0
    while True:
        try:
            value = yield total
        except AppError as e:
            total -= e.code
        else:
            total += value or 0


def ticker():
    i = 0
    while True:
        yield i
        i += 1


TICKER = ticker()  # left suspended in the mold, resumed by workers
next(TICKER)


def mixed_calls(count: int) -> int:
    """Method, closure and slot calls in a tight loop: what the specializing interpreter rewrites."""
    total = 0
    for i in range(count):
        total += SHAPES[i % 512].area() + ADDERS[i % 64](i) + SLOTTED[i % 256].total()
    return total


def lookup(n: int) -> Record:
    record = RECORDS.get(n % 5000)
    if record is None:
        raise NotFound(n)
    return record


def guarded(n: int) -> int:
    """Exceptions raised and caught through several frames, chained, re-raised."""
    try:
        try:
            return lookup(n).id
        except NotFound as e:
            raise AppError(e.code % 97) from e
    except AppError as e:
        return -e.code - (1 if e.__cause__ is not None else 0)
    finally:
        pass


@functools.lru_cache(maxsize=256)
def cached(n: int) -> int:
    return sum(TABLE[n % 64]) + n


async def fetch(n: int) -> int:
    await asyncio.sleep(0)
    return ADDERS[n % 64](n)


async def agen(n: int):
    for i in range(n):
        await asyncio.sleep(0)
        yield i


async def gather(n: int) -> int:
    values = await asyncio.gather(*(fetch(n + i) for i in range(4)))
    return sum(values) + sum([i async for i in agen(3)])


def answer(n: int, *, with_async: bool = False) -> int:
    """One request's worth of calls; depends only on n."""
    total = 0
    for i in range(20):
        k = n * 20 + i
        shape = SHAPES[k % len(SHAPES)]
        total += shape.area() + crc(shape.describe()) % 1000
        total += SLOTTED[k % 256].total()
        total += ADDERS[k % 64](k)
        record = RECORDS[k % 4000]
        total += BY_NAME[record.name] + len(record.tags) + int(record.score)
        total += len(TAGS.intersection(record.tags))
        total += sum(GROUPS[k % 37][:5])
        total += ORDERED[f"k{k % 300}"].y
        total += guarded(k * 3)
        total += cached(k)
    total += sum(fib_gen(20)) + sum(chained(10))
    bump = make_counter()
    for i in range(10):
        bump(i)
    total += bump(0)
    gen = echo()
    next(gen)
    gen.send(n % 13)
    total += gen.throw(AppError(3))
    gen.close()
    total += walk(NESTED) + walk([TABLE[n % 64], (n, n + 1)])
    total += sum(x * y for x, y in zip(TABLE[n % 64], TABLE[(n + 1) % 64], strict=True))
    if with_async:
        total += asyncio.run(gather(n))
    return total


def app(environ, start_response):
    path = environ.get("PATH_INFO", "/").strip("/")
    try:
        n = int(path or 0)
        body = str(answer(n)).encode()
        status = "200 OK"
    except ValueError:
        body, status = b"not a number", "400 Bad Request"
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
