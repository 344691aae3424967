//! refork's native request path (`refork._native`).
//!
//! `Engine` (engine.rs) is the connection loop of a single-thread WSGI worker: epoll, accept,
//! read, the common request shape parsed with `httparse`, the environ built, the app called and a
//! list body framed and written in one `send`, all without returning to Python between requests.
//! `PoolEngine` (pool.rs) is the same for a worker with a pool of app threads (`--threads N`): an
//! I/O thread that never takes the GIL reads and parses, the app threads call the app. Both share
//! the connection rules (conn.rs, the PROXY protocol header in proxy.rs) and the app call (call.rs).
//! Whatever is not the common shape is
//! handed, from its first byte, to the Python loop (refork.serving.threaded), which gives every
//! verdict exactly as it does without the engines.
//!
//! `Parser` (parser.rs) is a drop-in for `refork.http.parser.RequestParser` (same `feed()` /
//! `in_message` contract, same events) used by the Python loop: the common shape is read with
//! `httparse` in one pass; anything else goes, from the first byte of that message, to the Python
//! parser. The fast subset is deliberately narrow (see `parser::fast_head`): a well-known method,
//! HTTP/1.0 or 1.1, an origin-form target of visible ASCII, CRLF line ends only, printable header
//! values, one valid Host, at most one digits-only Content-Length within the body limit, no
//! Transfer-Encoding, no Expect, no Upgrade, Connection only `close` / `keep-alive`, every field
//! well within the limit_request_* settings.

use pyo3::prelude::*;

mod call;
mod clock;
mod conn;
mod engine;
mod environ;
mod frame;
mod listen;
mod parser;
mod pool;
mod proxy;
mod respond;
mod sys;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<parser::Parser>()?;
    m.add_class::<environ::Environ>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<pool::PoolEngine>()?;
    m.add_class::<respond::StartResponse>()?;
    m.add_class::<clock::Current>()?;
    m.add_class::<conn::MemoryBudget>()?;
    m.add_function(wrap_pyfunction!(frame::frame_list, m)?)?;
    m.add_function(wrap_pyfunction!(proxy::parse_proxy, m)?)?;
    Ok(())
}
