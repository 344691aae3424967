//! The static cache: the native engine's replay of --static answers, without the app or Python.
//!
//! refork.serving.static decides every static answer (the path resolved safely, the
//! representation chosen, the headers). When it answers a plain 200, its host
//! (refork.serving.static_apps) records the decision here: the request's key (method, the exact
//! target, the exact Accept-Encoding value or none), the answer's header fields, the files it
//! stands on with their stat keys (dev, inode, size, mtime), and the body (a small file's bytes,
//! or the path of a bigger one, sent by sendfile). The engine (engine/static_replay.rs), or the
//! pool engine's I/O thread without the GIL (pool/io.rs), then answers the same request again
//! from here: one `stat` per file checks it is still the file
//! that was decided on (any change drops the entry: Python decides again), the head is framed as
//! http/frame.rs frames it (the fields, Date, Server, Connection), the body sent.
//!
//! Only the plain request is replayed: no Range, If-None-Match, If-Modified-Since, If-Range, no
//! repeated Accept-Encoding, no request body; anything else goes to the app's path. The cache is
//! bounded (ENTRIES, HELD) and starts over when full; each worker empties it when it builds its
//! mounts (static_cache_reset), so a reload's workers decide again.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;

use crate::http::date::cached_date;
use crate::http::fields::{copy_fields, Facts};
use crate::http::head::Head;

/// Entries kept at most (one per method, target and Accept-Encoding value).
pub(crate) const ENTRIES: usize = 1024;
/// Bytes of small files' bodies kept at most.
pub(crate) const HELD: usize = 8 * 1024 * 1024;

/// (dev, inode, size, mtime in ns): what a file must still be for its entry to hold.
type StatKey = (u64, u64, u64, i64);
/// (method, target, Accept-Encoding value or None)
type Key = (&'static str, Vec<u8>, Option<Vec<u8>>);

enum Body {
    None,
    Held(Vec<u8>),
    File(Vec<u8>, StatKey),
}

struct Entry {
    key: Key,
    /// the status line and the answer's fields, as framed
    head: Vec<u8>,
    has_date: bool,
    has_server: bool,
    checks: Vec<(Vec<u8>, StatKey)>,
    body: Body,
}

#[derive(Default)]
struct Cache {
    /// by key_hash(): a request's lookup allocates nothing (the entry's key is compared)
    entries: HashMap<u64, Entry>,
    held: usize,
}

static ON: AtomicBool = AtomicBool::new(false);
static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn cache() -> std::sync::MutexGuard<'static, Option<Cache>> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// static_cache_reset(on): empty the cache; `on` False: nothing is recorded or replayed.
#[pyfunction]
pub(crate) fn static_cache_reset(on: bool) {
    *cache() = if on { Some(Cache::default()) } else { None };
    ON.store(on, Ordering::Release);
}

/// static_cache_remember(method, target, accept_encoding, headers, checks, path, data): record
/// a 200 answer. `headers` [(name, value)] as bytes, Content-Length included; `checks`
/// [(path, (dev, ino, size, mtime_ns))]; the body: `data` (a small file's bytes), or `path` (sent
/// from the file, which must still match its check), or neither (HEAD). False: not recorded.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (method, target, accept_encoding, headers, checks, path=None, data=None))]
pub(crate) fn static_cache_remember(
    method: &str,
    target: &[u8],
    accept_encoding: Option<&[u8]>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    checks: Vec<(Vec<u8>, StatKey)>,
    path: Option<Vec<u8>>,
    data: Option<Vec<u8>>,
) -> bool {
    let method = match method {
        "GET" => "GET",
        "HEAD" => "HEAD",
        _ => return false,
    };
    if !ON.load(Ordering::Acquire) {
        return false;
    }
    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
    let fields: Vec<(&[u8], &[u8])> = headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())).collect();
    let Ok(Facts { content_length: Some(length), close: false, has_date, has_server }) = copy_fields(&fields, false, &mut head) else {
        return false;
    };
    let body = match (path, data) {
        (_, Some(data)) if method == "GET" && data.len() as u64 == length => Body::Held(data),
        (Some(path), None) if method == "GET" => match checks.iter().find(|(p, _)| *p == path) {
            Some((_, key)) if key.2 == length => Body::File(path, *key),
            _ => return false,
        },
        (None, None) if method == "HEAD" => Body::None,
        _ => return false,
    };
    let size = if let Body::Held(data) = &body { data.len() } else { 0 };
    let mut guard = cache();
    let Some(cache) = guard.as_mut() else { return false };
    if size > HELD {
        return false;
    }
    if cache.entries.len() >= ENTRIES || cache.held + size > HELD {
        cache.entries.clear();
        cache.held = 0;
    }
    let hash = key_hash(method, target, accept_encoding);
    let key = (method, target.to_vec(), accept_encoding.map(<[u8]>::to_vec));
    let entry = Entry { key, head, has_date, has_server, checks, body };
    if let Some(old) = cache.entries.insert(hash, entry) {
        cache.held -= held(&old);
    }
    cache.held += size;
    true
}

fn key_hash(method: &str, target: &[u8], accept_encoding: Option<&[u8]>) -> u64 {
    let mut h = DefaultHasher::new();
    (method, target, accept_encoding).hash(&mut h);
    h.finish()
}

fn held(entry: &Entry) -> usize {
    match &entry.body {
        Body::Held(data) => data.len(),
        _ => 0,
    }
}

