//! Log setup: `tracing` to stderr as text or JSON, or to the journal,
//! filtered by `ZYGOTE_LOG` or `RUST_LOG`. Every format goes through
//! [`log_sink`](super::log_sink)'s queue, so that a log nobody reads never
//! blocks a daemon thread.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use clap::ValueEnum;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use super::log_sink::{JournalLayer, Queue, QueueWriter, Sink};

/// Where and how logs are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// The journal when stderr is connected to it (systemd sets
    /// `JOURNAL_STREAM`), else text.
    #[default]
    Auto,
    /// Human-readable lines on stderr.
    Text,
    /// One JSON object per line on stderr.
    Json,
    /// Native journal entries with structured fields.
    Journald,
}

/// Installs the global subscriber. The filter comes from `ZYGOTE_LOG`, then
/// `RUST_LOG`, then defaults to `info`.
pub fn init(format: LogFormat) {
    let filter = std::env::var("ZYGOTE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_owned());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|error| {
        eprintln!("zygote: ignoring bad log filter {filter:?}: {error}");
        EnvFilter::new("info")
    });
    let format = match format {
        LogFormat::Auto if stderr_is_journal() => LogFormat::Journald,
        LogFormat::Auto => LogFormat::Text,
        other => other,
    };
    let (sink, format) = match format {
        LogFormat::Journald => match Sink::journal() {
            Ok(journal) => (journal, LogFormat::Journald),
            Err(error) => {
                eprintln!("zygote: cannot log to the journal ({error}); logging to stderr");
                (Sink::Stderr, LogFormat::Text)
            }
        },
        other => (Sink::Stderr, other),
    };
    let queue = match Queue::start(sink) {
        Ok(queue) => queue,
        Err(error) => {
            eprintln!("zygote: cannot start the log writer thread ({error}); no logs");
            return;
        }
    };
    let layer: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(QueueWriter(queue))
            .boxed(),
        // Fields become ZYGOTE_PEER_PID, ZYGOTE_PROGRAM, ...: journalctl -o verbose.
        LogFormat::Journald => JournalLayer(queue).boxed(),
        LogFormat::Auto | LogFormat::Text => text_layer(queue),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .init();
}

fn text_layer(queue: std::sync::Arc<Queue>) -> Box<dyn Layer<Registry> + Send + Sync> {
    tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(QueueWriter(queue))
        .boxed()
}

/// Whether stderr is the journal's stream: systemd sets `JOURNAL_STREAM`
/// to the `DEVICE:INODE` of the socket it connects stderr to, and a
/// redirected stderr no longer matches (`systemd.exec(5)`).
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = rustix::fs::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    journal_stream_matches(&stream.to_string_lossy(), stat.st_dev, stat.st_ino)
}

fn journal_stream_matches(value: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = value.split_once(':') else {
        return false;
    };
    d.parse() == Ok(dev) && i.parse() == Ok(ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_must_match_device_and_inode() {
        assert!(journal_stream_matches("8:1234", 8, 1234));
        assert!(!journal_stream_matches("8:1234", 8, 1235));
        assert!(!journal_stream_matches("9:1234", 8, 1234));
        assert!(!journal_stream_matches("garbage", 8, 1234));
    }
}
