//! The connection loop of a single-thread WSGI worker, in Rust (`--wsgi-loop native`).
//!
//! The Python loop (refork.serving.wsgi.python_loop, with refork.serving.wsgi.native_parts) stays
//! the outer loop: it owns the worker's control socket, TLS listeners, ticks, the drain and the safe
//! points, and its host (refork.serving.wsgi.engine_host) calls `run()` in place of its own poll. `run()` waits on the engine's epoll, which also watches the Python loop's epoll fd
//! (`outer`): it returns when that one is ready, after a signal, or when its timeout ends. In
//! between, every request of the common shape (http/head.rs) is served here: accept, recv,
//! httparse, the environ (wsgi/environ.rs), the app called with the native start_response
//! (wsgi/start_response.rs), a list body framed (http/frame.rs) and written with one `send`. A
//! response the socket does not take whole waits in the connection's buffer (EPOLLOUT) and
//! pipelined requests behind it wait for it. A `wsgi.file_wrapper` with its Content-Length is
//! sent here too: the framed head, then sendfile (conn/mod.rs `FileBody`), waiting the same way.
//!
//! Anything else is handed to the Python loop with the bytes not yet consumed, from the first
//! byte of the message: a head that is not the common shape (the Python parser then gives the
//! verdict: same rejections, limits and status codes), a body over the in-memory threshold
//! (spooled by Python), a health check, a head over HEAD_WAIT bytes still
//! incomplete. `run()` returns those (conn/handed.rs: each with its unconsumed bytes and what of
//! the worker's budget they are charged, given back once the Python loop read them). A
//! response whose whole body the engine does not frame (a stream, write(), an error, a file
//! without Content-Length) is finished by the Python loop too (`host.finish_response`), which takes the connection with it.
//! Once it is between two requests again, the Python loop gives it back (`adopt`).
//!
//! The GIL is released only around epoll_wait. The engine starts no thread.

use std::io;

use pyo3::prelude::*;

mod serve;
mod static_replay;

use crate::conn::handed::Handed;
use crate::conn::intake::{Intake, Next, Preface};
use crate::conn::lingering::Lingering;
use crate::conn::listen::Listeners;
use crate::conn::scratch::Scratch;
use crate::conn::sweep::{sweep, Expired, Timeouts};
use crate::conn::{Conn, Conns, Phase};
use crate::host::{AppClock, Host, Refs};
use crate::sys;
use crate::wsgi::accounting::{Current, SlotClock};
use crate::wsgi::app_call::Spare;
use crate::wsgi::environ::Environ;
use crate::wsgi::start_response::Hooks;

const IN: u32 = libc::EPOLLIN as u32;
const OUT: u32 = libc::EPOLLOUT as u32;
/// Wake-ups one run() serves at most before the Python loop's turn (within its timeout). With a
/// signal wake-up fd (`watch_signals`) each wait may block: a signal makes it readable, so the
/// Python loop sees its handler's flags at once. Without one, the waits after the first only look
/// (timeout 0) and the run ends when nothing is ready: a signal's handler, or a flag it set, waits
/// at most this many rounds of ready work. Either way the Python loop's iteration is not paid per
/// wake-up.
const ROUNDS: usize = 64;

enum Served {
    Keep,
    Close,
    HandedOver,
}

#[pyclass(module = "refork._native", unsendable)]
pub struct Engine {
    ep: sys::Epoll,
    outer: i32,
    listeners: Listeners,
    /// the Environ of each listener, by its place in `listeners`
    environs: Vec<Py<Environ>>,
    conns: Conns,
    /// the connections closed lingering (conn/lingering.rs), still in `ep`
    lingering: Lingering,
    intake: Intake,
    timeouts: Timeouts,
    drain_until: f64,
    keep_alive: bool,
    host: Host,
    refs: Refs,
    hooks: Py<Hooks>,
    /// the worker's slot, when its control has an AppClock (else request_started/finished)
    clock: Option<SlotClock>,
    request: Option<Py<Current>>,
    next_check: i64,
    events: Vec<(i32, u32)>,
    handed: Vec<Py<Handed>>,
    /// the buffer a read goes into when its connection holds no partial request
    scratch: Scratch,
    /// the Python loop has news (a response it finishes, a --max-requests / --refork-after
    /// check): run() returns after this wake-up
    yield_now: bool,
    /// the last request's StartResponse, for the next (wsgi/app_call.rs `recycle`)
    spare: Option<Spare>,
    /// the read end of the process's signal wake-up fd (`watch_signals`), or -1
    signals: i32,
}

