//! The pool's I/O thread: accept, read, parse, the deadlines and slow writes, the --static
//! answers the static cache holds (static_files/); never the GIL.
//!
//! Every connection is registered with EPOLLONESHOT: an event disarms it, so a connection an app
//! thread serves gets no event here, and the app thread re-arms it when it gives it back (into
//! `Shared::returned`, which this thread empties before it looks at its events or its deadlines).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{log_notice, Shared, IN, OUT};
use crate::conn::intake::{Next, Preface};
use crate::conn::listen::Listeners;
use crate::conn::scratch::Scratch;
use crate::conn::sweep::{sweep, Expired, Timeouts};
use crate::conn::{describe, Conn, FileBody, FileOwner, Phase};
use crate::http::head::Head;
use crate::static_files::{replay, Reply};
use crate::sys;
use crate::wsgi::accounting::SlotClock;

const TICK: f64 = 1.0; // seconds between two sweeps (a quarter of it while draining)

/// What became of a --static answer the I/O thread sent (`Io::replay_static`).
enum Replayed {
    /// all out (`keep`: the connection stays open)
    Sent { keep: bool },
    /// the rest waits in the connection for the client to take it
    Waiting { keep: bool },
    /// the client is gone
    Failed,
}

pub(crate) struct Io {
    shared: Arc<Shared>,
    /// where the --static answers replayed here are counted (None: none are)
    statics: Option<SlotClock>,
    listeners: Listeners,
    conns: HashMap<i32, Conn>,
    timeouts: Timeouts,
    drain_until: f64,
    timeout_response: Vec<u8>,
    scratch: Scratch,
    events: Vec<(i32, u32)>,
}

impl Io {
    pub fn new(shared: Arc<Shared>, listeners: Vec<i32>, timeouts: Timeouts, timeout_response: Vec<u8>, statics: Option<SlotClock>) -> Io {
        let scratch = Scratch::new(shared.intake.read_size);
        Io {
            shared,
            statics,
            listeners: Listeners::new(listeners),
            conns: HashMap::new(),
            timeouts,
            drain_until: 0.0,
            timeout_response,
            scratch,
            events: Vec::with_capacity(256),
        }
    }

    /// The thread's loop, until `Shared::pause`; returns its state for the next start.
    pub fn run(mut self) -> Io {
        let mut next_sweep = sys::monotonic() + TICK;
        loop {
            if self.shared.pause.load(Ordering::Acquire) {
                return self;
            }
            let ms = ((next_sweep - sys::monotonic()) * 1000.0).ceil().clamp(0.0, 1000.0) as i32;
            let mut events = std::mem::take(&mut self.events);
            let waited = sys::epoll_wait(self.shared.ep.fd, &mut events, ms);
            self.take_returned();
            self.hold_accepts();
            if waited.is_ok() {
                for &(fd, _) in &events {
                    self.on_event(fd);
                }
            }
            self.events = events;
            let now = sys::monotonic();
            if now >= next_sweep {
                self.sweep(now);
                next_sweep = now + if self.drain_until > 0.0 { TICK / 4.0 } else { TICK };
            }
        }
    }

    fn on_event(&mut self, fd: i32) {
        if fd == self.shared.io_wake.fd {
            self.shared.io_wake.drain();
        } else if let Some(i) = self.listeners.event(fd) {
            if self.listeners.accepting() {
                let free = self.shared.free().max(1); // none free: accepting only when nobody has one
                self.accept(i, self.shared.intake.accept_batch.min(free));
            }
        } else if let Some(conn) = self.conns.remove(&fd) {
            if conn.phase == Phase::Writing {
                self.on_writable(conn);
            } else {
                self.on_readable(conn);
            }
        } else {
            let lingering = super::locked(&self.shared.lingering).on_readable(fd);
            match lingering {
                Some(true) => self.shared.close_fd(fd),
                Some(false) if self.shared.ep.modify(fd, IN).is_err() => {
                    super::locked(&self.shared.lingering).forget(fd);
                    self.shared.close_fd(fd);
                }
                _ => {}
            }
        }
    }

    /// Accept only while an app thread is free, or no other worker has one (see Listeners::hold;
    /// with none free anywhere a connection has nowhere better to go). `full` is set before the
    /// count is read again, so an app thread that frees one meanwhile sees it and wakes this one.
    fn hold_accepts(&mut self) {
        if self.shared.free() > 0 || !self.shared.free_elsewhere() {
            self.shared.full.store(false, Ordering::Release);
            self.listeners.hold(&self.shared.ep, false);
            return;
        }
        self.shared.full.store(true, Ordering::Release);
        let full = self.shared.free() == 0;
        if !full {
            self.shared.full.store(false, Ordering::Release);
        }
        self.listeners.hold(&self.shared.ep, full);
    }

