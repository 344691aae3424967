//! What both native loops keep per client connection, and the rules they share with the Python
//! loop (refork.serving.connection): where a request ends in the bytes read, the deadlines of the
//! once-a-second sweep, the write-timeout line. The engine (engine.rs, one app thread) and the
//! pool's I/O thread (pool/io.rs) differ only in who runs the app.
//!
//! Nothing here touches Python but `Conn::client`, so the pool's I/O thread, which never takes
//! the GIL, can own connections.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::parser::{parse_head, Head, HeadLimits, Parsed};
use crate::proxy::{Policy, Verdict};
use crate::sys::{self, Peer};

/// An incomplete head longer than this goes to the Python parser (its limits decide).
pub(crate) const HEAD_WAIT: usize = 1 << 14;
/// Bytes read from a socket at once.
pub(crate) const RECV: usize = 1 << 16;

/// A flood that held this much, or passed this much through, and then let go is worth a
/// malloc_trim() (refork.http.budget: TRIM_AFTER, CHURN_TRIM).
const TRIM_AFTER: usize = 8 << 20;
const CHURN_TRIM: usize = 4 << 20;

/// One worker's budget of request bytes held in memory while they arrive, over all its
/// connections: the Python loop's (refork.http.budget.MemoryBudget, the same interface, through
/// `MemoryBudget`) and the native loops' threads share it.
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    /// bytes charged or noted since the last ebb
    churn: AtomicUsize,
}

