//! refork's defences the `h2` crate lacks, read from the 9-byte frame headers (and the few bytes
//! of a control frame's payload) before the crate sees the bytes: a token budget per kind of
//! control frame (a flood ends in GOAWAY ENHANCE_YOUR_CALM), the header block bounded while it
//! arrives (CONTINUATION flood), a frame announcing more than SETTINGS_MAX_FRAME_SIZE refused
//! from its header, and what the driver must learn of each frame (a client's RST_STREAM, GOAWAY,
//! window openings). Only whole frames are handed on, so the crate always stops at a boundary.

use std::collections::{HashMap, HashSet, VecDeque};

pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const PRIORITY: u8 = 2;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;
pub const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;

pub const PROTOCOL_ERROR: u32 = 1;
pub const FLOW_CONTROL_ERROR: u32 = 3;
pub const FRAME_SIZE_ERROR: u32 = 6;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A token bucket: `burst` spent at once, refilled at `rate` a second of the caller's clock.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    burst: f64,
    rate: f64,
    tokens: f64,
    stamp: Option<f64>,
}

impl Budget {
    pub fn new(burst: u32, rate: f64) -> Self {
        Budget { burst: f64::from(burst), rate, tokens: f64::from(burst), stamp: None }
    }

    /// Take one token at `now`; false when the bucket is empty (the peer is over its budget).
    pub fn spend(&mut self, now: f64) -> bool {
        let since = self.stamp.map_or(0.0, |s| (now - s).max(0.0));
        self.tokens = self.burst.min(self.tokens + since * self.rate);
        self.stamp = Some(now);
        self.tokens -= 1.0;
        self.tokens >= 0.0
    }
}

/// The budgets of one connection, (burst, per second) each.
#[derive(Clone, Copy, Debug)]
pub struct Budgets {
    pub resets: Budget,
    pub settings: Budget,
    pub pings: Budget,
    pub window_updates: Budget,
    pub priorities: Budget,
    pub empty_data: Budget,
}

/// What a whole frame tells the driver once the crate has read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Note {
    None,
    /// The client reset a stream (its error code).
    ClientReset(u32, u32),
    /// A send window may have opened (0: the connection's, or every stream's by SETTINGS).
    Window(u32),
    /// The client's GOAWAY (last stream id, error code): nothing more is read.
    GoAway(u32, u32),
    /// A PING's ACK (its opaque data).
    PingAck([u8; 8]),
    /// A request head on a new stream.
    NewStream(u32),
}

/// The prefilter's verdict on the bytes at the front of the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Not a whole frame yet.
    Need,
    /// Hand these bytes to the crate, then act on the note.
    Pass(usize, Note),
    /// DATA on a stream the client had ended (a stream error the crate would make a connection
    /// error): not handed on; (stream, bytes, flow-controlled payload length).
    Stray(u32, usize, u32),
    /// End the connection with GOAWAY (code, why); the frame is not handed on.
    End(u32, String),
}

/// The frame walk over the client's bytes.
pub struct Prefilter {
    preface_left: usize,
    pub max_frame: usize,
    pub max_block: usize,
    /// Encoded bytes of the header block being received (HEADERS and its CONTINUATIONs so far).
    pub block: usize,
    pub block_open: bool,
    /// The stream whose header block is open.
    block_sid: u32,
    pub budgets: Budgets,
    highest: u32,
    ended: HashSet<u32>,
    ended_order: VecDeque<u32>,
    /// Each open stream's receive window as refork advertised it (the crate's is left wide open:
    /// refork gives the window back as the app takes the body, frame by frame).
    windows: HashMap<u32, i64>,
    initial_window: i64,
    /// DATA bytes received since the connection's window was last given back (it is given back
    /// as they arrive: each stream's window bounds what is held).
    pub credit: u64,
    /// Padding received per stream, given back to its window at once (not the app's to take).
    pub padding: Vec<(u32, u32)>,
}

const WINDOWS_KEPT: usize = 4096; // open streams whose windows are tracked, at most

const ENDED_KEPT: usize = 1024; // streams remembered as ended by the client (stray DATA on them)

