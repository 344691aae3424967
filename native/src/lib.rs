//! refork's native request path (`refork._native`).
//!
//! `Parser` is a drop-in for `refork.http.parser.RequestParser` (same `feed()` / `in_message`
//! contract, same events): the common request shape is read with `httparse` in one pass and its
//! `Request` event is built here, in one call; anything else is handed, from the first byte of
//! that message, to the Python parser, which gives the verdict (status codes, limits, every strict
//! rule) exactly as the Python loop would. The fast subset is deliberately narrow (see
//! `Parser::fast_head`): a head complete in one read, a well-known method, HTTP/1.0 or 1.1, an
//! origin-form target of visible ASCII, CRLF line ends only, printable header values, one valid
//! Host, at most one digits-only Content-Length within the body limit, no Transfer-Encoding, no
//! Expect, no Upgrade, Connection only `close` / `keep-alive`, every field well within the
//! limit_request_* settings. Once the Python parser ends a message and stands between requests,
//! the connection comes back to the fast path.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use std::collections::HashMap;
use std::sync::Mutex;

const MAX_FAST_HEADERS: usize = 64;

fn fast_method<'py>(py: Python<'py>, m: &str) -> Option<&'py Bound<'py, PyString>> {
    Some(match m {
        "GET" => pyo3::intern!(py, "GET"),
        "HEAD" => pyo3::intern!(py, "HEAD"),
        "POST" => pyo3::intern!(py, "POST"),
        "PUT" => pyo3::intern!(py, "PUT"),
        "DELETE" => pyo3::intern!(py, "DELETE"),
        "PATCH" => pyo3::intern!(py, "PATCH"),
        "OPTIONS" => pyo3::intern!(py, "OPTIONS"),
        _ => return None,
    })
}

fn host_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(&b)
}

