//! An eventfd: one thread wakes another's epoll.

use std::io;

use super::check;

/// An eventfd: one thread wakes another's epoll (non-blocking, close-on-exec).
pub struct EventFd {
    pub fd: libc::c_int,
}

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        Ok(EventFd { fd: check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })? })
    }

    /// Make it readable (until drained).
    pub fn notify(&self) {
        let one: u64 = 1;
        unsafe { libc::write(self.fd, &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Readable no more.
    pub fn drain(&self) {
        let mut n: u64 = 0;
        unsafe { libc::read(self.fd, &mut n as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}
