//! A response's header fields as the app gave them, checked and copied into its head by the rules
//! of refork.http.response.ResponseFramer.head: shared by `frame_list` (which declines what they
//! refuse) and `ResponseFramer` (which raises the Python framer's error for it).

/// What the fields said that the rest of the head depends on.
pub(crate) struct Facts {
    pub(crate) content_length: Option<u64>,
    /// `Connection: close` among them
    pub(crate) close: bool,
    pub(crate) has_date: bool,
    pub(crate) has_server: bool,
}

/// The first field the rules refuse, and why.
pub(crate) enum Refused<'a> {
    Name(&'a [u8]),
    Value(&'a [u8], &'a [u8]),
    Length(&'a [u8]),
    ConflictingLengths,
}

const TOKEN_EXTRA: &[u8] = b"!#$%&'*+-.^_`|~";

/// The bytes a token may hold, by value.
const TOKEN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let mut i = 0;
    while i < TOKEN_EXTRA.len() {
        table[TOKEN_EXTRA[i] as usize] = true;
        i += 1;
    }
    table
};

fn is_token(name: &[u8]) -> bool {
    !name.is_empty() && name.iter().all(|&b| TOKEN[b as usize])
}

/// A control character a field value must not hold (CTL but HTAB): CR/LF would split the response.
fn has_control(value: &[u8]) -> bool {
    value.iter().any(|&b| (b < 32 && b != b'\t') || b == 127)
}

/// Copy `fields` into `out` as "name: value" lines, checking each: a token name, no control
/// character in the value, Content-Length digits only (and one value); Transfer-Encoding,
/// Keep-Alive and Connection are dropped (the framing is the server's), Content-Length too with
/// `drop_length` (1xx, 204).
pub(crate) fn copy_fields<'a>(fields: &[(&'a [u8], &'a [u8])], drop_length: bool, out: &mut Vec<u8>) -> Result<Facts, Refused<'a>> {
    let mut facts = Facts { content_length: None, close: false, has_date: false, has_server: false };
    for &(name, value) in fields {
        if !is_token(name) {
            return Err(Refused::Name(name));
        }
        if has_control(value) {
            return Err(Refused::Value(name, value));
        }
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        match name.len() {
            14 if is(b"content-length") => {
                let length = value
                    .iter()
                    .try_fold(0u64, |n, &b| if b.is_ascii_digit() { n.checked_mul(10)?.checked_add(u64::from(b - b'0')) } else { None })
                    .filter(|_| !value.is_empty())
                    .ok_or(Refused::Length(value))?;
                if facts.content_length.is_some_and(|c| c != length) {
                    return Err(Refused::ConflictingLengths);
                }
                facts.content_length = Some(length);
                if drop_length {
                    continue;
                }
            }
            17 if is(b"transfer-encoding") => continue,
            10 if is(b"keep-alive") => continue,
            10 if is(b"connection") => {
                let squeezed: Vec<u8> = value.to_ascii_lowercase().into_iter().filter(|&b| b != b' ').collect();
                facts.close |= squeezed.split(|&b| b == b',').any(|t| t == b"close");
                continue;
            }
            4 if is(b"date") => facts.has_date = true,
            6 if is(b"server") => facts.has_server = true,
            _ => {}
        }
        out.reserve(name.len() + value.len() + 4);
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::{copy_fields, has_control, is_token, Refused};

    #[test]
    fn names_are_tokens_and_values_hold_no_control_bytes() {
        assert!(is_token(b"X-Request-Id") && is_token(b"a!#$%&'*+-.^_`|~9"));
        assert!(!is_token(b"") && !is_token(b"a b") && !is_token(b"a:b") && !is_token(b"\xc3\xa9"));
        assert!(!has_control(b"text/plain; q=1\t") && has_control(b"a\r\nb") && has_control(b"\x7f"));
    }

    #[test]
    fn framing_fields_are_the_servers() {
        let mut out = Vec::new();
        let fields: [(&[u8], &[u8]); 6] = [
            (b"Content-Type", b"text/plain"),
            (b"Content-Length", b"2"),
            (b"Transfer-Encoding", b"chunked"),
            (b"Connection", b"keep-alive, Close"),
            (b"Date", b"x"),
            (b"content-length", b"2"),
        ];
        let facts = copy_fields(&fields, false, &mut out).ok().expect("accepted");
        assert_eq!(out, b"Content-Type: text/plain\r\nContent-Length: 2\r\nDate: x\r\ncontent-length: 2\r\n");
        assert!(facts.content_length == Some(2) && facts.close && facts.has_date && !facts.has_server);
        out.clear();
        assert!(copy_fields(&fields[..2], true, &mut out).is_ok());
        assert_eq!(out, b"Content-Type: text/plain\r\n");
    }

    #[test]
    fn the_first_bad_field_is_named() {
        let mut out = Vec::new();
        let refused = |fields: &[(&'static [u8], &'static [u8])]| match copy_fields(fields, false, &mut Vec::new()) {
            Err(Refused::Name(n)) => format!("name {n:?}"),
            Err(Refused::Value(_, v)) => format!("value {v:?}"),
            Err(Refused::Length(v)) => format!("length {v:?}"),
            Err(Refused::ConflictingLengths) => "conflict".to_string(),
            Ok(_) => "ok".to_string(),
        };
        assert_eq!(refused(&[(b"a b", b"1"), (b"x", b"\r")]), format!("name {:?}", b"a b"));
        assert_eq!(refused(&[(b"x", b"\r\n")]), format!("value {:?}", b"\r\n"));
        assert_eq!(refused(&[(b"Content-Length", b"+1")]), format!("length {:?}", b"+1"));
        assert_eq!(refused(&[(b"Content-Length", b"99999999999999999999")]), format!("length {:?}", b"99999999999999999999"));
        assert_eq!(refused(&[(b"Content-Length", b"1"), (b"Content-Length", b"2")]), "conflict");
        assert!(copy_fields(&[], false, &mut out).is_ok() && out.is_empty());
    }
}