impl Budget {
    /// Charge n bytes if they fit; false, with nothing charged, when they do not.
    pub fn take(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            if used + n > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(used, used + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(used + n, Ordering::Relaxed);
                    self.churn.fetch_add(n, Ordering::Relaxed);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    /// Charge n bytes held already, whether they fit or not.
    pub fn charge(&self, n: usize) {
        let used = self.used.fetch_add(n, Ordering::AcqRel) + n;
        self.peak.fetch_max(used, Ordering::Relaxed);
        self.churn.fetch_add(n, Ordering::Relaxed);
    }

    pub fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// refork.http.budget.MemoryBudget for the native loops: one worker's `Budget`, shared by the
/// Python loop (which calls these methods) and the engines' threads.
#[pyclass(module = "refork._native", frozen)]
pub struct MemoryBudget {
    pub(crate) inner: Arc<Budget>,
}

#[pymethods]
impl MemoryBudget {
    /// MemoryBudget(limit): 0 is no cap.
    #[new]
    fn new(limit: usize) -> Self {
        let limit = if limit == 0 { usize::MAX / 4 } else { limit };
        let budget = Budget { limit, used: AtomicUsize::new(0), peak: AtomicUsize::new(0), churn: AtomicUsize::new(0) };
        MemoryBudget { inner: Arc::new(budget) }
    }

    fn take(&self, n: usize) -> bool {
        self.inner.take(n)
    }

    fn charge(&self, n: usize) {
        self.inner.charge(n)
    }

    fn give_back(&self, n: usize) {
        self.inner.give_back(n)
    }

    /// n bytes went through a connection's buffers without being charged (refused at once).
    fn note(&self, n: usize) {
        self.inner.churn.fetch_add(n, Ordering::Relaxed);
    }

    #[getter]
    fn limit(&self) -> usize {
        self.inner.limit
    }

    #[getter]
    fn used(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }

    #[getter]
    fn peak(&self) -> usize {
        self.inner.peak.load(Ordering::Acquire)
    }

    /// True (once) when the bytes held fell to a quarter of their peak after a flood (a peak of
    /// 8 MiB, or 4 MiB through the buffers): the moment for a malloc_trim()
    /// (refork.http.budget.MemoryBudget.ebbed).
    fn ebbed(&self) -> bool {
        let peak = self.inner.peak.load(Ordering::Acquire);
        let used = self.inner.used.load(Ordering::Acquire);
        if (peak < TRIM_AFTER && self.inner.churn.load(Ordering::Acquire) < CHURN_TRIM) || used * 4 > peak {
            return false;
        }
        self.inner.peak.store(used, Ordering::Release);
        self.inner.churn.store(0, Ordering::Release);
        true
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Phase {
    Idle,
    Head,
    Body,
    Writing,
}

pub(crate) struct Conn {
    pub fd: i32,
    pub peer: Peer,
    /// the peer as the environ's client tuple (host, port) or None, made on first use
    pub client: Option<PyObject>,
    pub listener: i32,
    /// the place of its listener's Environ in the loop's list
    pub environ: usize,
    /// the part of a request that has arrived (an idle connection holds no buffer)
    pub buf: Vec<u8>,
    pub phase: Phase,
    /// when the connection entered its phase
    pub since: f64,
    /// body bytes received of the request still arriving (each --body-min-rate: one more second)
    pub received: usize,
    /// no byte received yet (see refork.serving.connection.Timeouts.expiry)
    pub fresh: bool,
    /// a response the socket has not taken yet, from `out_at`
    pub out: Vec<u8>,
    pub out_at: usize,
    /// close once `out` is written
    pub close_after: bool,
    /// "METHOD target" of the response waiting in `out` (for the write-timeout line)
    pub writing: Option<String>,
    /// nothing read yet: a PROXY header may come first (see `Intake::preface`)
    pub preface: bool,
    /// the bytes of `buf` charged to the worker's budget (given back when the request is taken or
    /// the connection is dropped)
    held: usize,
    budget: Option<Arc<Budget>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.release();
    }
}

impl Conn {
    pub fn new(fd: i32, peer: Peer, listener: i32, environ: usize, now: f64) -> Conn {
        Conn {
            fd,
            peer,
            client: None,
            listener,
            environ,
            buf: Vec::new(),
            phase: Phase::Idle,
            since: now,
            received: 0,
            fresh: true,
            out: Vec::new(),
            out_at: 0,
            close_after: false,
            writing: None,
            preface: true,
            held: 0,
            budget: None,
        }
    }

    /// Keep `n` bytes charged to `budget` for this connection: more only if they fit (`must`:
    /// whether they fit or not, for bytes there is no refusing); false when they do not fit.
    pub fn hold(&mut self, budget: &Arc<Budget>, n: usize, must: bool) -> bool {
        if n > self.held {
            let more = n - self.held;
            if must {
                budget.charge(more);
            } else if !budget.take(more) {
                return false;
            }
        } else if n < self.held {
            budget.give_back(self.held - n);
        }
        self.held = n;
        if self.budget.is_none() {
            self.budget = Some(budget.clone());
        }
        true
    }

    /// Its bytes go to the Python loop (`data`, what is handed over): charged as they are, and
    /// the charge goes with them (the Python loop gives it back once it has read them: a burst of
    /// connections handed over at once is counted until then). Returns the charge.
    pub fn hand_charge(&mut self, budget: &Arc<Budget>, data: usize) -> usize {
        self.hold(budget, data, true);
        std::mem::take(&mut self.held)
    }

    /// Nothing of this connection is charged any more (its request is taken, or it is gone).
    pub fn release(&mut self) {
        if self.held > 0 {
            if let Some(budget) = &self.budget {
                budget.give_back(self.held);
            }
            self.held = 0;
        }
    }

    /// The client tuple of the environ (made once per connection).
    pub fn client(&mut self, py: Python<'_>) -> PyResult<PyObject> {
        if let Some(c) = &self.client {
            return Ok(c.clone_ref(py));
        }
        let c = match &self.peer {
            Peer::Inet(host, port) => PyTuple::new(py, [host.into_pyobject(py)?.into_any(), port.into_pyobject(py)?.into_any()])?.into_any().unbind(),
            Peer::Unix => py.None(),
        };
        self.client = Some(c.clone_ref(py));
        Ok(c)
    }

    /// A connection the Python loop gives back (it was this engine's listener's): between two
    /// requests since `since`, its client tuple as the environ had it.
    pub fn adopted(fd: i32, client: &Bound<'_, PyAny>, listener: i32, environ: usize, since: f64) -> PyResult<Conn> {
        let peer = if client.is_none() { Peer::Unix } else { Peer::Inet(client.get_item(0)?.extract()?, client.get_item(1)?.extract()?) };
        let mut conn = Conn::new(fd, peer, listener, environ, since);
        conn.client = Some(client.clone().unbind());
        conn.fresh = false;
        conn.preface = false;
        Ok(conn)
    }

    /// Enter `phase` (its clock starts now unless it is already in it).
    pub fn wait_in(&mut self, phase: Phase) {
        if self.phase != phase {
            self.phase = phase;
            self.since = sys::monotonic();
        }
    }

    /// A response was sent whole: idle (the keep-alive clock) until the next request.
    pub fn idle(&mut self) {
        self.phase = Phase::Idle;
        self.since = sys::monotonic();
    }

    /// What the socket did not take of `bytes` (sent up to `at`) waits in the connection.
    pub fn keep_output(&mut self, bytes: Vec<u8>, at: usize, what: String) {
        self.out = bytes;
        self.out_at = at;
        self.phase = Phase::Writing;
        self.since = sys::monotonic();
        self.writing = Some(what);
    }

    /// Write what waits in `out`: Ok(true) once it is all out (the connection is then idle).
    pub fn write_on(&mut self) -> std::io::Result<bool> {
        loop {
            let n = sys::send(self.fd, &self.out[self.out_at..])?;
            self.since = sys::monotonic(); // (progress or not: the socket said it may take more)
            if n == 0 {
                return Ok(false);
            }
            self.out_at += n;
            if self.out_at == self.out.len() {
                self.out = Vec::new();
                self.out_at = 0;
                self.writing = None;
                self.idle();
                return Ok(true);
            }
        }
    }

    /// refork.serving.connection.log_write_timeout's line for this connection.
    pub fn write_timeout_line(&self, timeout: f64) -> String {
        let peer = match &self.peer {
            Peer::Inet(host, port) => format!("{host}:{port}"),
            Peer::Unix => "a unix-socket client".to_string(),
        };
        let what = self.writing.as_deref().unwrap_or("-");
        format!("write timeout: {peer} stopped reading {what} for {timeout:.1} s; connection cut")
    }
}

/// A loop's one read buffer: a read goes into it unless the connection holds part of a request
/// already, so an idle connection holds no buffer.
pub(crate) struct Scratch {
    buf: Vec<u8>,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch { buf: Vec::with_capacity(RECV) }
    }

    /// The buffer to read `conn`'s next bytes into: its own, or the scratch one.
    pub fn for_read(&mut self, conn: &mut Conn) -> Vec<u8> {
        std::mem::take(if conn.buf.is_empty() { &mut self.buf } else { &mut conn.buf })
    }

    /// What stays with a connection of `buf` from `at` (the rest of a request): a little of a big
    /// buffer is copied out, and the big one serves the next read.
    pub fn keep(&mut self, mut buf: Vec<u8>, at: usize) -> Vec<u8> {
        let rest = buf.len() - at;
        if rest == 0 {
            self.recycle(buf);
            Vec::new()
        } else if rest * 4 < buf.capacity() {
            let kept = buf[at..].to_vec();
            self.recycle(buf);
            kept
        } else {
            buf.drain(..at);
            buf
        }
    }

    /// A buffer no longer needed: the scratch one again if it is one's size.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() >= RECV && buf.capacity() <= 4 * RECV && self.buf.capacity() < RECV {
            buf.clear();
            self.buf = buf;
        }
    }
}

/// "METHOD target" of a request (the target decoded as latin-1, as the Python loop logs it).
pub(crate) fn describe(head: &Head) -> String {
    let mut s = String::with_capacity(head.method.len() + 1 + head.target.len());
    s.push_str(head.method);
    s.push(' ');
    s.extend(head.target.iter().map(|&b| b as char));
    s
}

/// The per-connection deadlines (refork.serving.connection.Timeouts), in seconds.
pub(crate) struct Timeouts {
    pub header: f64,
    pub body: f64,
    pub write: f64,
    pub keepalive: f64,
    pub body_min_rate: f64,
}

impl Timeouts {
    pub fn from_py(t: &Bound<'_, PyAny>) -> PyResult<Timeouts> {
        let f = |name: &str| -> PyResult<f64> { t.getattr(name)?.extract() };
        Ok(Timeouts {
            header: f("header")?,
            body: f("body")?,
            write: f("write")?,
            keepalive: f("keepalive")?,
            body_min_rate: f("body_min_rate")?,
        })
    }
}

/// What the sweep does with a connection past its deadline.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Expired {
    /// idle too long, or drained: close quietly
    Close,
    /// a request did not arrive in time: 408, then close
    RequestTimeout,
    /// the client stopped reading a response: log it, close
    WriteTimeout,
}

