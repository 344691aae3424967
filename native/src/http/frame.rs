//! Response framing: a WSGI list body of bytes and its head in one buffer, as the Python
//! response path frames it.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::date::cached_date;

pub(crate) const JOIN_LIMIT: usize = 1 << 16;

/// The whole response to a WSGI app's list/tuple body of bytes, framed as refork.wsgi.response
/// (_send_result, _Exchange.head) and refork.http.response.ResponseFramer do for it, or None
/// for any case it does not take (the Python path then frames it; nothing was sent):
/// frame_list(code, reason, headers, has_length, result, no_body, http11, keep_alive)
///   -> (bytes, body_bytes, keep_alive) | None
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub(crate) fn frame_list<'py>(
    py: Python<'py>,
    code: u32,
    reason: &[u8],
    headers: &Bound<'py, PyList>,
    has_length: bool,
    result: &Bound<'py, PyAny>,
    no_body: bool,
    http11: bool,
    keep_alive: bool,
) -> PyResult<Option<(Bound<'py, PyBytes>, usize, bool)>> {
    Ok(frame_response(py, code, reason, headers, has_length, result, no_body, http11, keep_alive)?
        .map(|(out, total, keep)| (PyBytes::new(py, &out), total, keep)))
}

/// frame_list's work: the response bytes, the body length and whether to keep the connection.
#[allow(clippy::too_many_arguments)]
pub(crate) fn frame_response<'py>(
    py: Python<'py>,
    code: u32,
    reason: &[u8],
    headers: &Bound<'py, PyList>,
    has_length: bool,
    result: &Bound<'py, PyAny>,
    no_body: bool,
    http11: bool,
    keep_alive: bool,
) -> PyResult<Option<(Vec<u8>, usize, bool)>> {
    if !(200..=999).contains(&code) || code == 204 || code == 304 {
        return Ok(None);
    }
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = result.cast_exact::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = result.cast_exact::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Ok(None);
    };
    let mut total = 0usize;
    let mut bodies: Vec<&[u8]> = Vec::with_capacity(items.len());
    for item in &items {
        let Ok(b) = item.cast_exact::<PyBytes>() else { return Ok(None) };
        total += b.as_bytes().len();
        bodies.push(b.as_bytes());
    }
    if total > JOIN_LIMIT {
        return Ok(None);
    }
    let mut keep = keep_alive;
    let mut out: Vec<u8> = Vec::with_capacity(256 + if no_body { 0 } else { total });
    out.extend_from_slice(format!("HTTP/1.1 {code} ").as_bytes());
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
    let mut content_length: Option<usize> = None;
    let (mut has_date, mut has_server) = (false, false);
    let added;
    let mut all: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = Vec::with_capacity(headers.len() + 1);
    for item in headers.iter() {
        let pair = item.cast_exact::<PyTuple>()?;
        all.push((pair.get_item(0)?, pair.get_item(1)?));
    }
    if !has_length {
        added = (PyBytes::new(py, b"Content-Length").into_any(), PyBytes::new(py, total.to_string().as_bytes()).into_any());
        all.push(added);
    }
    for (name, value) in &all {
        let name = name.cast::<PyBytes>()?.as_bytes();
        let value = value.cast::<PyBytes>()?.as_bytes();
        if value.iter().any(|&b| (b < 32 && b != b'\t') || b == 127) {
            return Ok(None);
        }
        let lower = name.to_ascii_lowercase();
        match lower.as_slice() {
            b"content-length" => {
                if value.is_empty() || !value.iter().all(|b| b.is_ascii_digit()) || value.len() > 18 {
                    return Ok(None); // the Python path raises the exact error
                }
                let n: usize = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX);
                if content_length.is_some_and(|c| c != n) {
                    return Ok(None);
                }
                content_length = Some(n);
            }
            b"transfer-encoding" | b"keep-alive" => continue,
            b"connection" => {
                let squeezed: Vec<u8> = value.to_ascii_lowercase().into_iter().filter(|&b| b != b' ').collect();
                if squeezed.split(|&b| b == b',').any(|t| t == b"close") {
                    keep = false;
                }
                continue;
            }
            b"date" => has_date = true,
            b"server" => has_server = true,
            _ => {
                if name.is_empty() || !name.iter().all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
                    return Ok(None);
                }
            }
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    let length = content_length.expect("a Content-Length: the app's or the body's");
    if !no_body && total > length {
        return Ok(None); // longer than its Content-Length: the Python path's error
    }
    if !has_date {
        cached_date(&mut out);
    }
    if !has_server {
        out.extend_from_slice(b"Server: refork\r\n");
    }
    if !keep {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if !http11 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !no_body && total < length {
        keep = false; // (after the head, as ResponseFramer.end): the peer waits for bytes that never come
    }
    if !no_body {
        for b in bodies {
            out.extend_from_slice(b);
        }
    }
    Ok(Some((out, total, keep)))
}