fn stat_key(meta: &std::fs::Metadata) -> StatKey {
    (meta.dev(), meta.ino(), meta.size(), meta.mtime() * 1_000_000_000 + meta.mtime_nsec())
}

fn unchanged(path: &[u8], key: &StatKey) -> bool {
    use std::os::unix::ffi::OsStrExt;
    std::fs::metadata(std::ffi::OsStr::from_bytes(path)).is_ok_and(|m| m.is_file() && stat_key(&m) == *key)
}

/// A replayed answer: the framed head (and a small body), then `file`'s `size` bytes, if any.
pub(crate) struct Reply {
    pub bytes: Vec<u8>,
    pub file: Option<(File, usize)>,
}

/// The recorded answer to `head` (`keep`: the connection stays open), or None: the app's path
/// answers it (not recorded, not the plain request, or a file changed: then forgotten).
pub(crate) fn replay(head: &Head, keep: bool) -> Option<Reply> {
    if !ON.load(Ordering::Relaxed) || (head.method != "GET" && head.method != "HEAD") || head.content_length.is_some_and(|n| n > 0) {
        return None;
    }
    let mut accept_encoding = None;
    for (name, value) in &head.headers {
        match name.as_slice() {
            b"range" | b"if-none-match" | b"if-modified-since" | b"if-range" => return None,
            b"accept-encoding" if accept_encoding.is_some() => return None,
            b"accept-encoding" => accept_encoding = Some(*value),
            _ => {}
        }
    }
    let hash = key_hash(head.method, head.target, accept_encoding);
    let mut guard = cache();
    let cache = guard.as_mut()?;
    let entry = cache.entries.get(&hash)?;
    if entry.key.0 != head.method || entry.key.1 != head.target || entry.key.2.as_deref() != accept_encoding {
        return None;
    }
    let file = match &entry.body {
        _ if !entry.checks.iter().all(|(path, k)| unchanged(path, k)) => None,
        Body::File(path, k) => {
            use std::os::unix::ffi::OsStrExt;
            match File::open(std::ffi::OsStr::from_bytes(path)) {
                Ok(f) if f.metadata().is_ok_and(|m| stat_key(&m) == *k) => Some(Some((f, k.2 as usize))),
                _ => None,
            }
        }
        _ => Some(None),
    };
    let Some(file) = file else {
        if let Some(old) = cache.entries.remove(&hash) {
            cache.held -= held(&old);
        }
        return None;
    };
    let body: &[u8] = if let Body::Held(data) = &entry.body { data } else { b"" };
    let mut bytes = Vec::with_capacity(entry.head.len() + 96 + body.len());
    bytes.extend_from_slice(&entry.head);
    if !entry.has_date {
        cached_date(&mut bytes);
    }
    if !entry.has_server {
        bytes.extend_from_slice(b"Server: refork\r\n");
    }
    if !keep {
        bytes.extend_from_slice(b"Connection: close\r\n");
    } else if !head.http11 {
        bytes.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    bytes.extend_from_slice(b"\r\n");
    bytes.extend_from_slice(body);
    Some(Reply { bytes, file })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(target: &'a [u8], headers: Vec<(Vec<u8>, &'a [u8])>) -> Head<'a> {
        Head { method: "GET", target, http11: true, headers, keep_alive: true, content_length: None, forwarded: false, len: 0 }
    }

    #[test]
    fn a_recorded_answer_is_replayed_until_its_file_changes() {
        let dir = std::env::temp_dir().join(format!("refork-static-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.css");
        std::fs::write(&path, b"body{}").unwrap();
        let key = stat_key(&std::fs::metadata(&path).unwrap());
        let name = path.to_str().unwrap().as_bytes().to_vec();
        static_cache_reset(true);
        let fields = vec![(b"content-type".to_vec(), b"text/css".to_vec()), (b"content-length".to_vec(), b"6".to_vec())];
        assert!(static_cache_remember("GET", b"/s/a.css", None, fields, vec![(name, key)], None, Some(b"body{}".to_vec())));

        let reply = replay(&get(b"/s/a.css", vec![]), true).expect("replayed");
        let text = String::from_utf8(reply.bytes).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\ncontent-type: text/css\r\ncontent-length: 6\r\nDate: "), "{text}");
        assert!(text.ends_with("Server: refork\r\n\r\nbody{}") && reply.file.is_none(), "{text}");
        let closing = String::from_utf8(replay(&get(b"/s/a.css", vec![]), false).unwrap().bytes).unwrap();
        assert!(closing.ends_with("Connection: close\r\n\r\nbody{}"));

        assert!(replay(&get(b"/s/a.css?v=2", vec![]), true).is_none()); // another target
        assert!(replay(&get(b"/s/a.css", vec![(b"accept-encoding".to_vec(), b"gzip")]), true).is_none());
        assert!(replay(&get(b"/s/a.css", vec![(b"range".to_vec(), b"bytes=0-1")]), true).is_none());
        assert!(replay(&get(b"/s/a.css", vec![(b"if-none-match".to_vec(), b"\"x\"")]), true).is_none());

        std::fs::write(&path, b"body{x}").unwrap();
        assert!(replay(&get(b"/s/a.css", vec![]), true).is_none()); // changed: forgotten
        std::fs::write(&path, b"body{}").unwrap();
        assert!(replay(&get(b"/s/a.css", vec![]), true).is_none());
        static_cache_reset(false);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
