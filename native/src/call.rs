//! One request's app call, for both native loops: the environ built, the app called with the
//! native start_response, and the whole body framed (frame.rs) when it is the common response: a
//! list, or a sized iterable (`whole_body`). What happens next (the send, or the Python response
//! path) is the loop's.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::conn::Conn;
use crate::environ::{Environ, Parts};
use crate::frame::{frame_response, JOIN_LIMIT};
use crate::parser::{fast_method, Head};
use crate::respond::{Hooks, StartResponse};

/// A request's target split at '?': (path, query).
pub(crate) fn split_target<'a>(head: &Head<'a>) -> (&'a [u8], &'a [u8]) {
    match head.target.iter().position(|&b| b == b'?') {
        Some(i) => (&head.target[..i], &head.target[i + 1..]),
        None => (head.target, &b""[..]),
    }
}

/// The method as an interned str (one of the common shape's).
pub(crate) fn method_str<'py>(py: Python<'py>, head: &Head) -> Bound<'py, PyString> {
    fast_method(py, head.method).expect("a fast method").clone()
}

/// A framed response: (status, the bytes to send, body bytes, keep the connection).
pub(crate) type Framed = (u32, Vec<u8>, usize, bool);

/// The app has been called for a request.
pub(crate) struct Called<'py> {
    pub environ: Bound<'py, PyAny>,
    pub client: PyObject,
    pub start_response: Bound<'py, StartResponse>,
    /// what the app returned (None if it raised)
    pub result: Bound<'py, PyAny>,
    /// the Exception it raised, or None
    pub exc: Bound<'py, PyAny>,
    /// the common response, framed; None: the Python response path sends it
    /// (refork.wsgi.continue_wsgi)
    pub framed: Option<Framed>,
}

impl<'py> Called<'py> {
    /// The request's refork.http.events.Request (made on first use).
    pub fn request(&self) -> PyResult<Bound<'py, PyAny>> {
        Ok(StartResponse::request(&self.start_response)?.into_bound(self.environ.py()))
    }
}

/// What a loop calls the app with.
pub(crate) struct AppCall<'a, 'py> {
    pub app: &'a Bound<'py, PyAny>,
    pub environ: &'a Environ,
    pub hooks: &'a Py<Hooks>,
    /// the server's keep-alive (False: the worker stops, "Connection: close")
    pub keep_alive: bool,
}