/// Every LF is preceded by CR and every CR followed by LF (llhttp strict refuses bare ones).
fn crlf_only(head: &[u8]) -> bool {
    let mut i = 0;
    let n = head.len();
    while i < n {
        match head[i] {
            b'\r' => {
                if i + 1 >= n || head[i + 1] != b'\n' {
                    return false;
                }
                i += 2;
            }
            b'\n' => return false,
            _ => i += 1,
        }
    }
    true
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// A head the fast path serves, or None: the Python parser decides.
struct Head<'a> {
    method: &'static str,
    target: &'a [u8],
    http11: bool,
    headers: Vec<(Vec<u8>, &'a [u8])>,
    keep_alive: bool,
    content_length: Option<u64>,
    len: usize,
}

#[pyclass(module = "refork._native")]
pub struct Parser {
    max_line: usize,
    max_count: usize,
    max_field: usize,
    max_body: u64,
    body_left: u64,
    keep_alive: bool,
    closed: bool,
    /// The Python RequestParser of a message the fast path does not take (None: fast path).
    slow: Option<PyObject>,
    slow_factory: PyObject,
    limits: PyObject,
    request_cls: PyObject,
    body_cls: PyObject,
    eom: PyObject,
    parse_error: PyObject,
}

impl Parser {
    fn fast_head<'a>(&self, data: &'a [u8]) -> Option<Head<'a>> {
        let mut storage = [httparse::EMPTY_HEADER; MAX_FAST_HEADERS];
        let mut req = httparse::Request::new(&mut storage);
        let len = match req.parse(data) {
            Ok(httparse::Status::Complete(n)) => n,
            _ => return None, // partial, refused, too many headers: the Python parser's call
        };
        let method: &'static str = match req.method? {
            "GET" => "GET",
            "HEAD" => "HEAD",
            "POST" => "POST",
            "PUT" => "PUT",
            "DELETE" => "DELETE",
            "PATCH" => "PATCH",
            "OPTIONS" => "OPTIONS",
            _ => return None,
        };
        let http11 = match req.version? {
            1 => true,
            0 => false,
            _ => return None,
        };
        let target = req.path?.as_bytes();
        if target.first() != Some(&b'/')
            || !target.iter().all(|&b| (0x21..0x7f).contains(&b) && b != b'#')
            || target.len() + 13 > self.max_line
            || target.len() + method.len() + 10 > self.max_line
        {
            return None;
        }
        // the request line exactly "METHOD SP target SP HTTP/1.x CRLF": no extra spaces
        let line = method.len() + 1 + target.len() + 1 + 8 + 2;
        if data.len() < line || &data[line - 2..line] != b"\r\n" || !crlf_only(&data[..len]) {
            return None;
        }
        if req.headers.len() > self.max_count {
            return None;
        }
        let mut headers = Vec::with_capacity(req.headers.len());
        let mut hosts = 0;
        let mut content_length: Option<u64> = None;
        let mut close = false;
        let mut keep = false;
        for h in req.headers.iter() {
            let raw = h.value;
            if h.name.len() + raw.len() + 4 > self.max_field
                || !raw.iter().all(|&b| (0x20..0x7f).contains(&b) || b == b'\t')
            {
                return None;
            }
            let value = trim_ows(raw);
            let name = h.name.as_bytes().to_ascii_lowercase();
            match name.as_slice() {
                b"host" => {
                    hosts += 1;
                    if !value.iter().all(|&b| host_char(b)) {
                        return None;
                    }
                }
                b"content-length" => {
                    if content_length.is_some()
                        || value.is_empty()
                        || value.len() > 18
                        || !value.iter().all(|b| b.is_ascii_digit())
                    {
                        return None;
                    }
                    let n: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
                    if n > self.max_body {
                        return None;
                    }
                    content_length = Some(n);
                }
                b"connection" => {
                    for token in value.split(|&b| b == b',') {
                        let t = trim_ows(token).to_ascii_lowercase();
                        match t.as_slice() {
                            b"close" => close = true,
                            b"keep-alive" => keep = true,
                            b"" => {}
                            _ => return None,
                        }
                    }
                }
                b"transfer-encoding" | b"expect" | b"upgrade" => return None,
                _ => {}
            }
            headers.push((name, value));
        }
        if hosts > 1 || (http11 && hosts != 1) {
            return None;
        }
        let keep_alive = if close { false } else if http11 { true } else { keep };
        Some(Head { method, target, http11, headers, keep_alive, content_length, len })
    }

    fn request<'py>(&self, py: Python<'py>, head: &Head) -> PyResult<Bound<'py, PyAny>> {
        let method = fast_method(py, head.method).expect("a fast method").clone();
        let target = head.target;
        let url = PyBytes::new(py, target);
        let (path, query) = match target.iter().position(|&b| b == b'?') {
            Some(i) => (PyBytes::new(py, &target[..i]), PyBytes::new(py, &target[i + 1..])),
            None => (url.clone(), PyBytes::new(py, b"")),
        };
        let version = if head.http11 { pyo3::intern!(py, "1.1") } else { pyo3::intern!(py, "1.0") };
        let headers = PyList::empty(py);
        for (name, value) in &head.headers {
            let pair = PyTuple::new(py, [PyBytes::new(py, name), PyBytes::new(py, value)])?;
            headers.append(pair)?;
        }
        let cl: PyObject = match head.content_length {
            Some(n) => n.into_pyobject(py)?.into_any().unbind(),
            None => py.None(),
        };
        let args = PyTuple::new(
            py,
            [
                method.into_any(),
                url.into_any(),
                path.into_any(),
                query.into_any(),
                version.clone().into_any(),
                headers.into_any(),
                pyo3::types::PyBool::new(py, head.keep_alive).to_owned().into_any(),
                pyo3::types::PyBool::new(py, false).to_owned().into_any(),
                pyo3::types::PyBool::new(py, false).to_owned().into_any(),
                cl.into_bound(py),
            ],
        )?;
        self.request_cls.bind(py).call1(args)
    }

    /// Hand `data` (from a message boundary) to a Python parser; its events join `events`.
    fn feed_slow(&mut self, py: Python<'_>, data: &[u8], events: &Bound<'_, PyList>) -> PyResult<()> {
        let slow = match &self.slow {
            Some(p) => p.clone_ref(py),
            None => {
                let p = self.slow_factory.bind(py).call1((self.limits.bind(py),))?.unbind();
                self.slow = Some(p.clone_ref(py));
                p
            }
        };
        let slow = slow.bind(py);
        let got = match slow.call_method1(pyo3::intern!(py, "feed"), (PyBytes::new(py, data),)) {
            Ok(got) => got,
            Err(err) => {
                // the requests completed before the bad bytes are answered first: ours, then its own
                if err.is_instance(py, self.parse_error.bind(py)) && events.len() > 0 {
                    let exc = err.value(py);
                    let before = exc.getattr(pyo3::intern!(py, "events"))?;
                    let all = PyList::empty(py);
                    for e in events.iter() {
                        all.append(e)?;
                    }
                    for e in before.try_iter()? {
                        all.append(e?)?;
                    }
                    exc.setattr(pyo3::intern!(py, "events"), all)?;
                }
                return Err(err);
            }
        };
        let mut keeps = true;
        for e in got.try_iter()? {
            let e = e?;
            if e.is_instance(self.request_cls.bind(py))? {
                keeps &= e.getattr(pyo3::intern!(py, "keep_alive"))?.is_truthy()?;
            }
            events.append(e)?;
        }
        if !keeps {
            self.closed = true; // it ignores what follows a closing request: keep it to say so
        } else if !slow.getattr(pyo3::intern!(py, "in_message"))?.is_truthy()? {
            self.slow = None; // between requests: back to the fast path
        }
        Ok(())
    }
}