    fn take_returned(&mut self) {
        let mut returned = super::locked(&self.shared.returned);
        for conn in returned.drain(..) {
            self.conns.insert(conn.fd, conn);
        }
    }

    fn accept(&mut self, i: usize, batch: usize) {
        let (shared, conns) = (&self.shared, &mut self.conns);
        let now = sys::monotonic();
        let taken = self.listeners.accept(&shared.ep, i, batch, now, |fd, peer, lfd| {
            if shared.ep.add(fd, IN).is_err() {
                sys::close(fd);
                return Ok::<(), ()>(());
            }
            shared.open.fetch_add(1, Ordering::AcqRel);
            conns.insert(fd, Conn::new(fd, peer, lfd, i, now));
            Ok(())
        });
        if let Ok(Some(line)) = taken {
            log_notice(shared, true, line);
        }
    }

    fn keep(&mut self, conn: Conn, events: u32) {
        if self.shared.ep.modify(conn.fd, events).is_err() {
            self.shared.close(conn);
            return;
        }
        self.conns.insert(conn.fd, conn);
    }

    fn on_readable(&mut self, mut conn: Conn) {
        let mut buf = self.scratch.for_read(&mut conn);
        match sys::recv(conn.fd, &mut buf, self.shared.intake.read_size) {
            Ok(0) => {
                self.scratch.recycle(buf);
                self.shared.close(conn);
            }
            Ok(n) => {
                if std::mem::replace(&mut conn.fresh, false) && self.shared.intake.hands_h2c(&buf[buf.len() - n..]) {
                    let data = self.scratch.keep(buf, 0);
                    self.shared.hand_over(conn, data);
                    return;
                }
                self.process(conn, buf);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                conn.buf = self.scratch.keep(buf, 0);
                self.keep(conn, IN);
            }
            Err(_) => {
                self.scratch.recycle(buf);
                self.shared.close(conn);
            }
        }
    }

    /// What `buf` (non-empty) starts with: a request for the app threads, more to wait for, or
    /// the Python loop's; a --static answer the cache holds is sent from here, and what was
    /// pipelined behind it looked at next.
    fn process(&mut self, conn: Conn, buf: Vec<u8>) {
        let Some((mut conn, mut buf)) = self.preface(conn, buf) else { return };
        loop {
            let intake = &self.shared.intake;
            let (replayed, used) = match intake.next(&mut conn, &buf) {
                Next::Request(head, n) => match if n == 0 { self.replay_static(&mut conn, &head) } else { None } {
                    Some(replayed) => (replayed, head.len),
                    None => {
                        conn.buf = self.scratch.keep(buf, 0);
                        intake.keep(&mut conn, true); // (until an app thread takes it)
                        self.shared.dispatch(conn);
                        return;
                    }
                },
                Next::Wait => {
                    conn.buf = self.scratch.keep(buf, 0);
                    if intake.keep(&mut conn, false) {
                        self.keep(conn, IN);
                    } else {
                        let data = std::mem::take(&mut conn.buf);
                        self.shared.hand_over(conn, data);
                    }
                    return;
                }
                Next::HandOver => {
                    let data = self.scratch.keep(buf, 0);
                    self.shared.hand_over(conn, data);
                    return;
                }
            };
            conn.release(); // (the request is answered: its bytes are charged no more)
            match replayed {
                Replayed::Failed => {
                    self.scratch.recycle(buf);
                    return self.shared.close(conn);
                }
                Replayed::Waiting { keep } => {
                    // the rest when the client takes it (on_writable), then what it pipelined
                    conn.close_after = !keep;
                    conn.buf = self.scratch.keep(buf, used);
                    return self.keep(conn, OUT);
                }
                Replayed::Sent { keep: false } => {
                    self.scratch.recycle(buf);
                    return self.shared.end(conn);
                }
                Replayed::Sent { keep: true } if used == buf.len() => {
                    self.scratch.recycle(buf);
                    conn.idle();
                    return self.keep(conn, IN);
                }
                Replayed::Sent { keep: true } => {
                    conn.phase = Phase::Idle; // (the next request's clocks start now)
                    buf = self.scratch.keep(buf, used);
                }
            }
        }
    }

