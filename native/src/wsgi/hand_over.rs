//! `HandOver`: the one value an engine gives its host with a response it does not frame (a
//! generator, a file the engine does not send, write(), an app error): `host.finish_response(hand_over)`, a public method
//! typed in refork/_native.pyi and refork.serving.contract.HandOverHost.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::app_call::Called;
use super::start_response::StartResponse;
use crate::conn::Conn;

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

/// Where the request stands when an engine hands it over: its accounting token, when it started,
/// whether the server keeps connections, what was pipelined behind it.
pub(crate) struct Standing<'a, 'py> {
    pub token: Bound<'py, PyAny>,
    pub started: &'a Py<PyAny>,
    pub keep_alive: bool,
    pub rest: &'a [u8],
}

impl HandOver {
    /// The request `called` on `conn`, with its wsgi.input, handed to the host's
    /// `finish_response` (both engines' one epilogue for a response they do not frame); what the
    /// host returns.
    pub(crate) fn finish<'py>(
        finish_response: &Bound<'py, PyAny>,
        conn: &Conn,
        called: Called<'py>,
        input: &Bound<'py, PyAny>,
        standing: Standing<'_, 'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = finish_response.py();
        let hand_over = HandOver {
            fd: conn.fd,
            listener_fd: conn.listener,
            request: called.request()?.unbind(),
            client: called.client,
            start_response: called.start_response.unbind(),
            result: called.result.unbind(),
            exc: called.exc.unbind(),
            environ: called.environ.unbind(),
            stream: input.clone().unbind(),
            token: standing.token.unbind(),
            started: standing.started.clone_ref(py),
            keep_alive: standing.keep_alive,
            rest: PyBytes::new(py, standing.rest).unbind(),
        };
        finish_response.call1((hand_over,))
    }
}
