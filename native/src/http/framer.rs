//! `ResponseFramer`, refork.http.response.ResponseFramer in Rust for the ASGI loop: the head of a
//! response framed in one call (its fields checked as they are copied, by fields.rs), its body
//! pieces and end. Same attributes, same bytes, same ValueError messages
//! (tests/asgi/test_native_framer.py holds it to the Python class); the status line comes from the
//! Python module (`status_line`), so the reason phrases are the running Python's.

use std::collections::HashMap;
use std::sync::Mutex;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyInt, PyTuple};

use super::date::cached_date;
use super::fields::{copy_fields, Refused};
use super::request::FramedRequest;

/// refork.http.response.status_line, set once by `use_status_lines`.
static STATUS_LINE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// Status lines of the standard reasons, by code (what STATUS_LINE gave for them).
static LINES: Mutex<Option<HashMap<u16, Vec<u8>>>> = Mutex::new(None);

/// use_status_lines(status_line): the Python function that makes (and caches) a status line.
#[pyfunction]
pub(crate) fn use_status_lines(py: Python<'_>, status_line: Py<PyAny>) {
    let _ = STATUS_LINE.set(py, status_line);
}

fn status_line(py: Python<'_>, status: &Bound<'_, PyAny>, reason: Option<&Bound<'_, PyAny>>, out: &mut Vec<u8>) -> PyResult<u16> {
    let code = if status.is_exact_instance_of::<PyInt>() { status.extract::<i64>().ok() } else { None };
    let code = match code {
        Some(c) if (100..=999).contains(&c) => c as u16,
        _ => return Err(PyValueError::new_err(format!("invalid status code {}", status.repr()?))),
    };
    if reason.is_none() {
        let lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(line) = lines.as_ref().and_then(|m| m.get(&code)) {
            out.extend_from_slice(line);
            return Ok(code);
        }
    }
    let make = STATUS_LINE.get(py).ok_or_else(|| PyTypeError::new_err("use_status_lines() was not called"))?;
    let line = make.bind(py).call1((code, reason))?;
    let line = line.cast::<PyBytes>()?.as_bytes();
    out.extend_from_slice(line);
    if reason.is_none() {
        let mut lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
        let map = lines.get_or_insert_with(HashMap::new);
        if map.len() < 1024 {
            map.insert(code, line.to_vec());
        }
    }
    Ok(code)
}

/// A header pair as the app gave it: a tuple, or any iterable of exactly two items; TypeError
/// otherwise (the caller's check then names what is wrong).
fn pair<'py>(item: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    if let Ok(t) = item.cast::<PyTuple>() {
        if t.len() == 2 {
            return Ok((t.get_item(0)?, t.get_item(1)?));
        }
    } else {
        let mut items = item.try_iter()?;
        if let (Some(name), Some(value), None) = (items.next(), items.next(), items.next()) {
            return Ok((name?, value?));
        }
    }
    Err(PyTypeError::new_err("a response header must be a (name, value) pair"))
}

/// Python's repr of a bytes value (b'...'), for error messages.
fn repr_bytes(py: Python<'_>, value: &[u8]) -> String {
    PyBytes::new(py, value).repr().map(|r| r.to_string()).unwrap_or_default()
}

#[pyclass(module = "refork._native")]
pub struct ResponseFramer {
    #[pyo3(get, set)]
    keep_alive: bool,
    #[pyo3(get, set)]
    chunked: bool,
    #[pyo3(get, set)]
    content_length: Option<u64>,
    #[pyo3(get, set)]
    body_bytes: u64,
    #[pyo3(get, set)]
    no_body: bool,
    #[pyo3(get, set)]
    status: u16,
    http11: bool,
    http10: bool,
    state: u8, // 0: before head, 1: head sent, 2: ended
}

#[pymethods]
impl ResponseFramer {
    #[new]
    #[pyo3(signature = (request, *, server_keep_alive = true))]
    fn new(request: FramedRequest<'_>, server_keep_alive: bool) -> PyResult<Self> {
        let version = request.http_version.to_str()?;
        Ok(ResponseFramer {
            keep_alive: server_keep_alive && request.keep_alive,
            chunked: false,
            content_length: None,
            body_bytes: 0,
            no_body: request.method.to_str()? == "HEAD",
            status: 0,
            http11: version == "1.1",
            http10: version == "1.0",
            state: 0,
        })
    }

    /// The request is HTTP/1.0: no interim (1xx) response may go to it (RFC 9110 15.2).
    #[getter]
    fn http10(&self) -> bool {
        self.http10
    }

