//! What the native loops serve themselves and what they hand to the Python loop: the PROXY
//! header of a fresh connection, the next request in its bytes, the memory budget it may hold.

use std::sync::Arc;

use pyo3::prelude::*;

use super::budget::Budget;
use super::proxy::{Policy, Refusal, Verdict};
use super::{Conn, Phase, HEAD_WAIT};
use crate::host::Host;
use crate::http::head::{parse_head, Head, HeadLimits, Parsed};
use crate::sys::Peer;

/// What the bytes at the start of a connection's buffer are.
pub(crate) enum Next<'a> {
    /// a complete request of the common shape, with `body` bytes of body after its head
    Request(Head<'a>, usize),
    /// part of a request: wait for more in this phase (the connection's clock is set)
    Wait,
    /// the Python loop's, from this byte on (see the module docs of engine/mod.rs)
    HandOver,
}

/// What a fresh connection's first bytes were (`Intake::preface`).
pub(crate) enum Preface {
    /// no PROXY header, or one taken out of the buffer: requests may follow in it
    Ready,
    /// part of a header: wait for more (the header timeout runs)
    Wait,
    /// a malformed header (400) or one from a peer not allowed (403): answer, log, close
    Refused(Refusal),
}

/// What the native loops serve themselves and what they hand to the Python loop.
pub(crate) struct Intake {
    pub limits: HeadLimits,
    /// proxy_protocol on: the header a connection's first bytes may be
    pub proxy: Option<Policy>,
    /// bodies up to this many bytes are read into memory (larger: spooled by the Python loop)
    pub inline_body: usize,
    /// the --health-path paths (answered by the Python loop)
    pub health: Vec<Vec<u8>>,
    /// the worker's --max-request-memory: what waits in the connections' buffers
    pub memory: Arc<Budget>,
    /// connections accepted per wake-up (the settings' accept_batch)
    pub accept_batch: usize,
    /// bytes asked of one recv() (the settings' read_size)
    pub read_size: usize,
    /// h2c in --http-protocols: a cleartext connection that opens with the HTTP/2 preface is the
    /// Python loop's (refork.serving.wsgi.http2)
    pub h2c: bool,
    /// h1 in --http-protocols (without it, an h2c port hands every connection over: the Python
    /// loop closes one that does not open with the preface)
    pub h1: bool,
}

