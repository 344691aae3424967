//! The few system calls the engine makes, as safe functions returning io::Result.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

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
    let mut evs: [libc::epoll_event; 256] = unsafe { std::mem::zeroed() };
    let n = check(unsafe { libc::epoll_wait(epfd, evs.as_mut_ptr(), evs.len() as i32, timeout_ms) })?;
    out.clear();
    for ev in &evs[..n as usize] {
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

/// The peer of an accepted connection.
pub enum Peer {
    Inet(String, u16),
    Unix,
}

/// accept4 (non-blocking, close-on-exec); TCP_NODELAY on TCP connections.
pub fn accept(listener: libc::c_int) -> io::Result<(libc::c_int, Peer)> {
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let fd = check(unsafe {
        libc::accept4(
            listener,
            &mut storage as *mut _ as *mut libc::sockaddr,
            &mut len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    })?;
    let peer = match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            let a: &libc::sockaddr_in = unsafe { &*(&storage as *const _ as *const libc::sockaddr_in) };
            Peer::Inet(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).to_string(), u16::from_be(a.sin_port))
        }
        libc::AF_INET6 => {
            let a: &libc::sockaddr_in6 = unsafe { &*(&storage as *const _ as *const libc::sockaddr_in6) };
            Peer::Inet(Ipv6Addr::from(a.sin6_addr.s6_addr).to_string(), u16::from_be(a.sin6_port))
        }
        _ => Peer::Unix,
    };
    if let Peer::Inet(..) = peer {
        let one: libc::c_int = 1;
        unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                &one as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    Ok((fd, peer))
}

/// recv into the spare capacity of `buf` (at most `max` bytes); Ok(0): end of stream.
pub fn recv(fd: libc::c_int, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.capacity() - buf.len();
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().add(buf.len()) as *mut libc::c_void, spare.min(max), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    unsafe { buf.set_len(buf.len() + n as usize) };
    Ok(n as usize)
}

/// send without SIGPIPE; WouldBlock counts as 0 bytes taken.
pub fn send(fd: libc::c_int, data: &[u8]) -> io::Result<usize> {
    let n = unsafe { libc::send(fd, data.as_ptr() as *const libc::c_void, data.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// Bytes (or a FIN) wait to be read.
pub fn has_input(fd: libc::c_int) -> bool {
    let mut b = [0u8; 1];
    let n = unsafe { libc::recv(fd, b.as_mut_ptr() as *mut libc::c_void, 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n > 0
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
