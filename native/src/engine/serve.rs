//! The engine's request path: one complete request, the app called, its response written, the
//! request accounted (in the slot natively, or by the control's calls).

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use super::{Conn, Engine, Phase, Served, OUT};
use crate::environ::Parts;
use crate::frame::frame_response;
use crate::parser::{fast_method, Head};
use crate::respond::StartResponse;
use crate::sys;

/// How a request is accounted: in the slot natively (the worker's AppClock gives its words), or
/// by the control's request_started / request_finished (its token in refork.deadlines.current).
enum Tracking<'py> {
    Native,
    Python { token: Bound<'py, PyAny>, reset: Bound<'py, PyAny> },
}

impl Engine {
    /// One complete request: the app called, its response written (or queued in `conn.out`).
    pub(super) fn serve(&mut self, py: Python<'_>, conn: &mut Conn, head: &Head, raw_head: &[u8], body: &[u8], rest: &[u8]) -> PyResult<Served> {
        let method = fast_method(py, head.method).expect("a fast method").clone();
        let (path, query) = match head.target.iter().position(|&b| b == b'?') {
            Some(i) => (&head.target[..i], &head.target[i + 1..]),
            None => (head.target, &b""[..]),
        };
        let control = self.control.clone_ref(py).into_bound(py);
        let tracking = match (&self.clock, &self.request) {
            (Some(clock), Some(request)) => {
                let now = sys::monotonic();
                clock.start(now);
                request.borrow_mut(py).start(now, head.method, path);
                Tracking::Native
            }
            _ => {
                let token = control.call_method1(pyo3::intern!(py, "request_started"), (&method, PyBytes::new(py, path)))?;
                let current = self.current.bind(py);
                let reset = current.call_method1(pyo3::intern!(py, "set"), (&token,))?;
                Tracking::Python { token, reset }
            }
        };
        let started: PyObject = match self.access_log {
            Some(_) => self.perf_counter.bind(py).call0()?.unbind(),
            None => py.None(),
        };
        let input = if body.is_empty() {
            self.empty_input.bind(py).clone()
        } else {
            self.make_input.bind(py).call1((PyBytes::new(py, body),))?
        };
        let outcome = self.call_app(py, conn, head, raw_head, &method, path, query, &input, &tracking, &started, rest);
        let (status, length, keep, request, environ) = match outcome {
            Ok(Some(done)) => done,
            Ok(None) => {
                if let Tracking::Python { reset, .. } = &tracking {
                    self.current.bind(py).call_method1(pyo3::intern!(py, "reset"), (reset,))?;
                }
                return Ok(Served::HandedOver);
            }
            Err(e) => {
                self.finish(py, tracking, 0)?;
                return Err(e);
            }
        };
        self.finish(py, tracking, status)?;
        if !body.is_empty() {
            input.call_method0(pyo3::intern!(py, "close"))?;
        }
        if let Some(access_log) = &self.access_log {
            let started: f64 = started.extract(py)?;
            let took = self.perf_counter.bind(py).call0()?.extract::<f64>()? - started;
            let remote = environ.get_item(pyo3::intern!(py, "REMOTE_ADDR")).ok();
            self.log_access.bind(py).call1((access_log.bind(py), request, remote, status, length, took))?;
        }
        Ok(if keep { Served::Keep } else { Served::Close })
    }

