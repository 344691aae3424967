//! The ASGI `http` scope of a request of the common shape, built in one call: what
//! refork.asgi.scope.build_scope builds for it, key for key (tests/asgi/test_native_scope.py).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

use crate::http::request::RequestLine;

/// http_scope(request, *, server, client, scheme, root_path, state, proxies) -> dict | None: all but
/// the request by name, so none can be given in another's place.
///
/// None where refork.asgi.scope.build_scope must build it: a path with `%` or a byte past ASCII
/// (decoded there), or X-Forwarded-* fields from a trusted peer (`proxies` not None).
#[pyfunction]
#[pyo3(signature = (request, *, server, client, scheme, root_path, state, proxies))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn http_scope<'py>(
    py: Python<'py>,
    request: RequestLine<'py>,
    server: &Bound<'py, PyAny>,
    client: &Bound<'py, PyAny>,
    scheme: &Bound<'py, PyString>,
    root_path: &Bound<'py, PyString>,
    state: Option<&Bound<'py, PyDict>>,
    proxies: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let headers = request.headers;
    if !proxies.is_none() {
        for item in headers.iter() {
            let name = item.cast::<PyTuple>()?.get_item(0)?;
            if name.cast::<PyBytes>()?.as_bytes().starts_with(b"x-forwarded-") {
                return Ok(None);
            }
        }
    }
    let raw = request.path;
    let raw_bytes = raw.as_bytes();
    if !raw_bytes.iter().all(|&b| b.is_ascii() && b != b'%') {
        return Ok(None);
    }
    // ASCII: the str is the bytes
    let path = std::str::from_utf8(raw_bytes).expect("ascii");
    let root = root_path.to_str()?;
    let (path, raw_path) = if !root.is_empty() && !path.starts_with(root) {
        let mut raw_path = root.as_bytes().to_vec();
        raw_path.extend_from_slice(raw_bytes);
        (PyString::new(py, &format!("{root}{path}")), PyBytes::new(py, &raw_path).into_any())
    } else {
        (PyString::new(py, path), raw.into_any())
    };
    let version = request.http_version;
    let asgi = PyDict::new(py);
    asgi.set_item(pyo3::intern!(py, "version"), pyo3::intern!(py, "3.0"))?;
    asgi.set_item(pyo3::intern!(py, "spec_version"), pyo3::intern!(py, "2.4"))?;
    let extensions = PyDict::new(py);
    extensions.set_item(pyo3::intern!(py, "http.response.pathsend"), PyDict::new(py))?;
    extensions.set_item(pyo3::intern!(py, "http.response.zerocopysend"), PyDict::new(py))?;
    extensions.set_item(pyo3::intern!(py, "http.response.trailers"), PyDict::new(py))?;
    if version.to_str()? != "1.0" {
        // no 1xx may go to an HTTP/1.0 client (RFC 9110 15.2)
        extensions.set_item(pyo3::intern!(py, "http.response.early_hint"), PyDict::new(py))?;
    }
    let scope = PyDict::new(py);
    scope.set_item(pyo3::intern!(py, "type"), pyo3::intern!(py, "http"))?;
    scope.set_item(pyo3::intern!(py, "asgi"), asgi)?;
    scope.set_item(pyo3::intern!(py, "http_version"), version)?;
    scope.set_item(pyo3::intern!(py, "server"), server)?;
    scope.set_item(pyo3::intern!(py, "client"), client)?;
    scope.set_item(pyo3::intern!(py, "scheme"), scheme)?;
    scope.set_item(pyo3::intern!(py, "method"), request.method)?;
    scope.set_item(pyo3::intern!(py, "root_path"), root_path)?;
    scope.set_item(pyo3::intern!(py, "path"), path)?;
    scope.set_item(pyo3::intern!(py, "raw_path"), raw_path)?;
    scope.set_item(pyo3::intern!(py, "query_string"), request.query)?;
    scope.set_item(pyo3::intern!(py, "headers"), headers)?;
    scope.set_item(pyo3::intern!(py, "extensions"), extensions)?;
    if let Some(state) = state {
        scope.set_item(pyo3::intern!(py, "state"), state.copy()?)?;
    }
    Ok(Some(scope))
}
