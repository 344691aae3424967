//! The request head: `Parser` (the Python loop's drop-in for RequestParser) and `fast_head`, the
//! common-shape reader the native engine shares.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

const MAX_FAST_HEADERS: usize = 64;

pub(crate) fn fast_method<'py>(py: Python<'py>, m: &str) -> Option<&'py Bound<'py, PyString>> {
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
pub(crate) struct Head<'a> {
    pub method: &'static str,
    pub target: &'a [u8],
    pub http11: bool,
    /// (lower-cased name, value without surrounding whitespace), in order
    pub headers: Vec<(Vec<u8>, &'a [u8])>,
    pub keep_alive: bool,
    pub content_length: Option<u64>,
    /// an X-Forwarded-* field is present (the Python environ builder applies the proxy rules)
    pub forwarded: bool,
    /// bytes of the head, CRLF CRLF included
    pub len: usize,
}

/// The limit_request_* settings as the fast path applies them (0 in a setting: no limit).
#[derive(Clone, Copy)]
pub(crate) struct HeadLimits {
    pub max_line: usize,
    pub max_count: usize,
    pub max_field: usize,
    pub max_body: u64,
}

impl HeadLimits {
    /// From a refork.http.parser.Limits.
    pub fn from_py(limits: &Bound<'_, PyAny>) -> PyResult<Self> {
        let get = |name: &str| -> PyResult<usize> {
            let v: usize = limits.getattr(name)?.extract()?;
            Ok(if v == 0 { usize::MAX / 4 } else { v })
        };
        Ok(HeadLimits {
            max_line: get("max_request_line")?,
            max_count: get("max_header_count")?.min(MAX_FAST_HEADERS),
            max_field: get("max_header_size")?,
            max_body: get("max_body")? as u64,
        })
    }
}

/// What httparse makes of the start of `data`.
pub(crate) enum Parsed<'a> {
    /// a complete head of the common shape
    Fast(Head<'a>),
    /// a prefix of a head that may still turn out common: wait for more bytes
    Partial,
    /// anything else: the Python parser gives the verdict
    Other,
}

#[pyclass(module = "refork._native")]
pub struct Parser {
    head_limits: HeadLimits,
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

/// The refork.http.events.Request of a fast head (`cls` is that class).
pub(crate) fn request_object<'py>(py: Python<'py>, cls: &Bound<'py, PyAny>, head: &Head) -> PyResult<Bound<'py, PyAny>> {
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
    cls.call1(args)
}

/// The common-shape head at the start of `data` (see the module docs of lib.rs).
pub(crate) fn parse_head<'a>(limits: &HeadLimits, data: &'a [u8]) -> Parsed<'a> {
    if let Some(head) = fast_head(limits, data) {
        return Parsed::Fast(head);
    }
    // Waiting for the rest is only for a prefix that can still become the common shape: httparse
    // finds nothing wrong yet, CRLF line ends only, visible ASCII, SP and HTAB. Anything else goes
    // to the Python parser now, which refuses at the first bad byte as it always does.
    let mut storage = [httparse::EMPTY_HEADER; MAX_FAST_HEADERS];
    let mut req = httparse::Request::new(&mut storage);
    if !matches!(req.parse(data), Ok(httparse::Status::Partial)) {
        return Parsed::Other;
    }
    let lines = data.strip_suffix(b"\r").unwrap_or(data);
    if !crlf_only(lines) || !data.iter().all(|&b| (0x20..0x7f).contains(&b) || b == b'\r' || b == b'\n' || b == b'\t') {
        return Parsed::Other;
    }
    // A line still arriving past its limit is the Python parser's to refuse now (414, 431), with
    // the same bounds (refork.http.parser: RequestParser._measure): the request line and its CR,
    // a field line's name and value, ": " and CR.
    let Some(end) = data.windows(2).rposition(|w| w == b"\r\n") else {
        let fits = data.len() <= limits.max_line.saturating_add(1);
        return if fits && common_line_prefix(lines) { Parsed::Partial } else { Parsed::Other };
    };
    if data.len() - end - 2 > limits.max_field.saturating_add(4) {
        return Parsed::Other;
    }
    // The Python parser judges each header line as it completes (a second Host, a bad
    // Content-Length...): the complete lines must make a common-shape head on their own...
    let mut complete = data[..end + 2].to_vec();
    complete.extend_from_slice(b"\r\n");
    if fast_head(limits, &complete).is_none() {
        return Parsed::Other;
    }
    // ...and the line still arriving must not be one whose value the Python parser reads as it comes
    let tail = &data[end + 2..];
    if let Some(colon) = tail.iter().position(|&b| b == b':') {
        let name = tail[..colon].to_ascii_lowercase();
        if matches!(name.as_slice(), b"host" | b"content-length" | b"transfer-encoding" | b"connection" | b"expect" | b"upgrade") {
            return Parsed::Other;
        }
    }
    Parsed::Partial
}

