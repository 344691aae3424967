//! refork.http.events.Request (a Python dataclass, made by either parser) as the native code reads
//! it: each reader's fields in one typed extraction, so a renamed or mistyped field fails naming it
//! ("failed to extract field RequestLine.path").

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

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
