"""refork._native, the Rust extension built from native/: what Python calls, and what the engines
read of the objects they are given (the host loop and its settings, by attribute name).

tests/serving/test_native_stub.py checks it against the built module (mypy's stubtest).
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, Literal, Protocol, TypedDict, final

from refork.http.body import InputStream
from refork.http.events import Body, EndOfMessage, Event, ParseError, Request
from refork.http.parser import Limits, RequestParser
from refork.http.proxy_protocol import ProxyPolicy
from refork.serving.connection import RequestEnd, Timeouts
from refork.serving.contract import WorkerControl
from refork.wsgi.files import FileWrapper
from refork.wsgi.response import Prefetched, _Exchange

__all__ = [
    "Current", "Engine", "Environ", "MemoryBudget", "Parser", "PoolEngine", "StartResponse", "frame_list",
    "parse_proxy",
]  # fmt: skip

# a client as the environ has it: (host, port), or None (a unix-socket peer)
_Client = tuple[str, int] | None
# a connection an engine hands to the Python loop: (fd, client, listener fd, the bytes it has not
# consumed, since (time.monotonic()), fresh (no byte read yet), bytes of the worker's memory
# budget charged for those bytes (given back once the Python loop read them))
_Handed = tuple[int, _Client, int, bytes, float, bool, int]

class _Refs(TypedDict):
    """What the engines call in refork (refork.serving.native_engine.refs)."""

    current: ContextVar[object | None]
    request_cls: type[Request]
    make_input: Callable[[bytes], InputStream]
    empty_input: InputStream
    status_cache: dict[str, tuple[int, bytes]]
    header_cache: dict[tuple[str, str], tuple[tuple[bytes, bytes], bool]]
    check_status: Callable[[Any], tuple[int, bytes]]
    check_header: Callable[[Any], tuple[tuple[bytes, bytes], bool]]
    prefetched: Callable[[list[Any], Iterator[Any] | None, Any, Exception | None], Prefetched]
    file_wrapper: type[FileWrapper]
    closing_failed: Callable[[dict[str, Any], Exception], None]
    log_access: Callable[
        [RequestEnd, Request, str | None, int, int, float, dict[str, Any], list[tuple[bytes, bytes]] | None],
        None,
    ]
    log_warning: Callable[[str], None]
    log_error: Callable[[str], None]
    perf_counter: Callable[[], float]
    timeout_response: bytes

class _Poller(Protocol):
    def fileno(self) -> int: ...

class _HealthPaths(Protocol):
    @property
    def live(self) -> Iterable[bytes]: ...
    @property
    def ready(self) -> bytes: ...

class _Host(Protocol):
    """What both engines read of the Python loop around them (refork.serving.native_engine).
    The engines also call `control.request_started/request_finished`, the engine
    `control.requests_served` and `control.clock` (an AppClock, when it has one), the pool engine
    `control.free_threads_address()`."""

    @property
    def app(self) -> Any: ...
    @property
    def control(self) -> WorkerControl: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def timeouts(self) -> Timeouts: ...
    @property
    def spool(self) -> int: ...
    @property
    def health(self) -> _HealthPaths | None: ...
    @property
    def memory(self) -> MemoryBudget: ...
    @property
    def proxy(self) -> ProxyPolicy | None: ...
    @property
    def proxy_responses(self) -> tuple[bytes, bytes]: ...
    @property
    def access_log(self) -> RequestEnd | None: ...
    @property
    def pre_request_hook(self) -> Callable[[Request, dict[str, Any]], object] | None: ...
    def _exchange(
        self, fd: int, client: _Client, listener_fd: int, request: Request, keep_alive: bool, /
    ) -> _Exchange: ...

class _EngineHost(_Host, Protocol):
    @property
    def poller(self) -> _Poller: ...
    def _finish_slow(
        self, fd: int, client: _Client, listener_fd: int, start_response: StartResponse, result: Any,
        exc: Exception | None, environ: dict[str, Any], request: Request, stream: InputStream,
        token: object, started: float | None, keep_alive: bool, rest: bytes, /,
    ) -> None: ...  # fmt: skip

class _PoolHost(_Host, Protocol):
    @property
    def threads(self) -> int: ...
    def _finish_slow(
        self, fd: int, client: _Client, listener_fd: int, start_response: StartResponse, result: Any,
        exc: Exception | None, environ: dict[str, Any], request: Request, stream: InputStream,
        token: object, started: float | None, keep_alive: bool, /,
    ) -> bool: ...  # fmt: skip

@final
class Parser:
    """refork.http.parser.RequestParser's contract, httparse on the common shape."""

    def __new__(
        cls, limits: Limits, slow_factory: Callable[[Limits], RequestParser], request_cls: type[Request],
        body_cls: type[Body], eom: EndOfMessage, parse_error: type[ParseError],
    ) -> Parser: ...  # fmt: skip
    def feed(self, data: bytes) -> list[Event]: ...
    def release(self) -> None: ...
    @property
    def in_message(self) -> bool: ...
    @property
    def buffered(self) -> int: ...
    @property
    def head_held(self) -> int: ...

