//! `Http2Core`: the connection driver as a Python class (refork.http.h2.Http2Connection holds
//! one). Events come out as tuples, their first item the kind (see `refork/_native.pyi`).

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PySlice, PyTuple};

use super::driver::{Core, Event, Limits};
use super::prefilter::{Budget, Budgets};

#[pyclass(module = "refork._native")]
pub struct Http2Core {
    core: Mutex<Core>,
    told: Mutex<[u64; 4]>,
}

type Pair = (Vec<u8>, Vec<u8>);

/// A bytes-like object's bytes (bytes as they are; a bytearray or memoryview copied once).
fn with_bytes<R>(data: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(f(b.as_bytes()));
    }
    let copy = data.py().get_type::<PyBytes>().call1((data,))?;
    Ok(f(copy.cast::<PyBytes>()?.as_bytes()))
}

impl Http2Core {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn events<'py>(py: Python<'py>, events: Vec<Event>) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for e in events {
        let item = match e {
            Event::Opened { sid, method, path, authority, headers, ended } => {
                let fields = PyList::empty(py);
                for (n, v) in headers {
                    fields.append((PyBytes::new(py, &n), PyBytes::new(py, &v)))?;
                }
                (0, sid, method, PyBytes::new(py, &path), PyBytes::new(py, &authority), fields, ended).into_pyobject(py)?
            }
            Event::Body(sid, data) => (1, sid, PyBytes::new(py, &data)).into_pyobject(py)?,
            Event::Ended(sid) => (2, sid).into_pyobject(py)?,
            Event::Reset(sid, code, by_client) => (3, sid, code, by_client).into_pyobject(py)?,
            Event::Window(sid) => (4, sid).into_pyobject(py)?,
            Event::ConnectionEnded { code, reason, by_client, last } => (5, code, reason, by_client, last).into_pyobject(py)?,
        };
        out.append(item)?;
    }
    Ok(out)
}

#[pymethods]
impl Http2Core {
    /// `budgets`: (burst, per second) for resets, settings, pings, window updates, priorities,
    /// empty DATA.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_concurrent_streams: u32, initial_window_size: u32, max_frame_size: u32, max_header_list_size: u32,
        connection_window: u32, budgets: [(u32, f64); 6],
    ) -> Self {
        let b = budgets.map(|(burst, rate)| Budget::new(burst, rate));
        let budgets = Budgets { resets: b[0], settings: b[1], pings: b[2], window_updates: b[3], priorities: b[4], empty_data: b[5] };
        let limits = Limits { max_concurrent_streams, initial_window_size, max_frame_size, max_header_list_size, connection_window, budgets };
        Http2Core { core: Mutex::new(Core::new(limits)), told: Mutex::new([0; 4]) }
    }

    fn start(&self) {
        self.lock().start();
    }

    fn receive<'py>(&self, py: Python<'py>, data: &Bound<'py, PyAny>, now: f64) -> PyResult<Bound<'py, PyList>> {
        let got = with_bytes(data, |d| self.lock().receive(d, now))?;
        events(py, got)
    }

    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let got = self.lock().take_events();
        events(py, got)
    }

    fn data_to_send<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let out = self.lock().data_to_send();
        PyBytes::new(py, &out)
    }

    fn respond(&self, sid: u32, status: u16, headers: Vec<Pair>, end_stream: bool) {
        self.lock().respond(sid, status, &headers, end_stream);
    }

    fn informational(&self, sid: u32, status: u16, headers: Vec<Pair>) {
        self.lock().informational(sid, status, &headers);
    }

    fn window(&self, sid: u32) -> usize {
        self.lock().window(sid)
    }

    fn send_body(&self, sid: u32, data: &Bound<'_, PyAny>, end_stream: bool) -> PyResult<usize> {
        if let Ok(b) = data.cast::<PyBytes>() {
            return Ok(self.lock().send_body(sid, b.as_bytes(), end_stream));
        }
        // a memoryview: only what the window takes now is copied
        let total = data.len()?;
        let n = self.lock().room(sid, total);
        let part = if n == total { data.clone() } else { data.get_item(PySlice::new(data.py(), 0, n as isize, 1))? };
        with_bytes(&part, |d| self.lock().send_body(sid, d, end_stream && n == total))
    }

    fn send_trailers(&self, sid: u32, headers: Vec<Pair>) {
        self.lock().send_trailers(sid, &headers);
    }

    fn body_consumed(&self, sid: u32, n: usize) {
        self.lock().body_consumed(sid, n);
    }

    fn reset(&self, sid: u32, code: u32) {
        self.lock().reset(sid, code);
    }

    fn goaway(&self, now: f64) {
        self.lock().goaway(now);
    }

    fn tick(&self, now: f64, wait: f64) {
        self.lock().tick(now, wait);
    }

    fn end<'py>(&self, py: Python<'py>, code: u32, reason: &str) -> PyResult<Bound<'py, PyList>> {
        let mut core = self.lock();
        core.end(code, reason);
        let got = core.take_events();
        drop(core);
        events(py, got)
    }

    /// The counts (streams, resets received, resets sent, GOAWAYs sent) since the last call.
    fn take_tallies<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let now = self.lock().tallies;
        let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
        let delta: Vec<u64> = now.iter().zip(told.iter()).map(|(a, b)| a - b).collect();
        *told = now;
        PyTuple::new(py, delta)
    }

    fn release(&self) {
        self.lock().release();
    }

    #[getter]
    fn ended(&self) -> bool {
        self.lock().ended
    }

    #[getter]
    fn going_away(&self) -> bool {
        self.lock().going_away
    }

    #[getter]
    fn draining(&self) -> bool {
        self.lock().draining_since.is_some()
    }

    #[getter]
    fn last_stream_id(&self) -> u32 {
        self.lock().last_stream_id
    }

    #[getter]
    fn buffered(&self) -> usize {
        self.lock().buffered()
    }

    #[getter]
    fn head_arriving(&self) -> bool {
        self.lock().head_arriving()
    }

    #[getter]
    fn open_streams(&self) -> usize {
        self.lock().open_streams()
    }
}