    /// Build the environ, call the app and write a list body; None when the Python loop took
    /// over the response (and the connection); else (status, body bytes, keep, request, environ).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn call_app<'py>(
        &mut self,
        py: Python<'py>,
        conn: &mut Conn,
        head: &Head,
        raw_head: &[u8],
        method: &Bound<'py, PyString>,
        path: &[u8],
        query: &[u8],
        input: &Bound<'py, PyAny>,
        tracking: &Tracking<'py>,
        started: &PyObject,
        rest: &[u8],
    ) -> PyResult<Option<(u32, usize, bool, Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
        let parts = Parts {
            method: method.as_any(),
            target: head.target,
            path,
            query,
            version: if head.http11 { "1.1" } else { "1.0" },
        };
        let length = head.content_length.map(|n| PyString::new(py, &n.to_string()));
        let headers = head.headers.iter().map(|(n, v)| (n.as_slice(), *v));
        let environ = self.environs[conn.environ]
            .bind(py)
            .get().make(py, &parts, headers, length, input, conn.client.bind(py))?.into_any();
        let keep_alive = self.keep_alive;
        let sr = Bound::new(
            py,
            StartResponse {
                hooks: self.hooks.clone_ref(py),
                code: 0,
                reason: None,
                headers: None,
                has_length: false,
                exchange: None,
                fd: conn.fd,
                client: conn.client.clone_ref(py),
                listener: conn.listener,
                request: None,
                head: raw_head.to_vec(),
                keep_alive,
            },
        )?;
        let result = self.app.bind(py).call1((&environ, &sr));
        let (result, exc) = match result {
            Ok(r) => (r, py.None().into_bound(py)),
            Err(e) if e.is_instance_of::<PyException>(py) => (py.None().into_bound(py), e.into_value(py).into_bound(py).into_any()),
            Err(e) => return Err(e), // SystemExit, KeyboardInterrupt: out of the loop
        };
        let fast = {
            let s = sr.borrow();
            if s.exchange.is_none() && s.code != 0 && exc.is_none() {
                frame_response(
                    py,
                    s.code,
                    s.reason.as_ref().expect("set with code").bind(py).as_bytes(),
                    s.headers.as_ref().expect("set with code").bind(py),
                    s.has_length,
                    &result,
                    head.method == "HEAD",
                    head.http11,
                    head.keep_alive && keep_alive,
                )?
                .map(|framed| (s.code, framed))
            } else {
                None
            }
        };
        let Some((code, (bytes, total, mut keep))) = fast else {
            // everything else is the Python response path's, with the connection
            self.ep.delete(conn.fd);
            let request = StartResponse::request(&sr)?.into_bound(py);
            let token = match tracking {
                Tracking::Python { token, .. } => token.clone(),
                Tracking::Native => {
                    let current = self.request.as_ref().expect("native tracking").bind(py);
                    let token = current.call1((true,))?;
                    current.borrow_mut().end(); // the Python loop finishes it, with this token
                    token
                }
            };
            let args = PyTuple::new(
                py,
                [
                    conn.fd.into_pyobject(py)?.into_any(),
                    conn.client.bind(py).clone(),
                    conn.listener.into_pyobject(py)?.into_any(),
                    sr.into_any(),
                    result,
                    exc,
                    environ,
                    request,
                    input.clone(),
                    token,
                    started.bind(py).clone(),
                    pyo3::types::PyBool::new(py, keep_alive).to_owned().into_any(),
                    PyBytes::new(py, rest).into_any(),
                ],
            )?;
            self.host.bind(py).call_method1(pyo3::intern!(py, "_finish_slow"), args)?;
            return Ok(None);
        };
        match sys::send(conn.fd, &bytes) {
            Ok(n) if n == bytes.len() => {}
            Ok(n) => {
                conn.out = bytes;
                conn.out_at = n;
                conn.phase = Phase::Writing;
                conn.since = sys::monotonic();
                conn.writing = Some(StartResponse::request(&sr)?);
                if self.ep.modify(conn.fd, OUT).is_err() {
                    keep = false;
                    conn.phase = Phase::Idle;
                }
            }
            Err(_) => keep = false, // the client is gone
        }
        let request = if self.access_log.is_some() { StartResponse::request(&sr)?.into_bound(py) } else { py.None().into_bound(py) };
        Ok(Some((code, total, keep, request, environ)))
    }

    /// The request is answered (`status` 0: nothing was sent): account it.
    fn finish(&mut self, py: Python<'_>, tracking: Tracking<'_>, status: u32) -> PyResult<()> {
        let control = self.control.bind(py);
        match tracking {
            Tracking::Python { token, reset } => {
                self.current.bind(py).call_method1(pyo3::intern!(py, "reset"), (reset,))?;
                control.call_method1(pyo3::intern!(py, "request_finished"), (token, status))?;
            }
            Tracking::Native => {
                let (token, began) = self.request.as_ref().expect("native tracking").borrow_mut(py).end();
                if let Some(token) = token {
                    control.call_method1(pyo3::intern!(py, "request_finished"), (token, status))?;
                } else if let Some(clock) = &self.clock {
                    let served = clock.finish(began, sys::monotonic(), status);
                    if served >= self.next_check {
                        self.next_check = control.call_method1(pyo3::intern!(py, "requests_served"), (served,))?.extract()?;
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
