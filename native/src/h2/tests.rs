//! The driver end to end over hand-built client frames (no client library): a request and its
//! response, refork's window in the SETTINGS, the budgets, the two-step graceful GOAWAY.

use super::driver::{Core, Event, Limits};
use super::prefilter::{frame, Budget, Budgets, DATA, GOAWAY, HEADERS, PING, PREFACE, RST_STREAM, SETTINGS, WINDOW_UPDATE};

const GET: &[u8] = &[0x82, 0x84, 0x86, 0x41, 0x01, b'a']; // GET / http, :authority a (HPACK)

fn limits(resets: u32) -> Limits {
    let b = Budget::new(100, 10.0);
    let budgets = Budgets { resets: Budget::new(resets, 1.0), settings: b, pings: b, window_updates: b, priorities: b, empty_data: b };
    Limits { max_concurrent_streams: 10, initial_window_size: 1000, max_frame_size: 16384, max_header_list_size: 65536, connection_window: 1 << 24, budgets }
}

/// The frames in `data`: (type, flags, stream, payload).
fn frames(mut data: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while data.len() >= 9 {
        let len = (usize::from(data[0]) << 16) | (usize::from(data[1]) << 8) | usize::from(data[2]);
        let sid = u32::from_be_bytes([data[5], data[6], data[7], data[8]]);
        out.push((data[3], data[4], sid, data[9..9 + len].to_vec()));
        data = &data[9 + len..];
    }
    out
}

fn connected(resets: u32) -> Core {
    let mut core = Core::new(limits(resets));
    core.start();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, b""));
    assert_eq!(core.receive(&hello, 0.0), vec![Event::Window(0)]);
    core.data_to_send();
    core
}

#[test]
fn a_request_and_its_response() {
    let mut core = connected(10);
    let events = core.receive(&frame(HEADERS, 0x5, 1, GET), 0.0);
    assert!(matches!(&events[0], Event::Opened { sid: 1, method, path, authority, ended: true, .. }
        if method == "GET" && path == b"/" && authority == b"a"));
    assert_eq!(events[1], Event::Ended(1));
    core.respond(1, 200, &[(b"Content-Type".to_vec(), b"text/plain".to_vec()), (b"Connection".to_vec(), b"close".to_vec())], false);
    assert_eq!(core.send_body(1, b"hello", true), 5);
    let out = frames(&core.data_to_send());
    let kinds: Vec<(u8, u8, u32)> = out.iter().map(|f| (f.0, f.1, f.2)).collect();
    assert_eq!(kinds, vec![(HEADERS, 0x4, 1), (DATA, 0x1, 1)]);
    assert_eq!(out[1].3, b"hello");
    assert_eq!(core.open_streams(), 0);
}

#[test]
fn the_client_is_told_refork_s_window_and_gets_it_back_as_the_app_takes_the_body() {
    let mut core = Core::new(limits(10));
    core.start();
    let settings = frames(&core.data_to_send()).into_iter().find(|f| f.0 == SETTINGS).unwrap();
    let window = settings.3.chunks(6).find(|p| p[..2] == [0, 4]).map(|p| u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
    assert_eq!(window, Some(1000));
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, b""));
    hello.extend(frame(HEADERS, 0x4, 1, GET));
    hello.extend(frame(DATA, 0, 1, &[7; 1000]));
    let events = core.receive(&hello, 0.0);
    assert!(events.contains(&Event::Body(1, bytes::Bytes::from(vec![7; 1000]))));
    core.data_to_send();
    core.body_consumed(1, 300);
    let updates: Vec<_> = frames(&core.data_to_send()).into_iter().filter(|f| f.0 == 8 && f.2 == 1).collect();
    assert_eq!(updates[0].3, 300u32.to_be_bytes());
    let past = core.receive(&frame(DATA, 0, 1, &[7; 301]), 0.0);
    assert!(matches!(past[..], [Event::ConnectionEnded { code: 3, .. }]));
}

#[test]
fn rapid_reset_spends_the_budget_then_goaway() {
    let mut core = connected(5);
    let mut flood = Vec::new();
    for i in 0..10u32 {
        flood.extend(frame(HEADERS, 0x5, 1 + 2 * i, GET));
        flood.extend(frame(RST_STREAM, 0, 1 + 2 * i, &8u32.to_be_bytes()));
    }
    let events = core.receive(&flood, 0.0);
    assert!(events.iter().any(|e| matches!(e, Event::ConnectionEnded { code: 0xb, reason, .. } if reason.contains("Rapid Reset"))));
    let goaway = frames(&core.data_to_send()).into_iter().find(|f| f.0 == GOAWAY).unwrap();
    assert_eq!(goaway.3[4..], 0xbu32.to_be_bytes());
    assert!(core.receive(b"more", 1.0).is_empty());
}

#[test]
fn graceful_goaway_in_two_steps_the_second_on_the_ping_ack_or_the_wait() {
    for acked in [true, false] {
        let mut core = connected(10);
        core.receive(&frame(HEADERS, 0x5, 1, GET), 0.0);
        core.goaway(0.0);
        let first = frames(&core.data_to_send());
        assert_eq!(first[0].0, GOAWAY);
        assert_eq!(first[0].3[..4], ((1u32 << 31) - 1).to_be_bytes());
        assert_eq!((first[1].0, first[1].1), (PING, 0));
        core.receive(&frame(HEADERS, 0x5, 3, GET), 0.1);
        if acked {
            core.receive(&frame(PING, 1, 0, &first[1].3), 0.2);
        } else {
            core.tick(0.5, 0.9);
            assert!(!core.going_away);
            core.tick(1.0, 0.9);
        }
        assert!(core.going_away);
        let last = frames(&core.data_to_send()).into_iter().find(|f| f.0 == GOAWAY).unwrap();
        assert_eq!(last.3[..4], 3u32.to_be_bytes());
        core.receive(&frame(HEADERS, 0x5, 5, GET), 1.1);
        let refused = frames(&core.data_to_send()).into_iter().find(|f| f.0 == RST_STREAM).unwrap();
        assert_eq!((refused.2, refused.3), (5, 7u32.to_be_bytes().to_vec()));
    }
}

