//! The WSGI request path both engines share: the environ, start_response, the app call and its
//! body pulled for framing, the request's accounting and its access-log line.

pub(crate) mod access_log;
pub(crate) mod accounting;
pub(crate) mod app_call;
pub(crate) mod body;
pub(crate) mod environ;
pub(crate) mod hand_over;
pub(crate) mod start_response;
