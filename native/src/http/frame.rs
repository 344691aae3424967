//! Response framing: a WSGI list body of bytes and its head in one buffer, as the Python
//! response path frames it.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::date::cached_date;
use super::fields::{copy_fields, Facts};

pub(crate) const JOIN_LIMIT: usize = 1 << 16;

/// The whole response to a WSGI app's list/tuple body of bytes, framed as refork.wsgi.response
/// (_send_result, _Exchange.head) and refork.http.response.ResponseFramer do for it, or None
/// for any case it does not take (the Python path then frames it; nothing was sent):
/// frame_list(exchange, framer, result) -> (bytes, body_bytes, keep_alive) | None: `exchange`
/// a refork.wsgi.response._Exchange start_response was called on, `framer` its ResponseFramer.
#[pyfunction]
pub(crate) fn frame_list<'py>(
    py: Python<'py>,
    exchange: ExchangeStatus<'py>,
    framer: FramerState,
    result: &Bound<'py, PyAny>,
) -> PyResult<Option<(Bound<'py, PyBytes>, usize, bool)>> {
    let status = Status { code: exchange.code, reason: exchange.reason.as_bytes(), headers: &exchange.headers, has_length: exchange.has_length };
    let framing = Framing { no_body: framer.no_body, http11: !framer.http10, keep_alive: framer.keep_alive };
    Ok(frame_response(&status, result, framing)?.map(|(out, total, keep)| (PyBytes::new(py, &out), total, keep)))
}

/// What a refork.wsgi.response._Exchange holds once start_response was called.
#[derive(FromPyObject)]
pub(crate) struct ExchangeStatus<'py> {
    code: u32,
    reason: Bound<'py, PyBytes>,
    headers: Bound<'py, PyList>,
    has_length: bool,
}

/// What a refork.http.response.ResponseFramer decided of a response from its request.
#[derive(FromPyObject)]
pub(crate) struct FramerState {
    no_body: bool,
    http10: bool,
    keep_alive: bool,
}

/// What start_response set: the status, the app's headers (checked), one of them Content-Length.
pub(crate) struct Status<'a, 'py> {
    pub code: u32,
    pub reason: &'a [u8],
    pub headers: &'a Bound<'py, PyList>,
    pub has_length: bool,
}

/// How a response goes out: without a body (HEAD), to HTTP/1.1, keeping its connection.
#[derive(Clone, Copy)]
pub(crate) struct Framing {
    pub no_body: bool,
    pub http11: bool,
    pub keep_alive: bool,
}

/// frame_list's work: the response bytes, the body length and whether to keep the connection.
pub(crate) fn frame_response<'py>(
    status: &Status<'_, 'py>,
    result: &Bound<'py, PyAny>,
    framing: Framing,
) -> PyResult<Option<(Vec<u8>, usize, bool)>> {
    let Status { code, reason, headers, has_length } = *status;
    let Framing { no_body, http11, keep_alive } = framing;
    if !(200..=999).contains(&code) || code == 204 || code == 304 {
        return Ok(None);
    }
    let items: &Bound<'py, PyAny> = if result.is_exact_instance_of::<PyList>() || result.is_exact_instance_of::<PyTuple>() {
        result
    } else {
        return Ok(None);
    };
    // (a list's items are read twice: nothing in between calls Python or allocates a Python object)
    let each = |f: &mut dyn FnMut(&[u8])| -> bool {
        let mut all_bytes = true;
        let mut visit = |item: Bound<'py, PyAny>| match item.cast_exact::<PyBytes>() {
            Ok(b) => f(b.as_bytes()),
            Err(_) => all_bytes = false,
        };
        if let Ok(list) = items.cast_exact::<PyList>() {
            list.iter().for_each(&mut visit);
        } else if let Ok(tuple) = items.cast_exact::<PyTuple>() {
            tuple.iter().for_each(&mut visit);
        }
        all_bytes
    };
    let mut total = 0usize;
    if !each(&mut |b| total += b.len()) {
        return Ok(None);
    }
    if total > JOIN_LIMIT {
        return Ok(None);
    }
    let mut keep = keep_alive;
    let mut out: Vec<u8> = Vec::with_capacity(256 + if no_body { 0 } else { total });
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(&[b'0' + (code / 100) as u8, b'0' + (code / 10 % 10) as u8, b'0' + (code % 10) as u8, b' ']);
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
    let mut all: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = Vec::with_capacity(headers.len());
    for item in headers.iter() {
        let pair = item.cast_exact::<PyTuple>()?;
        all.push((pair.get_item(0)?, pair.get_item(1)?));
    }
    let added = if has_length { String::new() } else { total.to_string() };
    let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(all.len() + 1);
    for (name, value) in &all {
        fields.push((name.cast::<PyBytes>()?.as_bytes(), value.cast::<PyBytes>()?.as_bytes()));
    }
    if !has_length {
        fields.push((b"Content-Length", added.as_bytes()));
    }
    // a field the rules refuse: declined, and the Python path raises the exact error
    let Ok(Facts { content_length, close, has_date, has_server }) = copy_fields(&fields, false, &mut out) else {
        return Ok(None);
    };
    keep &= !close;
    let length = content_length.expect("a Content-Length: the app's or the body's");
    if !no_body && total as u64 > length {
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
    if !no_body && (total as u64) < length {
        keep = false; // (after the head, as ResponseFramer.end): the peer waits for bytes that never come
    }
    if !no_body {
        each(&mut |b| out.extend_from_slice(b));
    }
    Ok(Some((out, total, keep)))
}