/// A request line still arriving that can become the common shape (a well-known method, an
/// origin-form target, HTTP/1.x).
fn common_line_prefix(line: &[u8]) -> bool {
    const METHODS: [&[u8]; 7] = [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS"];
    let mut parts = line.splitn(3, |&b| b == b' ');
    let method = parts.next().unwrap_or(b"");
    let Some(target) = parts.next() else {
        return METHODS.iter().any(|m| m.starts_with(method));
    };
    if !METHODS.contains(&method) || !(target.is_empty() || target[0] == b'/') {
        return false;
    }
    match parts.next() {
        None => true,
        Some(version) => !target.is_empty() && (b"HTTP/1.1".starts_with(version) || b"HTTP/1.0".starts_with(version)),
    }
}

pub(crate) fn fast_head<'a>(this: &HeadLimits, data: &'a [u8]) -> Option<Head<'a>> {
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
            || target.len() + 13 > this.max_line
            || target.len() + method.len() + 10 > this.max_line
        {
            return None;
        }
        // the request line exactly "METHOD SP target SP HTTP/1.x CRLF": no extra spaces
        let line = method.len() + 1 + target.len() + 1 + 8 + 2;
        if data.len() < line || &data[line - 2..line] != b"\r\n" || !crlf_only(&data[..len]) {
            return None;
        }
        if req.headers.len() > this.max_count {
            return None;
        }
        let mut headers = Vec::with_capacity(req.headers.len());
        let mut hosts = 0;
        let mut content_length: Option<u64> = None;
        let mut close = false;
        let mut keep = false;
        let mut forwarded = false;
        for h in req.headers.iter() {
            let raw = h.value;
            if h.name.len() + raw.len() + 4 > this.max_field
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
                    if n > this.max_body {
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
                n if n.starts_with(b"x-forwarded-") => forwarded = true,
                _ => {}
            }
            headers.push((name, value));
        }
        if hosts > 1 || (http11 && hosts != 1) {
            return None;
        }
        let keep_alive = if close { false } else if http11 { true } else { keep };
        Some(Head { method, target, http11, headers, keep_alive, content_length, forwarded, len })
}

impl Parser {

    fn request<'py>(&self, py: Python<'py>, head: &Head) -> PyResult<Bound<'py, PyAny>> {
        request_object(py, self.request_cls.bind(py), head)
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
        Ok(Parser {
            head_limits: HeadLimits::from_py(limits.bind(py))?,
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

    /// The connection is gone: let go of what the Python parser of a message holds
    /// (refork.http.parser.RequestParser.release); feed() returns nothing from now on.
    fn release(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(p) = self.slow.take() {
            p.bind(py).call_method0(pyo3::intern!(py, "release"))?;
        }
        self.closed = true;
        self.body_left = 0;
        Ok(())
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

    /// What the Python parser of a message in progress holds of it (refork.http.parser's
    /// `buffered`); the fast path holds nothing between reads.
    #[getter]
    fn buffered(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.slow {
            Some(p) => p.bind(py).getattr(pyo3::intern!(py, "buffered"))?.extract(),
            None => Ok(0),
        }
    }

    /// Bytes of the head in progress (refork.http.parser's `head_held`).
    #[getter]
    fn head_held(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.slow {
            Some(p) => p.bind(py).getattr(pyo3::intern!(py, "head_held"))?.extract(),
            None => Ok(0),
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
            match fast_head(&self.head_limits, rest) {
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


