//! The loop's read buffer, lent to a connection only while it holds part of a request.

use super::Conn;

/// A loop's one read buffer: a read goes into it unless the connection holds part of a request
/// already, so an idle connection holds no buffer.
pub(crate) struct Scratch {
    buf: Vec<u8>,
    /// what one recv() asks (the settings' read_size): the buffer's size
    size: usize,
}

impl Scratch {
    pub fn new(size: usize) -> Scratch {
        Scratch { buf: Vec::with_capacity(size), size }
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
        let size = self.size;
        if buf.capacity() >= size && buf.capacity() <= 4 * size && self.buf.capacity() < size {
            buf.clear();
            self.buf = buf;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Peer;

    const RECV: usize = 1 << 16;

    fn conn() -> Conn {
        Conn::new(-1, Peer::Unix, -1, 0, 0.0)
    }

    #[test]
    fn an_idle_connection_reads_into_the_scratch_buffer() {
        let mut scratch = Scratch::new(RECV);
        let mut c = conn();
        let buf = scratch.for_read(&mut c);
        assert!(buf.capacity() >= RECV && buf.is_empty());
        assert_eq!(scratch.buf.capacity(), 0); // lent out
        // a connection holding part of a request reads on into its own
        c.buf = b"GET / HT".to_vec();
        let own = scratch.for_read(&mut c);
        assert_eq!(own, b"GET / HT");
        assert!(c.buf.is_empty());
    }

    #[test]
    fn nothing_left_the_buffer_goes_back() {
        let mut scratch = Scratch::new(RECV);
        let mut buf = scratch.for_read(&mut conn());
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let n = buf.len();
        assert!(scratch.keep(buf, n).is_empty());
        assert!(scratch.buf.capacity() >= RECV && scratch.buf.is_empty());
    }

    #[test]
    fn a_little_left_of_a_big_buffer_is_copied_out() {
        let mut scratch = Scratch::new(RECV);
        let mut buf = scratch.for_read(&mut conn());
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\nGET /next");
        let kept = scratch.keep(buf, 18);
        assert_eq!(kept, b"GET /next");
        assert!(kept.capacity() < RECV);
        assert!(scratch.buf.capacity() >= RECV); // the big one serves the next read
    }

    #[test]
    fn much_left_keeps_the_buffer_itself() {
        let mut scratch = Scratch::new(RECV);
        let mut buf = scratch.for_read(&mut conn());
        buf.resize(RECV, b'x');
        let kept = scratch.keep(buf, 10);
        assert_eq!(kept.len(), RECV - 10);
        assert!(kept.capacity() >= RECV);
        assert_eq!(scratch.buf.capacity(), 0); // still lent: the next read gets a new one
        assert_eq!(scratch.keep(Vec::new(), 0).capacity(), 0);
    }

    #[test]
    fn only_a_buffer_of_its_size_becomes_the_scratch_one() {
        let mut scratch = Scratch { buf: Vec::new(), size: RECV };
        scratch.recycle(Vec::with_capacity(100));
        assert_eq!(scratch.buf.capacity(), 0);
        scratch.recycle(Vec::with_capacity(8 * RECV)); // a flood's buffer is let go
        assert_eq!(scratch.buf.capacity(), 0);
        let mut used = Vec::with_capacity(2 * RECV);
        used.extend_from_slice(b"old bytes");
        scratch.recycle(used);
        assert!(scratch.buf.capacity() >= 2 * RECV && scratch.buf.is_empty());
        // one is enough
        let before = scratch.buf.as_ptr();
        scratch.recycle(Vec::with_capacity(RECV));
        assert_eq!(scratch.buf.as_ptr(), before);
    }
}
