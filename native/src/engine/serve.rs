//! The engine's request path: one complete request, the app called (wsgi/app_call.rs), its response
//! written, the request accounted (in the slot natively, or by the control's calls).

use pyo3::prelude::*;

use super::{Engine, Served, OUT};
use crate::conn::{describe, Conn, FileBody, FileOwner, Phase};
use crate::http::head::Head;
use crate::sys;
use crate::wsgi::access_log::AccessLog;
use crate::wsgi::accounting::PyTracking;
use crate::wsgi::app_call::{input_stream, method_str, recycle, split_target, AppCall, Called};
use crate::wsgi::hand_over::{HandOver, Standing};

/// How a request is accounted: in the slot natively (the worker's AppClock gives its words), or
/// by the control's request_started / request_finished (its token in refork.deadlines.current).
enum Tracking<'py> {
    Native,
    Python(PyTracking<'py>),
}

impl Engine {
    /// One complete request: the app called, its response written (or queued in `conn.out`).
    pub(super) fn serve(&mut self, py: Python<'_>, conn: &mut Conn, head: &Head, raw_head: &[u8], body: &[u8], rest: &[u8]) -> PyResult<Served> {
        if let Some(served) = self.replay_static(py, conn, head, body)? {
            return Ok(served); // a --static answer recorded before (static_replay.rs)
        }
        let method = method_str(py, head);
        let (path, _) = split_target(head);
        let tracking = match (&self.clock, &self.request) {
            (Some(clock), Some(request)) => {
                let now = sys::monotonic();
                clock.start(now);
                request.borrow_mut(py).start(now, head.method, path);
                Tracking::Native
            }
            _ => Tracking::Python(PyTracking::start(py, &self.host.control, &self.refs.current, &method, path)?),
        };
        let started: Py<PyAny> = match self.host.access_log {
            Some(_) => self.refs.perf_counter.bind(py).call0()?.unbind(),
            None => py.None(),
        };
        let input = input_stream(py, body, &self.refs.empty_input, &self.refs.make_input)?;
        let call = AppCall {
            app: self.host.app.bind(py),
            environ: self.environs[conn.environ].get(),
            hooks: &self.hooks,
            keep_alive: self.keep_alive,
            sends_files: true,
        };
        let mut called = match call.call_with(py, conn, head, raw_head, &method, &input, &mut self.spare) {
            Ok(called) => called,
            Err(e) => {
                self.finish(py, tracking, 0)?;
                return Err(e);
            }
        };
        let Some((status, bytes, length, mut keep)) = called.framed.take() else {
            self.finish_slow(py, conn, called, tracking, &input, &started, rest)?;
            return Ok(Served::HandedOver);
        };
        if let Some(file) = called.file.take() {
            keep &= self.send_file(py, conn, bytes, file, head);
        } else {
            keep &= self.send_bytes(conn, bytes, head);
        }
        self.finish(py, tracking, status)?;
        if !body.is_empty() {
            self.refs.close_input.bind(py).call1((input,))?;
        }
        if let Some(log) = &self.host.access_log {
            AccessLog { log, log_access: &self.refs.log_access, perf_counter: &self.refs.perf_counter }.write(py, &called, &started, status, length)?;
        }
        recycle(called, &mut self.spare);
        Ok(if keep { Served::Keep } else { Served::Close })
    }

    /// A response in `bytes`, as far as the socket takes it; the rest waits in the connection
    /// (EPOLLOUT). False: the connection cannot go on (the client is gone).
    pub(super) fn send_bytes(&mut self, conn: &mut Conn, bytes: Vec<u8>, head: &Head) -> bool {
        match sys::send(conn.fd, &bytes) {
            Ok(n) if n == bytes.len() => true,
            Ok(n) => {
                conn.keep_output(bytes, n, describe(head));
                if self.ep.modify(conn.fd, OUT).is_err() {
                    conn.phase = Phase::Idle;
                    return false;
                }
                true
            }
            Err(_) => false, // the client is gone
        }
    }

