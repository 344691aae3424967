//! The pool's I/O thread: accept, read, parse, the deadlines and slow writes; never the GIL.
//!
//! Every connection is registered with EPOLLONESHOT: an event disarms it, so a connection an app
//! thread serves gets no event here, and the app thread re-arms it when it gives it back (into
//! `Shared::returned`, which this thread empties before it looks at its events or its deadlines).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{log_notice, Shared, IN, OUT};
use crate::conn::{sweep, Conn, Expired, Next, Phase, Timeouts, RECV};
use crate::sys;

const ACCEPT_BATCH: usize = 8; // per wake-up: more would starve sibling workers on the listener
const TICK: f64 = 1.0; // seconds between two sweeps (a quarter of it while draining)

pub(crate) struct Io {
    shared: Arc<Shared>,
    listeners: Vec<i32>,
    accepting: bool,
    accept_paused_until: f64,
    conns: HashMap<i32, Conn>,
    timeouts: Timeouts,
    drain_until: f64,
    timeout_response: Vec<u8>,
    scratch: Vec<u8>,
    events: Vec<(i32, u32)>,
}

impl Io {
    pub fn new(shared: Arc<Shared>, listeners: Vec<i32>, timeouts: Timeouts, timeout_response: Vec<u8>) -> Io {
        Io {
            shared,
            listeners,
            accepting: true,
            accept_paused_until: 0.0,
            conns: HashMap::new(),
            timeouts,
            drain_until: 0.0,
            timeout_response,
            scratch: Vec::with_capacity(RECV),
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
        } else if let Some(i) = self.listeners.iter().position(|&l| l == fd) {
            if self.accepting {
                self.accept(i, ACCEPT_BATCH);
            }
        } else if let Some(conn) = self.conns.remove(&fd) {
            if conn.phase == Phase::Writing {
                self.on_writable(conn);
            } else {
                self.on_readable(conn);
            }
        }
    }

    fn take_returned(&mut self) {
        let mut returned = super::locked(&self.shared.returned);
        for conn in returned.drain(..) {
            self.conns.insert(conn.fd, conn);
        }
    }

    fn accept(&mut self, i: usize, batch: usize) {
        let lfd = self.listeners[i];
        let now = sys::monotonic();
        for _ in 0..batch {
            let (fd, peer) = match sys::accept(lfd) {
                Ok(got) => got,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => return,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNABORTED) | Some(libc::EPROTO)) => continue,
                Err(e) => {
                    // out of fds or memory (or worse): back off instead of spinning on a ready listener
                    log_notice(&self.shared, true, format!("accept() failed: {e}; pausing accepts for a second"));
                    for l in &self.listeners {
                        self.shared.ep.delete(*l);
                    }
                    self.accepting = false;
                    self.accept_paused_until = now + 1.0;
                    return;
                }
            };
            if self.shared.ep.add(fd, IN).is_err() {
                sys::close(fd);
                continue;
            }
            self.shared.open.fetch_add(1, Ordering::AcqRel);
            self.conns.insert(fd, Conn::new(fd, peer, lfd, i, now));
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
        let mut buf = if conn.buf.is_empty() { std::mem::take(&mut self.scratch) } else { std::mem::take(&mut conn.buf) };
        match sys::recv(conn.fd, &mut buf, RECV) {
            Ok(0) => {
                self.recycle(buf);
                self.shared.close(conn);
            }
            Ok(_) => {
                conn.fresh = false;
                self.process(conn, buf);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                conn.buf = self.own(buf);
                self.keep(conn, IN);
            }
            Err(_) => {
                self.recycle(buf);
                self.shared.close(conn);
            }
        }
    }

    /// The bytes of `buf` as a buffer of their own (the scratch buffer stays here).
    fn own(&mut self, buf: Vec<u8>) -> Vec<u8> {
        if buf.capacity() > 4 * buf.len().max(1024) {
            let copy = buf.clone();
            self.recycle(buf);
            copy
        } else {
            buf
        }
    }

    fn recycle(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() >= RECV && buf.capacity() <= 4 * RECV && self.scratch.capacity() < RECV {
            buf.clear();
            self.scratch = buf;
        }
    }

    /// What `buf` (non-empty) starts with: a request for the app threads, more to wait for, or
    /// the Python loop's.
    fn process(&mut self, mut conn: Conn, buf: Vec<u8>) {
        match self.shared.intake.next(&mut conn, &buf) {
            Next::Request(..) => {
                conn.buf = self.own(buf);
                self.shared.dispatch(conn);
            }
            Next::Wait => {
                conn.buf = self.own(buf);
                self.keep(conn, IN);
            }
            Next::HandOver => {
                let data = self.own(buf);
                self.shared.hand_over(conn, data);
            }
        }
    }

    /// The client read some of a waiting response: write on; once it is out, go on with what
    /// was pipelined behind it.
    fn on_writable(&mut self, mut conn: Conn) {
        match conn.write_on() {
            Ok(true) => {}
            Ok(false) => return self.keep(conn, OUT),
            Err(_) => return self.shared.close(conn),
        }
        if conn.close_after {
            return self.shared.close(conn);
        }
        let buf = std::mem::take(&mut conn.buf);
        if buf.is_empty() {
            self.keep(conn, IN);
        } else {
            self.process(conn, buf);
        }
    }

    fn sweep(&mut self, now: f64) {
        if self.accept_paused_until > 0.0 && now >= self.accept_paused_until {
            self.accept_paused_until = 0.0;
            for l in &self.listeners {
                let _ = self.shared.ep.add(*l, libc::EPOLLIN as u32);
            }
            self.accepting = !self.listeners.is_empty();
        }
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
            self.shared.close(conn);
        }
    }

    /// See PoolEngine.drain (the thread is paused).
    pub fn drain(&mut self, drain_until: f64, take_backlog: bool) {
        self.drain_until = drain_until;
        if take_backlog && self.accepting {
            for i in 0..self.listeners.len() {
                self.accept(i, usize::MAX);
            }
        }
        for l in &self.listeners {
            self.shared.ep.delete(*l);
        }
        self.listeners.clear(); // the Python loop closes the sockets
        self.accepting = false;
    }

    /// In a forked child: the fds of every connection (the parent's), forgotten here.
    pub fn forget(&mut self) -> Vec<i32> {
        self.listeners.clear();
        self.conns.drain().map(|(fd, _)| fd).collect()
    }

    /// Every connection this thread holds, out of it.
    pub fn take_all(&mut self) -> Vec<Conn> {
        self.take_returned();
        self.conns.drain().map(|(_, c)| c).collect()
    }
}
