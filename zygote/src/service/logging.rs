//! Log setup: `tracing` to stderr as text or JSON, or to the journal,
//! filtered by `ZYGOTE_LOG` or `RUST_LOG`.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use clap::ValueEnum;
use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

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
    let layer: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Journald => match tracing_journald::layer() {
            // Fields become ZYGOTE_PEER_PID, ZYGOTE_PROGRAM, ...: journalctl -o verbose.
            Ok(journal) => journal
                .with_syslog_identifier("zygote".into())
                .with_field_prefix(Some("ZYGOTE".into()))
                .with_priority_mappings(journal_priorities())
                .boxed(),
            Err(error) => {
                eprintln!("zygote: cannot log to the journal ({error}); logging to stderr");
                text_layer()
            }
        },
        LogFormat::Auto | LogFormat::Text => text_layer(),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .init();
}

/// syslog's priorities for tracing's levels. tracing-journald maps INFO to
/// NOTICE (5) and DEBUG to INFO (6) by default, which makes every
/// lifecycle line "significant" to `journalctl -p notice`.
fn journal_priorities() -> PriorityMappings {
    PriorityMappings {
        error: Priority::Error,
        warn: Priority::Warning,
        info: Priority::Informational,
        debug: Priority::Debug,
        trace: Priority::Debug,
    }
}

fn text_layer() -> Box<dyn Layer<Registry> + Send + Sync> {
    tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
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
    fn journal_priorities_are_syslogs() {
        let mappings = journal_priorities();
        let numbers = [
            mappings.error,
            mappings.warn,
            mappings.info,
            mappings.debug,
            mappings.trace,
        ]
        // The enum's values are the ASCII digits journald reads.
        .map(|priority| char::from(priority as u8));
        assert_eq!(numbers, ['3', '4', '6', '7', '7']);
    }

    #[test]
    fn journal_stream_must_match_device_and_inode() {
        assert!(journal_stream_matches("8:1234", 8, 1234));
        assert!(!journal_stream_matches("8:1234", 8, 1235));
        assert!(!journal_stream_matches("9:1234", 8, 1234));
        assert!(!journal_stream_matches("garbage", 8, 1234));
    }
}