impl<'py> AppCall<'_, 'py> {
    /// Build the environ, call the app, frame a list body. Err: an exception that is not an
    /// Exception (SystemExit, KeyboardInterrupt), which goes out of the loop.
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &self,
        py: Python<'py>,
        conn: &mut Conn,
        head: &Head,
        raw_head: &[u8],
        method: &Bound<'py, PyString>,
        input: &Bound<'py, PyAny>,
    ) -> PyResult<Called<'py>> {
        let (path, query) = split_target(head);
        let parts = Parts {
            method: method.as_any(),
            target: head.target,
            path,
            query,
            version: if head.http11 { "1.1" } else { "1.0" },
        };
        let length = head.content_length.map(|n| PyString::new(py, &n.to_string()));
        let headers = head.headers.iter().map(|(n, v)| (n.as_slice(), *v));
        let client = conn.client(py)?;
        let environ = self.environ.make(py, &parts, headers, length, input, client.bind(py))?;
        if head.forwarded {
            self.environ.apply_forwarded(py, &environ, &head.headers, client.bind(py))?;
        }
        let environ = environ.into_any();
        let sr = Bound::new(
            py,
            StartResponse {
                hooks: self.hooks.clone_ref(py),
                code: 0,
                reason: None,
                headers: None,
                has_length: false,
                exchange: None,
                fd: conn.fd,
                client: client.clone_ref(py),
                listener: conn.listener,
                request: None,
                head: raw_head.to_vec(),
                keep_alive: self.keep_alive,
            },
        )?;
        // gunicorn's pre_request first, if set (its error is answered as the app's would be)
        let returned = match &self.hooks.get().pre_request {
            Some(pre) => pre.bind(py).call1((StartResponse::request(&sr)?, &environ)).and_then(|_| self.app.call1((&environ, &sr))),
            None => self.app.call1((&environ, &sr)),
        };
        let (mut result, exc) = match returned {
            Ok(r) => (r, py.None().into_bound(py)),
            Err(e) if e.is_instance_of::<PyException>(py) => (py.None().into_bound(py), e.into_value(py).into_bound(py).into_any()),
            Err(e) => return Err(e), // SystemExit, KeyboardInterrupt: out of the loop
        };
        let started = {
            let s = sr.borrow();
            s.exchange.is_none() && s.code != 0 && exc.is_none()
        };
        let body = if started { self.whole_body(py, &sr, &result)? } else { Body::Python(result.clone()) };
        let framed = match body {
            Body::Items(items) => self.frame(py, &sr, head, &items)?,
            Body::Pulled(items, iterator) => match self.frame(py, &sr, head, items.as_any())? {
                Some(framed) => Some(self.closed(py, framed, &result, &environ)?),
                None => {
                    // declined: what was pulled goes first on the Python path, then the rest
                    result = self.hooks.get().prefetched.bind(py).call1((items, iterator, &result))?;
                    None
                }
            },
            Body::Python(body) => {
                result = body;
                None
            }
        };
        Ok(Called { environ, client, start_response: sr, result, exc, framed })
    }

    /// frame.rs's framing of these body items (None: declined, nothing was sent).
    fn frame(&self, py: Python<'py>, sr: &Bound<'py, StartResponse>, head: &Head, items: &Bound<'py, PyAny>) -> PyResult<Option<Framed>> {
        let s = sr.borrow();
        if s.exchange.is_some() {
            return Ok(None); // write() was called while the body was pulled
        }
        let reason = s.reason.as_ref().expect("set with code").bind(py).as_bytes();
        let headers = s.headers.as_ref().expect("set with code").bind(py);
        let keep = head.keep_alive && self.keep_alive;
        Ok(frame_response(py, s.code, reason, headers, s.has_length, items, head.method == "HEAD", head.http11, keep)?
            .map(|(bytes, total, keep)| (s.code, bytes, total, keep)))
    }

    /// The whole body of a response the app has started, when it is one: a list or tuple; or any
    /// other iterable (Django's HttpResponse, werkzeug's ClosingIterator) whose Content-Length, set
    /// by the app, is within the framing limit, pulled until it has that many bytes (no further:
    /// a stream is never waited on past its length). Anything else is the Python response
    /// path's: a body without Content-Length (it may be a stream), a file (sendfile), items that
    /// are not bytes or overrun the length (its error).
    fn whole_body(&self, py: Python<'py>, sr: &Bound<'py, StartResponse>, result: &Bound<'py, PyAny>) -> PyResult<Body<'py>> {
        if result.is_exact_instance_of::<PyList>() || result.is_exact_instance_of::<PyTuple>() {
            return Ok(Body::Items(result.clone()));
        }
        let hooks = self.hooks.get();
        let declared = declared_length(&sr.borrow(), py).filter(|&n| n <= JOIN_LIMIT);
        let Some(declared) = declared else {
            return Ok(Body::Python(result.clone()));
        };
        if result.is_instance(hooks.file_wrapper.bind(py))? {
            return Ok(Body::Python(result.clone()));
        }
        let items = PyList::empty(py);
        let mut iterator = match result.try_iter() {
            Ok(it) => it,
            Err(e) => return self.raised(py, items, e, result),
        };
        let mut total = 0usize;
        while total < declared {
            let item = match iterator.next() {
                None => break,
                Some(Ok(item)) => item,
                Some(Err(e)) => return self.raised(py, items, e, result),
            };
            let fits = match item.downcast_exact::<PyBytes>() {
                Ok(b) => {
                    total += b.as_bytes().len();
                    total <= declared
                }
                Err(_) => false,
            };
            items.append(&item)?;
            if !fits {
                return Ok(Body::Python(hooks.prefetched.bind(py).call1((items, iterator, result))?));
            }
        }
        Ok(Body::Pulled(items, iterator.into_any()))
    }

    /// Pulling the body raised `e`: an Exception is the app's error, raised on the Python path
    /// after what was pulled, so the client sees what it would have seen there; anything else
    /// (SystemExit...) goes out of the loop, the body closed first, as on the Python path.
    fn raised(&self, py: Python<'py>, items: Bound<'py, PyList>, e: PyErr, result: &Bound<'py, PyAny>) -> PyResult<Body<'py>> {
        if e.is_instance_of::<PyException>(py) {
            let error = e.into_value(py);
            return Ok(Body::Python(self.hooks.get().prefetched.bind(py).call1((items, py.None(), result, error))?));
        }
        if let Ok(close) = result.getattr(pyo3::intern!(py, "close")) {
            let _ = close.call0();
        }
        Err(e)
    }

    /// A body pulled from an iterable is framed: its close() now (PEP 3333). If that raises, the
    /// Python path's line, and the connection closes after the response.
    fn closed(
        &self,
        py: Python<'py>,
        framed: Framed,
        result: &Bound<'py, PyAny>,
        environ: &Bound<'py, PyAny>,
    ) -> PyResult<Framed> {
        let (code, bytes, total, mut keep) = framed;
        if let Ok(close) = result.getattr(pyo3::intern!(py, "close")) {
            if let Err(e) = close.call0() {
                if !e.is_instance_of::<PyException>(py) {
                    return Err(e);
                }
                self.hooks.get().closing_failed.bind(py).call1((environ, e.into_value(py)))?;
                keep = false;
            }
        }
        Ok((code, bytes, total, keep))
    }
}

/// What `whole_body` found.
enum Body<'py> {
    /// the app's list or tuple
    Items(Bound<'py, PyAny>),
    /// the whole body pulled from an iterable, and that iterable's iterator
    Pulled(Bound<'py, PyList>, Bound<'py, PyAny>),
    /// the Python path's, with this result (the app's, or a Prefetched: what was pulled, then the
    /// rest or the error pulling raised)
    Python(Bound<'py, PyAny>),
}

/// The Content-Length the app set (None: none, or not a plain number).
fn declared_length(s: &StartResponse, py: Python<'_>) -> Option<usize> {
    if !s.has_length {
        return None;
    }
    for pair in s.headers.as_ref()?.bind(py).iter() {
        let pair = pair.downcast_into::<PyTuple>().ok()?;
        let name = pair.get_item(0).ok()?;
        let name = name.downcast::<PyBytes>().ok()?.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let value = pair.get_item(1).ok()?;
            return std::str::from_utf8(value.downcast::<PyBytes>().ok()?.as_bytes()).ok()?.parse().ok();
        }
    }
    None
}

/// The access-log line of a request answered by a native loop (refork.serving.connection.log_access).
pub(crate) struct AccessLog<'a> {
    pub log: &'a PyObject,
    pub log_access: &'a PyObject,
    pub perf_counter: &'a PyObject,
}

