//! One server connection driven by hand: the `h2` crate's `server::Connection` over the in-memory
//! [`Pipe`], polled with a no-op waker whenever bytes came in or a response went out (no runtime,
//! no threads). The prefilter walks the client's bytes first; the crate's own frames are read
//! back from the output (headers only) for what refork counts and bounds: the resets it makes
//! (MadeYouReset, streams past the concurrency limit) spend the resets budget, its 431 to an
//! oversized header list ends the connection, its graceful GOAWAYs mark the drain.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use h2::server::{Builder, Connection, Handshake, SendResponse};
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::io::Pipe;
use super::prefilter::{self, Budgets, Note, Prefilter, Step, ENHANCE_YOUR_CALM, PROTOCOL_ERROR};

/// What one connection may do (refork.http.h2.Http2Limits).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_concurrent_streams: u32,
    pub initial_window_size: u32,
    pub max_frame_size: u32,
    pub max_header_list_size: u32,
    pub connection_window: u32,
    pub budgets: Budgets,
}

/// What the connection tells the loop.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Opened { sid: u32, method: String, path: Vec<u8>, authority: Vec<u8>, headers: Vec<(Vec<u8>, Vec<u8>)>, ended: bool },
    Body(u32, Bytes),
    Ended(u32),
    Reset(u32, u32, bool),
    Window(u32),
    ConnectionEnded { code: u32, reason: String, by_client: bool, last: u32 },
}

const ANY_STREAM: u32 = (1 << 31) - 1;
const REFUSED_STREAM: u32 = 7;
const STREAM_CLOSED: u32 = 5;
const RETIRED_KEPT: usize = 1024;
pub(super) const WIDE_OPEN: u32 = (1 << 31) - 1;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 4;

pub(super) enum State {
    Handshaking(Pin<Box<Handshake<Pipe, Bytes>>>),
    Open(Box<Connection<Pipe, Bytes>>),
    Closed,
}

/// A stream handed on to the loop, until its response and its request body are both done.
pub(super) struct Stream {
    pub(super) recv: RecvStream,
    pub(super) recv_done: bool,
    pub(super) respond: Option<SendResponse<Bytes>>,
    pub(super) send: Option<SendStream<Bytes>>,
    pub(super) send_done: bool,
}

pub struct Core {
    pub(super) pipe: Pipe,
    pub(super) state: State,
    pub(super) pre: Prefilter,
    pub(super) pending: Vec<u8>,
    /// Bytes at the front of `pending` the prefilter passed, held for the rest of their header block.
    pub(super) passed: usize,
    pub(super) streams: HashMap<u32, Stream>,
    pub(super) retired: HashSet<u32>,
    pub(super) retired_order: VecDeque<u32>,
    pub(super) scanned: usize,
    pub ended: bool,
    pub draining_since: Option<f64>,
    pub going_away: bool,
    pub(super) final_last: u32,
    pub(super) shutdown_ping: Option<[u8; 8]>,
    pub last_stream_id: u32,
    /// streams, resets received, resets sent, GOAWAYs sent
    pub tallies: [u64; 4],
    pub(super) events: Vec<Event>,
    pub(super) client_resets: Vec<(u32, u32)>,
    pub(super) now: f64,
    pub(super) initial_window: u32,
    pub(super) connection_window: u32,
    /// The crate sent the final GOAWAY itself (else refork did, a header block being received).
    pub(super) crate_final: bool,
}

pub(super) fn header_map(headers: &[(Vec<u8>, Vec<u8>)], map: &mut HeaderMap) {
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if matches!(&lower[..], b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade") {
            continue;
        }
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(&lower), HeaderValue::from_bytes(value)) {
            map.append(n, v);
        }
    }
}

pub(super) fn response(status: u16, headers: &[(Vec<u8>, Vec<u8>)]) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    header_map(headers, r.headers_mut());
    r
}