    /// The answer the static cache holds for `head` (static_files/), sent from this thread: no
    /// app thread, no GIL, counted in the worker's slot (refork_static_requests_total's 2xx);
    /// None when there is none (an app thread's request then).
    fn replay_static(&self, conn: &mut Conn, head: &Head) -> Option<Replayed> {
        let statics = self.statics.as_ref()?;
        let keep = head.keep_alive && self.shared.keep_alive.load(Ordering::Acquire);
        let Reply { bytes, file } = replay(head, keep)?;
        statics.count_static(200);
        let Some((file, size)) = file else {
            return Some(match sys::send(conn.fd, &bytes) {
                Ok(n) if n == bytes.len() => Replayed::Sent { keep },
                Ok(n) => {
                    conn.keep_output(bytes, n, describe(head));
                    Replayed::Waiting { keep }
                }
                Err(_) => Replayed::Failed, // the client is gone
            });
        };
        // the head with MSG_MORE, then sendfile, as far as the socket takes them
        conn.keep_output(bytes, 0, describe(head));
        conn.file = Some(Box::new(FileBody { fd: file.as_raw_fd(), offset: 0, remaining: size, owner: FileOwner::Static(file) }));
        Some(match conn.write_on() {
            Ok(true) => {
                conn.file = None;
                Replayed::Sent { keep }
            }
            Ok(false) => Replayed::Waiting { keep },
            Err(_) => Replayed::Failed,
        })
    }

    /// A fresh connection's PROXY header (conn/intake.rs `Intake::preface`): the connection and what
    /// follows the header when a request may be in it; None when it waits or is closed.
    fn preface(&mut self, mut conn: Conn, mut buf: Vec<u8>) -> Option<(Conn, Vec<u8>)> {
        if !conn.preface {
            return Some((conn, buf));
        }
        match self.shared.intake.preface(&mut conn, &mut buf) {
            Preface::Ready if !buf.is_empty() => return Some((conn, buf)),
            Preface::Ready | Preface::Wait => {
                conn.buf = self.scratch.keep(buf, 0);
                self.keep(conn, IN);
            }
            Preface::Refused(refusal) => {
                let _ = sys::send(conn.fd, self.shared.intake.refusal(refusal.forbidden));
                self.scratch.recycle(buf);
                self.shared.end(conn);
                log_notice(&self.shared, false, refusal.line);
            }
        }
        None
    }

    /// The client read some of a waiting response: write on; once it is out, go on with what
    /// was pipelined behind it.
    fn on_writable(&mut self, mut conn: Conn) {
        match conn.write_on() {
            Ok(true) => conn.file = None, // (a static answer's file: closed)
            Ok(false) => return self.keep(conn, OUT),
            Err(_) => return self.shared.close(conn),
        }
        if conn.close_after {
            return self.shared.end(conn);
        }
        let buf = std::mem::take(&mut conn.buf);
        if buf.is_empty() {
            self.keep(conn, IN);
        } else {
            self.process(conn, buf);
        }
    }

    fn sweep(&mut self, now: f64) {
        self.listeners.resume(&self.shared.ep, now);
        self.take_returned();
        for (conn, why) in sweep(&mut self.conns, &self.timeouts, now, self.drain_until) {
            match why {
                Expired::RequestTimeout => {
                    let _ = sys::send(conn.fd, &self.timeout_response);
                }
                Expired::WriteTimeout => {
                    log_notice(&self.shared, false, conn.write_timeout_line(self.timeouts.write));
                }
                Expired::Close => {}
            }
            if why == Expired::WriteTimeout {
                self.shared.close(conn);
            } else {
                self.shared.end(conn);
            }
        }
        let lingered = super::locked(&self.shared.lingering).expired(now);
        for fd in lingered {
            self.shared.close_fd(fd);
        }
    }

    /// See PoolEngine.drain (the thread is paused).
    pub fn drain(&mut self, drain_until: f64, take_backlog: bool) {
        self.drain_until = drain_until;
        if take_backlog && self.listeners.accepting() {
            for i in self.listeners.places() {
                self.accept(i, usize::MAX);
            }
        }
        self.listeners.close(&self.shared.ep); // (the Python loop closes the sockets)
    }

    /// In a forked child: the fds of every connection (the parent's), forgotten here.
    pub fn forget(&mut self) -> Vec<i32> {
        self.listeners.forget();
        self.conns.drain().map(|(fd, _)| fd).collect()
    }

    /// Every connection this thread holds, out of it.
    pub fn take_all(&mut self) -> Vec<Conn> {
        self.take_returned();
        self.conns.drain().map(|(_, c)| c).collect()
    }
}
