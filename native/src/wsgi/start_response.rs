//! start_response for the engine: PEP 3333's callable with refork.wsgi.response's rules.
//!
//! The checks are the Python ones, by construction: a status or header pair is looked up in
//! refork.wsgi.response's own caches and, on a miss, checked by its own `check_status` /
//! `check_header` (same exceptions, same messages; they fill the caches). Nothing is sent while
//! the app runs unless it calls the legacy `write()`: that creates the Python `_Exchange` of the
//! request (the engine's host hands the connection to the Python loop) and everything from then
//! on is the Python response path.

use pyo3::exceptions::{PyAssertionError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::host::{Host, Refs};
use crate::http::head::{fast_head, HeadLimits};
use crate::http::parser::request_object;
use crate::sys;

/// refork.wsgi.response's caches and checks, and the host's `response_exchange` (see module docs).
#[pyclass(module = "refork._native", frozen)]
pub struct Hooks {
    pub(crate) status_cache: Py<PyDict>,
    pub(crate) header_cache: Py<PyDict>,
    pub(crate) check_status: Py<PyAny>,
    pub(crate) check_header: Py<PyAny>,
    /// host.response_exchange(start_response) -> a Python _Exchange
    pub(crate) exchange: Py<PyAny>,
    /// refork.http.events.Request and the limits its head was read with (see StartResponse::request)
    pub(crate) request_cls: Py<PyAny>,
    pub(crate) limits: HeadLimits,
    /// refork.wsgi.response.Prefetched, refork.wsgi.files.FileWrapper and
    /// refork.wsgi.response.closing_failed (see wsgi/body.rs: a body that is not a list)
    pub(crate) prefetched: Py<PyAny>,
    pub(crate) file_wrapper: Py<PyAny>,
    /// refork.wsgi.files.file_span: (fd, offset, bytes to the end) of a wrapped regular file
    pub(crate) file_span: Py<PyAny>,
    pub(crate) closing_failed: Py<PyAny>,
    /// the host's `pre_request_hook(request, environ)`: gunicorn's pre_request (None: not set)
    pub(crate) pre_request: Option<Py<PyAny>>,
    /// refork.wsgi.response.hint_response: the 103 of a wsgi.early_hints call, its headers checked
    pub(crate) hint_response: Py<PyAny>,
}

impl Hooks {
    /// From the engine host (its `response_exchange`, `pre_request_hook`) and the engines' refs.
    pub(crate) fn new(py: Python<'_>, host: &Host, refs: &Refs) -> Hooks {
        Hooks {
            status_cache: refs.status_cache.clone_ref(py),
            header_cache: refs.header_cache.clone_ref(py),
            check_status: refs.check_status.clone_ref(py),
            check_header: refs.check_header.clone_ref(py),
            exchange: host.response_exchange.clone_ref(py),
            request_cls: refs.request_cls.clone_ref(py),
            limits: host.settings.limits,
            prefetched: refs.prefetched.clone_ref(py),
            file_wrapper: refs.file_wrapper.clone_ref(py),
            file_span: refs.file_span.clone_ref(py),
            closing_failed: refs.closing_failed.clone_ref(py),
            pre_request: host.pre_request_hook.as_ref().map(|h| h.clone_ref(py)),
            hint_response: refs.hint_response.clone_ref(py),
        }
    }
}

/// A method of a request's StartResponse as a callable of its own (write(), wsgi.early_hints),
/// made without a lookup by name.
#[pyclass(module = "refork._native", frozen)]
pub struct BoundMethod {
    start: Py<StartResponse>,
    call: for<'py> fn(&Bound<'py, StartResponse>, &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
}

#[pymethods]
impl BoundMethod {
    fn __call__<'py>(&self, py: Python<'py>, arg: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        (self.call)(self.start.bind(py), arg)
    }
}