@final
class Environ:
    """The WSGI environ of one listener's requests (refork.wsgi.EnvironBuilder's rules)."""

    def __new__(
        cls, base: dict[str, Any], root_path: str, url_scheme: str, server_name: str, server_port: str,
        apply_forwarded: Callable[[dict[str, Any], list[tuple[bytes, bytes]], _Client], object],
    ) -> Environ: ...  # fmt: skip
    def build(self, request: Request, body: InputStream, client: _Client) -> dict[str, Any]: ...

@final
class Engine:
    """The connection loop of a single-thread WSGI worker."""

    def __new__(cls, host: _EngineHost, listeners: Sequence[tuple[int, Environ]], refs: _Refs) -> Engine: ...
    def run(self, timeout: float, keep_alive: bool) -> tuple[list[_Handed], bool]: ...
    def drain(self, drain_until: float, take_backlog: bool) -> None: ...
    def sweep(self, now: float) -> None: ...
    def adopt(self, fd: int, client: _Client, listener_fd: int, since: float) -> None: ...
    def release_after_fork(self) -> None: ...
    def close_all(self) -> None: ...
    @property
    def accounts(self) -> bool: ...
    @property
    def idle(self) -> bool: ...

@final
class PoolEngine:
    """The connection loop of a WSGI worker with a pool of app threads."""

    def __new__(
        cls, host: _PoolHost, listeners: Sequence[tuple[int, Environ]], refs: _Refs
    ) -> PoolEngine: ...
    def start(self) -> None: ...
    def pause(self) -> None: ...
    def adopt(self, fd: int, client: _Client, listener_fd: int, since: float) -> None: ...
    def work(self, handler: Callable[..., object]) -> None: ...
    def submit(self, job: tuple[Any, ...]) -> None: ...
    def stop_workers(self, count: int) -> None: ...
    def hold(self, on: bool) -> None: ...
    def take(self) -> tuple[list[_Handed], list[tuple[bool, str]]]: ...
    def drain(self, drain_until: float, take_backlog: bool) -> None: ...
    def release_after_fork(self) -> None: ...
    def close_all(self) -> None: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def free_threads(self) -> int: ...
    @property
    def idle(self) -> bool: ...
    @property
    def wake_fd(self) -> int: ...

@final
class StartResponse:
    """PEP 3333's start_response of an engine's request (made by the engines only)."""

    def __call__(
        self, status: str, headers: list[tuple[str, str]], exc_info: object = None
    ) -> Callable[[bytes], object]: ...
    def exchange_now(self) -> _Exchange: ...
    def write(self, data: bytes) -> object: ...

@final
class Current:
    """The engine's request in the app: its AppClock token, registered on first ask (the clock's
    `engine_request`; made by the engine only)."""

    def __call__(self, blocking: bool = True) -> object | None: ...

@final
class MemoryBudget:
    """refork.http.budget.MemoryBudget, shared with the engines' threads."""

    def __new__(cls, limit: int) -> MemoryBudget: ...
    def take(self, n: int) -> bool: ...
    def charge(self, n: int) -> None: ...
    def give_back(self, n: int) -> None: ...
    def note(self, n: int) -> None: ...
    def ebbed(self) -> bool: ...
    @property
    def limit(self) -> int: ...
    @property
    def used(self) -> int: ...
    @property
    def peak(self) -> int: ...

def frame_list(
    code: int, reason: bytes, headers: list[tuple[bytes, bytes]], has_length: bool, result: object,
    no_body: bool, http11: bool, keep_alive: bool,
) -> tuple[bytes, int, bool] | None: ...  # fmt: skip
def parse_proxy(
    data: bytes, mode: str
) -> Literal["INCOMPLETE", "NOT_PROXY"] | tuple[str, int, _Client, _Client]: ...
