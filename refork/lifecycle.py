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
from typing import Any, Generic, TypeVar

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
    `db.execute(...)` then uses this process's own client, built lazily after each fork. Every
    attribute read goes through __getattribute__ (no AttributeError raised and caught on the way):
    two slot reads and an int comparison before the real getattr.
    """

    __slots__ = ("_factory", "_object", "_generation", "_lock", "__weakref__")

    def __init__(self, factory: Callable[[], T]) -> None:
        object.__setattr__(self, "_factory", factory)
        object.__setattr__(self, "_object", None)
        object.__setattr__(self, "_generation", -1)
        object.__setattr__(self, "_lock", threading.Lock())

    def __getattribute__(self, name: str) -> Any:
        if _get_generation(self) == _generation:  # the hot path
            return getattr(_get_object(self), name)
        return getattr(_build(self), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(_build(self), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(_build(self), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _build(self)(*args, **kwargs)

    def __getitem__(self, key: Any) -> Any:
        return _build(self)[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        _build(self)[key] = value

    def __iter__(self) -> Any:
        return iter(_build(self))

    def __len__(self) -> int:
        return len(_build(self))

    def __bool__(self) -> bool:
        return bool(_build(self))

    def __enter__(self) -> Any:
        return _build(self).__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return _build(self).__exit__(*exc)

    async def __aenter__(self) -> Any:
        return await _build(self).__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await _build(self).__aexit__(*exc)

    def __repr__(self) -> str:
        if _get_generation(self) == _generation:
            return f"<per_process {_get_object(self)!r}>"
        return f"<per_process {object.__getattribute__(self, '_factory')!r} (not built)>"


_get_generation = PerProcess._generation.__get__  # type: ignore[attr-defined]
_get_object = PerProcess._object.__get__  # type: ignore[attr-defined]


def _build(proxy: PerProcess[Any]) -> Any:
    """This process's object behind `proxy`, built on first use after each fork."""
    if _get_generation(proxy) == _generation:
        return _get_object(proxy)
    with object.__getattribute__(proxy, "_lock"):
        if _get_generation(proxy) != _generation:
            if _get_generation(proxy) != -1:
                _inherited.append(_get_object(proxy))
            object.__setattr__(proxy, "_object", object.__getattribute__(proxy, "_factory")())
            object.__setattr__(proxy, "_generation", _generation)
    return _get_object(proxy)


def per_process(factory: Callable[[], T]) -> T:
    """`factory()`'s object, built lazily in each process that uses it (see PerProcess)."""
    return PerProcess(factory)  # type: ignore[return-value]


def unwrap(proxy: Any) -> Any:
    """This process's object behind a per_process proxy (builds it if needed); anything else as is."""
    return _build(proxy) if isinstance(proxy, PerProcess) else proxy