/// The sweep (refork.serving.connection.Timeouts.expiry and write_stalled): the connections past
/// their deadline, out of `conns`. `drain_until` > 0: the worker stops, idle connections close
/// then (a fresh one keeps its keep-alive clock).
pub(crate) fn sweep(conns: &mut HashMap<i32, Conn>, t: &Timeouts, now: f64, drain_until: f64) -> Vec<(Conn, Expired)> {
    let mut expired: Vec<(i32, Expired)> = Vec::new();
    for conn in conns.values() {
        let age = now - conn.since;
        let verdict = match conn.phase {
            Phase::Writing => (age > t.write).then_some(Expired::WriteTimeout),
            Phase::Idle => {
                let drained = drain_until > 0.0 && now >= drain_until && !conn.fresh;
                // a request that arrived while the loop was busy is served, not dropped as idle
                ((age > t.keepalive || drained) && !sys::has_input(conn.fd)).then_some(Expired::Close)
            }
            Phase::Head => (age > t.header).then_some(Expired::RequestTimeout),
            Phase::Body => {
                let extra = if t.body_min_rate > 0.0 { conn.received as f64 / t.body_min_rate } else { 0.0 };
                (age > t.body + extra).then_some(Expired::RequestTimeout)
            }
        };
        if let Some(v) = verdict {
            expired.push((conn.fd, v));
        }
    }
    expired.into_iter().filter_map(|(fd, v)| conns.remove(&fd).map(|c| (c, v))).collect()
}