#[pymethods]
impl Engine {
    /// Engine(host, listeners, refs): `host` is the engine host that owns the Python loop (what
    /// the engine reads of it: host.rs), `listeners` [(fd, Environ)] its plain listening sockets,
    /// `refs` a dict of what the engine calls in refork (see refork.serving.wsgi.native_host).
    #[new]
    fn new(py: Python<'_>, host: Host, listeners: Vec<(i32, Py<Environ>)>, refs: Refs) -> PyResult<Self> {
        let ep = sys::Epoll::new()?;
        ep.add(host.poller, IN)?;
        for (fd, _) in &listeners {
            ep.add(*fd, IN)?;
        }
        let intake = Intake::new(&host, py)?;
        let scratch = Scratch::new(intake.read_size);
        let hooks = Hooks::new(py, &host, &refs);
        let (clock, request) = match &host.control.clock {
            Some(_) if host.control.requests_served.is_none() => {
                return Err(pyo3::exceptions::PyTypeError::new_err("a control with a clock has requests_served"));
            }
            Some(app_clock) => {
                let app_clock = app_clock.bind(py);
                let AppClock { native_words, adopt, use_engine_request } = app_clock.extract()?;
                let words = native_words.bind(py).call0()?;
                let current = Py::new(py, Current::new(adopt))?;
                use_engine_request.bind(py).call1((current.clone_ref(py),))?;
                (Some(SlotClock::new(words.cast::<pyo3::types::PyDict>()?)?), Some(current))
            }
            None => (None, None),
        };
        Ok(Engine {
            ep,
            outer: host.poller,
            listeners: Listeners::new(listeners.iter().map(|(fd, _)| *fd).collect()),
            environs: listeners.into_iter().map(|(_, environ)| environ).collect(),
            conns: Conns::default(),
            lingering: Lingering::default(),
            intake,
            timeouts: host.settings.timeouts,
            drain_until: 0.0,
            keep_alive: true,
            hooks: Py::new(py, hooks)?,
            clock,
            request,
            next_check: 1,
            host,
            refs,
            events: Vec::with_capacity(256),
            handed: Vec::new(),
            scratch,
            yield_now: false,
            spare: None,
            signals: -1,
        })
    }

    /// Wait up to `timeout` seconds for events and serve them, then what is ready since (ROUNDS),
    /// until the Python loop's epoll is ready or a signal came.
    /// `keep_alive` False: every response says "Connection: close" (a stopping worker).
    /// Returns (connections handed to the Python loop, whether its epoll is ready).
    fn run(&mut self, py: Python<'_>, timeout: f64, keep_alive: bool) -> PyResult<(Vec<Py<Handed>>, bool)> {
        self.keep_alive = keep_alive;
        self.yield_now = false;
        let timeout = timeout.clamp(0.0, 3600.0);
        let to_ms = |s: f64| (s * 1000.0).ceil() as i32;
        let mut ms = to_ms(timeout);
        let deadline = if self.signals >= 0 { sys::monotonic() + timeout } else { 0.0 };
        let mut events = std::mem::take(&mut self.events);
        let epfd = self.ep.fd;
        let mut outer_ready = false;
        let mut result = Ok(());
        for _ in 0..ROUNDS {
            // (a wait that may block releases the GIL)
            let waited = if ms == 0 { sys::epoll_wait(epfd, &mut events, 0) } else { py.detach(|| sys::epoll_wait(epfd, &mut events, ms)) };
            match waited {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    self.events = events;
                    py.check_signals()?;
                    return Ok((std::mem::take(&mut self.handed), true));
                }
                Err(e) => {
                    self.events = events;
                    return Err(e.into());
                }
            }
            if events.is_empty() {
                break;
            }
            result = self.on_events(py, &events, &mut outer_ready);
            if result.is_err() || outer_ready || self.yield_now || !self.handed.is_empty() {
                break;
            }
            ms = if self.signals >= 0 { to_ms(deadline - sys::monotonic()).max(0) } else { 0 };
        }
        self.events = events;
        result?;
        Ok((std::mem::take(&mut self.handed), outer_ready))
    }

    /// `fd`: the read end of the process's signal wake-up fd (signal.set_wakeup_fd), non-blocking:
    /// run() then returns as soon as a signal came, whatever it is doing (see ROUNDS).
    fn watch_signals(&mut self, fd: i32) -> PyResult<()> {
        self.ep.add(fd, IN)?;
        self.signals = fd;
        Ok(())
    }

    /// The worker stops: accept no more; `take_backlog` (the whole server stops): first accept
    /// every connection queued in the backlog. Idle connections close at `drain_until` (a fresh
    /// one keeps its keep-alive clock: see refork.serving.connection.Timeouts.expiry).
    fn drain(&mut self, py: Python<'_>, drain_until: f64, take_backlog: bool) -> PyResult<()> {
        self.drain_until = drain_until;
        self.keep_alive = false;
        if take_backlog && self.listeners.accepting() {
            for i in self.listeners.places() {
                self.accept(py, i, usize::MAX)?;
            }
        }
        self.listeners.close(&self.ep); // (the Python loop closes the sockets)
        Ok(())
    }

    /// The once-a-second sweep: the deadlines of refork.serving.connection (same rules).
    fn sweep(&mut self, py: Python<'_>, now: f64) -> PyResult<()> {
        self.listeners.resume(&self.ep, now);
        for (conn, why) in sweep(&mut self.conns, &self.timeouts, now, self.drain_until) {
            match why {
                Expired::RequestTimeout => {
                    let _ = sys::send(conn.fd, self.refs.timeout_response.bind(py).as_bytes());
                }
                Expired::WriteTimeout => {
                    self.refs.log_warning.bind(py).call1((conn.write_timeout_line(self.timeouts.write),))?;
                }
                Expired::Close => {}
            }
            if why == Expired::WriteTimeout {
                self.close(conn);
            } else {
                self.end(conn);
            }
        }
        for fd in self.lingering.expired(now) {
            self.ep.delete(fd);
            sys::close(fd);
        }
        Ok(())
    }

    /// A connection of `listener_fd` the Python loop gives back between two requests (see
    /// refork.serving.wsgi.native_host.NativeHost.take_back).
    fn adopt(&mut self, fd: i32, client: Bound<'_, PyAny>, listener_fd: i32, since: f64) -> PyResult<()> {
        let environ = self.listeners.place(listener_fd).ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not a listener of the engine"))?;
        let conn = Conn::adopted(fd, &client, listener_fd, environ, since)?;
        if let Err(e) = self.ep.add(fd, IN) {
            sys::close(fd);
            return Err(e.into());
        }
        self.conns.insert(fd, conn);
        Ok(())
    }

    /// The engine accounts its requests in the worker's slot itself (see wsgi/accounting.rs).
    #[getter]
    fn accounts(&self) -> bool {
        self.clock.is_some()
    }

    /// No connection is left (a draining worker may stop).
    #[getter]
    fn idle(&self) -> bool {
        self.conns.is_empty() && self.lingering.is_empty()
    }

    /// In a child forked at a safe point: the client sockets are the parent's (see
    /// refork.serving.connection.release_after_fork); forget them and the listeners.
    fn release_after_fork(&mut self) {
        sys::release(self.conns.keys().copied().chain(self.lingering.take_all()));
        self.conns.clear();
        self.listeners.forget();
    }

    /// The worker is done: close every connection (the listeners are the Python loop's).
    fn close_all(&mut self, py: Python<'_>) {
        for (_, mut conn) in std::mem::take(&mut self.conns) {
            self.close_file(py, &mut conn);
            sys::close(conn.fd);
        }
        for fd in self.lingering.take_all() {
            sys::close(fd);
        }
    }
}