#[test]
fn a_drain_begun_before_the_client_s_preface_sends_the_goaway_once_it_arrives() {
    // the worker stops while a just-accepted connection is mid-handshake: without the GOAWAY the
    // client would keep the connection, and the draining worker would serve it until killed
    let mut core = Core::new(limits(10));
    core.start();
    core.data_to_send();
    core.goaway(0.0);
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, b""));
    core.receive(&hello, 0.1);
    let out = frames(&core.data_to_send());
    let goaway = out.iter().find(|f| f.0 == GOAWAY).expect("a GOAWAY once the handshake is done");
    assert_eq!(goaway.3[..4], ((1u32 << 31) - 1).to_be_bytes());
    assert!(out.iter().any(|f| (f.0, f.1) == (PING, 0)));
}

#[test]
fn a_client_still_silent_at_the_drain_s_wait_is_ended() {
    // (TLS: ALPN picked h2 and the preface never came): the draining worker need not wait for it
    let mut core = Core::new(limits(10));
    core.start();
    core.data_to_send();
    core.goaway(0.0);
    core.tick(0.5, 0.9);
    assert!(!core.ended);
    core.tick(1.0, 0.9);
    assert!(core.ended);
    let goaway = frames(&core.data_to_send()).into_iter().find(|f| f.0 == GOAWAY).unwrap();
    assert_eq!(goaway.3, [0u8; 8]);
}

#[test]
fn a_header_block_being_received_at_the_wait_gets_refork_s_final_goaway() {
    let mut core = connected(10);
    core.receive(&frame(HEADERS, 0x1, 1, &GET[..3]), 0.0); // no END_HEADERS: a slowloris
    core.goaway(0.0);
    core.data_to_send();
    core.tick(1.0, 0.9);
    assert!(core.going_away);
    let last = frames(&core.data_to_send()).into_iter().find(|f| f.0 == GOAWAY).unwrap();
    assert_eq!(last.3, [0u8; 8]);
    let events = core.receive(&frame(super::prefilter::CONTINUATION, 0x4, 1, &GET[3..]), 1.1);
    assert!(!events.iter().any(|e| matches!(e, Event::Opened { .. })));
    let refused = frames(&core.data_to_send()).into_iter().find(|f| f.0 == RST_STREAM).unwrap();
    assert_eq!((refused.2, refused.3), (1, 7u32.to_be_bytes().to_vec()));
}

#[test]
fn uploads_in_the_first_flight_may_fill_the_connection_window_refork_announced_at_start() {
    // the client reads refork's connection WINDOW_UPDATE before the crate has one: 8 streams x
    // 65535 bytes in the first flight, however it is cut, are within the window
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, b""));
    for i in 0..8u32 {
        hello.extend(frame(HEADERS, 0x4, 1 + 2 * i, GET));
    }
    for i in 0..8u32 {
        for len in [16384usize, 16384, 16384, 16383] {
            hello.extend(frame(DATA, 0, 1 + 2 * i, &vec![7; len]));
        }
    }
    for cut in [hello.len(), 9, 40, 9000, 100_000] {
        let mut core = Core::new(Limits { initial_window_size: 65535, ..limits(10) });
        core.start();
        let mut events = core.receive(&hello[..cut], 0.0);
        events.extend(core.receive(&hello[cut..], 0.0));
        assert!(!events.iter().any(|e| matches!(e, Event::ConnectionEnded { .. })), "cut at {cut}: {events:?}");
        assert_eq!(events.iter().filter(|e| matches!(e, Event::Opened { .. })).count(), 8);
    }
}

#[test]
fn a_body_taken_before_the_client_acknowledges_the_settings_reopens_its_window_once() {
    // the crate's stream windows are the default until the client's SETTINGS ACK, and it would
    // reopen them itself: the client must get refork's WINDOW_UPDATE only, or it is told it may
    // send twice what refork counts (and is then ended for DATA past the window)
    let mut core = Core::new(Limits { initial_window_size: 65535, ..limits(10) });
    core.start();
    core.data_to_send();
    let mut flight = PREFACE.to_vec();
    flight.extend(frame(SETTINGS, 0, 0, b""));
    flight.extend(frame(HEADERS, 0x4, 1, GET));
    for _ in 0..3 {
        flight.extend(frame(DATA, 0, 1, &[7; 16384]));
    }
    let events = core.receive(&flight, 0.0);
    assert!(!events.iter().any(|e| matches!(e, Event::ConnectionEnded { .. })), "{events:?}");
    core.body_consumed(1, 27_563);
    let updates: Vec<(u32, Vec<u8>)> =
        frames(&core.data_to_send()).into_iter().filter(|f| f.0 == WINDOW_UPDATE && f.2 == 1).map(|f| (f.2, f.3)).collect();
    assert_eq!(updates, vec![(1, 27_563u32.to_be_bytes().to_vec())]);
}
