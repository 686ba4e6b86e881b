//! Log setup: `tracing` to stderr, filtered by `ZYGOTE_LOG` or `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. The filter comes from `ZYGOTE_LOG`, then
/// `RUST_LOG`, then defaults to `info`.
pub fn init() {
    let filter = std::env::var("ZYGOTE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_owned());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|error| {
        eprintln!("zygote: ignoring bad log filter {filter:?}: {error}");
        EnvFilter::new("info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
