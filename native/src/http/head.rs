//! The request head's fast path: `fast_head` reads the common shape (see the module docs of
//! lib.rs) with httparse in one pass; `parse_head` also tells a prefix worth waiting for from
//! bytes the Python parser must judge now. Pure: bytes in, a verdict out.

use std::mem::MaybeUninit;

use pyo3::prelude::*;

const MAX_FAST_HEADERS: usize = 64;

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

/// refork.http.parser.Limits, as Python has it.
#[derive(FromPyObject)]
struct Limits {
    max_request_line: usize,
    max_header_count: usize,
    max_header_size: usize,
    max_body: usize,
}

impl HeadLimits {
    /// From a refork.http.parser.Limits.
    pub fn from_py(limits: &Bound<'_, PyAny>) -> PyResult<Self> {
        let l: Limits = limits.extract()?;
        let get = |v: usize| if v == 0 { usize::MAX / 4 } else { v };
        Ok(HeadLimits {
            max_line: get(l.max_request_line),
            max_count: get(l.max_header_count).min(MAX_FAST_HEADERS),
            max_field: get(l.max_header_size),
            max_body: get(l.max_body) as u64,
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

/// The common-shape head at the start of `data` (see the module docs of lib.rs).
pub(crate) fn parse_head<'a>(limits: &HeadLimits, data: &'a [u8]) -> Parsed<'a> {
    if let Some(head) = fast_head(limits, data) {
        return Parsed::Fast(head);
    }
    // Waiting for the rest is only for a prefix that can still become the common shape: httparse
    // finds nothing wrong yet, CRLF line ends only, visible ASCII, SP and HTAB. Anything else goes
    // to the Python parser now, which refuses at the first bad byte as it always does.
    let mut storage = header_storage();
    let mut req = httparse::Request::new(&mut []);
    if !matches!(req.parse_with_uninit_headers(data, &mut storage), Ok(httparse::Status::Partial)) {
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

/// Room for the headers httparse finds, left uninitialized: it writes those it finds (filling 64
/// empty ones first was 2 KiB of stores per request).
fn header_storage<'a>() -> [MaybeUninit<httparse::Header<'a>>; MAX_FAST_HEADERS] {
    [const { MaybeUninit::uninit() }; MAX_FAST_HEADERS]
}

pub(crate) fn fast_head<'a>(this: &HeadLimits, data: &'a [u8]) -> Option<Head<'a>> {
    let mut storage = header_storage();
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(data, &mut storage) {
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

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits { max_line: 4094, max_count: 64, max_field: 8190, max_body: 1 << 30 };

    fn fast(data: &[u8]) -> Option<Head<'_>> {
        fast_head(&LIMITS, data)
    }

    fn kind(limits: &HeadLimits, data: &[u8]) -> &'static str {
        match parse_head(limits, data) {
            Parsed::Fast(_) => "fast",
            Parsed::Partial => "partial",
            Parsed::Other => "other",
        }
    }

