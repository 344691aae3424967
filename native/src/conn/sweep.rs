//! The once-a-second sweep: which connections are past their deadline, and what then.

use std::collections::HashMap;

use pyo3::prelude::*;

use super::{Conn, Phase};
use crate::sys;

/// The per-connection deadlines (refork.serving.connection.Timeouts), in seconds.
#[derive(FromPyObject, Clone, Copy)]
pub(crate) struct Timeouts {
    pub header: f64,
    pub body: f64,
    pub write: f64,
    pub keepalive: f64,
    pub body_min_rate: f64,
}

impl Timeouts {
    /// How long a connection may wait for its next request (Timeouts.idle_limit): keepalive; with
    /// keepalive 0 (no reuse) a fresh one still gets the header timeout for its first.
    fn idle_limit(&self, fresh: bool) -> f64 {
        if fresh && self.keepalive == 0.0 { self.header } else { self.keepalive }
    }
}

/// What the sweep does with a connection past its deadline.
#[derive(Clone, Copy, PartialEq, Debug)]
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
pub(crate) fn sweep<S: std::hash::BuildHasher>(conns: &mut HashMap<i32, Conn, S>, t: &Timeouts, now: f64, drain_until: f64) -> Vec<(Conn, Expired)> {
    let mut expired: Vec<(i32, Expired)> = Vec::new();
    for conn in conns.values() {
        let age = now - conn.since;
        let verdict = match conn.phase {
            Phase::Writing => (age > t.write).then_some(Expired::WriteTimeout),
            Phase::Idle => {
                let drained = drain_until > 0.0 && now >= drain_until && !conn.fresh;
                // a request that arrived while the loop was busy is served, not dropped as idle
                ((age > t.idle_limit(conn.fresh) || drained) && !sys::has_input(conn.fd)).then_some(Expired::Close)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Peer;

    const T: Timeouts = Timeouts { header: 10.0, body: 20.0, write: 30.0, keepalive: 5.0, body_min_rate: 0.0 };
    const NOW: f64 = 1000.0;

    /// A connection (fd: a number no socket has, so no bytes wait) in `phase` for `age` seconds.
    fn conn(fd: i32, phase: Phase, age: f64) -> Conn {
        let mut c = Conn::new(fd, Peer::Unix, -1, 0, NOW - age);
        c.phase = phase;
        c.fresh = false;
        c
    }

    /// The sweep's verdict on one connection.
    fn verdict(c: Conn, t: &Timeouts, drain_until: f64) -> Option<Expired> {
        let fd = c.fd;
        let mut conns = HashMap::from([(fd, c)]);
        let expired = sweep(&mut conns, t, NOW, drain_until);
        assert_eq!(conns.len() + expired.len(), 1, "an expired connection is taken out, no other");
        expired.first().map(|(c, v)| {
            assert_eq!(c.fd, fd);
            *v
        })
    }

    const FD: i32 = 1 << 20;


    #[test]
    fn a_request_that_arrived_while_the_loop_was_busy_is_not_dropped_as_idle() {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) }, 0);
        let idle = |fd| conn(fd, Phase::Idle, 60.0);
        assert_eq!(verdict(idle(fds[0]), &T, 0.0), Some(Expired::Close));
        assert_eq!(sys::send(fds[1], b"GET / HTTP/1.1\r\n").unwrap(), 16);
        assert_eq!(verdict(idle(fds[0]), &T, 0.0), None);
        assert_eq!(verdict(idle(fds[0]), &T, NOW - 1.0), None); // nor at the drain
        sys::close(fds[0]);
        sys::close(fds[1]);
    }







    #[test]
    fn only_the_expired_are_taken_out() {
        let mut conns: HashMap<i32, Conn> = HashMap::new();
        for (i, (phase, age)) in [(Phase::Idle, 1.0), (Phase::Idle, 6.0), (Phase::Head, 11.0), (Phase::Writing, 2.0)].into_iter().enumerate() {
            let fd = FD + i as i32;
            conns.insert(fd, conn(fd, phase, age));
        }
        let mut expired: Vec<(i32, Expired)> = sweep(&mut conns, &T, NOW, 0.0).into_iter().map(|(c, v)| (c.fd, v)).collect();
        expired.sort_by_key(|(fd, _)| *fd);
        assert_eq!(expired, [(FD + 1, Expired::Close), (FD + 2, Expired::RequestTimeout)]);
        let mut left: Vec<i32> = conns.into_keys().collect();
        left.sort();
        assert_eq!(left, [FD, FD + 3]);
    }

    /// tests/vectors/sweep.txt, which refork.serving.connection.Timeouts is held to as well.
    #[test]
    fn the_shared_vectors() {
        for row in crate::vectors::rows(include_str!("../../../tests/vectors/sweep.txt")) {
            let num = |i: usize| -> f64 { row[i].parse().unwrap() };
            let phase = match row[0].as_str() {
                "idle" => Phase::Idle,
                "head" => Phase::Head,
                "body" => Phase::Body,
                "writing" => Phase::Writing,
                other => panic!("phase {other}"),
            };
            let mut c = conn(FD, phase, num(1));
            c.received = row[2].parse().unwrap();
            c.fresh = row[5] == "yes";
            let t = Timeouts { body_min_rate: num(3), keepalive: num(4), ..T };
            let drain_until = if row[6] == "-" { 0.0 } else { NOW + num(6) };
            let expected = match row[7].as_str() {
                "none" => None,
                "close" => Some(Expired::Close),
                "request-timeout" => Some(Expired::RequestTimeout),
                "write-timeout" => Some(Expired::WriteTimeout),
                other => panic!("verdict {other}"),
            };
            assert_eq!(verdict(c, &t, drain_until), expected, "{row:?}");
        }
    }
}
