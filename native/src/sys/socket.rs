//! The client sockets: accept, recv, send, and a peek for bytes waiting.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::check;

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

/// recv into the spare capacity of `buf` (at most `max` bytes; grown by `max` only when it has
/// none, so a buffer reserved for a whole request is not grown past it); Ok(0): end of stream.
pub fn recv(fd: libc::c_int, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    if buf.capacity() == buf.len() {
        buf.reserve(max);
    }
    let spare = buf.capacity() - buf.len();
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().add(buf.len()) as *mut libc::c_void, spare.min(max), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    unsafe { buf.set_len(buf.len() + n as usize) };
    Ok(n as usize)
}

/// Bytes a lingering connection reads and drops at most (refork.serving.lingering.LINGER_DROP).
const LINGER_DROP: usize = 1 << 18;

/// Shut the write side: a FIN after what is written (conn/lingering.rs).
pub fn shut_write(fd: libc::c_int) -> io::Result<()> {
    if unsafe { libc::shutdown(fd, libc::SHUT_WR) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Read and drop what waits, counted in `dropped`; true when the connection is over: the client's
/// FIN, an error, or LINGER_DROP bytes dropped (conn/lingering.rs).
pub fn drop_input(fd: libc::c_int, dropped: &mut usize) -> bool {
    let mut buf = [0u8; 1 << 14];
    while *dropped < LINGER_DROP {
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted);
        }
        if n == 0 {
            return true;
        }
        *dropped += n as usize;
    }
    true
}

/// send without SIGPIPE; WouldBlock counts as 0 bytes taken.
pub fn send(fd: libc::c_int, data: &[u8]) -> io::Result<usize> {
    send_flags(fd, data, 0)
}

/// send, more to follow (MSG_MORE: the kernel holds a partial segment for the bytes after it).
pub fn send_more(fd: libc::c_int, data: &[u8]) -> io::Result<usize> {
    send_flags(fd, data, libc::MSG_MORE)
}

fn send_flags(fd: libc::c_int, data: &[u8], flags: libc::c_int) -> io::Result<usize> {
    let n = unsafe { libc::send(fd, data.as_ptr() as *const libc::c_void, data.len(), libc::MSG_NOSIGNAL | flags) };
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

/// sendfile(2) of up to `count` bytes of `file` from `*offset` (moved on) to the socket `fd`:
/// Ok(None) when the socket would block, Ok(Some(0)) when the file has ended.
pub fn sendfile(fd: libc::c_int, file: libc::c_int, offset: &mut i64, count: usize) -> io::Result<Option<usize>> {
    let mut off: libc::off_t = *offset as libc::off_t;
    let n = unsafe { libc::sendfile(fd, file, &mut off, count.min(1 << 30)) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    *offset = off as i64;
    Ok(Some(n as usize))
}