#[cfg(test)]
mod tests {
    use super::*;

    type Fields<'a> = &'a [(&'a str, &'a str)];

    /// frame_response of a list body; the Date line it adds shown as "Date: *".
    fn frame(code: u32, fields: Fields, has_length: bool, body: &[&[u8]], no_body: bool, http11: bool, keep: bool) -> Option<(String, usize, bool)> {
        Python::initialize();
        Python::attach(|py| {
            let headers = PyList::empty(py);
            for (n, v) in fields {
                headers.append((PyBytes::new(py, n.as_bytes()), PyBytes::new(py, v.as_bytes()))).unwrap();
            }
            let items = PyList::new(py, body.iter().map(|b| PyBytes::new(py, b))).unwrap();
            let status = Status { code, reason: b"OK", headers: &headers, has_length };
            let framing = Framing { no_body, http11, keep_alive: keep };
            let framed = frame_response(&status, items.as_any(), framing).unwrap();
            framed.map(|(bytes, total, keep)| (masked(&bytes), total, keep))
        })
    }

    fn masked(bytes: &[u8]) -> String {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let Some(at) = text.find("\r\nDate: ") else { return text };
        let end = at + 2 + text[at + 2..].find("\r\n").unwrap();
        format!("{}\r\nDate: *{}", &text[..at], &text[end..])
    }

    const CRLF2: &str = "\r\n\r\n";

