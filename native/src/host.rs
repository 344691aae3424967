//! What the engines read of their Python side, typed, extracted once when an engine is built:
//! its host (refork.serving.wsgi.native_host.NativeHost), the worker's settings and control, and
//! the refs (refork.serving.wsgi.native_host.refs). A renamed, missing or mistyped field fails
//! there, naming it ("failed to extract field Settings.read_size"), never at a request; and no
//! request looks anything up by name in them (the methods called per request are bound here).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::conn::budget::MemoryBudget;
use crate::conn::sweep::Timeouts;
use crate::http::head::HeadLimits;
use crate::http::request::request_class;

/// The engine host: what both engines read of it.
#[derive(FromPyObject)]
pub(crate) struct Host {
    pub settings: Settings,
    pub control: Control,
    #[pyo3(from_py_with = callable)]
    pub app: Py<PyAny>,
    pub memory: Py<MemoryBudget>,
    /// the access log (a refork.serving.connection.RequestEnd), None: off
    pub access_log: Option<Py<PyAny>>,
    /// the 400 and 403 answers to a refused PROXY header
    pub proxy_responses: (Vec<u8>, Vec<u8>),
    /// gunicorn's pre_request(request, environ), None: not set
    pub pre_request_hook: Option<Py<PyAny>>,
    /// response_exchange(start_response) -> a Python _Exchange
    #[pyo3(from_py_with = callable)]
    pub response_exchange: Py<PyAny>,
    /// finish_response(hand_over): sends a response the engine does not frame
    #[pyo3(from_py_with = callable)]
    pub finish_response: Py<PyAny>,
    /// the Python loop's epoll fd (the single-thread engine waits on it too)
    #[pyo3(attribute("poller_fd"))]
    pub poller: i32,
    /// a response may leave its connection open (False with --keep-alive 0)
    pub keep_alive: bool,
}

/// A callable (a method, bound once), else a TypeError.
pub(crate) fn callable(o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    if o.is_callable() {
        Ok(o.clone().unbind())
    } else {
        Err(pyo3::exceptions::PyTypeError::new_err(format!("{} is not callable", o.get_type().name()?)))
    }
}

/// refork.serving.settings.ServingSettings: what the engines serve with.
#[derive(FromPyObject)]
pub(crate) struct Settings {
    #[pyo3(from_py_with = HeadLimits::from_py)]
    pub limits: HeadLimits,
    pub timeouts: Timeouts,
    pub health: Option<HealthPaths>,
    pub proxy: Option<ProxyPolicy>,
    pub inline_body: usize,
    pub threads: usize,
    pub h1: bool,
    pub h2c: bool,
    pub accept_batch: usize,
    pub read_size: usize,
}

/// refork.serving.health.HealthPaths (--health-path).
#[derive(FromPyObject)]
pub(crate) struct HealthPaths {
    pub live: Vec<Vec<u8>>,
    pub ready: Vec<u8>,
}

/// refork.http.proxy_protocol.ProxyPolicy (--proxy-protocol, --proxy-allow-ips).
#[derive(FromPyObject)]
pub(crate) struct ProxyPolicy {
    pub mode: String,
    pub allow: Vec<String>,
}

/// The worker's control (refork.serving.contract.WorkerControl): the methods the engines call.
#[derive(FromPyObject)]
pub(crate) struct Control {
    /// request_started(method, path) -> its token
    #[pyo3(from_py_with = callable)]
    pub request_started: Py<PyAny>,
    /// request_finished(token, status)
    #[pyo3(from_py_with = callable)]
    pub request_finished: Py<PyAny>,
    /// free_threads_address() -> the address of the count of free app threads (the pool engine's)
    #[pyo3(from_py_with = callable)]
    pub free_threads_address: Py<PyAny>,
    /// the worker's refork.process.slots.AppClock, when it has one: the single-thread engine
    /// accounts its requests in the worker's slot itself (wsgi/accounting.rs)
    #[pyo3(default)]
    pub clock: Option<Py<PyAny>>,
    /// requests_served(n) -> the count at which to call it again (with a clock)
    #[pyo3(default)]
    pub requests_served: Option<Py<PyAny>>,
}

/// The worker's refork.process.slots.AppClock, as the single-thread engine uses it.
#[derive(FromPyObject)]
pub(crate) struct AppClock {
    /// native_words() -> the words of the worker's slot (wsgi/accounting.rs: SlotClock)
    #[pyo3(from_py_with = callable)]
    pub native_words: Py<PyAny>,
    /// adopt(began, method, path, blocking) -> a token for the engine's request in the app
    #[pyo3(from_py_with = callable)]
    pub adopt: Py<PyAny>,
    /// use_engine_request(current): the engine's Current, how the clock finds that request
    #[pyo3(from_py_with = callable)]
    pub use_engine_request: Py<PyAny>,
}

/// A contextvars.ContextVar's set and reset, bound.
#[derive(FromPyObject)]
pub(crate) struct ContextVar {
    #[pyo3(from_py_with = callable)]
    pub set: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub reset: Py<PyAny>,
}

/// What the engines call in refork (refork.serving.wsgi.native_host.refs, a dict).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct Refs {
    /// refork.deadlines.current: the request in the app
    pub current: ContextVar,
    /// refork.http.events.Request, its fields checked (http/request.rs: request_class)
    #[pyo3(from_py_with = request_class)]
    pub request_cls: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub make_input: Py<PyAny>,
    /// close_input(stream): a stream of make_input's, once its request is answered
    #[pyo3(from_py_with = callable)]
    pub close_input: Py<PyAny>,
    pub empty_input: Py<PyAny>,
    pub status_cache: Py<PyDict>,
    pub header_cache: Py<PyDict>,
    #[pyo3(from_py_with = callable)]
    pub check_status: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub check_header: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub prefetched: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub file_wrapper: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub file_span: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub closing_failed: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub hint_response: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub log_access: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub log_warning: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub log_error: Py<PyAny>,
    #[pyo3(from_py_with = callable)]
    pub perf_counter: Py<PyAny>,
    pub timeout_response: Py<PyBytes>,
}
