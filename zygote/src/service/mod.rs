//! Glue between the daemon and the system it runs in.
//!
//! - [`activation`]: what systemd hands over: sockets, the notify socket,
//!   the watchdog.
//! - [`metrics`]: the counters, as Prometheus metrics; `exporter` serves
//!   them over HTTP.
//! - [`logging`]: log setup: text, JSON or the journal.

pub mod activation;
pub(crate) mod exporter;
pub mod logging;
pub mod metrics;