#[pymethods]
impl Parser {
    /// Parser(limits, slow_factory, request_cls, body_cls, eom, parse_error): `limits` is a
    /// refork.http.head.Limits, `slow_factory(limits)` makes the Python RequestParser.
    #[new]
    fn new(
        py: Python<'_>,
        limits: PyObject,
        slow_factory: PyObject,
        request_cls: PyObject,
        body_cls: PyObject,
        eom: PyObject,
        parse_error: PyObject,
    ) -> PyResult<Self> {
        let get = |name: &str| -> PyResult<usize> {
            let v: usize = limits.bind(py).getattr(name)?.extract()?;
            Ok(if v == 0 { usize::MAX / 4 } else { v })
        };
        Ok(Parser {
            max_line: get("max_request_line")?,
            max_count: get("max_header_count")?.min(MAX_FAST_HEADERS),
            max_field: get("max_header_size")?,
            max_body: get("max_body")? as u64,
            body_left: 0,
            keep_alive: true,
            closed: false,
            slow: None,
            slow_factory,
            limits,
            request_cls,
            body_cls,
            eom,
            parse_error,
        })
    }

    /// True from the first byte of a request until its EndOfMessage.
    #[getter]
    fn in_message(&self, py: Python<'_>) -> PyResult<bool> {
        if self.body_left > 0 {
            return Ok(true);
        }
        match &self.slow {
            Some(p) => p.bind(py).getattr(pyo3::intern!(py, "in_message"))?.is_truthy(),
            None => Ok(false),
        }
    }

    /// Parse more bytes; return the events they complete, in order (ParseError as the Python parser).
    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let events = PyList::empty(py);
        if self.slow.is_some() {
            if self.closed {
                let p = self.slow.as_ref().expect("slow").clone_ref(py);
                return Ok(p.bind(py).call_method1("feed", (PyBytes::new(py, data),))?.downcast_into()?);
            }
            self.feed_slow(py, data, &events)?;
            return Ok(events);
        }
        if self.closed {
            return Ok(events);
        }
        let mut at = 0;
        while at < data.len() {
            if self.body_left > 0 {
                let take = (self.body_left as usize).min(data.len() - at);
                events.append(self.body_cls.bind(py).call1((PyBytes::new(py, &data[at..at + take]),))?)?;
                at += take;
                self.body_left -= take as u64;
                if self.body_left == 0 {
                    events.append(self.eom.bind(py))?;
                    if !self.keep_alive {
                        self.closed = true;
                        break;
                    }
                }
                continue;
            }
            let rest = &data[at..];
            match self.fast_head(rest) {
                Some(head) => {
                    events.append(self.request(py, &head)?)?;
                    at += head.len;
                    self.keep_alive = head.keep_alive;
                    match head.content_length {
                        Some(n) if n > 0 => self.body_left = n,
                        _ => {
                            events.append(self.eom.bind(py))?;
                            if !head.keep_alive {
                                self.closed = true;
                                break;
                            }
                        }
                    }
                }
                None => {
                    self.feed_slow(py, rest, &events)?;
                    break;
                }
            }
        }
        Ok(events)
    }
}


/// latin-1 bytes as a str (what `bytes.decode("latin-1")` gives).
fn latin1<'py>(py: Python<'py>, b: &[u8]) -> Bound<'py, PyString> {
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

/// refork.wsgi.environ._split_host: (name, port) of a Host value.
fn split_host<'a>(host: &'a [u8], default_port: &'a [u8]) -> (&'a [u8], &'a [u8]) {
    if host.first() == Some(&b'[') {
        if let Some(end) = host.iter().position(|&b| b == b']') {
            if end > 0 {
                let rest = &host[end + 1..];
                let port = if rest.first() == Some(&b':') && rest.len() > 1 { &rest[1..] } else { default_port };
                return (&host[1..end], port);
            }
        }
    }
    if let Some(colon) = host.iter().rposition(|&b| b == b':') {
        let port = &host[colon + 1..];
        if !port.is_empty() && port.iter().all(|b| b.is_ascii_digit()) {
            return (&host[..colon], port);
        }
    }
    (host, default_port)
}