    #[test]
    fn a_list_body_after_its_head_in_one_buffer() {
        let (bytes, total, keep) = frame(200, &[("Content-Type", "text/plain")], false, &[b"Hello, ", b"world!"], false, true, true).unwrap();
        assert_eq!(bytes, format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\nDate: *\r\nServer: refork{CRLF2}Hello, world!"));
        assert_eq!((total, keep), (13, true));
    }

    #[test]
    fn the_apps_content_length_date_and_server_are_kept() {
        let fields = [("Content-Length", "2"), ("Date", "Tue, 14 Nov 2023 22:13:20 GMT"), ("Server", "app")];
        let (bytes, total, keep) = frame(200, &fields, true, &[b"ok"], false, true, true).unwrap();
        assert_eq!(bytes, format!("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: *\r\nServer: app{CRLF2}ok"));
        assert_eq!((total, keep), (2, true));
    }

    #[test]
    fn a_head_response_has_no_body() {
        let (bytes, total, keep) = frame(200, &[("Content-Length", "100")], true, &[], true, true, true).unwrap();
        assert_eq!(bytes, format!("HTTP/1.1 200 OK\r\nContent-Length: 100\r\nDate: *\r\nServer: refork{CRLF2}"));
        assert_eq!((total, keep), (0, true));
        let (bytes, _, _) = frame(200, &[], false, &[b"body"], true, true, true).unwrap();
        assert!(bytes.ends_with(&format!("Content-Length: 4\r\nDate: *\r\nServer: refork{CRLF2}")), "{bytes:?}");
    }

    #[test]
    fn the_connection_line() {
        let head = |fields: Fields, http11, keep| {
            let (bytes, _, keep) = frame(200, fields, false, &[], false, http11, keep).unwrap();
            (bytes.split("Server: refork\r\n").nth(1).unwrap().to_string(), keep)
        };
        assert_eq!(head(&[], true, true), ("\r\n".into(), true));
        assert_eq!(head(&[], true, false), ("Connection: close\r\n\r\n".into(), false));
        assert_eq!(head(&[], false, true), ("Connection: keep-alive\r\n\r\n".into(), true));
        assert_eq!(head(&[], false, false), ("Connection: close\r\n\r\n".into(), false));
        // the app's own Connection, Keep-Alive and Transfer-Encoding are the server's to say
        assert_eq!(head(&[("Connection", "Keep-Alive, Close")], true, true), ("Connection: close\r\n\r\n".into(), false));
        let (bytes, _, keep) = frame(200, &[("Connection", "keep-alive"), ("Keep-Alive", "timeout=5"), ("Transfer-Encoding", "chunked")], false, &[b"x"], false, true, true).unwrap();
        assert_eq!(bytes, format!("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nDate: *\r\nServer: refork{CRLF2}x"));
        assert!(keep);
    }

    #[test]
    fn a_body_shorter_than_its_content_length_closes_the_connection() {
        let (bytes, total, keep) = frame(200, &[("Content-Length", "10")], true, &[b"short"], false, true, true).unwrap();
        assert!(bytes.starts_with("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n") && bytes.ends_with("\r\n\r\nshort"), "{bytes:?}");
        assert!(!bytes.contains("Connection:")); // (decided after the head, as ResponseFramer does)
        assert_eq!((total, keep), (5, false));
    }

    #[test]
    fn what_the_python_path_frames_instead() {
        let declined = |code: u32, fields: Fields, has_length: bool, body: &[&[u8]]| frame(code, fields, has_length, body, false, true, true).is_none();
        for code in [100, 101, 199, 204, 304, 1000] {
            assert!(declined(code, &[], false, &[]), "{code}");
        }
        assert!(!declined(201, &[], false, &[]));
        let big = vec![b'x'; JOIN_LIMIT + 1];
        assert!(declined(200, &[], false, &[&big]));
        assert!(!declined(200, &[], false, &[&big[1..]]));
        assert!(declined(200, &[("X-Bad", "a\r\nInjected: 1")], false, &[]));
        assert!(declined(200, &[("X-Bad", "a\x00")], false, &[]));
        assert!(!declined(200, &[("X-Tab", "a\tb")], false, &[]));
        assert!(declined(200, &[("Bad Name", "a")], false, &[]));
        assert!(declined(200, &[("", "a")], false, &[]));
        assert!(declined(200, &[("Content-Length", "x")], true, &[]));
        assert!(declined(200, &[("Content-Length", "1"), ("Content-Length", "2")], true, &[b"x"]));
        assert!(!declined(200, &[("Content-Length", "1"), ("content-length", "1")], true, &[b"x"]));
        assert!(declined(200, &[("Content-Length", "1")], true, &[b"too long"]));
    }

    #[test]
    fn only_a_list_or_tuple_of_bytes() {
        Python::initialize();
        Python::attach(|py| {
            let headers = PyList::empty(py);
            let frame = |result: &Bound<'_, PyAny>| frame_response(&Status { code: 200, reason: b"OK", headers: &headers, has_length: false }, result, Framing { no_body: false, http11: true, keep_alive: true }).unwrap().map(|(_, total, _)| total);
            let tuple = PyTuple::new(py, [PyBytes::new(py, b"ab"), PyBytes::new(py, b"c")]).unwrap();
            assert_eq!(frame(tuple.as_any()), Some(3));
            let with_str = PyList::new(py, [PyBytes::new(py, b"ab").into_any(), pyo3::types::PyString::new(py, "c").into_any()]).unwrap();
            assert_eq!(frame(with_str.as_any()), None);
            let bytearray = PyList::new(py, [pyo3::types::PyByteArray::new(py, b"ab")]).unwrap();
            assert_eq!(frame(bytearray.as_any()), None);
            assert_eq!(frame(PyBytes::new(py, b"bytes itself").as_any()), None);
        });
    }

    /// tests/vectors/framing.txt, which refork.http.response.ResponseFramer is held to as well.
    #[test]
    fn the_shared_vectors() {
        for row in crate::vectors::rows(include_str!("../../../tests/vectors/framing.txt")) {
            let request: Vec<&str> = row[0].split(' ').collect();
            let fields: Vec<(&str, &str)> = if row[2] == "-" {
                vec![]
            } else {
                row[2].split("; ").map(|f| f.split_once(": ").unwrap()).collect()
            };
            let has_length = fields.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
            let body: Vec<&[u8]> = if row[3] == "-" { vec![] } else { row[3].split('+').map(str::as_bytes).collect() };
            let reason = match row[1].as_str() {
                "200" => "OK",
                "201" => "Created",
                other => panic!("status {other}"),
            };
            Python::initialize();
            let framed = Python::attach(|py| {
                let headers = PyList::empty(py);
                for (n, v) in &fields {
                    headers.append((PyBytes::new(py, n.as_bytes()), PyBytes::new(py, v.as_bytes()))).unwrap();
                }
                let items = PyList::new(py, body.iter().map(|b| PyBytes::new(py, b))).unwrap();
                let (no_body, http11, keep) = (request[0] == "HEAD", request[1] == "1.1", request[2] == "keep");
                let code = row[1].parse().unwrap();
                let status = Status { code, reason: reason.as_bytes(), headers: &headers, has_length };
                frame_response(&status, items.as_any(), Framing { no_body, http11, keep_alive: keep }).unwrap()
            });
            match framed {
                None => assert_eq!(row[4], "error", "{row:?}"),
                Some((bytes, _, keep)) => {
                    assert_eq!(masked(&bytes), row[4], "{row:?}");
                    assert_eq!(if keep { "kept" } else { "closed" }, row[5], "{row:?}");
                }
            }
        }
    }
}
