//! refork.http.events.Request (a Python dataclass, made by either parser) as the native code reads
//! it: each reader's fields in one typed extraction, so a renamed or mistyped field fails naming it
//! ("failed to extract field RequestLine.path"); and as it makes it (`request_class`).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use super::head::Head;
use super::parser::request_object;

/// What the ASGI scope reads (asgi/scope.rs).
#[derive(FromPyObject)]
pub(crate) struct RequestLine<'py> {
    pub method: Bound<'py, PyString>,
    pub path: Bound<'py, PyBytes>,
    pub query: Bound<'py, PyBytes>,
    pub http_version: Bound<'py, PyString>,
    /// [(name, value)], names lower-cased
    pub headers: Bound<'py, PyList>,
}

/// What the environ reads (wsgi/environ.rs: Environ.build).
#[derive(FromPyObject)]
pub(crate) struct EnvironRequest<'py> {
    pub method: Bound<'py, PyString>,
    pub target: Bound<'py, PyBytes>,
    pub path: Bound<'py, PyBytes>,
    pub query: Bound<'py, PyBytes>,
    pub http_version: Bound<'py, PyString>,
    pub headers: Bound<'py, PyList>,
    pub content_length: Option<u64>,
    pub chunked: bool,
}

/// What a response's framing reads (http/framer.rs).
#[derive(FromPyObject)]
pub(crate) struct FramedRequest<'py> {
    pub method: Bound<'py, PyString>,
    pub http_version: Bound<'py, PyString>,
    /// what the client asked for (version and Connection field)
    pub keep_alive: bool,
}

/// What the Python loop's Parser reads of a request the Python parser made (http/parser.rs).
#[derive(FromPyObject)]
pub(crate) struct KeepAlive {
    /// what the client asked for (version and Connection field)
    pub keep_alive: bool,
}

/// Every field of a refork.http.events.Request, as `request_object` (http/parser.rs) makes it.
#[derive(FromPyObject)]
struct RequestFields {
    method: String,
    target: Vec<u8>,
    path: Vec<u8>,
    query: Vec<u8>,
    http_version: String,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    keep_alive: bool,
    expect_continue: bool,
    chunked: bool,
    content_length: Option<u64>,
}

/// The Request class, checked once: `request_object` calls it with its fields in order, so one
/// moved, renamed or retyped on the Python side fails here, where the class is given (at import,
/// or when an engine is built), naming it; never at a request.
pub(crate) fn request_class(cls: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let head = Head {
        method: "POST",
        target: b"/p?q",
        http11: true,
        headers: vec![(b"host".to_vec(), b"h")],
        keep_alive: true,
        content_length: Some(7),
        forwarded: false,
        len: 0,
    };
    let made: RequestFields = request_object(cls.py(), cls, &head)?.extract()?;
    let fields = [
        ("method", made.method == "POST"),
        ("target", made.target == b"/p?q"),
        ("path", made.path == b"/p"),
        ("query", made.query == b"q"),
        ("http_version", made.http_version == "1.1"),
        ("headers", made.headers == [(b"host".to_vec(), b"h".to_vec())]),
        ("keep_alive", made.keep_alive),
        ("expect_continue", !made.expect_continue),
        ("chunked", !made.chunked),
        ("content_length", made.content_length == Some(7)),
    ];
    match fields.iter().find(|(_, same)| !same) {
        Some((name, _)) => Err(PyTypeError::new_err(format!("{} does not take Request.{name} where refork._native gives it", cls.repr()?))),
        None => Ok(cls.clone().unbind()),
    }
}
