//! The loop's read buffer, lent to a connection only while it holds part of a request.

use super::{Conn, RECV};

/// A loop's one read buffer: a read goes into it unless the connection holds part of a request
/// already, so an idle connection holds no buffer.
pub(crate) struct Scratch {
    buf: Vec<u8>,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch { buf: Vec::with_capacity(RECV) }
    }

    /// The buffer to read `conn`'s next bytes into: its own, or the scratch one.
    pub fn for_read(&mut self, conn: &mut Conn) -> Vec<u8> {
        std::mem::take(if conn.buf.is_empty() { &mut self.buf } else { &mut conn.buf })
    }

    /// What stays with a connection of `buf` from `at` (the rest of a request): a little of a big
    /// buffer is copied out, and the big one serves the next read.
    pub fn keep(&mut self, mut buf: Vec<u8>, at: usize) -> Vec<u8> {
        let rest = buf.len() - at;
        if rest == 0 {
            self.recycle(buf);
            Vec::new()
        } else if rest * 4 < buf.capacity() {
            let kept = buf[at..].to_vec();
            self.recycle(buf);
            kept
        } else {
            buf.drain(..at);
            buf
        }
    }

    /// A buffer no longer needed: the scratch one again if it is one's size.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() >= RECV && buf.capacity() <= 4 * RECV && self.buf.capacity() < RECV {
            buf.clear();
            self.buf = buf;
        }
    }
}