#[pyclass(module = "refork._native")]
pub struct StartResponse {
    pub(crate) hooks: Py<Hooks>,
    pub(crate) code: u32,
    pub(crate) reason: Option<Py<PyBytes>>,
    pub(crate) headers: Option<Py<PyList>>,
    pub(crate) has_length: bool,
    /// the Python _Exchange once write() was called: from then on it answers
    pub(crate) exchange: Option<Py<PyAny>>,
    #[pyo3(get)]
    pub(crate) fd: i32,
    #[pyo3(get)]
    pub(crate) client: Py<PyAny>,
    #[pyo3(get, name = "listener_fd")]
    pub(crate) listener: i32,
    /// the Request event, made on first use from `head` (most responses never need it)
    pub(crate) request: Option<Py<PyAny>>,
    /// the request's head as received
    pub(crate) head: Vec<u8>,
    /// the server's keep-alive (False: the worker stops)
    #[pyo3(get)]
    pub(crate) keep_alive: bool,
    /// an HTTP/1.1 request: early hints may go to it (never a 1xx to HTTP/1.0, RFC 9110 15.2)
    pub(crate) http11: bool,
    /// the final response is framed: early hints are ignored from now on (once an exchange is
    /// made, its rules answer them)
    pub(crate) final_framed: bool,
    /// the part of an early hint the socket did not take: it goes before the response
    pub(crate) hint_rest: Vec<u8>,
}

#[pymethods]
impl StartResponse {
    #[pyo3(signature = (status, headers, exc_info=None))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        status: &Bound<'py, PyAny>,
        headers: &Bound<'py, PyAny>,
        exc_info: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let exchange = slf.borrow().exchange.as_ref().map(|e| e.clone_ref(py));
        if let Some(ex) = exchange {
            return ex.bind(py).call_method1(pyo3::intern!(py, "start_response"), (status, headers, exc_info));
        }
        let has_exc = exc_info.is_some_and(|e| !e.is_none());
        // (no head is ever out here: with exc_info the app may replace the status)
        if !has_exc && slf.borrow().code != 0 {
            return Err(PyAssertionError::new_err("start_response() called a second time without exc_info"));
        }
        let hooks = slf.borrow().hooks.clone_ref(py);
        let hooks = hooks.get();
        let hit = if status.is_exact_instance_of::<PyString>() {
            hooks.status_cache.bind(py).get_item(status)?
        } else {
            None
        };
        let hit = match hit {
            Some(h) => h,
            None => hooks.check_status.bind(py).call1((status,))?,
        };
        let hit = hit.cast_into::<PyTuple>()?;
        let code: u32 = hit.get_item(0)?.extract()?;
        let reason = hit.get_item(1)?.cast_into::<PyBytes>()?;
        let Ok(headers) = headers.cast_exact::<PyList>() else {
            let name = headers.get_type().name()?;
            return Err(PyTypeError::new_err(format!("WSGI headers must be a list, got {name}")));
        };
        let out = PyList::empty(py);
        let mut has_length = false;
        let cache = hooks.header_cache.bind(py);
        for item in headers.iter() {
            let hit = if item.is_exact_instance_of::<PyTuple>() { cache.get_item(&item)? } else { None };
            let hit = match hit {
                Some(h) => h,
                None => hooks.check_header.bind(py).call1((&item,))?,
            };
            let hit = hit.cast_into::<PyTuple>()?;
            if hit.get_item(1)?.is_truthy()? {
                has_length = true;
            }
            out.append(hit.get_item(0)?)?;
        }
        {
            let mut this = slf.borrow_mut();
            this.code = code;
            this.reason = Some(reason.unbind());
            this.headers = Some(out.unbind());
            this.has_length = has_length;
        }
        Ok(Bound::new(py, BoundMethod { start: slf.clone().unbind(), call: StartResponse::write })?.into_any())
    }

    /// The Python _Exchange of this request (made now if write() did not make it).
    fn exchange_now(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        Self::exchange(slf)
    }

    /// `wsgi.early_hints(headers)`: refork.wsgi.response._Exchange.early_hints's rules (gunicorn's
    /// API). Nothing of the response is out while the app runs, so the 103 is written to the
    /// socket at once, if it takes it now: hints are advisory, so one the socket cannot take
    /// (EAGAIN) is dropped, never buffered; a part of one it took partly goes before the response.
    fn early_hints(slf: &Bound<'_, Self>, headers: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let exchange = slf.borrow().exchange.as_ref().map(|e| e.clone_ref(py));
        if let Some(ex) = exchange {
            ex.bind(py).call_method1(pyo3::intern!(py, "early_hints"), (headers,))?;
            return Ok(());
        }
        if !slf.borrow().http11 || slf.borrow().final_framed {
            return Ok(()); // (as gunicorn: neither checked nor sent)
        }
        let hint_response = slf.borrow().hooks.get().hint_response.clone_ref(py);
        let data = hint_response.bind(py).call1((headers,))?;
        let data = data.cast::<PyBytes>()?.as_bytes();
        let mut this = slf.borrow_mut();
        if !this.hint_rest.is_empty() {
            return Ok(()); // part of an earlier one still waits: this one would only wait behind it
        }
        match sys::send(this.fd, data) {
            Ok(n) if n > 0 && n < data.len() => this.hint_rest = data[n..].to_vec(),
            Ok(_) => {}  // all of it, or none (EAGAIN): dropped
            Err(_) => {} // the client is gone: the response's own send finds out
        }
        Ok(())
    }

    /// The request's refork.http.events.Request.
    #[getter(request)]
    fn request_event(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        Self::request(slf)
    }

    /// What start_response set: (code, reason, headers checked, has Content-Length), or None.
    #[getter]
    #[allow(clippy::type_complexity)]
    fn status(&self, py: Python<'_>) -> Option<(u32, Py<PyBytes>, Py<PyList>, bool)> {
        match (&self.reason, &self.headers) {
            (Some(reason), Some(headers)) if self.code != 0 => Some((self.code, reason.clone_ref(py), headers.clone_ref(py), self.has_length)),
            _ => None,
        }
    }

    /// The part of an early hint the socket did not take (it goes before anything else), once.
    fn take_hint_rest<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &std::mem::take(&mut self.hint_rest))
    }

    /// The legacy write() callable: the response goes the Python way from here (module docs).
    fn write<'py>(slf: &Bound<'py, Self>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let ex = Self::exchange(slf)?;
        ex.bind(py).call_method1(pyo3::intern!(py, "write"), (data,))
    }
}