impl Core {
    pub fn new(limits: Limits) -> Self {
        let pipe = Pipe::default();
        let mut b = Builder::new();
        b.max_concurrent_streams(limits.max_concurrent_streams)
            // the crate's stream windows stay wide open: refork's own (the prefilter's, advertised
            // in the SETTINGS the crate writes) reopen as the app takes the body, however little
            .initial_window_size(WIDE_OPEN)
            // the crate's connection window stays wide open too: refork's is given back as DATA
            // arrives (every stream's window bounds what is held), so a stream that is not read
            // never holds up the others
            .initial_connection_window_size(WIDE_OPEN)
            .max_frame_size(limits.max_frame_size)
            .max_header_list_size(limits.max_header_list_size)
            // refork's resets budget bounds these; the crate's own bounds stay as a backstop
            .max_pending_accept_reset_streams(1024)
            .max_local_error_reset_streams(Some(1024));
        let handshake = Box::pin(b.handshake::<Pipe, Bytes>(pipe.clone()));
        let pre = Prefilter::new(
            limits.max_frame_size as usize, limits.max_header_list_size as usize, limits.initial_window_size, limits.budgets,
        );
        Core {
            pipe, state: State::Handshaking(handshake), pre, pending: Vec::new(), passed: 0, streams: HashMap::new(),
            retired: HashSet::new(), retired_order: VecDeque::new(), scanned: 0, ended: false,
            draining_since: None, going_away: false, final_last: 0, shutdown_ping: None, last_stream_id: 0,
            tallies: [0; 4], events: Vec::new(), client_resets: Vec::new(), now: 0.0,
            initial_window: limits.initial_window_size,
            connection_window: limits.connection_window.clamp(65535, WIDE_OPEN), crate_final: false,
        }
    }

    /// The server's preface (SETTINGS, the connection window opened wide).
    pub fn start(&mut self) {
        self.drive();
        let grow = self.connection_window - 65535;
        if grow > 0 {
            self.raw(prefilter::frame(prefilter::WINDOW_UPDATE, 0, 0, &grow.to_be_bytes()));
        }
    }

    /// Feed the client's bytes at clock time `now`; the events they make.
    pub fn receive(&mut self, data: &[u8], now: f64) -> Vec<Event> {
        if self.ended {
            return std::mem::take(&mut self.events);
        }
        self.now = now;
        self.pending.extend_from_slice(data);
        let mut pos = self.passed;
        let mut fed = 0; // bytes of `pending` before `pos` already handed to the crate
        // where the header block being received begins: the crate gets a block whole, so a block
        // that never ends is held once, here (the crate would keep its frames and a copy)
        let mut block_at = self.pre.block_open.then_some(0);
        loop {
            let was_open = self.pre.block_open;
            match self.pre.next(&self.pending[pos..], now) {
                Step::Need => break,
                Step::Pass(n, note) => {
                    if !was_open && self.pre.block_open {
                        block_at = Some(pos);
                    }
                    pos += n;
                    match note {
                        Note::None => {}
                        Note::ClientReset(sid, code) => {
                            self.tallies[1] += 1;
                            self.client_resets.push((sid, code));
                        }
                        Note::Window(sid) => self.events.push(Event::Window(sid)),
                        Note::NewStream(sid) => {
                            if self.going_away && self.crate_final && sid > self.final_last {
                                self.feed(&mut fed, pos);
                                self.raw(prefilter::frame(prefilter::RST_STREAM, 0, sid, &REFUSED_STREAM.to_be_bytes()));
                            }
                        }
                        Note::PingAck(_) if self.draining_since.is_some() && !self.going_away => self.feed(&mut fed, pos),
                        Note::PingAck(_) => {}
                        Note::GoAway(last, code) => {
                            self.feed(&mut fed, pos);
                            if !self.ended {
                                self.ended = true;
                                let reason = "GOAWAY from the client".to_string();
                                self.events.push(Event::ConnectionEnded { code, reason, by_client: true, last });
                            }
                            break;
                        }
                    }
                    if self.ended {
                        break;
                    }
                    if matches!(self.state, State::Handshaking(_)) {
                        // the crate's connection window opens (to refork's, announced at start)
                        // only once its handshake is done and it has read all it was given: the
                        // client's first flight goes in after that, not with the preface
                        self.feed(&mut fed, pos);
                    }
                }
                Step::Stray(sid, n, _) => {
                    // DATA after the client's END_STREAM: a stream error (RFC 9113 5.1) the crate
                    // would make a connection error; the stream is reset, the connection window
                    // given back for the bytes the crate never saw
                    self.feed(&mut fed, pos);
                    pos += n;
                    fed = pos;
                    if let Some(s) = self.streams.get_mut(&sid) {
                        if let Some(send) = s.send.as_mut() {
                            send.send_reset(Reason::from(STREAM_CLOSED));
                        } else if let Some(r) = s.respond.as_mut() {
                            r.send_reset(Reason::from(STREAM_CLOSED));
                        }
                        self.drive();
                    } else {
                        // (a stream refork let go, or never had): its reset is refork's own
                        self.raw(prefilter::frame(prefilter::RST_STREAM, 0, sid, &STREAM_CLOSED.to_be_bytes()));
                        if !self.pre_spend_reset() {
                            self.end(ENHANCE_YOUR_CALM, "too many streams reset (stream errors, MadeYouReset)");
                        }
                    }
                    if self.ended {
                        break;
                    }
                }
                Step::End(code, reason) => {
                    self.feed(&mut fed, pos);
                    self.end(code, &reason);
                    break;
                }
            }
        }
        if !self.ended || fed < pos {
            let upto = match block_at {
                Some(at) if self.pre.block_open && !self.ended => at.max(fed),
                _ => pos,
            };
            self.feed(&mut fed, upto);
        }
        for (sid, n) in std::mem::take(&mut self.pre.padding) {
            if !self.ended {
                self.raw(prefilter::frame(prefilter::WINDOW_UPDATE, 0, sid, &n.to_be_bytes()));
            }
        }
        let credit = std::mem::take(&mut self.pre.credit);
        if credit > 0 && !self.ended {
            let n = credit.min(u64::from(WIDE_OPEN)) as u32; // (at most a read's worth)
            self.raw(prefilter::frame(prefilter::WINDOW_UPDATE, 0, 0, &n.to_be_bytes()));
        }
        if self.ended {
            self.pending = Vec::new();
            self.passed = 0;
            self.pre.block_open = false;
        } else {
            self.pending.drain(..fed);
            self.passed = pos - fed;
            shrink(&mut self.pending);
        }
        std::mem::take(&mut self.events)
    }

