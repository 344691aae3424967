//! What both native loops keep per client connection, and the rules they share with the Python
//! loop (refork.serving.connection): where a request ends in the bytes read, the deadlines of the
//! once-a-second sweep, the write-timeout line. The engine (engine/, one app thread) and the
//! pool's I/O thread (pool/io.rs) differ only in who runs the app.
//!
//! Nothing here touches Python but `Conn::client`, so the pool's I/O thread, which never takes
//! the GIL, can own connections.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::http::head::Head;
use crate::sys::{self, Peer};

pub(crate) mod budget;
pub(crate) mod handed;
pub(crate) mod intake;
pub(crate) mod lingering;
pub(crate) mod listen;
pub(crate) mod proxy;
pub(crate) mod scratch;
pub(crate) mod sweep;

use budget::Budget;

/// The connections of a loop by fd: a multiplicative hash of the fd (SipHash cost more than a
/// request's map lookups are worth; fds are not chosen by clients).
pub(crate) type Conns = std::collections::HashMap<i32, Conn, FdHash>;

#[derive(Default, Clone, Copy)]
pub(crate) struct FdHash;

pub(crate) struct FdHasher(u64);

impl std::hash::BuildHasher for FdHash {
    type Hasher = FdHasher;
    fn build_hasher(&self) -> FdHasher {
        FdHasher(0)
    }
}

