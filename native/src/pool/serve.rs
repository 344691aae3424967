//! An app thread's part of the pool: a connection whose buffer starts with a complete request.
//! The request accounted (the worker's Python clock: several requests are in the app at once),
//! the app called (wsgi/app_call.rs), the whole body framed, the access-log line; then the one `send`, and the
//! connection given back to the I/O thread, or its next pipelined request served here.

use std::sync::atomic::Ordering;

use pyo3::prelude::*;

use super::{locked, PoolEngine, Shared, IN, OUT};
use crate::conn::intake::Next;
use crate::conn::{describe, Conn, Phase};
use crate::http::head::fast_head;
use crate::sys;
use crate::wsgi::access_log::AccessLog;
use crate::wsgi::accounting::PyTracking;
use crate::wsgi::app_call::{input_stream, method_str, split_target, AppCall};
use crate::wsgi::hand_over::{HandOver, Standing};

/// What became of a request's response once the app returned.
enum Answer {
    /// framed here: to send
    Send { bytes: Vec<u8>, keep: bool },
    /// sent by the Python response path (a generator, a file, write(), an error...)
    Sent { keep: bool },
}

impl PoolEngine {
    /// Serve `conn`'s request, and what it pipelined behind it while it is complete and common.
    pub(super) fn serve(&self, py: Python<'_>, mut conn: Conn) -> PyResult<()> {
        loop {
            let buf = std::mem::take(&mut conn.buf);
            let (answer, used) = match self.answer(py, &mut conn, &buf) {
                Ok(done) => done,
                Err(e) => {
                    self.shared.close(conn);
                    return Err(e);
                }
            };
            // (the GIL kept: one non-blocking send costs less than handing the GIL to another
            // app thread and waiting to get it back)
            match self.shared.after(conn, buf, used, answer) {
                Some(next) => conn = next,
                None => return Ok(()),
            }
        }
    }

    /// Call the app for the request at the start of `buf`; also the bytes it took. Its socket is
    /// in `in_app` meanwhile (until its response is framed or sent: nothing of it went out).
    fn answer(&self, py: Python<'_>, conn: &mut Conn, buf: &[u8]) -> PyResult<(Answer, usize)> {
        let _in_app = InApp::enter(&self.shared, conn.fd);
        let side = &self.side;
        let head = fast_head(&side.limits, buf).expect("a request the I/O thread found complete");
        let n = head.content_length.unwrap_or(0) as usize;
        let (raw_head, body) = (&buf[..head.len], &buf[head.len..head.len + n]);
        let method = method_str(py, &head);
        let (control, current) = (&side.host.control, &side.refs.current);
        let tracking = PyTracking::start(py, control, current, &method, split_target(&head).0)?;
        let started: Py<PyAny> = match side.host.access_log {
            Some(_) => side.refs.perf_counter.bind(py).call0()?.unbind(),
            None => py.None(),
        };
        let keep_alive = self.shared.keep_alive.load(Ordering::Acquire);
        let call = AppCall {
            app: side.host.app.bind(py),
            environ: side.environs[conn.environ].get(),
            hooks: &side.hooks,
            keep_alive,
            sends_files: false, // (the I/O thread never takes the GIL to close the file)
        };
        let called = input_stream(py, body, &side.refs.empty_input, &side.refs.make_input)
            .and_then(|input| Ok((call.call(py, conn, &head, raw_head, &method, &input)?, input)));
        let (mut called, input) = match called {
            Ok(done) => done,
            Err(e) => {
                tracking.finish(control, current, 0)?;
                return Err(e);
            }
        };
        let used = head.len + n;
        let Some((status, bytes, length, keep)) = called.framed.take() else {
            // the Python response path, on this thread: it writes, blocking, and accounts the request
            tracking.leave(current)?;
            let standing = Standing { token: tracking.token, started: &started, keep_alive, rest: b"" };
            let keep: bool = HandOver::finish(side.host.finish_response.bind(py), conn, called, &input, standing)?.extract()?;
            return Ok((Answer::Sent { keep }, used));
        };
        // the line first: gunicorn's post_request hook runs there, inside the request's --timeout
        let logged = match &side.host.access_log {
            Some(log) => AccessLog { log, log_access: &side.refs.log_access, perf_counter: &side.refs.perf_counter }.write(py, &called, &started, status, length),
            None => Ok(()),
        };
        tracking.finish(control, current, status)?;
        if !body.is_empty() {
            side.refs.close_input.bind(py).call1((input,))?;
        }
        logged?;
        Ok((Answer::Send { bytes, keep }, used))
    }
}

/// A request's socket in `Shared::in_app` while this lives.
struct InApp<'a> {
    shared: &'a Shared,
    fd: i32,
}

impl<'a> InApp<'a> {
    fn enter(shared: &'a Shared, fd: i32) -> Self {
        locked(&shared.in_app).push(fd);
        InApp { shared, fd }
    }
}

impl Drop for InApp<'_> {
    fn drop(&mut self) {
        let mut fds = locked(&self.shared.in_app);
        if let Some(i) = fds.iter().position(|&fd| fd == self.fd) {
            fds.swap_remove(i);
        }
    }
}

impl Shared {
    /// After the app: send the response, then the connection's next request to serve on
    /// this thread (Some), or the connection given back, handed over or closed (None).
    fn after(&self, mut conn: Conn, buf: Vec<u8>, used: usize, answer: Answer) -> Option<Conn> {
        let keep = match answer {
            Answer::Sent { keep } => keep,
            Answer::Send { bytes, keep } => match sys::send(conn.fd, &bytes) {
                Ok(n) if n == bytes.len() => keep,
                Ok(n) => {
                    // the rest waits for the client (the I/O thread writes it), what it pipelined too
                    let what = fast_head(&self.intake.limits, &buf).map(|h| describe(&h)).unwrap_or_default();
                    conn.keep_output(bytes, n, what);
                    conn.close_after = !keep;
                    conn.buf = buf[used..].to_vec();
                    self.give_back(conn, OUT);
                    return None;
                }
                Err(_) => false, // the client is gone
            },
        };
        if !keep {
            self.end(conn);
            return None;
        }
        let rest = &buf[used..];
        if rest.is_empty() {
            conn.idle();
            self.give_back(conn, IN);
            return None;
        }
        conn.phase = Phase::Idle; // (the next request's clocks start now)
        match self.intake.next(&mut conn, rest) {
            Next::Request(..) => {
                conn.buf = rest.to_vec();
                if self.holding.load(Ordering::Acquire) {
                    self.dispatch(conn); // parked until the safe point is over
                    return None;
                }
                Some(conn)
            }
            Next::Wait => {
                conn.buf = rest.to_vec();
                self.give_back(conn, IN);
                None
            }
            Next::HandOver => {
                self.hand_over(conn, rest.to_vec());
                None
            }
        }
    }
}