/// What the bytes at the start of a connection's buffer are.
pub(crate) enum Next<'a> {
    /// a complete request of the common shape, with `body` bytes of body after its head
    Request(Head<'a>, usize),
    /// part of a request: wait for more in this phase (the connection's clock is set)
    Wait,
    /// the Python loop's, from this byte on (see the module docs of engine.rs)
    HandOver,
}

/// What a fresh connection's first bytes were (`Intake::preface`).
pub(crate) enum Preface {
    /// no PROXY header, or one taken out of the buffer: requests may follow in it
    Ready,
    /// part of a header: wait for more (the header timeout runs)
    Wait,
    /// a malformed header (400) or one from a peer not allowed (403): answer, log, close
    Refused(crate::proxy::Refusal),
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
}

impl Intake {
    pub fn from_host(host: &Bound<'_, PyAny>) -> PyResult<Intake> {
        let mut health = Vec::new();
        let hp = host.getattr("health")?;
        if !hp.is_none() {
            for p in hp.getattr("live")?.try_iter()? {
                health.push(p?.extract::<Vec<u8>>()?);
            }
            health.push(hp.getattr("ready")?.extract::<Vec<u8>>()?);
        }
        let memory = host.getattr("memory")?;
        let memory = memory.downcast::<MemoryBudget>()?.get().inner.clone();
        Ok(Intake {
            proxy: Policy::from_host(host)?,
            limits: HeadLimits::from_py(&host.getattr("limits")?)?,
            inline_body: host.getattr("spool")?.extract()?,
            health,
            memory,
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
    pub fn keep(&self, conn: &mut Conn, must: bool) -> bool {
        conn.hold(&self.memory, conn.buf.capacity(), must)
    }

    fn is_health(&self, head: &Head) -> bool {
        if self.health.is_empty() || !(head.method == "GET" || head.method == "HEAD") {
            return false;
        }
        let path = match head.target.iter().position(|&b| b == b'?') {
            Some(i) => &head.target[..i],
            None => head.target,
        };
        self.health.iter().any(|p| p.as_slice() == path)
    }
}
