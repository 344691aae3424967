//! The ASGI loop's per-request work in Rust: its http scope (scope.rs) and the awaiting of the
//! app's coroutine that sees each step of its task end (steps.rs). The loop itself
//! (refork.serving.asgi) stays on asyncio; these are called from it once a request.

pub(crate) mod scope;
pub(crate) mod steps;
