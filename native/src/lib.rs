//! refork's native request path (`refork._native`), by role:
//!
//! - `engine/`: `Engine`, the connection loop of a single-thread WSGI worker: epoll, accept, read,
//!   the common request shape parsed with `httparse`, the environ built, the app called and a
//!   list body framed and written in one `send`, all without returning to Python between requests.
//! - `pool/`: `PoolEngine`, the same for a worker with a pool of app threads (`--threads N`): an
//!   I/O thread that never takes the GIL reads and parses (io.rs), the app threads call the app
//!   (serve.rs).
//! - `conn/`: what both loops keep per connection and the rules they share with the Python loop:
//!   what they serve and what they hand over (intake.rs), the sweep's deadlines (sweep.rs), the
//!   read buffer (scratch.rs), the memory budget (budget.rs), the listeners (listen.rs), the
//!   PROXY protocol header (proxy.rs).
//! - `http/`: HTTP without WSGI: the head's fast path (head.rs), the Python loops' `Parser`
//!   (parser.rs, with its `ParserRefs`), a Python Request read typed (request.rs), the Host value
//!   (host.rs), response framing (frame.rs; the ASGI loop's `ResponseFramer`, framer.rs), its
//!   header fields (fields.rs) and its Date line (date.rs).
//! - `wsgi/`: the WSGI request path both engines share: the environ, start_response, the app
//!   call (app_call.rs) and its body pulled for framing (body.rs), the request's accounting in the
//!   worker's slot or by the Python clock (accounting.rs), the access-log line (`AccessLine`,
//!   access_log.rs).
//! - `asgi/`: what the ASGI loop (on asyncio) calls once a request: its http scope, and `AppSteps`,
//!   the app's coroutine awaited so that each step's end is seen. (It parses with `Parser` and frames
//!   with `ResponseFramer` too, from http/.)
//! - `host.rs`: what both engines read of their Python host, settings, control and refs, typed and
//!   extracted once when they are built (a renamed field fails there, named).
//! - `sys/`: the system calls (epoll, sockets, eventfd), as safe functions.
//! - `h2/`: HTTP/2 connections, sans-IO, on the `h2` crate driven by hand: `Http2Core`.
//!
//! Whatever is not the common shape is handed, from its first byte, to the Python loop
//! (refork.serving.wsgi.python_loop), which gives every verdict exactly as it does without the engines.
//!
//! `Parser` is a drop-in for `refork.http.parser.RequestParser` (same `feed()` / `in_message`
//! contract, same events) used by the Python loops (refork.serving.parsers): the common shape is read with `httparse` in
//! one pass; anything else goes, from the first byte of that message, to the Python parser. The
//! fast subset is deliberately narrow (see `http::head::fast_head`): a well-known method, HTTP/1.0
//! or 1.1, an origin-form target of visible ASCII, CRLF line ends only, printable header values,
//! one valid Host, at most one digits-only Content-Length within the body limit, no
//! Transfer-Encoding, no Expect, no Upgrade, Connection only `close` / `keep-alive`, every field
//! well within the limit_request_* settings.

use pyo3::prelude::*;

mod asgi;
mod conn;
mod engine;
mod h2;
mod host;
mod http;
mod pool;
mod static_files;
mod sys;
mod wsgi;
/// the reader of the shared test vectors (tests/vectors/*.txt)
#[cfg(test)]
mod vectors;

// The engines rely on the GIL (an abi3 module loads on GIL builds only in any case).
#[pymodule(gil_used = true)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<http::parser::Parser>()?;
    m.add_class::<http::parser::ParserRefs>()?;
    m.add_class::<wsgi::environ::Environ>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<pool::PoolEngine>()?;
    m.add_class::<wsgi::start_response::StartResponse>()?;
    m.add_class::<h2::py::Http2Core>()?;
    m.add_class::<wsgi::hand_over::HandOver>()?;
    m.add_class::<conn::handed::Handed>()?;
    m.add_class::<wsgi::accounting::Current>()?;
    m.add_class::<wsgi::accounting::SlotWords>()?;
    m.add_class::<conn::budget::MemoryBudget>()?;
    m.add_class::<http::framer::ResponseFramer>()?;
    m.add_class::<wsgi::access_log::AccessLine>()?;
    m.add_function(wrap_pyfunction!(http::frame::frame_list, m)?)?;
    m.add_function(wrap_pyfunction!(conn::proxy::parse_proxy, m)?)?;
    m.add_function(wrap_pyfunction!(http::framer::use_status_lines, m)?)?;
    m.add_function(wrap_pyfunction!(asgi::scope::http_scope, m)?)?;
    m.add_class::<asgi::steps::AppSteps>()?;
    m.add_function(wrap_pyfunction!(static_files::static_cache_reset, m)?)?;
    m.add_function(wrap_pyfunction!(static_files::static_cache_remember, m)?)?;
    Ok(())
}
