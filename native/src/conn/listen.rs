//! The listening sockets a native loop accepts on (the Python loop owns them and closes them):
//! accepting in batches, backing off for a second when accepting fails for a reason that is not
//! the client's (out of fds or memory), and letting go of them when the worker stops. Shared by
//! the engine (engine/) and the pool's I/O thread (pool/io.rs).

use std::io::ErrorKind;

use crate::sys::{self, Epoll, Peer};

pub(crate) struct Listeners {
    /// in the order of the loop's Environs
    fds: Vec<i32>,
    /// registered in the loop's epoll and accepted from (not while paused or full, nor once closed)
    accepting: bool,
    closed: bool,
    paused_until: f64,
    /// no app thread is free (`hold`): accept nothing, other workers take the connections
    full: bool,
}

impl Listeners {
    /// `fds`, already registered (EPOLLIN) in the loop's epoll.
    pub fn new(fds: Vec<i32>) -> Listeners {
        Listeners { fds, accepting: true, closed: false, paused_until: 0.0, full: false }
    }

    /// The place of a listening fd in the constructor's list (its Environ); kept once closed, to
    /// place the connections the Python loop gives back.
    pub fn place(&self, fd: i32) -> Option<usize> {
        self.fds.iter().position(|&l| l == fd)
    }

    /// An event of `fd`: its place if it is a listener (then accept, if `accepting`).
    pub fn event(&self, fd: i32) -> Option<usize> {
        if self.closed {
            return None;
        }
        self.place(fd)
    }

    pub fn accepting(&self) -> bool {
        self.accepting
    }

    /// Accept up to `batch` connections on the listener at `place`, each given to `take` (fd,
    /// peer, listener fd); an error of `take` ends the batch. On a failure that is not the
    /// client's, stop accepting for a second: Some(the line to log).
    pub fn accept<E>(
        &mut self,
        ep: &Epoll,
        place: usize,
        batch: usize,
        now: f64,
        mut take: impl FnMut(i32, Peer, i32) -> Result<(), E>,
    ) -> Result<Option<String>, E> {
        let lfd = self.fds[place];
        for _ in 0..batch {
            let (fd, peer) = match sys::accept(lfd) {
                Ok(got) => got,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => break,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNABORTED) | Some(libc::EPROTO)) => continue,
                Err(e) => {
                    // out of fds or memory (or worse): back off instead of spinning on a ready listener
                    for l in &self.fds {
                        ep.delete(*l);
                    }
                    self.accepting = false;
                    self.paused_until = now + 1.0;
                    return Ok(Some(format!("accept() failed: {e}; pausing accepts for a second")));
                }
            };
            take(fd, peer, lfd)?;
        }
        Ok(None)
    }

    /// At the sweep: accept again once a pause is over.
    pub fn resume(&mut self, ep: &Epoll, now: f64) {
        if self.paused_until > 0.0 && now >= self.paused_until {
            self.paused_until = 0.0;
            if !self.closed && !self.full {
                self.register(ep);
            }
        }
    }

    /// Every app thread is busy (`full`), or one is free again: a worker accepts only connections
    /// it can start serving, so the kernel offers the rest to its siblings (as Puma's reactor
    /// waits for a free thread). A request queued behind hung ones would be lost with them.
    pub fn hold(&mut self, ep: &Epoll, full: bool) {
        if full == self.full {
            return;
        }
        self.full = full;
        if self.closed || self.paused_until > 0.0 {
            return; // not registered either way; resume() looks at `full`
        }
        if full {
            for l in &self.fds {
                ep.delete(*l);
            }
            self.accepting = false;
        } else {
            self.register(ep);
        }
    }

    fn register(&mut self, ep: &Epoll) {
        for l in &self.fds {
            let _ = ep.add(*l, libc::EPOLLIN as u32);
        }
        self.accepting = true;
    }

    /// The worker stops: accept no more.
    pub fn close(&mut self, ep: &Epoll) {
        if !self.closed {
            for l in &self.fds {
                ep.delete(*l);
            }
        }
        self.closed = true;
        self.accepting = false;
    }

    /// In a child forked at a safe point: the loop is the parent's (its epoll too: nothing is
    /// deregistered); accept no more.
    pub fn forget(&mut self) {
        self.closed = true;
        self.accepting = false;
    }

    /// Every place, for a drain that takes the whole backlog first.
    pub fn places(&self) -> std::ops::Range<usize> {
        0..self.fds.len()
    }
}
