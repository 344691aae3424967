//! The whole body of a response the app has started, pulled for framing when it is one: a list
//! or tuple, or a sized iterable within the framing limit; anything else stays the Python
//! response path's.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::app_call::{AppCall, Framed};
use super::start_response::StartResponse;
use crate::conn::{FileBody, FileOwner};
use crate::http::frame::{frame_response, Framing, Status, JOIN_LIMIT};
use crate::http::head::Head;

impl<'py> AppCall<'_, 'py> {
    /// A wsgi.file_wrapper over a regular file, with the app's Content-Length, to a request that
    /// is not HEAD: its head framed, and the file range the loop sends after it (sendfile). None:
    /// the Python response path's (a file without fileno(), no Content-Length, a length past
    /// the file's end, a head the framing declines), nothing read or sent.
    pub(super) fn file_body(&self, py: Python<'py>, sr: &Bound<'py, StartResponse>, head: &Head, result: &Bound<'py, PyAny>) -> PyResult<Option<(Framed, FileBody)>> {
        let hooks = self.hooks.get();
        if !self.sends_files || head.method == "HEAD" || !result.is_exact_instance(hooks.file_wrapper.bind(py)) {
            return Ok(None);
        }
        let s = sr.borrow();
        let Some(declared) = declared_length(&s, py) else { return Ok(None) };
        let span = hooks.file_span.bind(py).call1((result,))?;
        let Some((fd, offset, remaining)) = span.extract::<Option<(i32, i64, usize)>>()? else { return Ok(None) };
        if declared > remaining {
            return Ok(None); // (the Python path's error: the file ends before its length)
        }
        let reason = s.reason.as_ref().expect("set with code").bind(py).as_bytes();
        let headers = s.headers.as_ref().expect("set with code").bind(py);
        let keep = head.keep_alive && self.keep_alive;
        let empty = PyList::empty(py);
        // framed as a HEAD response is: the head alone, with the app's Content-Length
        let status = Status { code: s.code, reason, headers, has_length: true };
        let framing = Framing { no_body: true, http11: head.http11, keep_alive: keep };
        let Some((bytes, _, keep)) = frame_response(&status, empty.as_any(), framing)? else {
            return Ok(None);
        };
        let file = FileBody { fd, offset, remaining: declared, owner: FileOwner::App(result.clone().unbind()) };
        Ok(Some(((s.code, bytes, declared, keep), file)))
    }

    /// The whole body of a response the app has started, when it is one: a list or tuple; or any
    /// other iterable (Django's HttpResponse, werkzeug's ClosingIterator) whose Content-Length, set
    /// by the app, is within the framing limit, pulled until it has that many bytes (no further:
    /// a stream is never waited on past its length). Anything else is the Python response
    /// path's: a body without Content-Length (it may be a stream), a file (`file_body`'s, or the Python
    /// path's sendfile), items that
    /// are not bytes or overrun the length (its error).
    pub(super) fn whole_body(&self, py: Python<'py>, sr: &Bound<'py, StartResponse>, result: &Bound<'py, PyAny>) -> PyResult<Body<'py>> {
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
            let fits = match item.cast_exact::<PyBytes>() {
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
    pub(super) fn closed(
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
pub(super) enum Body<'py> {
    /// a file the loop sends after its framed head
    File((Framed, FileBody)),
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
        let pair = pair.cast_into::<PyTuple>().ok()?;
        let name = pair.get_item(0).ok()?;
        let name = name.cast::<PyBytes>().ok()?.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let value = pair.get_item(1).ok()?;
            return std::str::from_utf8(value.cast::<PyBytes>().ok()?.as_bytes()).ok()?.parse().ok();
        }
    }
    None
}