impl Engine {
    /// Serve one wait's events; `outer_ready`: the Python loop's epoll was among them.
    fn on_events(&mut self, py: Python<'_>, events: &[(i32, u32)], outer_ready: &mut bool) -> PyResult<()> {
        for &(fd, ev) in events {
            if fd == self.outer {
                *outer_ready = true;
            } else if fd == self.signals {
                sys::drain(fd);
                *outer_ready = true; // (the Python loop looks at what the handlers set)
            } else if let Some(i) = self.listeners.event(fd) {
                if self.listeners.accepting() {
                    self.accept(py, i, self.intake.accept_batch)?;
                }
            } else if let Some(conn) = self.conns.remove(&fd) {
                if conn.phase == Phase::Writing {
                    self.on_writable(py, conn)?;
                } else if ev & (IN | libc::EPOLLERR as u32 | libc::EPOLLHUP as u32) != 0 {
                    self.on_readable(py, conn)?;
                } else {
                    self.conns.insert(fd, conn);
                }
            } else if self.lingering.on_readable(fd) == Some(true) {
                self.ep.delete(fd);
                sys::close(fd);
            }
        }
        Ok(())
    }

    fn accept(&mut self, py: Python<'_>, i: usize, batch: usize) -> PyResult<()> {
        let (ep, conns) = (&self.ep, &mut self.conns);
        let now = sys::monotonic();
        let failed = self.listeners.accept(ep, i, batch, now, |fd, peer, lfd| {
            if let Err(e) = ep.add(fd, IN) {
                sys::close(fd);
                return Err(e);
            }
            conns.insert(fd, Conn::new(fd, peer, lfd, i, now));
            Ok(())
        })?;
        if let Some(line) = failed {
            self.refs.log_error.bind(py).call1((line,))?;
        }
        Ok(())
    }

    fn close(&mut self, mut conn: Conn) {
        if conn.file.is_some() {
            Python::attach(|py| self.close_file(py, &mut conn));
        }
        self.ep.delete(conn.fd);
        sys::close(conn.fd);
    }