    /// A file response: its head with MSG_MORE, then sendfile, as far as the socket takes them;
    /// the rest waits in the connection (EPOLLOUT), the file with it. False: the connection
    /// cannot go on (the client is gone, or the file ended before its length).
    pub(super) fn send_file(&mut self, py: Python<'_>, conn: &mut Conn, head_bytes: Vec<u8>, file: FileBody, head: &Head) -> bool {
        conn.keep_output(head_bytes, 0, describe(head));
        conn.file = Some(Box::new(file));
        match conn.write_on() {
            Ok(true) => {
                self.close_file(py, conn);
                true
            }
            Ok(false) => self.ep.modify(conn.fd, OUT).is_ok() || self.stop_writing(py, conn),
            Err(_) => self.stop_writing(py, conn),
        }
    }

    /// A response cannot be written on: nothing waits any more (the connection is to close).
    fn stop_writing(&mut self, py: Python<'_>, conn: &mut Conn) -> bool {
        conn.out = Vec::new();
        conn.out_at = 0;
        conn.writing = None;
        conn.phase = Phase::Idle;
        self.close_file(py, conn);
        false
    }

    /// The file a response was sent from is done with (sent, or its connection ends): its
    /// wrapper's close() (PEP 3333), an error in it logged.
    pub(super) fn close_file(&mut self, py: Python<'_>, conn: &mut Conn) {
        let Some(file) = conn.file.take() else { return };
        let FileOwner::App(owner) = &file.owner else { return }; // (a static file: closed as dropped)
        let owner = owner.bind(py);
        let closed = match owner.getattr(pyo3::intern!(py, "close")) {
            Ok(close) => close.call0().map(drop),
            Err(_) => Ok(()),
        };
        if let Err(e) = closed {
            let _ = self.refs.log_error.bind(py).call1((format!("closing a file response failed: {e}"),));
        }
    }

    /// A response the engine does not frame: the Python response path sends it
    /// (host.finish_response), and the Python loop takes the connection with it.
    #[allow(clippy::too_many_arguments)]
    fn finish_slow<'py>(
        &mut self,
        py: Python<'py>,
        conn: &mut Conn,
        called: Called<'py>,
        tracking: Tracking<'py>,
        input: &Bound<'py, PyAny>,
        started: &Py<PyAny>,
        rest: &[u8],
    ) -> PyResult<()> {
        self.ep.delete(conn.fd);
        self.yield_now = true;
        let token = match tracking {
            Tracking::Python(t) => {
                t.leave(&self.refs.current)?;
                t.token
            }
            Tracking::Native => {
                let current = self.request.as_ref().expect("native tracking").bind(py);
                let token = current.call1((true,))?;
                current.borrow_mut().end(); // the Python loop finishes it, with this token
                token
            }
        };
        let standing = Standing { token, started, keep_alive: self.keep_alive, rest };
        HandOver::finish(self.host.finish_response.bind(py), conn, called, input, standing)?;
        Ok(())
    }

    /// The request is answered (`status` 0: nothing was sent): account it.
    fn finish(&mut self, py: Python<'_>, tracking: Tracking<'_>, status: u32) -> PyResult<()> {
        let control = &self.host.control;
        match tracking {
            Tracking::Python(t) => t.finish(control, &self.refs.current, status)?,
            Tracking::Native => {
                let (token, began) = self.request.as_ref().expect("native tracking").borrow_mut(py).end();
                if let Some(token) = token {
                    control.request_finished.bind(py).call1((token, status))?;
                } else if let Some(clock) = &self.clock {
                    let served = clock.finish(began, sys::monotonic(), status);
                    if let Some(requests_served) = control.requests_served.as_ref().filter(|_| served >= self.next_check) {
                        self.yield_now = true;
                        self.next_check = requests_served.bind(py).call1((served,))?.extract()?;
                        if self.next_check <= 0 {
                            self.next_check = i64::MAX;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
