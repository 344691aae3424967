//! HTTP/2 server connections, sans-IO, on the `h2` crate (refork.http.h2 wraps [`py::Http2Core`]):
//! the in-memory transport (io.rs), refork's frame-header prefilter and attack budgets
//! (prefilter.rs), the connection driven by hand with a no-op waker (driver.rs) and what the loop
//! does to it between reads (respond.rs), the PyO3 class (py.rs).

pub mod driver;
pub mod io;
pub mod prefilter;
pub mod py;
pub mod respond;
#[cfg(test)]
mod tests;