    /// Close a connection the engine is done with lingering (conn/lingering.rs): what its client
    /// still sends is dropped, never answered with a reset.
    fn end(&mut self, mut conn: Conn) {
        if conn.file.is_some() {
            Python::attach(|py| self.close_file(py, &mut conn));
        }
        if self.ep.modify(conn.fd, IN).is_err() || !self.lingering.begin(conn.fd, sys::monotonic()) {
            self.close(conn);
        }
    }

    /// Give a connection to the Python loop with `data`, its unconsumed bytes.
    fn hand_over(&mut self, py: Python<'_>, mut conn: Conn, data: &[u8]) -> PyResult<()> {
        self.ep.delete(conn.fd);
        self.handed.push(Handed::new(py, &mut conn, &self.intake.memory, data)?);
        Ok(())
    }

    fn on_readable(&mut self, py: Python<'_>, mut conn: Conn) -> PyResult<()> {
        let mut buf = self.scratch.for_read(&mut conn);
        match sys::recv(conn.fd, &mut buf, self.intake.read_size) {
            Ok(0) => {
                self.scratch.recycle(buf);
                self.close(conn);
                Ok(())
            }
            Ok(n) => {
                if std::mem::replace(&mut conn.fresh, false) && self.intake.hands_h2c(&buf[buf.len() - n..]) {
                    let data = self.scratch.keep(buf, 0);
                    return self.hand_over(py, conn, &data);
                }
                self.process(py, conn, buf)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                conn.buf = self.scratch.keep(buf, 0);
                self.conns.insert(conn.fd, conn);
                Ok(())
            }
            Err(_) => {
                self.scratch.recycle(buf);
                self.close(conn);
                Ok(())
            }
        }
    }

    /// The client read some of a waiting response: write on; once it is out, go on with what
    /// was pipelined behind it.
    fn on_writable(&mut self, py: Python<'_>, mut conn: Conn) -> PyResult<()> {
        match conn.write_on() {
            Ok(true) => self.close_file(py, &mut conn),
            Ok(false) => {
                self.conns.insert(conn.fd, conn);
                return Ok(());
            }
            Err(_) => {
                self.close(conn);
                return Ok(());
            }
        }
        if conn.close_after {
            self.end(conn);
            return Ok(());
        }
        if self.ep.modify(conn.fd, IN).is_err() {
            self.close(conn);
            return Ok(());
        }
        let buf = std::mem::take(&mut conn.buf);
        self.process(py, conn, buf)
    }

    /// Serve what `conn.buf` holds: complete requests in order, then wait for more bytes.
    fn process(&mut self, py: Python<'_>, mut conn: Conn, mut buf: Vec<u8>) -> PyResult<()> {
        if conn.preface {
            match self.intake.preface(&mut conn, &mut buf) {
                Preface::Ready => {}
                Preface::Wait => {
                    conn.buf = self.scratch.keep(buf, 0);
                    self.conns.insert(conn.fd, conn);
                    return Ok(());
                }
                Preface::Refused(refusal) => {
                    let _ = sys::send(conn.fd, self.intake.refusal(refusal.forbidden));
                    self.scratch.recycle(buf);
                    self.end(conn);
                    self.refs.log_warning.bind(py).call1((refusal.line,))?;
                    return Ok(());
                }
            }
        }
        let mut at = 0;
        loop {
            let data = &buf[at..];
            if data.is_empty() {
                if conn.phase != Phase::Writing {
                    conn.idle();
                }
                break;
            }
            if conn.phase == Phase::Writing {
                break; // pipelined: answered once the response before it is out
            }
            let (head, n) = match self.intake.next(&mut conn, data) {
                Next::Request(head, n) => {
                    conn.release(); // served now: not waiting any more (charged again if kept)
                    (head, n)
                }
                Next::Wait => break,
                Next::HandOver => return self.hand_over(py, conn, data),
            };
            let rest = &data[head.len + n..];
            match self.serve(py, &mut conn, &head, &data[..head.len], &data[head.len..head.len + n], rest)? {
                Served::HandedOver => return Ok(()),
                Served::Keep => at += head.len + n,
                Served::Close => {
                    if conn.phase == Phase::Writing {
                        conn.close_after = true;
                        break;
                    }
                    self.end(conn);
                    return Ok(());
                }
            }
        }
        conn.buf = self.scratch.keep(buf, at);
        let writing = conn.phase == Phase::Writing; // (bytes behind a response: kept, charged)
        if conn.buf.is_empty() {
            conn.release();
        } else if !self.intake.keep(&mut conn, writing) {
            let data = std::mem::take(&mut conn.buf);
            return self.hand_over(py, conn, &data);
        }
        self.conns.insert(conn.fd, conn);
        Ok(())
    }
}
