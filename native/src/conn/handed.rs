//! `Handed`: a connection an engine gives to the Python loop (what the engine does not serve
//! itself: see intake.rs), with the bytes it read and has not consumed. Returned by
//! `Engine.run()` and `PoolEngine.take()`, typed in refork/_native.pyi.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::budget::Budget;
use super::Conn;

#[pyclass(module = "refork._native", frozen, get_all)]
pub struct Handed {
    /// the connection's socket: the Python loop's now
    pub fd: i32,
    /// (host, port), or None for a unix-socket peer
    pub client: Py<PyAny>,
    /// the listener it was accepted on
    pub listener_fd: i32,
    /// the bytes read and not consumed, from the first byte of the request in progress
    pub data: Py<PyBytes>,
    /// when the connection's current phase began (time.monotonic()): its deadlines go on
    pub since: f64,
    /// no byte of it was read yet (its keep-alive clock, not a request's, runs)
    pub fresh: bool,
    /// bytes of the worker's memory budget charged for `data` (the Python loop gives them back
    /// once it has read them)
    pub held: usize,
}

impl Handed {
    /// `conn` (its epoll registration already dropped) with `data`, charged to `budget`.
    pub(crate) fn new(py: Python<'_>, conn: &mut Conn, budget: &Arc<Budget>, data: &[u8]) -> PyResult<Py<Handed>> {
        let held = conn.hand_charge(budget, data.len());
        let handed = Handed {
            fd: conn.fd,
            client: conn.client(py)?,
            listener_fd: conn.listener,
            data: PyBytes::new(py, data).unbind(),
            since: conn.since,
            fresh: conn.fresh,
            held,
        };
        Py::new(py, handed)
    }
}