impl Prefilter {
    pub fn new(max_frame: usize, max_block: usize, initial_window: u32, budgets: Budgets) -> Self {
        Prefilter {
            preface_left: PREFACE.len(), max_frame, max_block, block: 0, block_open: false, block_sid: 0, budgets,
            highest: 0, ended: HashSet::new(), ended_order: VecDeque::new(), windows: HashMap::new(),
            initial_window: i64::from(initial_window), credit: 0, padding: Vec::new(),
        }
    }

    /// A stream refork let go of: its window is no longer tracked.
    pub fn forget(&mut self, sid: u32) {
        self.windows.remove(&sid);
    }

    /// The app took `n` bytes of the stream's body: its window grows by that much; false when the
    /// stream is not receiving (no WINDOW_UPDATE is due).
    pub fn window_opened(&mut self, sid: u32, n: usize) -> bool {
        match self.windows.get_mut(&sid) {
            Some(w) => {
                *w += n as i64;
                true
            }
            None => false,
        }
    }

    fn remote_ended(&mut self, sid: u32) {
        self.windows.remove(&sid);
        if self.ended.insert(sid) {
            self.ended_order.push_back(sid);
            if self.ended_order.len() > ENDED_KEPT {
                if let Some(old) = self.ended_order.pop_front() {
                    self.ended.remove(&old);
                }
            }
        }
    }

    /// A header block is arriving: its HEADERS or CONTINUATIONs received (or the front of `buf`
    /// is one) and its END_HEADERS not yet.
    pub fn head_arriving(&self, buf: &[u8]) -> bool {
        self.block_open || (self.preface_left == 0 && buf.len() >= 9 && matches!(buf[3], HEADERS | CONTINUATION))
    }

    /// The verdict on the front of `buf` (the bytes not handed on yet) at clock time `now`.
    pub fn next(&mut self, buf: &[u8], now: f64) -> Step {
        if self.preface_left > 0 {
            let done = PREFACE.len() - self.preface_left;
            let n = self.preface_left.min(buf.len());
            if n == 0 {
                return Step::Need;
            }
            if buf[..n] != PREFACE[done..done + n] {
                return Step::End(PROTOCOL_ERROR, "invalid connection preface".into());
            }
            self.preface_left -= n;
            return Step::Pass(n, Note::None);
        }
        if buf.len() < 9 {
            return Step::Need;
        }
        let length = (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
        if length > self.max_frame {
            return Step::End(FRAME_SIZE_ERROR, format!("frame of {length} bytes announced"));
        }
        if buf.len() < 9 + length {
            return Step::Need;
        }
        let (kind, flags) = (buf[3], buf[4]);
        let sid = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
        let payload = &buf[9..9 + length];
        let n = 9 + length;
        if self.block_open && (kind != CONTINUATION || sid != self.block_sid) {
            // (RFC 9113 6.10: a header block's frames come together; the crate gets a block whole)
            return Step::End(PROTOCOL_ERROR, "a frame inside a header block".into());
        }
        let b = &mut self.budgets;
        let note = match kind {
            DATA => {
                self.credit += length as u64;
                if self.ended.contains(&sid) {
                    return Step::Stray(sid, n, length as u32);
                }
                if let Some(w) = self.windows.get_mut(&sid) {
                    *w -= length as i64;
                    if *w < 0 {
                        return Step::End(FLOW_CONTROL_ERROR, format!("DATA past the window of stream {sid}"));
                    }
                    if flags & PADDED != 0 && length > 0 && flags & END_STREAM == 0 {
                        let pad = (usize::from(payload[0]) + 1).min(length);
                        *w += pad as i64;
                        self.padding.push((sid, pad as u32));
                    }
                }
                if length == 0 && flags & END_STREAM == 0 && !b.empty_data.spend(now) {
                    return Step::End(ENHANCE_YOUR_CALM, "too many empty DATA frames".into());
                }
                if flags & END_STREAM != 0 {
                    self.remote_ended(sid);
                }
                Note::None
            }
            HEADERS | CONTINUATION => {
                self.block = length + if kind == CONTINUATION { self.block } else { 0 };
                if self.block > self.max_block {
                    self.block = 0;
                    self.block_open = false;
                    let most = self.max_block;
                    return Step::End(ENHANCE_YOUR_CALM, format!("a header block of more than {most} bytes"));
                }
                self.block_open = flags & END_HEADERS == 0;
                self.block_sid = sid;
                if kind == HEADERS && flags & END_STREAM != 0 {
                    self.remote_ended(sid);
                }
                if kind == HEADERS && sid > self.highest {
                    self.highest = sid;
                    if flags & END_STREAM == 0 {
                        if self.windows.len() >= WINDOWS_KEPT {
                            let oldest = self.windows.keys().min().copied().unwrap_or(0);
                            self.windows.remove(&oldest);
                        }
                        self.windows.insert(sid, self.initial_window);
                    }
                    Note::NewStream(sid)
                } else {
                    Note::None
                }
            }
            PRIORITY => {
                if !b.priorities.spend(now) {
                    return Step::End(ENHANCE_YOUR_CALM, "too many PRIORITY frames".into());
                }
                Note::None
            }
            RST_STREAM => {
                if !b.resets.spend(now) {
                    return Step::End(ENHANCE_YOUR_CALM, "too many streams reset (Rapid Reset)".into());
                }
                let code = if length >= 4 { u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) } else { 0 };
                self.windows.remove(&sid);
                Note::ClientReset(sid, code)
            }
            SETTINGS if flags & ACK == 0 => {
                if !b.settings.spend(now) {
                    return Step::End(ENHANCE_YOUR_CALM, "too many SETTINGS frames".into());
                }
                Note::Window(0) // (a new initial window may have opened every stream's)
            }
            PING if flags & ACK == 0 => {
                if !b.pings.spend(now) {
                    return Step::End(ENHANCE_YOUR_CALM, "too many PING frames".into());
                }
                Note::None
            }
            PING if length == 8 => {
                let mut data = [0u8; 8];
                data.copy_from_slice(payload);
                Note::PingAck(data)
            }
            GOAWAY if length >= 8 => {
                let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
                Note::GoAway(last, u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]))
            }
            WINDOW_UPDATE => {
                if !b.window_updates.spend(now) {
                    return Step::End(ENHANCE_YOUR_CALM, "too many WINDOW_UPDATE frames".into());
                }
                Note::Window(sid)
            }
            _ => Note::None,
        };
        Step::Pass(n, note)
    }
}

