"""The app-level fork API: hooks registered by decorators, per_process proxies, keep_fd."""

from __future__ import annotations

import os

import pytest

import refork
from refork import lifecycle

# forks while a test server thread runs: Python 3.12+ warns, on purpose here
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


@pytest.fixture(autouse=True)
def clean_registry():
    saved = {when: list(hooks) for when, hooks in lifecycle._hooks.items()}
    kept = set(lifecycle._kept_fds)
    yield
    lifecycle._hooks.update(saved)
    lifecycle._kept_fds.clear()
    lifecycle._kept_fds.update(kept)


def in_child(func) -> str:
    """Run func() in a forked child; its str() result."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, str(func()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        return os.read(read, 1000).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_decorators_register_and_return_the_function_and_run_in_order():
    ran = []

    @refork.after_fork
    def first():
        ran.append("first")

    @refork.after_fork
    def second():
        ran.append("second")

    @refork.before_fork
    def other():
        ran.append("other")

    assert first.__name__ == "first"
    lifecycle.run_hooks("after_fork")
    assert ran == ["first", "second"]


def test_per_process_builds_lazily_once_per_process_and_rebuilds_after_a_fork():
    built = []

    def factory():
        built.append(os.getpid())
        return {"pid": os.getpid()}

    proxy = refork.per_process(factory)
    assert built == []
    assert proxy["pid"] == os.getpid() and proxy.get("pid") == os.getpid()
    assert built == [os.getpid()]
    child = in_child(lambda: proxy["pid"])
    assert int(child) != os.getpid()
    assert proxy["pid"] == os.getpid() and built == [os.getpid()]  # the parent's is untouched


def test_per_process_forwards_attributes_calls_and_context_managers():
    class Client:
        closed = False

        def __call__(self, x):
            return x * 2

        def __enter__(self):
            return "entered"

        def __exit__(self, *exc):
            return False

    proxy = refork.per_process(Client)
    assert proxy(21) == 42 and proxy.closed is False
    proxy.closed = True
    assert lifecycle.unwrap(proxy).closed is True
    with proxy as value:
        assert value == "entered"
    assert "per_process" in repr(proxy)


def test_the_object_a_fork_copied_is_never_finalized_in_the_child():
    finalized = []

    class Holder:
        def __del__(self):
            finalized.append(os.getpid())

    proxy = refork.per_process(Holder)
    lifecycle.unwrap(proxy)

    def child():
        lifecycle.unwrap(proxy)  # rebuilt: the parent's copy is kept, not dropped
        import gc

        gc.collect()
        return len(finalized)

    assert in_child(child) == "0"


def test_keep_fd_takes_a_number_or_an_object_with_fileno(tmp_path):
    with open(tmp_path / "f", "w") as f:
        assert refork.keep_fd(f) == f.fileno()
        assert refork.keep_fd(99) == 99
        assert {f.fileno(), 99} <= lifecycle.kept_fds()


def test_make_harmless_spares_kept_descriptors_logs_and_stdio(tmp_path):
    from refork.process import descriptors

    shared = open(tmp_path / "shared", "w")  # noqa: SIM115
    kept = open(tmp_path / "kept", "w")  # noqa: SIM115
    appended = open(tmp_path / "log", "a")  # noqa: SIM115
    read, write = os.pipe()

    def child():
        cleaned = descriptors.make_harmless({kept.fileno()}, "test")
        mine = {shared.fileno(), kept.fileno(), appended.fileno(), read}
        return sorted(fd for fd, _ in cleaned if fd in mine)

    try:
        descriptors.remember_before_fork()
        assert in_child(child) == str(sorted([shared.fileno(), read]))
    finally:
        descriptors._parent_fds = None
        for f in (shared, kept, appended):
            f.close()
        os.close(read)
        os.close(write)


def test_make_harmless_leaves_a_descriptor_dup2_refuses(tmp_path, monkeypatch):
    """Valgrind lists descriptors of its own in /proc that dup2 refuses (EBADF): the mold must
    carry on (before, it died there and benchmarks/instructions.py hung)."""
    import errno

    from refork.process import descriptors

    refused = open(tmp_path / "refused", "w")  # noqa: SIM115
    other = open(tmp_path / "other", "w")  # noqa: SIM115
    real_dup2 = os.dup2

    def dup2(fd: int, fd2: int, inheritable: bool = True) -> int:
        if fd2 == refused.fileno():
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real_dup2(fd, fd2, inheritable)

    def child():
        monkeypatch.setattr(os, "dup2", dup2)
        cleaned = descriptors.make_harmless(set(), "test")
        return sorted(fd for fd, _ in cleaned if fd in (refused.fileno(), other.fileno()))

    try:
        descriptors.remember_before_fork()
        assert in_child(child) == str([other.fileno()])
    finally:
        descriptors._parent_fds = None
        refused.close()
        other.close()
