//! A --static answer replayed from the static cache (static_files/): no environ, no app call, no
//! Python code; counted in the worker's slot as refork_static_requests_total's 2xx, never among
//! the app's requests. Only when nothing else must see the request: no access log (nor
//! post_request), no pre_request, the slot accounted natively.

use std::os::fd::AsRawFd;

use pyo3::prelude::*;

use super::{Engine, Served};
use crate::conn::{Conn, FileBody, FileOwner};
use crate::http::head::Head;
use crate::static_files::{replay, Reply};

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
            keep &= self.send_bytes(conn, bytes, head);
        }
        Ok(Some(if keep { Served::Keep } else { Served::Close }))
    }
}