/// A frame's bytes (for the few refork writes itself and for tests).
pub fn frame(kind: u8, flags: u8, sid: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&sid.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(n: u32) -> Budgets {
        let b = Budget::new(n, 1.0);
        Budgets { resets: b, settings: b, pings: b, window_updates: b, priorities: b, empty_data: b }
    }

    fn past_preface(p: &mut Prefilter) {
        assert_eq!(p.next(PREFACE, 0.0), Step::Pass(24, Note::None));
    }

    #[test]
    fn the_preface_is_checked_as_it_arrives() {
        let mut p = Prefilter::new(16384, 65536, 65535, budgets(5));
        assert_eq!(p.next(b"PRI * HT", 0.0), Step::Pass(8, Note::None));
        assert_eq!(p.next(b"TP/2.0\r\n\r\nSM\r\n\r\n", 0.0), Step::Pass(16, Note::None));
        let mut bad = Prefilter::new(16384, 65536, 65535, budgets(5));
        assert!(matches!(bad.next(b"GET / HTTP/1.1\r\n", 0.0), Step::End(PROTOCOL_ERROR, _)));
    }

    #[test]
    fn whole_frames_only_and_an_oversized_one_is_refused_from_its_header() {
        let mut p = Prefilter::new(16384, 65536, 65535, budgets(5));
        past_preface(&mut p);
        let f = frame(DATA, 0, 1, b"hello");
        assert_eq!(p.next(&f[..8], 0.0), Step::Need);
        assert_eq!(p.next(&f[..12], 0.0), Step::Need);
        assert_eq!(p.next(&f, 0.0), Step::Pass(14, Note::None));
        let big = [0x10, 0, 0, DATA, 0, 0, 0, 0, 1];
        assert!(matches!(p.next(&big, 0.0), Step::End(FRAME_SIZE_ERROR, _)));
    }

    #[test]
    fn control_floods_spend_their_budget_and_refill_with_time() {
        let mut p = Prefilter::new(16384, 65536, 65535, budgets(3));
        past_preface(&mut p);
        let ping = frame(PING, 0, 0, b"12345678");
        for _ in 0..3 {
            assert_eq!(p.next(&ping, 0.0), Step::Pass(17, Note::None));
        }
        assert!(matches!(p.next(&ping, 0.0), Step::End(ENHANCE_YOUR_CALM, _)));
        assert_eq!(p.next(&ping, 10.0), Step::Pass(17, Note::None));
        let rst = frame(RST_STREAM, 0, 1, &8u32.to_be_bytes());
        assert_eq!(p.next(&rst, 10.0), Step::Pass(13, Note::ClientReset(1, 8)));
    }

    #[test]
    fn a_header_block_is_bounded_while_it_arrives() {
        let mut p = Prefilter::new(16384, 20000, 65535, budgets(3));
        past_preface(&mut p);
        let head = frame(HEADERS, 0, 1, &[0u8; 10]);
        assert_eq!(p.next(&head, 0.0), Step::Pass(19, Note::NewStream(1)));
        assert!(p.head_arriving(b""));
        let more = frame(CONTINUATION, 0, 1, &[0u8; 16000]);
        assert!(matches!(p.next(&more, 0.0), Step::Pass(..)));
        assert!(matches!(p.next(&more, 0.0), Step::End(ENHANCE_YOUR_CALM, _)));
        assert!(!p.block_open);
    }

    #[test]
    fn only_its_own_continuations_may_come_inside_a_header_block() {
        for (kind, sid) in [(DATA, 1), (PING, 0), (0xfa, 0), (CONTINUATION, 3)] {
            let mut p = Prefilter::new(16384, 65536, 65535, budgets(3));
            past_preface(&mut p);
            assert_eq!(p.next(&frame(HEADERS, 0, 1, &[0x82]), 0.0), Step::Pass(10, Note::NewStream(1)));
            let inside = frame(kind, 0, sid, &[0u8; 8]);
            assert!(matches!(p.next(&inside, 0.0), Step::End(PROTOCOL_ERROR, _)), "{kind} on {sid}");
        }
    }

    #[test]
    fn data_on_a_stream_the_client_ended_is_stray() {
        let mut p = Prefilter::new(16384, 65536, 65535, budgets(3));
        past_preface(&mut p);
        let head = frame(HEADERS, END_STREAM | END_HEADERS, 1, &[0x82]);
        assert_eq!(p.next(&head, 0.0), Step::Pass(10, Note::NewStream(1)));
        assert_eq!(p.next(&frame(DATA, 0, 1, b"x"), 0.0), Step::Stray(1, 10, 1));
    }

    #[test]
    fn a_stream_window_is_refork_s_own_and_grows_as_the_body_is_taken() {
        let mut p = Prefilter::new(16384, 65536, 10, budgets(3));
        past_preface(&mut p);
        assert_eq!(p.next(&frame(HEADERS, END_HEADERS, 1, &[0x83]), 0.0), Step::Pass(10, Note::NewStream(1)));
        assert_eq!(p.next(&frame(DATA, 0, 1, &[0; 10]), 0.0), Step::Pass(19, Note::None));
        assert!(p.window_opened(1, 4));
        assert_eq!(p.next(&frame(DATA, 0, 1, &[0; 4]), 0.0), Step::Pass(13, Note::None));
        assert!(matches!(p.next(&frame(DATA, 0, 1, &[0; 1]), 0.0), Step::End(FLOW_CONTROL_ERROR, _)));
        assert!(!p.window_opened(3, 4));
    }

    #[test]
    fn padding_is_given_back_to_the_stream_window_at_once() {
        let mut p = Prefilter::new(16384, 65536, 10, budgets(3));
        past_preface(&mut p);
        assert_eq!(p.next(&frame(HEADERS, END_HEADERS, 1, &[0x83]), 0.0), Step::Pass(10, Note::NewStream(1)));
        let padded = frame(DATA, PADDED, 1, &[5, b'a', b'b', b'c', b'd', 0, 0, 0, 0, 0]); // 4 bytes, 6 of padding
        assert_eq!(p.next(&padded, 0.0), Step::Pass(19, Note::None));
        assert_eq!(p.padding, vec![(1, 6)]);
        assert_eq!(p.next(&frame(DATA, 0, 1, &[0; 6]), 0.0), Step::Pass(15, Note::None)); // 4 + 6 = its window
    }
}
