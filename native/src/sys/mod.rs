//! The few system calls the native loops make, as safe functions returning io::Result.

use std::io;

mod epoll;
mod eventfd;
mod socket;

pub use epoll::{epoll_wait, Epoll};
pub use eventfd::EventFd;
pub use socket::{accept, drop_input, has_input, recv, send, send_more, sendfile, shut_write, Peer};

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// time.monotonic(): CLOCK_MONOTONIC in seconds (the Python loop's clock, so `since` values move
/// between the two loops unchanged).
pub fn monotonic() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Read a non-blocking fd until nothing is left (a wake-up fd's bytes).
pub fn drain(fd: libc::c_int) {
    let mut buf = [0u8; 64];
    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

pub fn close(fd: libc::c_int) {
    unsafe { libc::close(fd) };
}

/// In a child forked at a safe point: the fd now points at /dev/null (see
/// refork.serving.connection.release_after_fork).
pub fn release(fds: impl Iterator<Item = libc::c_int>) {
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if null < 0 {
        return;
    }
    for fd in fds {
        unsafe { libc::dup2(null, fd) };
    }
    unsafe { libc::close(null) };
}
