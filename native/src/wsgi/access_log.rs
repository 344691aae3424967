//! The access-log line of a request a native loop answered.

use pyo3::prelude::*;

use super::app_call::Called;

/// The access-log line of a request answered by a native loop (refork.serving.connection.log_access).
pub(crate) struct AccessLog<'a> {
    pub log: &'a Py<PyAny>,
    pub log_access: &'a Py<PyAny>,
    pub perf_counter: &'a Py<PyAny>,
}

impl AccessLog<'_> {
    pub fn write(&self, py: Python<'_>, called: &Called<'_>, started: &Py<PyAny>, status: u32, length: usize) -> PyResult<()> {
        let started: f64 = started.extract(py)?;
        let took = self.perf_counter.bind(py).call0()?.extract::<f64>()? - started;
        let remote = called.environ.get_item(pyo3::intern!(py, "REMOTE_ADDR")).ok();
        let headers = called.start_response.borrow().headers.as_ref().map(|h| h.clone_ref(py));
        let args = (self.log.bind(py), called.request()?, remote, status, length, took, &called.environ, headers);
        self.log_access.bind(py).call1(args)?;
        Ok(())
    }
}
