//! The once-a-second sweep: which connections are past their deadline, and what then.

use std::collections::HashMap;

use pyo3::prelude::*;

use super::{Conn, Phase};
use crate::sys;

/// The per-connection deadlines (refork.serving.connection.Timeouts), in seconds.
pub(crate) struct Timeouts {
    pub header: f64,
    pub body: f64,
    pub write: f64,
    pub keepalive: f64,
    pub body_min_rate: f64,
}

impl Timeouts {
    pub fn from_py(t: &Bound<'_, PyAny>) -> PyResult<Timeouts> {
        let f = |name: &str| -> PyResult<f64> { t.getattr(name)?.extract() };
        Ok(Timeouts {
            header: f("header")?,
            body: f("body")?,
            write: f("write")?,
            keepalive: f("keepalive")?,
            body_min_rate: f("body_min_rate")?,
        })
    }
}

/// What the sweep does with a connection past its deadline.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Expired {
    /// idle too long, or drained: close quietly
    Close,
    /// a request did not arrive in time: 408, then close
    RequestTimeout,
    /// the client stopped reading a response: log it, close
    WriteTimeout,
}

/// The sweep (refork.serving.connection.Timeouts.expiry and write_stalled): the connections past
/// their deadline, out of `conns`. `drain_until` > 0: the worker stops, idle connections close
/// then (a fresh one keeps its keep-alive clock).
pub(crate) fn sweep(conns: &mut HashMap<i32, Conn>, t: &Timeouts, now: f64, drain_until: f64) -> Vec<(Conn, Expired)> {
    let mut expired: Vec<(i32, Expired)> = Vec::new();
    for conn in conns.values() {
        let age = now - conn.since;
        let verdict = match conn.phase {
            Phase::Writing => (age > t.write).then_some(Expired::WriteTimeout),
            Phase::Idle => {
                let drained = drain_until > 0.0 && now >= drain_until && !conn.fresh;
                // a request that arrived while the loop was busy is served, not dropped as idle
                ((age > t.keepalive || drained) && !sys::has_input(conn.fd)).then_some(Expired::Close)
            }
            Phase::Head => (age > t.header).then_some(Expired::RequestTimeout),
            Phase::Body => {
                let extra = if t.body_min_rate > 0.0 { conn.received as f64 / t.body_min_rate } else { 0.0 };
                (age > t.body + extra).then_some(Expired::RequestTimeout)
            }
        };
        if let Some(v) = verdict {
            expired.push((conn.fd, v));
        }
    }
    expired.into_iter().filter_map(|(fd, v)| conns.remove(&fd).map(|c| (c, v))).collect()
}
