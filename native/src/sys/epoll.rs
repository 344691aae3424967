//! epoll: the native loops' readiness.

use std::io;
use std::mem::MaybeUninit;

use super::check;

pub struct Epoll {
    pub fd: libc::c_int,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        Ok(Epoll { fd: check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })? })
    }

    fn ctl(&self, op: libc::c_int, fd: libc::c_int, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: fd as u64 };
        check(unsafe { libc::epoll_ctl(self.fd, op, fd, &mut ev) }).map(|_| ())
    }

    pub fn add(&self, fd: libc::c_int, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events)
    }

    pub fn modify(&self, fd: libc::c_int, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events)
    }

    pub fn delete(&self, fd: libc::c_int) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0);
    }
}

/// Ready fds of epoll `epfd` and their events into `out`; EINTR gives an error of that kind.
pub fn epoll_wait(epfd: libc::c_int, out: &mut Vec<(libc::c_int, u32)>, timeout_ms: i32) -> io::Result<()> {
    // not zeroed: the kernel writes the first n (zeroing 3 KiB was a memset per wait, per request
    // when requests come one at a time)
    let mut evs: [MaybeUninit<libc::epoll_event>; 256] = [const { MaybeUninit::uninit() }; 256];
    let n = check(unsafe { libc::epoll_wait(epfd, evs.as_mut_ptr().cast(), evs.len() as i32, timeout_ms) })?;
    out.clear();
    for ev in &evs[..n as usize] {
        let ev = unsafe { ev.assume_init_read() };
        out.push((ev.u64 as libc::c_int, ev.events));
    }
    Ok(())
}

impl Drop for Epoll {
    /// Close only: after a fork the epoll instance is shared with the parent, whose
    /// registrations a DEL here would remove.
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}