/// The environ of one request, as refork.wsgi.EnvironBuilder.build makes it, for requests
/// without X-Forwarded-* fields (None: the Python builder decides, proxies and all).
///
/// Shared by the app threads of a listener (--threads): frozen, its two caches behind mutexes
/// that are never held across a call into Python (which may switch threads).
#[pyclass(module = "refork._native", frozen)]
pub struct Environ {
    base: Py<PyDict>,
    root: Vec<u8>,
    scheme: Vec<u8>,
    server_name: Py<PyString>,
    server_port: Py<PyString>,
    names: Mutex<HashMap<Vec<u8>, Option<Py<PyString>>>>,
    hosts: Mutex<HashMap<Vec<u8>, (Py<PyString>, Py<PyString>)>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymethods]
impl Environ {
    /// Environ(base, root_path, url_scheme, server_name, server_port): root_path latin-1 encodable.
    #[new]
    fn new(
        base: Bound<'_, PyDict>,
        root_path: &str,
        url_scheme: &str,
        server_name: Bound<'_, PyString>,
        server_port: Bound<'_, PyString>,
    ) -> PyResult<Self> {
        let root: Vec<u8> = root_path
            .chars()
            .map(|c| u8::try_from(c as u32).map_err(|_| pyo3::exceptions::PyValueError::new_err("root_path")))
            .collect::<PyResult<_>>()?;
        Ok(Environ {
            base: base.unbind(),
            root,
            scheme: url_scheme.as_bytes().to_vec(),
            server_name: server_name.unbind(),
            server_port: server_port.unbind(),
            names: Mutex::new(HashMap::new()),
            hosts: Mutex::new(HashMap::new()),
        })
    }

    /// build(request, body, client) -> the environ dict, or None when a forwarded field is present.
    fn build<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        body: &Bound<'py, PyAny>,
        client: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let headers = request.getattr(pyo3::intern!(py, "headers"))?;
        let headers = headers.downcast::<PyList>()?;
        let env = self.base.bind(py).copy()?;
        let mut host: Option<Vec<u8>> = None;
        for item in headers.iter() {
            let pair = item.downcast::<PyTuple>()?;
            let name_obj = pair.get_item(0)?;
            let name = name_obj.downcast::<PyBytes>()?.as_bytes();
            if name.starts_with(b"x-forwarded-") {
                return Ok(None);
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
            let value_obj = pair.get_item(1)?;
            let value = value_obj.downcast::<PyBytes>()?.as_bytes();
            if name == b"host" {
                host = Some(value.to_vec());
            }
            match env.get_item(key)? {
                Some(old) => {
                    let sep = if key.to_str()? == "HTTP_COOKIE" { "; " } else { "," };
                    let joined = format!("{}{}{}", old.downcast::<PyString>()?.to_str()?, sep, latin1(py, value).to_str()?);
                    env.set_item(key, joined)?;
                }
                None => env.set_item(key, latin1(py, value))?,
            }
        }
        env.set_item(pyo3::intern!(py, "REQUEST_METHOD"), request.getattr(pyo3::intern!(py, "method"))?)?;
        let path_obj = request.getattr(pyo3::intern!(py, "path"))?;
        let raw = path_obj.downcast::<PyBytes>()?.as_bytes();
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
        let query = request.getattr(pyo3::intern!(py, "query"))?;
        env.set_item(pyo3::intern!(py, "QUERY_STRING"), latin1(py, query.downcast::<PyBytes>()?.as_bytes()))?;
        let target = request.getattr(pyo3::intern!(py, "target"))?;
        let target = latin1(py, target.downcast::<PyBytes>()?.as_bytes());
        env.set_item(pyo3::intern!(py, "RAW_URI"), &target)?;
        env.set_item(pyo3::intern!(py, "REQUEST_URI"), &target)?;
        let version = request.getattr(pyo3::intern!(py, "http_version"))?;
        let version = version.downcast::<PyString>()?.to_str()?;
        match version {
            "1.1" => env.set_item(pyo3::intern!(py, "SERVER_PROTOCOL"), pyo3::intern!(py, "HTTP/1.1"))?,
            "1.0" => env.set_item(pyo3::intern!(py, "SERVER_PROTOCOL"), pyo3::intern!(py, "HTTP/1.0"))?,
            v => env.set_item(pyo3::intern!(py, "SERVER_PROTOCOL"), format!("HTTP/{v}"))?,
        }
        if !request.getattr(pyo3::intern!(py, "content_length"))?.is_none()
            || request.getattr(pyo3::intern!(py, "chunked"))?.is_truthy()?
        {
            let length = body.getattr(pyo3::intern!(py, "length"))?;
            env.set_item(pyo3::intern!(py, "CONTENT_LENGTH"), length.str()?)?;
        }
        env.set_item(pyo3::intern!(py, "wsgi.input"), body)?;
        if !client.is_none() {
            env.set_item(pyo3::intern!(py, "REMOTE_ADDR"), client.get_item(0)?)?;
            env.set_item(pyo3::intern!(py, "REMOTE_PORT"), client.get_item(1)?.str()?)?;
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
            Some(h) => match {
                // (a statement of its own: the guard is dropped before the arms run)
                let hit = locked(&self.hosts).get(&h).map(|(n, p)| (n.clone_ref(py), p.clone_ref(py)));
                hit
            } {
                Some((n, p)) => (n.into_bound(py), p.into_bound(py)),
                None => {
                    let default: &[u8] = if self.scheme == b"https" || self.scheme == b"wss" { b"443" } else { b"80" };
                    let (n, p) = split_host(&h, default);
                    let (n, p) = (latin1(py, n), latin1(py, p));
                    let mut hosts = locked(&self.hosts);
                    if hosts.len() < 256 {
                        hosts.insert(h.clone(), (n.clone().unbind(), p.clone().unbind()));
                    }
                    (n, p)
                }
            },
        };
        env.set_item(pyo3::intern!(py, "SERVER_NAME"), name)?;
        env.set_item(pyo3::intern!(py, "SERVER_PORT"), port)?;
        Ok(Some(env))
    }
}


