"""Fork hooks for app code: decorators, per-process objects and descriptors to keep.

App code registers here without a config file (`@refork.after_fork`, `refork.per_process(...)`,
`refork.keep_fd(fd)`); the mold and the workers run what it registered. It imports nothing of
refork, so `import refork` stays cheap and any layer may read it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

log = logging.getLogger("refork")
T = TypeVar("T")
Hook = Callable[[], Any]

_hooks: dict[str, list[Hook]] = {"before_fork": [], "after_fork": [], "before_promotion": []}
_kept_fds: set[int] = set()
# Objects a fork copied: never finalized here (their __del__ would close a shared stream).
_inherited: list[Any] = []


def before_fork(func: Hook) -> Hook:
    """Decorator: run `func()` in the mold right before it forks each worker."""
    _hooks["before_fork"].append(func)
    return func


def after_fork(func: Hook) -> Hook:
    """Decorator: run `func()` in each new worker right after the fork, before it serves."""
    _hooks["after_fork"].append(func)
    return func


def before_promotion(func: Hook) -> Hook:
    """Decorator: run `func()` in a worker at a safe point right before it forks the next mold."""
    _hooks["before_promotion"].append(func)
    return func


def run_hooks(when: str) -> None:
    """Run the app's hooks for `when`; a hook that raises propagates (the caller decides)."""
    for func in _hooks[when]:
        func()


def keep_fd(fd: int | Any) -> int:
    """Keep descriptor `fd` (or an object's `fileno()`) open and untouched in every worker.

    After a fork, refork makes inherited descriptors it does not know harmless (see
    docs/fork-safety.md); a file or pipe the app shares on purpose is registered here.
    """
    number = fd if isinstance(fd, int) else int(fd.fileno())
    _kept_fds.add(number)
    return number


def kept_fds() -> frozenset[int]:
    return frozenset(_kept_fds)


# per_process: one generation number per process, bumped in every child by the fork itself, so a
# proxy compares two ints on each access instead of calling os.getpid().
_generation = 0


def _new_process() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_new_process)


class PerProcess(Generic[T]):
    """A transparent proxy to an object built by `factory()` once per process, on first use.

    For clients kept in module or class attributes: `db = refork.per_process(lambda: connect(...))`;
    `db.execute(...)` then uses this process's own client, built lazily after each fork.
    """

    __slots__ = ("_factory", "_object", "_generation", "_lock", "__weakref__")

    def __init__(self, factory: Callable[[], T]) -> None:
        object.__setattr__(self, "_factory", factory)
        object.__setattr__(self, "_object", None)
        object.__setattr__(self, "_generation", -1)
        object.__setattr__(self, "_lock", threading.Lock())

    def _get(self) -> T:
        if self._generation == _generation:
            return cast(T, self._object)
        with self._lock:
            if self._generation != _generation:
                if self._generation != -1:
                    _inherited.append(self._object)
                object.__setattr__(self, "_object", self._factory())
                object.__setattr__(self, "_generation", _generation)
        return cast(T, self._object)

    def __getattr__(self, name: str) -> Any:
        if self._generation == _generation:  # the hot path, inlined
            return getattr(self._object, name)
        return getattr(self._get(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._get(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._get()(*args, **kwargs)  # type: ignore[operator]

    def __getitem__(self, key: Any) -> Any:
        return self._get()[key]  # type: ignore[index]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._get()[key] = value  # type: ignore[index]

    def __iter__(self) -> Any:
        return iter(self._get())  # type: ignore[call-overload]

    def __len__(self) -> int:
        return len(self._get())  # type: ignore[arg-type]

    def __bool__(self) -> bool:
        return bool(self._get())

    def __enter__(self) -> Any:
        return self._get().__enter__()  # type: ignore[attr-defined]

    def __exit__(self, *exc: Any) -> Any:
        return self._get().__exit__(*exc)  # type: ignore[attr-defined]

    async def __aenter__(self) -> Any:
        return await self._get().__aenter__()  # type: ignore[attr-defined]

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._get().__aexit__(*exc)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        built = self._generation == _generation
        return f"<per_process {self._object!r}>" if built else f"<per_process {self._factory!r} (not built)>"


def per_process(factory: Callable[[], T]) -> T:
    """`factory()`'s object, built lazily in each process that uses it (see PerProcess)."""
    return PerProcess(factory)  # type: ignore[return-value]


def unwrap(proxy: Any) -> Any:
    """This process's object behind a per_process proxy (builds it if needed); anything else as is."""
    return proxy._get() if isinstance(proxy, PerProcess) else proxy
