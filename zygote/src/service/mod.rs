//! Glue between the daemon and the system it runs in.
//!
//! - [`activation`]: what systemd hands over: sockets, the notify socket,
//!   the watchdog.
//! - [`metrics`]: the counters, as Prometheus metrics; `exporter` serves
//!   them over HTTP.
//! - [`logging`]: log setup: text, JSON or the journal; [`log_sink`]: the
//!   queue and writer thread every format goes through.

pub mod activation;
pub(crate) mod exporter;
pub mod log_sink;
pub mod logging;
pub mod metrics;
