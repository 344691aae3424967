//! The PROXY protocol header (HAProxy's v1 and v2) for the native loops: refork.http.proxy_protocol's
//! rules in Rust, so that the pool's I/O thread, which never takes the GIL, reads it too. One table
//! of vectors (tests/support/proxy_vectors.py) drives both parsers (`parse_proxy` below is its Python face).
//!
//! A fresh connection's first bytes (conn/intake.rs `Intake::preface`): no header (served as it came), part
//! of one (wait), a header (taken out of the buffer, its client the connection's peer from then on),
//! or a malformed header or one from a peer not in proxy_allow_ips (400 or 403, then closed).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::host::ProxyPolicy;
use crate::sys::Peer;

const V1_PREFIX: &[u8] = b"PROXY ";
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\x00\r\nQUIT\n";
const V1_MAX: usize = 107;

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Mode {
    V1,
    V2,
    Auto,
}

impl Mode {
    fn parse(text: &str) -> Option<Mode> {
        match text {
            "v1" => Some(Mode::V1),
            "v2" => Some(Mode::V2),
            "auto" => Some(Mode::Auto),
            _ => None,
        }
    }

    fn v1(self) -> bool {
        self != Mode::V2
    }

    fn v2(self) -> bool {
        self != Mode::V1
    }
}

/// The verdict on a connection's first bytes (Err: a malformed header, why).
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    Incomplete,
    NotProxy,
    /// `len` bytes; the protocol ("TCP4", "TCP6", "UNKNOWN", "LOCAL", "UNSPEC", "UNIX"); the client
    /// (source) and server (destination) when it names them
    Header { len: usize, protocol: &'static str, client: Option<(String, u16)>, server: Option<(String, u16)> },
}

fn starts(data: &[u8], sig: &[u8]) -> bool {
    let n = data.len().min(sig.len());
    data[..n] == sig[..n]
}

pub(crate) fn parse(data: &[u8], mode: Mode) -> Result<Verdict, String> {
    if data.is_empty() {
        return Ok(Verdict::Incomplete);
    }
    if mode.v2() && starts(data, V2_SIGNATURE) {
        return if data.len() < V2_SIGNATURE.len() { Ok(Verdict::Incomplete) } else { v2(data) };
    }
    if mode.v1() && starts(data, V1_PREFIX) {
        return if data.len() < V1_PREFIX.len() { Ok(Verdict::Incomplete) } else { v1(data) };
    }
    Ok(Verdict::NotProxy)
}

fn v1(data: &[u8]) -> Result<Verdict, String> {
    let window = &data[..data.len().min(V1_MAX)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        if data.len() >= V1_MAX || window.contains(&b'\n') {
            return Err("PROXY v1 line longer than 107 bytes or without CRLF".into());
        }
        return Ok(Verdict::Incomplete);
    };
    let line = std::str::from_utf8(&data[..end]).ok().filter(|s| s.is_ascii()).ok_or("PROXY v1 line is not ASCII")?;
    let parts: Vec<&str> = line.split(' ').collect();
    if parts.len() >= 2 && parts[1] == "UNKNOWN" {
        return Ok(Verdict::Header { len: end + 2, protocol: "UNKNOWN", client: None, server: None });
    }
    if parts.len() != 6 {
        return Err(format!("invalid PROXY v1 line {line:?}"));
    }
    let (protocol, v6) = match parts[1] {
        "TCP4" => ("TCP4", false),
        "TCP6" => ("TCP6", true),
        other => return Err(format!("PROXY v1 protocol {other:?} not supported")),
    };
    let address = |text: &str| -> Result<String, String> {
        let ok = if v6 { text.parse::<Ipv6Addr>().is_ok() } else { text.parse::<Ipv4Addr>().is_ok() };
        if ok { Ok(text.to_string()) } else { Err(format!("invalid PROXY v1 address {text:?} for {protocol}")) }
    };
    let port = |text: &str| -> Result<u16, String> {
        if !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(p) = text.parse::<u32>() {
                if p <= 65535 {
                    return Ok(p as u16);
                }
            }
        }
        Err(format!("invalid PROXY v1 port {text:?}"))
    };
    let client = (address(parts[2])?, port(parts[4])?);
    let server = (address(parts[3])?, port(parts[5])?);
    Ok(Verdict::Header { len: end + 2, protocol, client: Some(client), server: Some(server) })
}

fn v2(data: &[u8]) -> Result<Verdict, String> {
    if data.len() < 16 {
        return Ok(Verdict::Incomplete);
    }
    let (version, command) = (data[12] >> 4, data[12] & 0x0F);
    if version != 2 {
        return Err(format!("PROXY v2 version {version} not supported"));
    }
    if command > 1 {
        return Err(format!("PROXY v2 command {command} not supported"));
    }
    let size = u16::from_be_bytes([data[14], data[15]]) as usize;
    let len = 16 + size;
    if data.len() < len {
        return Ok(Verdict::Incomplete);
    }
    let none = |protocol| Ok(Verdict::Header { len, protocol, client: None, server: None });
    if command == 0 {
        return none("LOCAL");
    }
    let (family, transport) = (data[13] >> 4, data[13] & 0x0F);
    if family == 0 {
        return none("UNSPEC");
    }
    if transport != 1 {
        return Err(format!("PROXY v2 transport {transport} not supported (TCP only)"));
    }
    let body = &data[16..len];
    let port = |at: usize| u16::from_be_bytes([body[at], body[at + 1]]);
    match family {
        1 => {
            if size < 12 {
                return Err("PROXY v2 header too short for IPv4 addresses".into());
            }
            let src = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
            let dst = Ipv4Addr::new(body[4], body[5], body[6], body[7]);
            Ok(Verdict::Header { len, protocol: "TCP4", client: Some((src.to_string(), port(8))), server: Some((dst.to_string(), port(10))) })
        }
        2 => {
            if size < 36 {
                return Err("PROXY v2 header too short for IPv6 addresses".into());
            }
            let octets = |at: usize| -> [u8; 16] { body[at..at + 16].try_into().expect("16 bytes") };
            let (src, dst) = (Ipv6Addr::from(octets(0)), Ipv6Addr::from(octets(16)));
            Ok(Verdict::Header { len, protocol: "TCP6", client: Some((src.to_string(), port(32))), server: Some((dst.to_string(), port(34))) })
        }
        3 => none("UNIX"),
        _ => Err(format!("PROXY v2 address family {family} not supported")),
    }
}

