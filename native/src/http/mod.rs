//! HTTP/1.1 without WSGI: the request head's fast path and the Python loop's parser, the Host
//! value, the response's framing (a WSGI list body; the ASGI loop's ResponseFramer) and its Date line.

pub(crate) mod date;
pub(crate) mod fields;
pub(crate) mod frame;
pub(crate) mod framer;
pub(crate) mod head;
pub(crate) mod host;
pub(crate) mod parser;
pub(crate) mod request;