    /// Hand `pending[*fed..upto]` to the crate and drive it.
    fn feed(&mut self, fed: &mut usize, upto: usize) {
        if *fed < upto {
            self.pipe.lock().input.extend_from_slice(&self.pending[*fed..upto]);
            *fed = upto;
        }
        self.drive();
    }

    /// A frame of refork's own, after what the crate wrote so far.
    pub(super) fn raw(&mut self, frame: Vec<u8>) {
        if frame[3] == prefilter::RST_STREAM {
            self.tallies[2] += 1;
        }
        let mut b = self.pipe.lock();
        b.output.extend_from_slice(&frame);
        self.scanned = b.output.len();
    }

    pub(super) fn retire(&mut self, sid: u32) {
        self.pre.forget(sid);
        if self.streams.remove(&sid).is_some() && self.retired.insert(sid) {
            self.retired_order.push_back(sid);
            if self.retired_order.len() > RETIRED_KEPT {
                if let Some(old) = self.retired_order.pop_front() {
                    self.retired.remove(&old);
                }
            }
        }
    }

    /// Poll the connection until it waits on the client; accept the new streams, read the bodies,
    /// read back what was written.
    pub(super) fn drive(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..1000 {
            let before = { let b = self.pipe.lock(); (b.output.len(), b.unread()) };
            match &mut self.state {
                State::Handshaking(h) => match h.as_mut().poll(&mut cx) {
                    Poll::Ready(Ok(mut conn)) => {
                        if self.draining_since.is_some() {
                            conn.graceful_shutdown(); // (a drain begun during the handshake)
                        }
                        self.state = State::Open(Box::new(conn));
                    }
                    Poll::Ready(Err(e)) => self.crate_error(&e),
                    Poll::Pending => {}
                },
                State::Open(conn) => loop {
                    match conn.poll_accept(&mut cx) {
                        Poll::Ready(Some(Ok((req, respond)))) => {
                            let (parts, recv) = req.into_parts();
                            let sid = u32::from(respond.stream_id());
                            if self.going_away && sid > self.final_last {
                                // (past refork's own final GOAWAY, which the crate does not know of)
                                let mut respond = respond;
                                respond.send_reset(Reason::REFUSED_STREAM);
                                self.retired.insert(sid);
                                continue;
                            }
                            let ended = recv.is_end_stream();
                            let path = parts.uri.path_and_query().map_or(b"/".to_vec(), |p| p.as_str().as_bytes().to_vec());
                            let authority = parts.uri.authority().map_or(Vec::new(), |a| a.as_str().as_bytes().to_vec());
                            let headers = parts.headers.iter().map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())).collect();
                            self.events.push(Event::Opened { sid, method: parts.method.as_str().to_string(), path, authority, headers, ended });
                            self.tallies[0] += 1;
                            self.last_stream_id = self.last_stream_id.max(sid);
                            self.streams.insert(sid, Stream { recv, recv_done: false, respond: Some(respond), send: None, send_done: false });
                        }
                        Poll::Ready(Some(Err(e))) => {
                            self.crate_error(&e);
                            break;
                        }
                        Poll::Ready(None) => {
                            self.state = State::Closed;
                            break;
                        }
                        Poll::Pending => break,
                    }
                },
                State::Closed => {}
            }
            let after = { let b = self.pipe.lock(); (b.output.len(), b.unread()) };
            if after == before || matches!(self.state, State::Closed) {
                break;
            }
        }
        self.read_bodies(&mut cx);
        for (sid, code) in std::mem::take(&mut self.client_resets) {
            if self.streams.contains_key(&sid) {
                self.events.push(Event::Reset(sid, code, true));
                self.retire(sid);
            }
        }
        self.scan();
    }

    fn read_bodies(&mut self, cx: &mut Context<'_>) {
        let mut done = Vec::new();
        for (&sid, s) in self.streams.iter_mut().filter(|(_, s)| !s.recv_done) {
            loop {
                match s.recv.poll_data(cx) {
                    Poll::Ready(Some(Ok(data))) => self.events.push(Event::Body(sid, data)),
                    Poll::Ready(Some(Err(e))) => {
                        let code = e.reason().map_or(0, u32::from);
                        if e.is_remote() {
                            self.events.push(Event::Reset(sid, code, true));
                            self.client_resets.retain(|&(id, _)| id != sid);
                            done.push(sid);
                        }
                        s.recv_done = true;
                        break;
                    }
                    Poll::Ready(None) => {
                        self.events.push(Event::Ended(sid));
                        s.recv_done = true;
                        if s.send_done {
                            done.push(sid);
                        }
                        break;
                    }
                    Poll::Pending => break,
                }
            }
        }
        for sid in done {
            self.retire(sid);
        }
    }

    /// Read back the frames the crate wrote since the last scan (their headers).
    fn scan(&mut self) {
        let mut found = Vec::new();
        {
            let mut b = self.pipe.lock();
            let out = &mut b.output;
            let mut at = self.scanned;
            while out.len() >= at + 9 {
                let len = (usize::from(out[at]) << 16) | (usize::from(out[at + 1]) << 8) | usize::from(out[at + 2]);
                if out.len() < at + 9 + len {
                    break;
                }
                let sid = u32::from_be_bytes([out[at + 5], out[at + 6], out[at + 7], out[at + 8]]) & 0x7fff_ffff;
                if out[at + 3] == prefilter::SETTINGS && out[at + 4] & 1 == 0 {
                    // the window the client is told is refork's own (the crate's is wide open)
                    for param in out[at + 9..at + 9 + len].chunks_exact_mut(6) {
                        if u16::from_be_bytes([param[0], param[1]]) == SETTINGS_INITIAL_WINDOW_SIZE {
                            param[2..].copy_from_slice(&self.initial_window.to_be_bytes());
                        }
                    }
                }
                if out[at + 3] == prefilter::WINDOW_UPDATE {
                    // the crate's windows are not the client's: refork gives back its own (the
                    // connection's as DATA arrives, a stream's as the app takes the body). Until
                    // the client acknowledges the SETTINGS, the crate's stream windows are the
                    // default 65,535 and it reopens them itself: passed on, each opening would
                    // reach the client twice
                    out.drain(at..at + 9 + len);
                    continue;
                }
                let p = &out[at + 9..at + 9 + len];
                let word = |i: usize| if p.len() >= i + 4 { u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]) } else { 0 };
                match out[at + 3] {
                    prefilter::RST_STREAM => found.push((prefilter::RST_STREAM, sid, word(0), 0)),
                    prefilter::GOAWAY => found.push((prefilter::GOAWAY, word(0) & 0x7fff_ffff, word(4), 0)),
                    prefilter::HEADERS => found.push((prefilter::HEADERS, sid, 0, 0)),
                    prefilter::PING if out[at + 4] & 1 == 0 && len == 8 => {
                        let mut data = [0u8; 8];
                        data.copy_from_slice(p);
                        self.shutdown_ping = Some(data);
                    }
                    _ => {}
                }
                at += 9 + len;
            }
            self.scanned = at;
        }
        for (kind, id, code, _) in found {
            match kind {
                prefilter::RST_STREAM => {
                    self.tallies[2] += 1;
                    if self.retired.contains(&id) || self.ended {
                        continue; // (refork's own, or the crate's on a stream refork let go)
                    }
                    let reason = if code == REFUSED_STREAM && !self.streams.contains_key(&id) {
                        "too many streams past the concurrency limit"
                    } else {
                        "too many streams reset (stream errors, MadeYouReset)"
                    };
                    if self.streams.contains_key(&id) {
                        self.events.push(Event::Reset(id, code, false));
                        self.retire(id);
                    }
                    if !self.pre_spend_reset() {
                        self.end(ENHANCE_YOUR_CALM, reason);
                    }
                }
                prefilter::GOAWAY => {
                    self.tallies[3] += 1;
                    if self.draining_since.is_some() && id != ANY_STREAM && code == 0 {
                        if !self.going_away {
                            self.going_away = true;
                            self.final_last = id;
                        }
                        self.crate_final = true;
                    }
                }
                _ => {
                    if !self.ended && !self.streams.contains_key(&id) && !self.retired.contains(&id) {
                        // the crate's 431 to a header list over the limit: an HPACK bomb
                        self.end(ENHANCE_YOUR_CALM, "a header list over the limit (HPACK bomb)");
                    }
                }
            }
        }
    }

    fn pre_spend_reset(&mut self) -> bool {
        self.pre.budgets.resets.spend(self.now)
    }

    fn crate_error(&mut self, e: &h2::Error) {
        self.state = State::Closed;
        if !self.ended {
            self.ended = true;
            let code = e.reason().map_or(PROTOCOL_ERROR, u32::from);
            let by_client = e.is_go_away() && e.is_remote();
            self.events.push(Event::ConnectionEnded { code, reason: e.to_string(), by_client, last: self.last_stream_id });
        }
    }

    /// End the connection now: GOAWAY with `code`; nothing more is read.
    pub fn end(&mut self, code: u32, reason: &str) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.events.push(Event::ConnectionEnded { code, reason: reason.to_string(), by_client: false, last: self.last_stream_id });
        match &mut self.state {
            State::Open(conn) => {
                conn.abrupt_shutdown(Reason::from(code));
                self.drive();
            }
            _ => {
                let mut payload = self.last_stream_id.to_be_bytes().to_vec();
                payload.extend_from_slice(&code.to_be_bytes());
                self.raw(prefilter::frame(prefilter::GOAWAY, 0, 0, &payload));
                self.tallies[3] += 1;
                self.state = State::Closed;
            }
        }
    }
}

/// A buffer's spare room given back once it is mostly empty: hundreds of connections each
/// holding a read's worth of capacity they no longer use would cost the worker tens of MiB.
pub(super) fn shrink(buf: &mut Vec<u8>) {
    if buf.capacity() > 4096 && buf.capacity() > 2 * buf.len() {
        buf.shrink_to(buf.len());
    }
}