    /// A request of the common shape with `fields` between its request line and its end.
    fn request(line: &str, fields: &[&str]) -> Vec<u8> {
        let mut out = format!("{line}\r\n");
        for f in fields {
            out.push_str(f);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    #[test]
    fn a_common_get_is_read_whole() {
        let mut data = request("GET /a/b?c=1 HTTP/1.1", &["Host: example.com:8080", "User-Agent:  curl \t"]);
        let len = data.len();
        data.extend_from_slice(b"GET / HTTP/1.1\r\n"); // pipelined behind it: not part of this head
        let head = fast(&data).expect("common");
        assert_eq!(head.method, "GET");
        assert_eq!(head.target, b"/a/b?c=1");
        assert!(head.http11 && head.keep_alive && !head.forwarded);
        assert_eq!(head.content_length, None);
        assert_eq!(head.len, len);
        let fields: Vec<(&[u8], &[u8])> = head.headers.iter().map(|(n, v)| (n.as_slice(), *v)).collect();
        assert_eq!(fields, [(&b"host"[..], &b"example.com:8080"[..]), (b"user-agent", b"curl")]);
    }

    #[test]
    fn every_common_method_and_both_versions() {
        for method in ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let head = fast(&request(&format!("{method} / HTTP/1.1"), &["Host: a"])).expect(method).method;
            assert_eq!(head, method);
        }
        let data = request("GET / HTTP/1.0", &[]);
        assert!(!fast(&data).expect("1.0 without Host").http11);
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection() {
        let keep = |line: &str, fields: &[&str]| fast(&request(line, fields)).expect("common").keep_alive;
        assert!(keep("GET / HTTP/1.1", &["Host: a"]));
        assert!(!keep("GET / HTTP/1.1", &["Host: a", "Connection: close"]));
        assert!(!keep("GET / HTTP/1.1", &["Host: a", "Connection: keep-alive, Close"]));
        assert!(!keep("GET / HTTP/1.0", &[]));
        assert!(keep("GET / HTTP/1.0", &["Connection: Keep-Alive"]));
        assert!(keep("GET / HTTP/1.0", &["Connection: ,keep-alive,"]));
        // any other token (upgrade, a hop-by-hop field's name) is the Python parser's
        assert!(fast(&request("GET / HTTP/1.1", &["Host: a", "Connection: upgrade"])).is_none());
        assert!(fast(&request("GET / HTTP/1.1", &["Host: a", "Connection: close, x-trace"])).is_none());
    }

    #[test]
    fn content_length_digits_only_once_within_the_body_limit() {
        let length = |value: &str| fast(&request("POST / HTTP/1.1", &["Host: a", &format!("Content-Length: {value}")])).map(|h| h.content_length);
        assert_eq!(length("0"), Some(Some(0)));
        assert_eq!(length("42"), Some(Some(42)));
        assert_eq!(length("007"), Some(Some(7)));
        for bad in ["", "+1", "-1", "1 2", "0x10", "1.0", "1234567890123456789"] {
            assert_eq!(length(bad), None, "{bad:?}");
        }
        let twice = request("POST / HTTP/1.1", &["Host: a", "Content-Length: 1", "Content-Length: 1"]);
        assert!(fast(&twice).is_none());
        let limits = HeadLimits { max_body: 10, ..LIMITS };
        let body = |n: u32| request("POST / HTTP/1.1", &["Host: a", &format!("Content-Length: {n}")]);
        assert!(fast_head(&limits, &body(10)).is_some());
        assert!(fast_head(&limits, &body(11)).is_none());
    }

    #[test]
    fn what_is_not_the_common_shape_goes_to_the_python_parser() {
        let host = ["Host: a"];
        for line in [
            "PROPFIND / HTTP/1.1",
            "CONNECT a:443 HTTP/1.1",
            "OPTIONS * HTTP/1.1",
            "GET http://a/ HTTP/1.1",
            "GET /a#b HTTP/1.1",
            "GET  / HTTP/1.1",
            "GET / HTTP/1.1 ",
            "GET / HTTP/2.0",
            "get / HTTP/1.1",
        ] {
            assert!(fast(&request(line, &host)).is_none(), "{line:?}");
        }
        for fields in [
            &["Host: a", "Transfer-Encoding: chunked"][..],
            &["Host: a", "Expect: 100-continue"],
            &["Host: a", "Upgrade: websocket"],
            &[],
            &["Host: a", "Host: a"],
            &["Host: a b"],
            &["Host: a/b"],
            &["Host: a", "X-Bin: a\x01b"],
            &["Host: a", "X-Del: a\x7fb"],
        ] {
            assert!(fast(&request("GET / HTTP/1.1", fields)).is_none(), "{fields:?}");
        }
        assert!(fast(b"GET / HTTP/1.1\nHost: a\n\n").is_none()); // bare LF line ends
        assert!(fast(b"GET / HTTP/1.1\r\nHost: a\r\n").is_none()); // not complete
        assert!(fast(&request("GET / HTTP/1.0", &["Host: a", "Host: b"])).is_none());
    }

    #[test]
    fn x_forwarded_fields_are_flagged() {
        let forwarded = |field: &str| fast(&request("GET / HTTP/1.1", &["Host: a", field])).expect("common").forwarded;
        assert!(forwarded("X-Forwarded-For: 10.0.0.1"));
        assert!(forwarded("x-forwarded-proto: https"));
        assert!(!forwarded("X-Forwarder: no"));
    }

    #[test]
    fn the_request_line_limit() {
        // the target + " HTTP/1.x" + method, as refork.http.parser measures it: GET /1234567 is 20
        let limits = HeadLimits { max_line: 20, ..LIMITS };
        assert!(fast_head(&limits, &request("GET /234567 HTTP/1.1", &["Host: a"])).is_some());
        assert!(fast_head(&limits, &request("GET /2345678 HTTP/1.1", &["Host: a"])).is_none());
        assert!(fast_head(&limits, &request("OPTIONS /23 HTTP/1.1", &["Host: a"])).is_some());
        assert!(fast_head(&limits, &request("OPTIONS /234 HTTP/1.1", &["Host: a"])).is_none());
    }

    #[test]
    fn the_field_size_and_count_limits() {
        // a field's name and value and 4 (": ", CRLF): "Host: abc" is 11
        let fields = ["Host: abc"];
        assert!(fast_head(&HeadLimits { max_field: 11, ..LIMITS }, &request("GET / HTTP/1.1", &fields)).is_some());
        assert!(fast_head(&HeadLimits { max_field: 10, ..LIMITS }, &request("GET / HTTP/1.1", &fields)).is_none());
        let fields = ["Host: a", "A: 1", "B: 2"];
        assert!(fast_head(&HeadLimits { max_count: 3, ..LIMITS }, &request("GET / HTTP/1.1", &fields)).is_some());
        assert!(fast_head(&HeadLimits { max_count: 2, ..LIMITS }, &request("GET / HTTP/1.1", &fields)).is_none());
        // past the fast path's own table of fields, whatever the setting
        let many: Vec<String> = std::iter::once("Host: a".to_string()).chain((0..MAX_FAST_HEADERS).map(|i| format!("X-{i}: v"))).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(fast_head(&HeadLimits { max_count: usize::MAX / 4, ..LIMITS }, &request("GET / HTTP/1.1", &many)).is_none());
    }

    #[test]
    fn a_request_line_still_arriving_is_waited_for() {
        let line = b"GET /path HTTP/1.1\r";
        for n in 1..=line.len() {
            assert_eq!(kind(&LIMITS, &line[..n]), "partial", "{:?}", String::from_utf8_lossy(&line[..n]));
        }
        for bad in [&b"GX"[..], b"XYZ /", b"GET a", b"GET / HTTP/2", b"GET / HTTP/1.1\rX", b"GET /\x01", b"GET /\xff"] {
            assert_eq!(kind(&LIMITS, bad), "other", "{:?}", String::from_utf8_lossy(bad));
        }
        // past the limit (and its CR) while it arrives: refused now (414) by the Python parser
        let limits = HeadLimits { max_line: 10, ..LIMITS };
        assert_eq!(kind(&limits, b"GET /234567"), "partial");
        assert_eq!(kind(&limits, b"GET /2345678"), "other");
    }

    #[test]
    fn a_field_still_arriving_is_waited_for_when_the_complete_lines_are_common() {
        let start = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        let with = |tail: &[u8]| [start.as_slice(), tail].concat();
        assert_eq!(kind(&LIMITS, &with(b"")), "partial");
        assert_eq!(kind(&LIMITS, &with(b"Acc")), "partial");
        assert_eq!(kind(&LIMITS, &with(b"Accept: text/html")), "partial");
        assert_eq!(kind(&LIMITS, &with(b"Accept: text/html\r\n\r")), "partial");
        assert_eq!(kind(&LIMITS, &with(b"Accept: text/html\r\n\r\n")), "fast");
        // fields the Python parser judges as they come: its verdict now
        for tail in [&b"Host: b"[..], b"content-length: 1", b"Transfer-Encoding: c", b"Connection: x", b"Expect: 1", b"Upgrade: h2c"] {
            assert_eq!(kind(&LIMITS, &with(tail)), "other", "{:?}", String::from_utf8_lossy(tail));
        }
        // the complete lines must make a common head on their own (Host first on HTTP/1.1)
        assert_eq!(kind(&LIMITS, b"GET / HTTP/1.1\r\nAccept: x\r\nHo"), "other");
        assert_eq!(kind(&LIMITS, b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01"), "other");
        assert_eq!(kind(&LIMITS, b"GET / HTTP/1.1\r\nHost: a\nX"), "other");
        // a field line past its limit (name, value, ": ", CR) while it arrives: refused now (431)
        let limits = HeadLimits { max_field: 16, ..LIMITS };
        assert_eq!(kind(&limits, &with(b"X-Long: 12345678901")), "partial"); // 19 bytes
        assert_eq!(kind(&limits, &with(b"X-Long: 1234567890123")), "other"); // 21 bytes
    }
}
