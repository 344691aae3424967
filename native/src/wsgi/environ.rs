//! The WSGI environ built natively (refork.wsgi.EnvironBuilder.build's rules).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use std::collections::HashMap;
use std::sync::Mutex;

use crate::http::host::split_host;
use crate::http::request::EnvironRequest;

/// latin-1 bytes as a str (what `bytes.decode("latin-1")` gives).
pub(crate) fn latin1<'py>(py: Python<'py>, b: &[u8]) -> Bound<'py, PyString> {
    if b.is_ascii() {
        PyString::new(py, std::str::from_utf8(b).expect("ascii"))
    } else {
        PyString::new(py, &b.iter().map(|&c| c as char).collect::<String>())
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// urllib.parse.unquote_to_bytes: %XX decoded, any other % kept.
fn unquote(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    out
}

/// The environ of one request, as refork.wsgi.EnvironBuilder.build makes it, for requests
/// without X-Forwarded-* fields (None: the Python builder decides, proxies and all).
///
/// Shared by the app threads of a listener (--threads): frozen, its two caches behind mutexes
/// that are never held across a call into Python (which may switch threads).
#[pyclass(module = "refork._native", frozen)]
pub struct Environ {
    /// the base dict with every key `make` always sets (None until it does), sized so that a
    /// request's headers fit: its copy is the environ, each key a replacement, no resize
    template: Py<PyDict>,
    root: Vec<u8>,
    scheme: Vec<u8>,
    server_name: Py<PyString>,
    server_port: Py<PyString>,
    names: Mutex<HashMap<Vec<u8>, Option<Py<PyString>>, Fnv>>,
    hosts: Mutex<HashMap<Vec<u8>, HostStrs, Fnv>>,
    /// refork.wsgi.EnvironBuilder.apply_forwarded(environ, headers, client) of its builder: the
    /// trusted-proxy rules, for a request with X-Forwarded-* fields
    forwarded: Py<PyAny>,
}

/// One Host header value's HTTP_HOST, SERVER_NAME and SERVER_PORT.
type HostStrs = (Py<PyString>, Py<PyString>, Py<PyString>);

/// The keys `make` sets on every request (REMOTE_ADDR is the base's already).
const ALWAYS: [&str; 10] =
    ["REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "RAW_URI", "REQUEST_URI", "SERVER_PROTOCOL", "wsgi.input", "REMOTE_PORT", "SERVER_NAME", "SERVER_PORT"];


/// FNV-1a: the caches' keys are a few short header names and Host values (SipHash's
/// flood-resistance is not needed: each cache stops growing at its limit).
#[derive(Default, Clone, Copy)]
pub(crate) struct Fnv;

pub(crate) struct FnvHasher(u64);

impl std::hash::BuildHasher for Fnv {
    type Hasher = FnvHasher;
    fn build_hasher(&self) -> FnvHasher {
        FnvHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for FnvHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The environ template of `base` (see Environ.template).
fn template<'py>(base: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
    let py = base.py();
    let t = base.copy()?;
    for key in ALWAYS {
        t.set_item(PyString::intern(py, key), py.None())?;
    }
    // CPython's dict of n keys has room for 5, 10, 21, 42... (2/3 of 8, 16, 32, 64): one key past
    // a full table doubles it, and a copy keeps the size if at most a third of its entries were
    // deleted, so the request's own keys (HTTP_*, CONTENT_LENGTH, wsgi.early_hints) fit in it
    let mut size = 8;
    while size * 2 / 3 < t.len() {
        size *= 2;
    }
    let room = size * 2 / 3 + 1;
    let room = if room - t.len() <= t.len() / 2 { room } else { t.len() };
    let spare: Vec<String> = (t.len()..room).map(|i| format!(" spare {i}")).collect();
    for key in &spare {
        t.set_item(key, py.None())?;
    }
    for key in &spare {
        t.del_item(key)?;
    }
    Ok(t)
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymethods]
impl Environ {
    /// Environ(*, base, root_path, url_scheme, server_name, server_port, apply_forwarded): by name,
    /// so no two of its strings can be swapped; root_path latin-1 encodable.
    #[new]
    #[pyo3(signature = (*, base, root_path, url_scheme, server_name, server_port, apply_forwarded))]
    fn new(
        base: Bound<'_, PyDict>,
        root_path: &str,
        url_scheme: &str,
        server_name: Bound<'_, PyString>,
        server_port: Bound<'_, PyString>,
        apply_forwarded: Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let root: Vec<u8> = root_path
            .chars()
            .map(|c| u8::try_from(c as u32).map_err(|_| pyo3::exceptions::PyValueError::new_err("root_path")))
            .collect::<PyResult<_>>()?;
        Ok(Environ {
            template: template(&base)?.unbind(),
            root,
            scheme: url_scheme.as_bytes().to_vec(),
            server_name: server_name.unbind(),
            server_port: server_port.unbind(),
            names: Mutex::new(HashMap::with_hasher(Fnv)),
            hosts: Mutex::new(HashMap::with_hasher(Fnv)),
            forwarded: apply_forwarded.unbind(),
        })
    }

    /// build(request, body, client) -> the environ dict.
    fn build<'py>(
        &self,
        py: Python<'py>,
        request: EnvironRequest<'py>,
        body: &Bound<'py, PyAny>,
        client: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let headers = request.headers;
        let mut pairs: Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> = Vec::with_capacity(headers.len());
        let mut forwarded = false;
        for item in headers.iter() {
            let pair = item.cast::<PyTuple>()?;
            let name = pair.get_item(0)?.cast_into::<PyBytes>()?;
            forwarded |= name.as_bytes().starts_with(b"x-forwarded-");
            pairs.push((name, pair.get_item(1)?.cast_into::<PyBytes>()?));
        }
        let length = if request.content_length.is_some() || request.chunked {
            Some(body.getattr(pyo3::intern!(py, "length"))?.str()?)
        } else {
            None
        };
        let parts = Parts {
            method: request.method.as_any(),
            target: request.target.as_bytes(),
            path: request.path.as_bytes(),
            query: request.query.as_bytes(),
            version: request.http_version.to_str()?,
        };
        let pairs = pairs.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
        let port = if client.is_none() { None } else { Some(client.get_item(1)?.str()?) };
        let env = self.make(py, &parts, pairs, length, body, client, port)?;
        if forwarded {
            self.forwarded.bind(py).call1((&env, &headers, client))?;
        }
        Ok(env)
    }
}

/// The request line's parts, for Environ::make.
pub(crate) struct Parts<'a, 'py> {
    pub method: &'a Bound<'py, PyAny>,
    pub target: &'a [u8],
    pub path: &'a [u8],
    pub query: &'a [u8],
    /// "1.1", "1.0"
    pub version: &'a str,
}

impl Environ {
    /// The trusted-proxy rules on an environ `make` built from `headers` (see `forwarded`).
    pub(crate) fn apply_forwarded<'py>(
        &self,
        py: Python<'py>,
        env: &Bound<'py, PyDict>,
        headers: &[(Vec<u8>, &[u8])],
        client: &Bound<'py, PyAny>,
    ) -> PyResult<()> {
        let list = PyList::empty(py);
        for (name, value) in headers {
            list.append((PyBytes::new(py, name), PyBytes::new(py, value)))?;
        }
        self.forwarded.bind(py).call1((env, list, client))?;
        Ok(())
    }

    /// The environ of a request: `headers` (lower-cased name, trimmed value), X-Forwarded-* fields
    /// as plain HTTP_ keys (`apply_forwarded` then); `length` the CONTENT_LENGTH when the request
    /// has a body; `port` the client's port as a str (None: no client).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn make<'py, 'h>(
        &self,
        py: Python<'py>,
        parts: &Parts<'_, 'py>,
        headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
        length: Option<Bound<'py, PyString>>,
        body: &Bound<'py, PyAny>,
        client: &Bound<'py, PyAny>,
        port: Option<Bound<'py, PyString>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let env = self.template.bind(py).copy()?;
        let mut host: Option<(Py<PyString>, Py<PyString>)> = None;
        for (name, value) in headers {
            if name == b"host" {
                let (value_str, n, p) = self.host_strs(py, value);
                let first = host.is_none();
                host = Some((n, p)); // (the last Host names the server, as in the Python builder)
                if first {
                    env.set_item(pyo3::intern!(py, "HTTP_HOST"), value_str)?;
                    continue;
                }
            }
            let cached = locked(&self.names).get(name).map(|k| k.as_ref().map(|k| k.clone_ref(py)));
            let key = match cached {
                Some(k) => k,
                None => {
                    let k = if name.contains(&b'_') {
                        None
                    } else {
                        let cgi = match name {
                            b"content-type" => "CONTENT_TYPE".to_string(),
                            b"content-length" => "CONTENT_LENGTH".to_string(),
                            _ => {
                                let mut k = String::from("HTTP_");
                                for &b in name {
                                    k.push(if b == b'-' { '_' } else { (b as char).to_ascii_uppercase() });
                                }
                                k
                            }
                        };
                        Some(PyString::intern(py, &cgi).unbind())
                    };
                    let mut names = locked(&self.names);
                    if names.len() < 512 {
                        names.insert(name.to_vec(), k.as_ref().map(|k| k.clone_ref(py)));
                    }
                    k
                }
            };
            let Some(key) = key else { continue };
            let key = key.bind(py);
            match env.get_item(key)? {
                Some(old) => {
                    let sep = if key.to_str()? == "HTTP_COOKIE" { "; " } else { "," };
                    let joined = format!("{}{}{}", old.cast::<PyString>()?.to_str()?, sep, latin1(py, value).to_str()?);
                    env.set_item(key, joined)?;
                }
                None => env.set_item(key, latin1(py, value))?,
            }
        }
        env.set_item(pyo3::intern!(py, "REQUEST_METHOD"), parts.method)?;
        let raw = parts.path;
        let decoded;
        let mut path: &[u8] = if raw.contains(&b'%') {
            decoded = unquote(raw);
            &decoded
        } else {
            raw
        };
        let root = &self.root;
        if !root.is_empty() && path.starts_with(root) && (path.len() == root.len() || path[root.len()] == b'/') {
            path = &path[root.len()..];
        }
        env.set_item(pyo3::intern!(py, "PATH_INFO"), latin1(py, path))?;
        env.set_item(pyo3::intern!(py, "QUERY_STRING"), latin1(py, parts.query))?;
        let target = latin1(py, parts.target);
        env.set_item(pyo3::intern!(py, "RAW_URI"), &target)?;
        env.set_item(pyo3::intern!(py, "REQUEST_URI"), &target)?;
        match parts.version {
            "1.1" => env.set_item(pyo3::intern!(py, "SERVER_PROTOCOL"), pyo3::intern!(py, "HTTP/1.1"))?,
            "1.0" => env.set_item(pyo3::intern!(py, "SERVER_PROTOCOL"), pyo3::intern!(py, "HTTP/1.0"))?,
            v => env.set_item(pyo3::intern!(py, "SERVER_PROTOCOL"), format!("HTTP/{v}"))?,
        }
        if let Some(length) = length {
            env.set_item(pyo3::intern!(py, "CONTENT_LENGTH"), length)?;
        }
        env.set_item(pyo3::intern!(py, "wsgi.input"), body)?;
        match port {
            Some(port) => {
                env.set_item(pyo3::intern!(py, "REMOTE_ADDR"), client.get_item(0)?)?;
                env.set_item(pyo3::intern!(py, "REMOTE_PORT"), port)?;
            }
            None => env.del_item(pyo3::intern!(py, "REMOTE_PORT"))?,
        }
        let (name, port) = match host {
            None => {
                let port = self.server_port.bind(py);
                let port = if port.to_str()?.is_empty() {
                    let default = if self.scheme == b"https" || self.scheme == b"wss" { "443" } else { "80" };
                    PyString::new(py, default)
                } else {
                    port.clone()
                };
                (self.server_name.bind(py).clone(), port)
            }
            Some((n, p)) => (n.into_bound(py), p.into_bound(py)),
        };
        env.set_item(pyo3::intern!(py, "SERVER_NAME"), name)?;
        env.set_item(pyo3::intern!(py, "SERVER_PORT"), port)?;
        Ok(env)
    }

    /// A Host value's HTTP_HOST, SERVER_NAME and SERVER_PORT (cached for 256 values).
    fn host_strs(&self, py: Python<'_>, h: &[u8]) -> (Py<PyString>, Py<PyString>, Py<PyString>) {
        // (a statement of its own: the guard is dropped before the match)
        let hit = locked(&self.hosts).get(h).map(|(v, n, p)| (v.clone_ref(py), n.clone_ref(py), p.clone_ref(py)));
        if let Some(hit) = hit {
            return hit;
        }
        let default: &[u8] = if self.scheme == b"https" || self.scheme == b"wss" { b"443" } else { b"80" };
        let (n, p) = split_host(h, default);
        let strs = (latin1(py, h).unbind(), latin1(py, n).unbind(), latin1(py, p).unbind());
        let mut hosts = locked(&self.hosts);
        if hosts.len() < 256 {
            hosts.insert(h.to_vec(), (strs.0.clone_ref(py), strs.1.clone_ref(py), strs.2.clone_ref(py)));
        }
        strs
    }
}