impl StartResponse {
    /// Back to what a new one holds, for `renew` (wsgi/app_call.rs `recycle`).
    pub(crate) fn clear(&mut self) {
        self.code = 0;
        self.reason = None;
        self.headers = None;
        self.has_length = false;
        self.exchange = None;
        self.request = None;
        self.final_framed = false;
        self.hint_rest.clear();
    }

    /// A cleared one for another request of the same loop.
    pub(crate) fn renew(&mut self, fd: i32, client: Py<PyAny>, listener: i32, head: &[u8], keep_alive: bool, http11: bool) {
        self.fd = fd;
        self.client = client;
        self.listener = listener;
        self.head.clear();
        self.head.extend_from_slice(head);
        self.keep_alive = keep_alive;
        self.http11 = http11;
    }

    /// wsgi.early_hints of this request's environ.
    pub fn hints_callable<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        fn call<'py>(slf: &Bound<'py, StartResponse>, headers: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
            StartResponse::early_hints(slf, headers)?;
            Ok(slf.py().None().into_bound(slf.py()))
        }
        Ok(Bound::new(slf.py(), BoundMethod { start: slf.clone().unbind(), call })?.into_any())
    }

    /// The request's refork.http.events.Request (made now from its head if not made yet).
    pub fn request(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if let Some(r) = slf.borrow().request.as_ref() {
            return Ok(r.clone_ref(py));
        }
        let r = {
            let this = slf.borrow();
            let hooks = this.hooks.get();
            let head = fast_head(&hooks.limits, &this.head).expect("a head the engine parsed");
            request_object(py, hooks.request_cls.bind(py), &head)?.unbind()
        };
        slf.borrow_mut().request = Some(r.clone_ref(py));
        Ok(r)
    }

    /// The Python _Exchange of this request, made on first use by the host's response_exchange
    /// (which reads what start_response set, and the early hint's rest, of this object).
    pub fn exchange(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if let Some(ex) = slf.borrow().exchange.as_ref() {
            return Ok(ex.clone_ref(py));
        }
        let exchange = slf.borrow().hooks.get().exchange.clone_ref(py);
        let ex = exchange.bind(py).call1((slf,))?;
        let ex = ex.unbind();
        slf.borrow_mut().exchange = Some(ex.clone_ref(py));
        Ok(ex)
    }
}