impl std::hash::Hasher for FdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_i32(&mut self, fd: i32) {
        self.0 = u64::from(fd as u32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// An incomplete head longer than this goes to the Python parser (its limits decide).
pub(crate) const HEAD_WAIT: usize = 1 << 14;

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
    pub client: Option<Py<PyAny>>,
    /// its port as the environ's REMOTE_PORT str (made with `client`)
    pub remote_port: Option<Py<PyString>>,
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
    /// the size of the request whose body is arriving (head and body): its buffer is reserved
    /// whole once, not grown read by read (each growth a copy, and the heap left fragmented)
    pub expect: usize,
    /// no byte received yet (see refork.serving.connection.Timeouts.expiry)
    pub fresh: bool,
    /// a response the socket has not taken yet, from `out_at`
    pub out: Vec<u8>,
    pub out_at: usize,
    /// close once `out` is written
    pub close_after: bool,
    /// "METHOD target" of the response waiting in `out` (for the write-timeout line)
    pub writing: Option<String>,
    /// the file part of the response, sent after `out` (sendfile); its owner is closed by the
    /// engine once it is out or the connection ends
    pub file: Option<Box<FileBody>>,
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
            remote_port: None,
            listener,
            environ,
            buf: Vec::new(),
            phase: Phase::Idle,
            since: now,
            received: 0,
            expect: 0,
            fresh: true,
            out: Vec::new(),
            out_at: 0,
            close_after: false,
            writing: None,
            file: None,
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
    pub fn client(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
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

    /// REMOTE_PORT of the environ: the client tuple's port as a str, made once per connection
    /// (None: a unix-socket client).
    pub fn remote_port<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyString>>> {
        if let Some(p) = &self.remote_port {
            return Ok(Some(p.bind(py).clone()));
        }
        let client = self.client(py)?.into_bound(py);
        if client.is_none() {
            return Ok(None);
        }
        let port = client.get_item(1)?.str()?;
        self.remote_port = Some(port.clone().unbind());
        Ok(Some(port))
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

    /// Write what waits in `out`, then the file part: Ok(true) once it is all out (the
    /// connection is then idle; a `file` sent whole stays for its owner to be closed).
    pub fn write_on(&mut self) -> std::io::Result<bool> {
        loop {
            // (progress or not, `since` moves: the socket said it may take more)
            if self.out_at < self.out.len() {
                let rest = &self.out[self.out_at..];
                let more = self.file.as_ref().is_some_and(|f| f.remaining > 0);
                let n = if more { sys::send_more(self.fd, rest)? } else { sys::send(self.fd, rest)? };
                self.since = sys::monotonic();
                if n == 0 {
                    return Ok(false);
                }
                self.out_at += n;
                continue;
            }
            if let Some(file) = self.file.as_mut().filter(|f| f.remaining > 0) {
                let sent = sys::sendfile(self.fd, file.fd, &mut file.offset, file.remaining)?;
                self.since = sys::monotonic();
                match sent {
                    None => return Ok(false),
                    Some(0) => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file ended before its Content-Length")),
                    Some(n) => file.remaining -= n,
                }
                continue;
            }
            self.out = Vec::new();
            self.out_at = 0;
            self.writing = None;
            self.idle();
            return Ok(true);
        }
    }

    /// The write-timeout warning for this connection (tests/vectors/write_timeout.txt;
    /// refork.serving.connection.write_timeout_line).
    pub fn write_timeout_line(&self, timeout: f64) -> String {
        let peer = peer_text(&self.peer);
        let what = self.writing.as_deref().unwrap_or("-");
        format!("write timeout: {peer} stopped reading {what} for {timeout:.1} s; connection cut")
    }
}

/// A file a response's body is sent from (sendfile): `remaining` bytes of `fd` from `offset`.
pub(crate) struct FileBody {
    pub fd: i32,
    pub offset: i64,
    pub remaining: usize,
    /// keeps the file open until the body is sent or the connection ends
    pub owner: FileOwner,
}

/// What keeps a file response's file open.
pub(crate) enum FileOwner {
    /// what the app returned (its wsgi.file_wrapper): its close() called when done
    App(Py<PyAny>),
    /// a --static answer's file, opened in Rust (static_files/): held only to be closed when
    /// dropped, without the GIL
    Static(#[allow(dead_code)] std::fs::File),
}

/// "METHOD target" of a request (the target decoded as latin-1, as the Python loop logs it).
pub(crate) fn describe(head: &Head) -> String {
    let mut s = String::with_capacity(head.method.len() + 1 + head.target.len());
    s.push_str(head.method);
    s.push(' ');
    s.extend(head.target.iter().map(|&b| b as char));
    s
}

/// A client as the log lines name it (refork.serving.connection.peer_text; tests/vectors/peer.txt):
/// host:port, [host]:port for IPv6, or a unix-socket client.
pub(crate) fn peer_text(peer: &Peer) -> String {
    match peer {
        Peer::Inet(host, port) if host.contains(':') => format!("[{host}]:{port}"),
        Peer::Inet(host, port) => format!("{host}:{port}"),
        Peer::Unix => "a unix-socket client".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tests/vectors/peer.txt, which refork.serving.connection.peer_text is held to as well.
    #[test]
    fn the_shared_peer_vectors() {
        for row in crate::vectors::rows(include_str!("../../../tests/vectors/peer.txt")) {
            let peer = if row[0] == "-" { Peer::Unix } else { Peer::Inet(row[0].clone(), row[1].parse().unwrap()) };
            assert_eq!(peer_text(&peer), row[2], "{row:?}");
        }
    }

    /// tests/vectors/write_timeout.txt, which refork.serving.connection.write_timeout_line is held
    /// to as well (the rows that cut a connection: an HTTP/2 stream is the Python loops' only).
    #[test]
    fn the_shared_write_timeout_vectors() {
        for row in crate::vectors::rows(include_str!("../../../tests/vectors/write_timeout.txt")) {
            if row[4] != "connection cut" {
                continue;
            }
            let peer = if row[0] == "-" { Peer::Unix } else { Peer::Inet(row[0].clone(), row[1].parse().unwrap()) };
            let mut conn = Conn::new(-1, peer, -1, 0, 0.0);
            conn.writing = (row[2] != "-").then(|| row[2].clone());
            assert_eq!(conn.write_timeout_line(row[3].parse().unwrap()), row[5], "{row:?}");
        }
    }
}
