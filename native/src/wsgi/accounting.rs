//! How a native loop accounts a request: in the worker's slot natively (`SlotClock`, `Current`:
//! the single-thread engine when the worker has an AppClock), or by the worker's Python clock
//! (`PyTracking`: control.request_started / request_finished).
//!
//! The slot (refork.process.slots): for a request alone in the app (always, on the engine: the app runs on the worker's only
//! thread) AppClock.started and .finished come down to a few word writes; `SlotClock` makes them
//! here, with the same words and rules: the deadline (now + --timeout), the started and served
//! counts, the duration sum and one histogram cell by (status class, bucket); and, when the worker
//! records for StatsD, the count of the status code and the duration in the ring. The Python
//! clock reads its counts from the same words, so both stay one account.
//!
//! `SlotWords` gives the worker's Python clock the same writes, one call for each of its
//! started() and finished() (the ASGI loop's requests, the Python loop's).
//!
//! `Current` is the request in the app. It gets a token of the Python clock (AppClock.adopt) only
//! when something asks (refork.extend_deadline, --request-timeout): it is the clock's
//! `engine_request` hook. A request with a token is finished by the Python clock.

use std::sync::atomic::{AtomicI64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::host::{ContextVar, Control};

pub struct SlotClock {
    words: *mut i64,
    deadline: usize,
    starts: usize,
    requests: usize,
    duration: usize,
    cells: usize,
    timeout: f64,
    bounds: Vec<f64>,
    /// recording (StatsD): the counts by status code (code 100 at `codes`; 0: not recording) and
    /// the ring of durations in ms
    codes: usize,
    ring: usize,
    ring_size: usize,
    /// the --static answers' words, by status class (refork_static_requests_total)
    statics: usize,
}

// SAFETY: its words are the worker's slot, mapped for the process's life; the pool's I/O thread,
// which owns one, only counts static answers (atomic adds).
unsafe impl Send for SlotClock {}

impl SlotClock {
    /// From AppClock.native_words().
    pub fn new(words: &Bound<'_, PyDict>) -> PyResult<SlotClock> {
        let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            words.get_item(k)?.ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(k.to_string()))
        };
        let address: usize = get("address")?.extract()?;
        Ok(SlotClock {
            words: address as *mut i64,
            deadline: get("deadline")?.extract()?,
            starts: get("starts")?.extract()?,
            requests: get("requests")?.extract()?,
            duration: get("duration")?.extract()?,
            cells: get("cells")?.extract()?,
            timeout: get("timeout")?.extract()?,
            bounds: get("bounds")?.extract()?,
            codes: get("codes")?.extract()?,
            ring: get("ring")?.extract()?,
            ring_size: get("ring_size")?.extract()?,
            statics: get("static")?.extract()?,
        })
    }

    fn int(&self, i: usize) -> *mut i64 {
        unsafe { self.words.add(i) }
    }

    fn float(&self, i: usize) -> *mut f64 {
        unsafe { self.words.add(i) as *mut f64 }
    }

    /// Slots.count_static: one more --static answer of `status` (2xx-5xx), not one of the app's.
    /// An atomic add: the pool's I/O thread counts here while app threads do (SlotWords).
    pub fn count_static(&self, status: u32) {
        if (200..600).contains(&status) {
            // SAFETY: an aligned word of the worker's slot, mapped for the process's life
            let word = unsafe { AtomicI64::from_ptr(self.int(self.statics + (status / 100 - 2) as usize)) };
            word.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// AppClock.started for a request alone in the app.
    pub fn start(&self, now: f64) {
        self.start_with(Some(now + self.timeout));
    }

    /// AppClock.started's writes: the deadline (None: unchanged) and the started count.
    pub fn start_with(&self, deadline: Option<f64>) {
        unsafe {
            if let Some(deadline) = deadline {
                *self.float(self.deadline) = deadline;
            }
            *self.int(self.starts) += 1;
        }
    }

    /// AppClock.finished for a request alone in the app; returns the requests served.
    pub fn finish(&self, began: f64, now: f64, status: u32) -> i64 {
        self.finish_with(now + self.timeout, now - began, status)
    }

    /// AppClock.finished's writes: the deadline, the served count, the duration sum and its
    /// histogram cell (and, recording, the status count and the ring); returns the requests served.
    pub fn finish_with(&self, deadline: f64, took: f64, status: u32) -> i64 {
        let width = self.bounds.len() + 1;
        let row = if (100..600).contains(&status) { status as usize / 100 } else { 0 };
        let bucket = self.bounds.partition_point(|&b| b < took);
        unsafe {
            *self.float(self.deadline) = deadline;
            let served = *self.int(self.requests) + 1;
            if self.codes != 0 {
                // before the count that says the ring holds it
                if (100..600).contains(&status) {
                    *self.int(self.codes + status as usize - 100) += 1;
                }
                *self.float(self.ring + (served as usize - 1) % self.ring_size) = took * 1000.0;
            }
            *self.int(self.requests) = served;
            *self.float(self.duration) += took;
            *self.int(self.cells + row * width + bucket) += 1;
            served
        }
    }
}

/// The slot's writes of the worker's Python clock (refork.process.slots.AppClock.started and
/// .finished) in one call each: what it decides (the deadline, the duration) it passes in.
#[pyclass(module = "refork._native")]
pub struct SlotWords {
    slot: SlotClock,
}

// The clock calls it from any of its threads, always under its own lock: one writer at a time,
// into the worker's shared slot (mapped for the process's life).
unsafe impl Send for SlotWords {}
unsafe impl Sync for SlotWords {}

#[pymethods]
impl SlotWords {
    /// SlotWords(AppClock.native_words())
    #[new]
    fn py_new(words: &Bound<'_, PyDict>) -> PyResult<Self> {
        Ok(SlotWords { slot: SlotClock::new(words)? })
    }

    /// A request entered the app: the deadline (a negative one: unchanged) and the started count.
    fn started(&self, deadline: f64) {
        self.slot.start_with((deadline >= 0.0).then_some(deadline));
    }

    /// A request was answered (status 0: nothing was sent); returns the requests served.
    fn finished(&self, deadline: f64, took: f64, status: i64) -> i64 {
        self.slot.finish_with(deadline, took, u32::try_from(status).unwrap_or(0))
    }

    /// One more --static answer of this status (an atomic add: see SlotClock::count_static).
    fn count_static(&self, status: i64) {
        self.slot.count_static(u32::try_from(status).unwrap_or(0));
    }
}

#[pyclass(module = "refork._native")]
pub struct Current {
    active: bool,
    began: f64,
    method: &'static str,
    path: Vec<u8>,
    token: Option<Py<PyAny>>,
    adopt: Py<PyAny>,
}

impl Current {
    pub fn new(adopt: Py<PyAny>) -> Current {
        Current { active: false, began: 0.0, method: "", path: Vec::new(), token: None, adopt }
    }

    pub fn start(&mut self, began: f64, method: &'static str, path: &[u8]) {
        self.active = true;
        self.began = began;
        self.method = method;
        self.path.clear();
        self.path.extend_from_slice(path);
        self.token = None;
    }

    /// The request is over: its token if it got one (the Python clock finishes it), and when it began.
    pub fn end(&mut self) -> (Option<Py<PyAny>>, f64) {
        self.active = false;
        (self.token.take(), self.began)
    }
}

#[pymethods]
impl Current {
    /// The token of the engine's request in the app (registered now if it has none); None when
    /// the engine has no request in the app, or `blocking` is False and the clock's lock is held.
    #[pyo3(signature = (blocking=true))]
    fn __call__(slf: &Bound<'_, Self>, blocking: bool) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        let (method, path, began, adopt) = {
            let this = slf.borrow();
            if !this.active {
                return Ok(None);
            }
            if let Some(t) = &this.token {
                return Ok(Some(t.clone_ref(py)));
            }
            (this.method, PyBytes::new(py, &this.path), this.began, this.adopt.clone_ref(py))
        };
        let token = adopt.bind(py).call1((began, method, path, blocking))?;
        if token.is_none() {
            return Ok(None);
        }
        let token = token.unbind();
        slf.borrow_mut().token = Some(token.clone_ref(py));
        Ok(Some(token))
    }
}

/// A request accounted by the worker's Python clock (control.request_started / request_finished),
/// its token in refork.deadlines.current while the app has it.
pub(crate) struct PyTracking<'py> {
    pub token: Bound<'py, PyAny>,
    reset: Bound<'py, PyAny>,
}

impl<'py> PyTracking<'py> {
    pub fn start(py: Python<'py>, control: &Control, current: &ContextVar, method: &Bound<'py, PyString>, path: &[u8]) -> PyResult<Self> {
        let token = control.request_started.bind(py).call1((method, PyBytes::new(py, path)))?;
        let reset = current.set.bind(py).call1((&token,))?;
        Ok(PyTracking { token, reset })
    }

    /// The app is done with it (the context variable back as it was).
    pub fn leave(&self, current: &ContextVar) -> PyResult<()> {
        current.reset.bind(self.token.py()).call1((&self.reset,))?;
        Ok(())
    }

    /// The request is answered (`status` 0: nothing was sent).
    pub fn finish(self, control: &Control, current: &ContextVar, status: u32) -> PyResult<()> {
        self.leave(current)?;
        control.request_finished.bind(self.token.py()).call1((self.token, status))?;
        Ok(())
    }
}
