//! The ASGI loop's per-request work in Rust: its http scope (scope.rs). The loop itself
//! (refork.serving.asgi) stays on asyncio; these are called from it once a request.

pub(crate) mod scope;
pub(crate) mod steps;
