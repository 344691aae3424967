//! The access-log line of a request a native loop answered.

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::app_call::Called;

/// What the access-log line of an engine's request says (refork.serving.connection.log_access's
/// arguments, by name): the host's `log_access(access_log, line)` writes it.
#[pyclass(module = "refork._native", frozen, get_all)]
pub struct AccessLine {
    /// the refork.http.events.Request
    request: Py<PyAny>,
    remote: Option<Py<PyAny>>,
    status: u32,
    length: usize,
    duration: f64,
    environ: Py<PyAny>,
    /// the app's headers, checked (None: start_response was not called)
    response_headers: Option<Py<PyList>>,
}

/// The access-log line of a request answered by a native loop.
pub(crate) struct AccessLog<'a> {
    pub log: &'a Py<PyAny>,
    pub log_access: &'a Py<PyAny>,
    pub perf_counter: &'a Py<PyAny>,
}

impl AccessLog<'_> {
    pub fn write(&self, py: Python<'_>, called: &Called<'_>, started: &Py<PyAny>, status: u32, length: usize) -> PyResult<()> {
        let started: f64 = started.extract(py)?;
        let line = AccessLine {
            request: called.request()?.unbind(),
            remote: called.environ.get_item(pyo3::intern!(py, "REMOTE_ADDR")).ok().map(Bound::unbind),
            status,
            length,
            duration: self.perf_counter.bind(py).call0()?.extract::<f64>()? - started,
            environ: called.environ.clone().unbind(),
            response_headers: called.start_response.borrow().headers.as_ref().map(|h| h.clone_ref(py)),
        };
        self.log_access.bind(py).call1((self.log.bind(py), line))?;
        Ok(())
    }
}
