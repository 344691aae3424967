//! The in-memory transport the `h2` crate's connection reads and writes: an input buffer the
//! Python side fills (whole frames only, from the prefilter) and an output buffer it drains. A
//! read with nothing buffered is `Pending`; a write always takes everything.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The bytes between the loop and the connection: `input` not read by the crate yet, `output`
/// written by it and not taken yet.
#[derive(Default)]
pub struct Buffers {
    pub input: Vec<u8>,
    pub read_at: usize,
    pub output: Vec<u8>,
}

impl Buffers {
    /// Input the crate has not read yet.
    pub fn unread(&self) -> usize {
        self.input.len() - self.read_at
    }
}

/// A handle on the shared buffers; the connection owns one, the driver another.
#[derive(Clone, Default)]
pub struct Pipe(Arc<Mutex<Buffers>>);

impl Pipe {
    pub fn lock(&self) -> MutexGuard<'_, Buffers> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AsyncRead for Pipe {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut b = self.lock();
        let n = b.unread().min(buf.remaining());
        if n == 0 {
            return Poll::Pending; // (the driver polls again once the loop has fed bytes)
        }
        let at = b.read_at;
        buf.put_slice(&b.input[at..at + n]);
        b.read_at += n;
        if b.read_at == b.input.len() {
            b.input = Vec::new(); // (its room given back: a connection waiting holds no read's worth)
            b.read_at = 0;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.lock().output.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(self: Pin<&mut Self>, _: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let mut b = self.lock();
        let mut n = 0;
        for s in bufs {
            b.output.extend_from_slice(s);
            n += s.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncRead;

    #[test]
    fn reads_what_was_fed_then_pends_and_writes_everything() {
        let pipe = Pipe::default();
        pipe.lock().input.extend_from_slice(b"abcdef");
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut space = [0u8; 4];
        let mut buf = ReadBuf::new(&mut space);
        let mut p = pipe.clone();
        assert!(Pin::new(&mut p).poll_read(&mut cx, &mut buf).is_ready());
        assert_eq!(buf.filled(), b"abcd");
        let mut space = [0u8; 4];
        let mut buf = ReadBuf::new(&mut space);
        assert!(Pin::new(&mut p).poll_read(&mut cx, &mut buf).is_ready());
        assert_eq!(buf.filled(), b"ef");
        assert!(Pin::new(&mut p).poll_read(&mut cx, &mut buf).is_pending());
        assert!(matches!(Pin::new(&mut p).poll_write(&mut cx, b"out"), Poll::Ready(Ok(3))));
        assert_eq!(pipe.lock().output, b"out");
    }
}