/// "Date: <IMF-fixdate>\r\n" for a Unix second (email.utils.formatdate(usegmt=True)).
fn date_line(secs: u64) -> Vec<u8> {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let days = secs / 86400;
    let rem = secs % 86400;
    let weekday = DAYS[(days % 7) as usize];
    // civil from days (Howard Hinnant's algorithm)
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "Date: {}, {:02} {} {:04} {:02}:{:02}:{:02} GMT\r\n",
        weekday,
        day,
        MONTHS[(month - 1) as usize],
        year,
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
    .into_bytes()
}

static DATE: std::sync::Mutex<(u64, Vec<u8>)> = std::sync::Mutex::new((0, Vec::new()));

/// The Date line, cached per second.
fn cached_date(out: &mut Vec<u8>) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut cache = DATE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.0 != now || cache.1.is_empty() {
        *cache = (now, date_line(now));
    }
    out.extend_from_slice(&cache.1);
}

const JOIN_LIMIT: usize = 1 << 16;

/// The whole response to a WSGI app's list/tuple body of bytes, framed as refork.wsgi.response
/// (_send_result, _Exchange.head) and refork.http.response.ResponseFramer do for it, or None
/// for any case it does not take (the Python path then frames it; nothing was sent):
/// frame_list(code, reason, headers, has_length, result, no_body, http11, keep_alive)
///   -> (bytes, body_bytes, keep_alive) | None
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn frame_list<'py>(
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
    if !(200..=999).contains(&code) || code == 204 || code == 304 {
        return Ok(None);
    }
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = result.downcast_exact::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = result.downcast_exact::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Ok(None);
    };
    let mut total = 0usize;
    let mut bodies: Vec<&[u8]> = Vec::with_capacity(items.len());
    for item in &items {
        let Ok(b) = item.downcast_exact::<PyBytes>() else { return Ok(None) };
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
        let pair = item.downcast_exact::<PyTuple>()?;
        all.push((pair.get_item(0)?, pair.get_item(1)?));
    }
    if !has_length {
        added = (PyBytes::new(py, b"Content-Length").into_any(), PyBytes::new(py, total.to_string().as_bytes()).into_any());
        all.push(added);
    }
    for (name, value) in &all {
        let name = name.downcast::<PyBytes>()?.as_bytes();
        let value = value.downcast::<PyBytes>()?.as_bytes();
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
    Ok(Some((PyBytes::new(py, &out), total, keep)))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Parser>()?;
    m.add_class::<Environ>()?;
    m.add_function(wrap_pyfunction!(frame_list, m)?)?;
    Ok(())
}
