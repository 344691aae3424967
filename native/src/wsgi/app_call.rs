//! One request's app call, for both native loops: the environ built, the app called with the
//! native start_response, and the whole body framed (http/frame.rs) when it is the common
//! response: a list, or a sized iterable (body.rs). What happens next (the send, or the Python
//! response path) is the loop's.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::body::Body;
use super::environ::{Environ, Parts};
use super::start_response::{Hooks, StartResponse};
use crate::conn::{Conn, FileBody};
use crate::http::frame::{frame_response, Framing, Status};
use crate::http::head::Head;
use crate::http::parser::fast_method;

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
    pub client: Py<PyAny>,
    pub start_response: Bound<'py, StartResponse>,
    /// what the app returned (None if it raised)
    pub result: Bound<'py, PyAny>,
    /// the Exception it raised, or None
    pub exc: Bound<'py, PyAny>,
    /// the common response, framed; None: the Python response path sends it
    /// (refork.wsgi.response.continue_wsgi)
    pub framed: Option<Framed>,
    /// the file `framed`'s head is followed by (a wsgi.file_wrapper the loop sends itself)
    pub file: Option<FileBody>,
    /// the environ's wsgi.early_hints
    pub hints: Bound<'py, PyAny>,
}

/// A request's StartResponse and its wsgi.early_hints callable, kept by a loop for its next
/// request when nothing else holds either (`recycle`): two objects fewer made and freed a request.
pub(crate) type Spare = (Py<StartResponse>, Py<PyAny>);

/// The request is done with: its StartResponse and hints callable become `spare` if only
/// `called` holds them (the app kept neither, nor the environ, nor a write callable).
pub(crate) fn recycle(called: Called<'_>, spare: &mut Option<Spare>) {
    let Called { environ, client, start_response, result, exc, framed, file, hints } = called;
    drop((environ, client, result, exc, framed, file));
    // (ours, and the one the hints callable holds)
    let refs = |o: &Bound<'_, PyAny>| unsafe { pyo3::ffi::Py_REFCNT(o.as_ptr()) };
    if refs(start_response.as_any()) == 2 && refs(&hints) == 1 {
        start_response.borrow_mut().clear();
        *spare = Some((start_response.unbind(), hints.unbind()));
    }
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
    /// the loop sends a wsgi.file_wrapper itself (sendfile after the framed head)
    pub sends_files: bool,
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
        self.call_with(py, conn, head, raw_head, method, input, &mut None)
    }

    /// `call`, with the StartResponse of an earlier request if `spare` holds one (see `recycle`).
    #[allow(clippy::too_many_arguments)]
    pub fn call_with(
        &self,
        py: Python<'py>,
        conn: &mut Conn,
        head: &Head,
        raw_head: &[u8],
        method: &Bound<'py, PyString>,
        input: &Bound<'py, PyAny>,
        spare: &mut Option<Spare>,
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
        let port = conn.remote_port(py)?;
        let environ = self.environ.make(py, &parts, headers, length, input, client.bind(py), port)?;
        if head.forwarded {
            self.environ.apply_forwarded(py, &environ, &head.headers, client.bind(py))?;
        }
        let (sr, hints) = match spare.take() {
            Some((sr, hints)) => {
                let sr = sr.into_bound(py);
                sr.borrow_mut().renew(conn.fd, client.clone_ref(py), conn.listener, raw_head, self.keep_alive, head.http11);
                (sr, hints.into_bound(py))
            }
            None => {
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
                        http11: head.http11,
                        final_framed: false,
                        hint_rest: Vec::new(),
                    },
                )?;
                let hints = StartResponse::hints_callable(&sr)?;
                (sr, hints)
            }
        };
        environ.set_item(pyo3::intern!(py, "wsgi.early_hints"), &hints)?;
        let environ = environ.into_any();
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
        let body = if !started {
            Body::Python(result.clone())
        } else if let Some(file) = self.file_body(py, &sr, head, &result)? {
            Body::File(file)
        } else {
            self.whole_body(py, &sr, &result)?
        };
        let mut file = None;
        let framed = match body {
            Body::File((framed, body)) => {
                file = Some(body);
                Some(framed)
            }
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
        let framed = framed.map(|f| Self::after_hints(&sr, f));
        Ok(Called { environ, client, start_response: sr, result, exc, framed, file, hints })
    }

    /// A framed response: from now on early hints are ignored, and the part of one the socket did
    /// not take goes first.
    fn after_hints(sr: &Bound<'py, StartResponse>, (status, bytes, length, keep): Framed) -> Framed {
        let mut s = sr.borrow_mut();
        s.final_framed = true;
        if s.hint_rest.is_empty() {
            return (status, bytes, length, keep);
        }
        let mut out = std::mem::take(&mut s.hint_rest);
        out.extend_from_slice(&bytes);
        (status, out, length, keep)
    }

    /// http/frame.rs's framing of these body items (None: declined, nothing was sent).
    fn frame(&self, py: Python<'py>, sr: &Bound<'py, StartResponse>, head: &Head, items: &Bound<'py, PyAny>) -> PyResult<Option<Framed>> {
        let s = sr.borrow();
        if s.exchange.is_some() {
            return Ok(None); // write() was called while the body was pulled
        }
        let reason = s.reason.as_ref().expect("set with code").bind(py).as_bytes();
        let headers = s.headers.as_ref().expect("set with code").bind(py);
        let keep = head.keep_alive && self.keep_alive;
        let status = Status { code: s.code, reason, headers, has_length: s.has_length };
        let framing = Framing { no_body: head.method == "HEAD", http11: head.http11, keep_alive: keep };
        Ok(frame_response(&status, items, framing)?
            .map(|(bytes, total, keep)| (s.code, bytes, total, keep)))
    }
}

/// The request body as wsgi.input: the shared empty stream, or a stream over `body`.
pub(crate) fn input_stream<'py>(py: Python<'py>, body: &[u8], empty: &Py<PyAny>, make: &Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if body.is_empty() {
        Ok(empty.bind(py).clone())
    } else {
        make.bind(py).call1((PyBytes::new(py, body),))
    }
}
