//! What the loop does to a connection between two reads: responses and their bodies (as flow
//! control allows), the windows given back as the app takes request bodies, resets, the two-step
//! graceful GOAWAY, and the bytes to write.

use bytes::Bytes;
use h2::Reason;
use http::HeaderMap;

use super::driver::{header_map, response, Core, Event, State, WIDE_OPEN};
use super::prefilter;

impl Core {
    /// The response head; `end`: no body follows.
    pub fn respond(&mut self, sid: u32, status: u16, headers: &[(Vec<u8>, Vec<u8>)], end: bool) {
        let Some(s) = self.streams.get_mut(&sid) else { return };
        let Some(mut r) = s.respond.take() else { return };
        match r.send_response(response(status, headers), end) {
            Ok(send) if !end => s.send = Some(send),
            _ => self.response_done(sid),
        }
    }

    /// A 1xx response before the final one.
    pub fn informational(&mut self, sid: u32, status: u16, headers: &[(Vec<u8>, Vec<u8>)]) {
        if let Some(r) = self.streams.get_mut(&sid).and_then(|s| s.respond.as_mut()) {
            let _ = r.send_informational(response(status, headers));
        }
    }

    /// Body bytes the stream may send now (what flow control has given it, up to a frame).
    pub fn window(&mut self, sid: u32) -> usize {
        match self.streams.get_mut(&sid).and_then(|s| s.send.as_mut()) {
            Some(send) => {
                if send.capacity() == 0 {
                    send.reserve_capacity(16384);
                }
                send.capacity()
            }
            None => 0,
        }
    }

    /// Body bytes of `total` the stream may send now.
    pub fn room(&mut self, sid: u32, total: usize) -> usize {
        match self.streams.get_mut(&sid).and_then(|s| s.send.as_mut()) {
            Some(send) if total > 0 => {
                send.reserve_capacity(total);
                send.capacity().min(total)
            }
            _ => 0,
        }
    }

    /// Send as much of `data` as flow control allows now; the bytes taken (END_STREAM goes with
    /// the last byte only).
    pub fn send_body(&mut self, sid: u32, data: &[u8], end: bool) -> usize {
        let Some(send) = self.streams.get_mut(&sid).and_then(|s| s.send.as_mut()) else { return 0 };
        let total = data.len();
        if total == 0 {
            if end {
                let _ = send.send_data(Bytes::new(), true);
                self.response_done(sid);
            }
            return 0;
        }
        send.reserve_capacity(total);
        let n = send.capacity().min(total);
        if n == 0 {
            return 0;
        }
        let last = n == total;
        if send.send_data(Bytes::copy_from_slice(&data[..n]), end && last).is_err() {
            self.response_done(sid);
            return total; // (reset meanwhile: nothing more goes out on it)
        }
        if end && last {
            self.response_done(sid);
        }
        n
    }

    pub fn send_trailers(&mut self, sid: u32, headers: &[(Vec<u8>, Vec<u8>)]) {
        if let Some(send) = self.streams.get_mut(&sid).and_then(|s| s.send.as_mut()) {
            let mut map = HeaderMap::new();
            header_map(headers, &mut map);
            let _ = send.send_trailers(map);
        }
        self.response_done(sid);
    }

    fn response_done(&mut self, sid: u32) {
        if let Some(s) = self.streams.get_mut(&sid) {
            s.send_done = true;
            if s.recv_done {
                self.retire(sid);
            }
        }
    }

    /// The app took `n` body bytes: the client may send that many more on the stream.
    pub fn body_consumed(&mut self, sid: u32, n: usize) {
        if let Some(s) = self.streams.get_mut(&sid) {
            let _ = s.recv.flow_control().release_capacity(n); // (the connection's window: the crate's)
        }
        if !self.ended && n > 0 && n < WIDE_OPEN as usize && self.pre.window_opened(sid, n) {
            self.raw(prefilter::frame(prefilter::WINDOW_UPDATE, 0, sid, &(n as u32).to_be_bytes()));
        }
    }

    /// Abandon a stream: RST_STREAM with `code`. After a complete response, the crate sends it
    /// once the response is out (NO_ERROR: the rest of the request body is not wanted).
    pub fn reset(&mut self, sid: u32, code: u32) {
        if let Some(s) = self.streams.get_mut(&sid) {
            if s.send_done {
            } else if let Some(send) = s.send.as_mut() {
                send.send_reset(Reason::from(code));
            } else if let Some(r) = s.respond.as_mut() {
                r.send_reset(Reason::from(code));
            }
            self.retire(sid);
        }
    }

    /// The graceful end's first step: GOAWAY naming every stream, and a PING.
    pub fn goaway(&mut self, now: f64) {
        if self.draining_since.is_some() || self.ended {
            return;
        }
        self.draining_since = Some(now);
        if let State::Open(conn) = &mut self.state {
            conn.graceful_shutdown();
        }
        self.drive();
    }

    /// The final GOAWAY, if `wait` seconds have passed since the first without the PING's ACK:
    /// the crate is handed the ACK it waits for.
    pub fn tick(&mut self, now: f64, wait: f64) {
        let Some(since) = self.draining_since else { return };
        if self.going_away || self.ended || now - since < wait {
            return;
        }
        if self.pre.block_open {
            // a header block is being received: no frame may come between its frames, so the
            // final GOAWAY is refork's own (the streams past it are refused as they open)
            let mut payload = self.last_stream_id.to_be_bytes().to_vec();
            payload.extend_from_slice(&0u32.to_be_bytes());
            self.raw(prefilter::frame(prefilter::GOAWAY, 0, 0, &payload));
            self.tallies[3] += 1;
            self.going_away = true;
            self.final_last = self.last_stream_id;
        } else if let Some(ping) = self.shutdown_ping {
            self.pipe.lock().input.extend_from_slice(&prefilter::frame(prefilter::PING, 1, 0, &ping));
            self.drive();
        } else if matches!(self.state, State::Handshaking(_)) {
            self.end(0, "no preface by the drain's wait"); // (a client that opened and never spoke)
        }
    }

    /// What to write to the client.
    pub fn data_to_send(&mut self) -> Vec<u8> {
        self.drive();
        let mut b = self.pipe.lock();
        self.scanned = 0;
        std::mem::take(&mut b.output)
    }

    /// Events made outside `receive` (a budget spent by what the crate wrote).
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Bytes received and held: a header block not ended (refork holds it until its end, unless
    /// the crate took its first frames) and the frame being received.
    pub fn buffered(&self) -> usize {
        let crate_held = if self.pre.block_open { self.pre.block.saturating_sub(self.passed) } else { 0 };
        crate_held + self.pending.len() + self.pipe.lock().unread()
    }

    pub fn head_arriving(&self) -> bool {
        !self.ended && self.pre.head_arriving(&self.pending)
    }

    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// The connection is gone: everything it holds goes now.
    pub fn release(&mut self) {
        self.streams.clear();
        self.state = State::Closed;
        self.pending = Vec::new();
        self.passed = 0;
        let mut b = self.pipe.lock();
        b.input = Vec::new();
        b.output = Vec::new();
        b.read_at = 0;
    }
}