/// proxy_protocol and proxy_allow_ips (refork.http.proxy_protocol.ProxyPolicy), and the answers to
/// a refused header.
pub(crate) struct Policy {
    mode: Mode,
    any: bool,
    /// networks (address, prefix length); IPv4-mapped IPv6 peers are compared as IPv4
    networks: Vec<(IpAddr, u8)>,
    pub bad_request: Vec<u8>,
    pub forbidden: Vec<u8>,
}

/// What a refused header gets: 403 (`forbidden`) or 400, and the warning line.
pub(crate) struct Refusal {
    pub forbidden: bool,
    pub line: String,
}

fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn within(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix as u32) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix as u32) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

impl Policy {
    /// From the settings' ProxyPolicy and the host's `proxy_responses` (the 400 and 403 answers).
    pub fn new(proxy: &ProxyPolicy, (bad_request, forbidden): (Vec<u8>, Vec<u8>)) -> PyResult<Policy> {
        let mode = Mode::parse(&proxy.mode).ok_or_else(|| PyValueError::new_err(format!("proxy_protocol {:?}", proxy.mode)))?;
        let mut policy = Policy { mode, any: false, networks: Vec::new(), bad_request, forbidden };
        for entry in &proxy.allow {
            let entry = entry.trim();
            if entry == "*" {
                policy.any = true;
            } else if entry == "unix:" || entry.is_empty() {
                continue; // unix-socket peers may always send a header
            } else {
                let (addr, prefix) = match entry.split_once('/') {
                    Some((a, p)) => (a, Some(p)),
                    None => (entry, None),
                };
                let ip: IpAddr = addr.parse().map_err(|_| PyValueError::new_err(format!("proxy_allow_ips: {entry:?}")))?;
                let full = if ip.is_ipv4() { 32 } else { 128 };
                let prefix = match prefix {
                    Some(p) => p.parse::<u8>().ok().filter(|&p| p <= full).ok_or_else(|| PyValueError::new_err(format!("proxy_allow_ips: {entry:?}")))?,
                    None => full,
                };
                let ip = if prefix == full { unmapped(ip) } else { ip }; // an address, as the peer is compared
                policy.networks.push((ip, if prefix == full && ip.is_ipv4() { 32 } else { prefix }));
            }
        }
        Ok(policy)
    }

    pub fn allowed(&self, peer: &Peer) -> bool {
        let Peer::Inet(host, _) = peer else { return true };
        if self.any {
            return true;
        }
        let Ok(ip) = host.parse::<IpAddr>() else { return false };
        let ip = unmapped(ip);
        self.networks.iter().any(|&(net, prefix)| within(ip, net, prefix))
    }

    /// parse(), and a refusal once a header's signature arrived from a peer that may not send one
    /// (before its syntax is judged, as gunicorn does).
    pub fn check(&self, data: &[u8], peer: &Peer) -> Result<Verdict, Refusal> {
        let verdict = parse(data, self.mode);
        let signed = (self.mode.v1() && data.starts_with(V1_PREFIX)) || (self.mode.v2() && data.starts_with(V2_SIGNATURE));
        let who = match peer {
            Peer::Inet(host, _) => host.as_str(),
            Peer::Unix => "a unix-socket peer",
        };
        if signed && !self.allowed(peer) {
            let line = format!("PROXY protocol: a PROXY header from a peer not in proxy_allow_ips (from {who}); connection closed");
            return Err(Refusal { forbidden: true, line });
        }
        verdict.map_err(|why| Refusal { forbidden: false, line: format!("PROXY protocol: {why} (from {who}); connection closed") })
    }
}

/// parse_proxy(data, mode) -> (protocol, length, client, server) | "INCOMPLETE" | "NOT_PROXY";
/// ValueError for a malformed header (the Rust parser, for the shared table of vectors).
#[pyfunction]
pub fn parse_proxy(py: Python<'_>, data: &[u8], mode: &str) -> PyResult<Py<PyAny>> {
    let mode = Mode::parse(mode).ok_or_else(|| PyValueError::new_err(format!("mode {mode:?}")))?;
    match parse(data, mode).map_err(PyValueError::new_err)? {
        Verdict::Incomplete => Ok("INCOMPLETE".into_pyobject(py)?.into_any().unbind()),
        Verdict::NotProxy => Ok("NOT_PROXY".into_pyobject(py)?.into_any().unbind()),
        Verdict::Header { len, protocol, client, server } => Ok((protocol, len, client, server).into_pyobject(py)?.into_any().unbind()),
    }
}