/// The HTTP/2 connection preface (RFC 9113 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl Intake {
    /// From the engine host's settings, memory budget and PROXY answers.
    pub fn new(host: &Host, py: Python<'_>) -> PyResult<Intake> {
        let settings = &host.settings;
        let mut health = Vec::new();
        if let Some(hp) = &settings.health {
            health.extend(hp.live.iter().cloned());
            health.push(hp.ready.clone());
        }
        let proxy = match &settings.proxy {
            Some(p) => Some(Policy::new(p, host.proxy_responses.clone())?),
            None => None,
        };
        Ok(Intake {
            proxy,
            limits: settings.limits,
            inline_body: settings.inline_body,
            health,
            memory: host.memory.bind(py).get().inner.clone(),
            accept_batch: settings.accept_batch,
            read_size: settings.read_size,
            h2c: settings.h2c,
            h1: settings.h1,
        })
    }

    /// A fresh connection's first bytes (`conn.preface`): a PROXY header, when proxy_protocol is on,
    /// is taken out of `buf` and the client it names becomes the connection's peer.
    pub fn preface(&self, conn: &mut Conn, buf: &mut Vec<u8>) -> Preface {
        let Some(policy) = &self.proxy else {
            conn.preface = false;
            return Preface::Ready;
        };
        match policy.check(buf, &conn.peer) {
            Ok(Verdict::Incomplete) => {
                conn.wait_in(Phase::Head);
                Preface::Wait
            }
            Ok(Verdict::NotProxy) => {
                conn.preface = false;
                Preface::Ready
            }
            Ok(Verdict::Header { len, client, .. }) => {
                conn.preface = false;
                buf.drain(..len);
                if let Some((host, port)) = client {
                    conn.peer = Peer::Inet(host, port);
                    conn.client = None;
                }
                conn.idle();
                Preface::Ready
            }
            Err(refusal) => Preface::Refused(refusal),
        }
    }

    /// A connection's first read (`data`, non-empty) on an h2c port: true when the connection is
    /// the Python loop's (it opens with the HTTP/2 preface, or HTTP/1.1 is off). One compare of at
    /// most 24 bytes, on the first read only: the HTTP/1.1 path pays nothing after it. (Behind a
    /// PROXY header the preface is the Python loop's by the HTTP/1.1 rules: not a request head.)
    pub fn hands_h2c(&self, data: &[u8]) -> bool {
        let n = data.len().min(PREFACE.len());
        self.h2c && self.proxy.is_none() && (!self.h1 || data[..n] == PREFACE[..n])
    }

    /// The answer to a refused header.
    pub fn refusal(&self, forbidden: bool) -> &[u8] {
        match &self.proxy {
            Some(p) if forbidden => &p.forbidden,
            Some(p) => &p.bad_request,
            None => b"",
        }
    }

    /// The next request in `data` (non-empty), the connection's phase and clock set when it waits.
    pub fn next<'a>(&self, conn: &mut Conn, data: &'a [u8]) -> Next<'a> {
        let head = match parse_head(&self.limits, data) {
            Parsed::Fast(head) => head,
            Parsed::Partial if data.len() <= HEAD_WAIT => {
                conn.wait_in(Phase::Head);
                return Next::Wait;
            }
            _ => return Next::HandOver,
        };
        let n = head.content_length.unwrap_or(0) as usize;
        if n > self.inline_body || self.is_health(&head) {
            return Next::HandOver;
        }
        if data.len() < head.len + n {
            conn.wait_in(Phase::Body);
            conn.received = data.len() - head.len;
            conn.expect = head.len + n;
            return Next::Wait;
        }
        Next::Request(head, n)
    }

    /// A connection keeps its buffer (part of a request, or a request for an app thread): charged
    /// to the worker's budget by what it takes in memory (its capacity). A connection waiting for
    /// more bytes keeps them only while the budget has room: false, and it is the Python loop's
    /// (a head gets its 503 there, a body goes to the spool). `must`: charged whether it fits or
    /// not (a complete request, or bytes behind a response). Given back when an app thread takes
    /// the request or the connection is dropped (`Conn::release`).
    /// A body still arriving is charged, and its buffer reserved, at the request's whole size.
    pub fn keep(&self, conn: &mut Conn, must: bool) -> bool {
        let size = conn.buf.capacity();
        let want = if conn.phase == Phase::Body { size.max(conn.expect) } else { size };
        if !conn.hold(&self.memory, want, must) {
            return false;
        }
        if want > size {
            conn.buf.reserve_exact(want - conn.buf.len());
        }
        true
    }

    /// A --health-path check (tests/vectors/health.txt; refork.serving.health.HealthPaths.check):
    /// GET or HEAD without a body, for one of the paths (the query aside). A fast head has no
    /// Transfer-Encoding and an origin-form target; the other shapes are the Python loop's anyway.
    fn is_health(&self, head: &Head) -> bool {
        let bodiless = head.content_length.unwrap_or(0) == 0;
        if self.health.is_empty() || !(head.method == "GET" || head.method == "HEAD") || !bodiless {
            return false;
        }
        let path = match head.target.iter().position(|&b| b == b'?') {
            Some(i) => &head.target[..i],
            None => head.target,
        };
        self.health.iter().any(|p| p.as_slice() == path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Peer;

    fn intake(memory: usize) -> Intake {
        Intake {
            limits: HeadLimits { max_line: 4094, max_count: 64, max_field: 8190, max_body: 1 << 30 },
            proxy: None,
            inline_body: 100,
            health: vec![b"/healthz".to_vec()],
            memory: Arc::new(Budget::new(memory)),
            accept_batch: 8,
            read_size: 1 << 16,
            h2c: false,
            h1: true,
        }
    }

    fn conn() -> Conn {
        Conn::new(-1, Peer::Unix, -1, 0, 0.0)
    }

    /// What `next` makes of `data` on a fresh connection, and the phase it leaves it in.
    fn next(intake: &Intake, data: &[u8]) -> (String, Phase, usize) {
        let mut c = conn();
        let what = match intake.next(&mut c, data) {
            Next::Request(head, n) => format!("request {} {} +{n}", head.method, String::from_utf8_lossy(head.target)),
            Next::Wait => "wait".into(),
            Next::HandOver => "hand over".into(),
        };
        (what, c.phase, c.received)
    }

    #[test]
    fn a_complete_request_with_its_body() {
        let i = intake(0);
        let data = b"POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET";
        assert_eq!(next(&i, data), ("request POST /f +3".into(), Phase::Idle, 0));
    }

    #[test]
    fn part_of_a_head_or_a_body_waits_in_its_phase() {
        let i = intake(0);
        assert_eq!(next(&i, b"GET / HTTP/1.1\r\nHost: a\r\n"), ("wait".into(), Phase::Head, 0));
        let data = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabcd";
        assert_eq!(next(&i, data), ("wait".into(), Phase::Body, 4));
    }

    #[test]
    fn what_the_python_loop_serves() {
        let i = intake(0);
        // a body past the in-memory threshold (spooled there), a health check, another shape
        assert_eq!(next(&i, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n").0, "hand over");
        assert_eq!(next(&i, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n").0, "wait");
        assert_eq!(next(&i, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n").0, "hand over");
        assert_eq!(next(&i, b"HEAD /healthz?full=1 HTTP/1.1\r\nHost: a\r\n\r\n").0, "hand over");
        assert_eq!(next(&i, b"POST /healthz HTTP/1.1\r\nHost: a\r\n\r\n").0, "request POST /healthz +0");
        assert_eq!(next(&i, b"GET /healthz/x HTTP/1.1\r\nHost: a\r\n\r\n").0, "request GET /healthz/x +0");
        assert_eq!(next(&i, b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n").0, "hand over");
        // a head still incomplete past HEAD_WAIT bytes: the Python parser's limits decide
        let mut long = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        while long.len() <= HEAD_WAIT {
            long.extend_from_slice(format!("X-Pad: {}\r\n", "p".repeat(4000)).as_bytes());
        }
        assert_eq!(next(&i, &long[..HEAD_WAIT]).0, "wait");
        assert_eq!(next(&i, &long).0, "hand over");
    }

    /// tests/vectors/health.txt, which refork.serving.health.HealthPaths.check is held to as well:
    /// a health check is handed to the Python loop (which answers it), an app request of the fast
    /// shape is served here; a head of another shape is the Python loop's whatever its verdict.
    #[test]
    fn the_shared_health_vectors() {
        let mut i = intake(0);
        i.health = vec![b"/healthz".to_vec(), b"/healthz/live".to_vec(), b"/healthz/ready".to_vec()];
        for row in crate::vectors::rows(include_str!("../../../tests/vectors/health.txt")) {
            let data = row[0].as_bytes();
            let got = next(&i, data).0;
            match parse_head(&i.limits, data) {
                Parsed::Fast(_) if row[1] == "app" => assert!(got.starts_with("request "), "{row:?}: {got}"),
                Parsed::Fast(head) => assert!(i.is_health(&head) && got == "hand over", "{row:?}: {got}"),
                _ => assert_eq!(got, "hand over", "{row:?}"),
            }
        }
    }

    #[test]
    fn an_h2c_port_hands_over_what_opens_with_the_preface() {
        let mut i = intake(0);
        assert!(!i.hands_h2c(PREFACE)); // h2c off: the HTTP/1.1 rules (a bad request there)
        i.h2c = true;
        assert!(i.hands_h2c(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04"));
        assert!(i.hands_h2c(b"PRI * HT")); // the start of it: the Python loop waits for the rest
        assert!(!i.hands_h2c(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(!i.hands_h2c(b"PRIX"));
        i.h1 = false; // h2c only: everything (the Python loop closes what is not the preface)
        assert!(i.hands_h2c(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    }

    #[test]
    fn a_connection_keeps_its_bytes_while_the_budget_has_room() {
        let i = intake(1000);
        let mut a = conn();
        a.buf = Vec::with_capacity(600);
        assert!(i.keep(&mut a, false));
        let mut b = conn();
        b.buf = Vec::with_capacity(600);
        assert!(!i.keep(&mut b, false)); // the Python loop's then (503, or the spool)
        assert!(i.keep(&mut b, true)); // a complete request: charged anyway
        assert!(!i.memory.take(1));
        drop(b); // a dropped connection gives its bytes back
        assert!(i.memory.take(400));
        i.memory.give_back(400);
        a.release(); // its request taken
        assert!(i.memory.take(1000));
    }

    #[test]
    fn a_body_still_arriving_is_reserved_and_charged_whole() {
        let i = intake(1000);
        let mut c = conn();
        let head = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n";
        let mut data = head.to_vec();
        data.extend_from_slice(b"0123456789");
        assert!(matches!(i.next(&mut c, &data), Next::Wait));
        c.buf = data;
        assert!(i.keep(&mut c, false));
        assert!(c.buf.capacity() >= head.len() + 100); // one allocation for the rest of the body
        assert!(!i.memory.take(1000 - head.len() - 100 + 1)); // charged at the request's size
        let before = c.buf.as_ptr();
        c.buf.extend_from_slice(&[b'x'; 90]); // the rest arrives: no reallocation
        assert_eq!(before, c.buf.as_ptr());
    }
}
