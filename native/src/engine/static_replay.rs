//! A --static answer replayed from the static cache (static_files/): no environ, no app call, no
//! Python code; counted in the worker's slot as refork_static_requests_total's 2xx, never among
//! the app's requests. Only when nothing else must see the request: no access log (nor
//! post_request), no pre_request, the slot accounted natively.

use std::os::fd::AsRawFd;

use pyo3::prelude::*;

use super::{Engine, Served, OUT};
use crate::conn::{describe, Conn, FileBody, FileOwner, Phase};
use crate::http::head::Head;
use crate::static_files::{replay, Reply};
use crate::sys;

impl Engine {
    /// The recorded answer to this request, sent; None: the app's path answers it.
    pub(super) fn replay_static(&mut self, py: Python<'_>, conn: &mut Conn, head: &Head, body: &[u8]) -> PyResult<Option<Served>> {
        let Some(clock) = self.clock.as_ref() else { return Ok(None) };
        if !body.is_empty() || self.host.access_log.is_some() || self.hooks.get().pre_request.is_some() {
            return Ok(None);
        }
        let mut keep = head.keep_alive && self.keep_alive;
        let Some(Reply { bytes, file }) = replay(head, keep) else { return Ok(None) };
        clock.count_static(200);
        if let Some((file, size)) = file {
            let fd = file.as_raw_fd();
            keep &= self.send_file(py, conn, bytes, FileBody { fd, offset: 0, remaining: size, owner: FileOwner::Static(file) }, head);
        } else {
            match sys::send(conn.fd, &bytes) {
                Ok(n) if n == bytes.len() => {}
                Ok(n) => {
                    conn.keep_output(bytes, n, describe(head));
                    if self.ep.modify(conn.fd, OUT).is_err() {
                        keep = false;
                        conn.phase = Phase::Idle;
                    }
                }
                Err(_) => keep = false, // the client is gone
            }
        }
        Ok(Some(if keep { Served::Keep } else { Served::Close }))
    }
}