impl AccessLog<'_> {
    pub fn write(&self, py: Python<'_>, called: &Called<'_>, started: &PyObject, status: u32, length: usize) -> PyResult<()> {
        let started: f64 = started.extract(py)?;
        let took = self.perf_counter.bind(py).call0()?.extract::<f64>()? - started;
        let remote = called.environ.get_item(pyo3::intern!(py, "REMOTE_ADDR")).ok();
        let headers = called.start_response.borrow().headers.as_ref().map(|h| h.clone_ref(py));
        let args = (self.log.bind(py), called.request()?, remote, status, length, took, &called.environ, headers);
        self.log_access.bind(py).call1(args)?;
        Ok(())
    }
}

/// The request body as wsgi.input: the shared empty stream, or a stream over `body`.
pub(crate) fn input_stream<'py>(py: Python<'py>, body: &[u8], empty: &PyObject, make: &PyObject) -> PyResult<Bound<'py, PyAny>> {
    if body.is_empty() {
        Ok(empty.bind(py).clone())
    } else {
        make.bind(py).call1((PyBytes::new(py, body),))
    }
}

/// A request accounted by the worker's Python clock (control.request_started / request_finished),
/// its token in refork.deadlines.current while the app has it.
pub(crate) struct PyTracking<'py> {
    pub token: Bound<'py, PyAny>,
    reset: Bound<'py, PyAny>,
}

impl<'py> PyTracking<'py> {
    pub fn start(py: Python<'py>, control: &Bound<'py, PyAny>, current: &Bound<'py, PyAny>, method: &Bound<'py, PyString>, path: &[u8]) -> PyResult<Self> {
        let token = control.call_method1(pyo3::intern!(py, "request_started"), (method, PyBytes::new(py, path)))?;
        let reset = current.call_method1(pyo3::intern!(py, "set"), (&token,))?;
        Ok(PyTracking { token, reset })
    }

    /// The app is done with it (the context variable back as it was).
    pub fn leave(&self, current: &Bound<'py, PyAny>) -> PyResult<()> {
        current.call_method1(pyo3::intern!(self.token.py(), "reset"), (&self.reset,))?;
        Ok(())
    }

    /// The request is answered (`status` 0: nothing was sent).
    pub fn finish(self, control: &Bound<'py, PyAny>, current: &Bound<'py, PyAny>, status: u32) -> PyResult<()> {
        self.leave(current)?;
        control.call_method1(pyo3::intern!(self.token.py(), "request_finished"), (self.token, status))?;
        Ok(())
    }
}
