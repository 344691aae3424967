//! `HandOver`: the one value an engine gives its host with a response it does not frame (a
//! generator, a file, write(), an app error): `host.finish_response(hand_over)`, a public method
//! typed in refork/_native.pyi and refork.serving.contract.EngineHost.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::start_response::StartResponse;

/// A request the app answered off the engine's path: which connection, what the app returned, and
/// where the request stands (its accounting token, when it started, what was pipelined behind it).
#[pyclass(module = "refork._native", frozen, get_all)]
pub struct HandOver {
    /// the connection's socket (the host's now, for the single-thread engine; borrowed by the pool's)
    pub fd: i32,
    /// (host, port), or None for a unix-socket peer
    pub client: Py<PyAny>,
    /// the listener it was accepted on
    pub listener_fd: i32,
    /// the request's start_response (its exchange_now() is the Python response state)
    pub start_response: Py<StartResponse>,
    /// what the app returned (None if it raised)
    pub result: Py<PyAny>,
    /// the Exception the app raised, or None
    pub exc: Py<PyAny>,
    pub environ: Py<PyAny>,
    /// the refork.http.events.Request
    pub request: Py<PyAny>,
    /// its wsgi.input
    pub stream: Py<PyAny>,
    /// the request's token for the worker's control (request_finished)
    pub token: Py<PyAny>,
    /// time.perf_counter() when the request began, None without an access log
    pub started: Py<PyAny>,
    /// the server may keep the connection (not draining)
    pub keep_alive: bool,
    /// bytes the client pipelined behind the request (the single-thread engine; empty for the pool's)
    pub rest: Py<PyBytes>,
}
