//! The native loops' lingering close (refork.serving.lingering, the same rule): a connection they
//! are done with (its last response out, a refusal, a 408, an idle one) is shut for writing and
//! stays in their epoll, its reads dropped, until the client's FIN, LINGER_DROP bytes or LINGER
//! seconds. Closing it with input unread (a request written a moment after the answer) would send
//! a reset, which can destroy the answer unread and shows the client ECONNRESET, not EOF.
//!
//! Only the fds and their clocks are kept here; the loop polls them and closes what ends.

use std::collections::HashMap;

use crate::sys;

/// Seconds a lingering connection is kept at most (refork.serving.http2.LINGER).
pub const LINGER: f64 = 1.0;

#[derive(Default)]
pub struct Lingering {
    /// fd -> (since, bytes dropped)
    socks: HashMap<i32, (f64, usize)>,
}

impl Lingering {
    /// Shut `fd` for writing and drop what waits; true when it lingers (keep it polled for reads),
    /// false when it is over already (the caller closes it).
    pub fn begin(&mut self, fd: i32, now: f64) -> bool {
        let mut dropped = 0;
        if sys::shut_write(fd).is_err() || sys::drop_input(fd, &mut dropped) {
            return false;
        }
        self.socks.insert(fd, (now, dropped));
        true
    }

    /// `fd` is readable: None when it is not lingering; Some(true) when it is over (no longer
    /// kept: the caller closes it), Some(false) when it lingers on.
    pub fn on_readable(&mut self, fd: i32) -> Option<bool> {
        let (_, dropped) = self.socks.get_mut(&fd)?;
        if sys::drop_input(fd, dropped) {
            self.socks.remove(&fd);
            return Some(true);
        }
        Some(false)
    }

    /// Keep `fd` no longer (the caller could not poll it: it closes it).
    pub fn forget(&mut self, fd: i32) {
        self.socks.remove(&fd);
    }

    /// The fds that lingered LINGER, no longer kept (the caller closes them).
    pub fn expired(&mut self, now: f64) -> Vec<i32> {
        let over: Vec<i32> = self.socks.iter().filter(|(_, (since, _))| now - since >= LINGER).map(|(fd, _)| *fd).collect();
        for fd in &over {
            self.socks.remove(fd);
        }
        over
    }

    /// Every fd, no longer kept (the worker is done, or a forked child forgets them).
    pub fn take_all(&mut self) -> Vec<i32> {
        self.socks.drain().map(|(fd, _)| fd).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.socks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (i32, i32) {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0, fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    }

    #[test]
    fn drops_reads_until_the_peer_closes() {
        let (ours, theirs) = pair();
        let mut lingering = Lingering::default();
        assert!(lingering.begin(ours, 0.0));
        let mut buf = [0u8; 4];
        assert_eq!(unsafe { libc::recv(theirs, buf.as_mut_ptr() as *mut libc::c_void, 4, 0) }, 0); // our FIN
        assert_eq!(sys::send(theirs, b"late").unwrap(), 4);
        assert_eq!(lingering.on_readable(ours), Some(false)); // dropped, lingers on
        assert_eq!(lingering.on_readable(theirs), None);
        sys::close(theirs);
        assert_eq!(lingering.on_readable(ours), Some(true));
        assert!(lingering.is_empty());
        sys::close(ours);
    }

    #[test]
    fn lets_go_after_linger() {
        let (ours, theirs) = pair();
        let mut lingering = Lingering::default();
        assert!(lingering.begin(ours, 10.0));
        assert!(lingering.expired(10.5).is_empty());
        assert_eq!(lingering.expired(10.0 + LINGER), vec![ours]);
        assert!(lingering.is_empty());
        sys::close(ours);
        sys::close(theirs);
    }
}