    /// Status line and headers; decides the framing of the body.
    #[pyo3(signature = (status, headers, reason = None))]
    fn head<'py>(
        &mut self,
        py: Python<'py>,
        status: &Bound<'py, PyAny>,
        headers: &Bound<'py, PyAny>,
        reason: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if self.state != 0 {
            return Err(PyValueError::new_err("response head already sent"));
        }
        let mut out: Vec<u8> = Vec::with_capacity(256);
        let status = status_line(py, status, reason, &mut out)?;
        self.status = status;
        if status < 200 || status == 204 || status == 304 {
            self.no_body = true;
        }
        let drop_length = status < 200 || status == 204;
        let mut pairs: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = Vec::new();
        for item in headers.try_iter()? {
            pairs.push(pair(&item?)?);
        }
        let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(pairs.len());
        for (name, value) in &pairs {
            let name = name.cast::<PyBytes>().map_err(|_| PyTypeError::new_err("header names must be bytes"))?;
            let value = value.cast::<PyBytes>().map_err(|_| PyTypeError::new_err("header values must be bytes"))?;
            fields.push((name.as_bytes(), value.as_bytes()));
        }
        let facts = copy_fields(&fields, drop_length, &mut out).map_err(|refused| {
            PyValueError::new_err(match refused {
                Refused::Name(name) => format!("invalid header name {}", repr_bytes(py, name)),
                Refused::Value(name, value) => {
                    format!("invalid value for header {}: {}", repr_bytes(py, name), repr_bytes(py, value))
                }
                Refused::Length(value) => format!("invalid Content-Length {}", repr_bytes(py, value)),
                Refused::ConflictingLengths => "conflicting Content-Length headers".to_string(),
            })
        })?;
        let (length, has_date, has_server) = (facts.content_length, facts.has_date, facts.has_server);
        if facts.close {
            self.keep_alive = false;
        }
        if self.no_body {
            if !drop_length {
                self.content_length = length;
            }
        } else if length.is_some() {
            self.content_length = length;
        } else if self.http11 {
            self.chunked = true;
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        } else {
            self.keep_alive = false; // HTTP/1.0 without a length: the close delimits the body
        }
        if !has_date {
            cached_date(&mut out);
        }
        if !has_server {
            out.extend_from_slice(b"Server: refork\r\n");
        }
        if !self.keep_alive {
            out.extend_from_slice(b"Connection: close\r\n");
        } else if self.http10 {
            out.extend_from_slice(b"Connection: keep-alive\r\n");
        }
        out.extend_from_slice(b"\r\n");
        self.state = 1;
        Ok(PyBytes::new(py, &out))
    }

    /// Bytes to write for one piece of body (b"" when there is nothing to send).
    fn body<'py>(&mut self, py: Python<'py>, data: &Bound<'py, PyBytes>) -> PyResult<Bound<'py, PyBytes>> {
        if self.state != 1 {
            return Err(PyValueError::new_err("body() before head() or after end()"));
        }
        let bytes = data.as_bytes();
        let size = bytes.len() as u64;
        self.body_bytes += size;
        if self.no_body || size == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        if self.chunked {
            return Ok(PyBytes::new(py, &chunk(bytes, false)));
        }
        if let Some(length) = self.content_length {
            if self.body_bytes > length {
                self.keep_alive = false;
                return Err(PyValueError::new_err(format!("response body longer than Content-Length {length}")));
            }
        }
        Ok(data.clone())
    }

    /// body(data) then end() in one call: the response's last (often its only) piece of body.
    fn last<'py>(&mut self, py: Python<'py>, data: &Bound<'py, PyBytes>) -> PyResult<Bound<'py, PyBytes>> {
        if self.state != 1 {
            return Err(PyValueError::new_err("body() before head() or after end()"));
        }
        let bytes = data.as_bytes();
        self.body_bytes += bytes.len() as u64;
        if self.no_body {
            self.state = 2;
            return Ok(PyBytes::new(py, b""));
        }
        if self.chunked {
            self.state = 2;
            return Ok(PyBytes::new(py, &chunk(bytes, true)));
        }
        if let Some(length) = self.content_length {
            if self.body_bytes != length {
                self.keep_alive = false; // longer: refused below; shorter: the peer waits on, for nothing
                if self.body_bytes > length {
                    return Err(PyValueError::new_err(format!("response body longer than Content-Length {length}")));
                }
            }
        }
        self.state = 2;
        Ok(data.clone())
    }

    /// Bytes that finish the response; afterwards keep_alive is final.
    fn end<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if self.state != 1 {
            return Err(PyValueError::new_err("end() before head() or called twice"));
        }
        self.state = 2;
        if self.chunked {
            return Ok(PyBytes::new(py, b"0\r\n\r\n"));
        }
        if let Some(length) = self.content_length {
            if !self.no_body && self.body_bytes < length {
                self.keep_alive = false; // the peer is still waiting for bytes that never come
            }
        }
        Ok(PyBytes::new(py, b""))
    }
}

/// One chunk of a chunked body ("size CRLF data CRLF"), and the last chunk after it if `last`;
/// an empty last piece is the last chunk alone.
fn chunk(data: &[u8], last: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 24);
    if !data.is_empty() {
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    if last {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::chunk;

    #[test]
    fn chunks_frame_as_the_python_framer_does() {
        assert_eq!(chunk(b"hello", false), b"5\r\nhello\r\n");
        assert_eq!(chunk(b"hello", true), b"5\r\nhello\r\n0\r\n\r\n");
        assert_eq!(chunk(b"", true), b"0\r\n\r\n");
        assert_eq!(chunk(&[b'x'; 26], false)[..4], *b"1a\r\n");
    }
}
