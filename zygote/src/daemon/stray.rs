//! Stray signals, logged and otherwise ignored: USR1, USR2, ALRM, VTALRM,
//! PROF, IO, PWR, WINCH, URG, STKFLT, XCPU, XFSZ and the real-time
//! signals (see [`crate::spawn::STRAY_SIGNALS`]). They mean nothing to a
//! zygote, and a child that signals its parent (`kill(getppid(),
//! SIGUSR1)`, as Xvfb and many test programs do) must not end it and, with
//! it, every other client's children's statuses.
//!
//! Each is logged with its sender's pid and uid, at most [`LOG_LIMIT`]
//! lines per [`LOG_WINDOW`]; past that they are counted, and the count is
//! logged once when the window ends, so that a child sending them in a
//! loop cannot fill the log.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tracing::{info, warn};

use crate::spawn::{self, StraySignal};

/// How many stray signals are logged one by one per [`LOG_WINDOW`].
pub const LOG_LIMIT: u32 = 10;

/// The window of [`LOG_LIMIT`].
pub const LOG_WINDOW: Duration = Duration::from_secs(10);

/// Reads the stray signals for the zygote's life and logs them; never
/// returns. Needs every thread to block them
/// ([`crate::spawn::block_stray_signals`]), which the zygote's first
/// thread did before starting any other.
///
/// Run it inside the serving future (in a `select!`), not as a task of its
/// own: a private zygote exits once its runtime has no task left.
pub async fn log_stray_signals() -> Infallible {
    let fd = match spawn::stray_signal_fd()
        .and_then(|fd| zygote_proto::register(fd, Interest::READABLE))
    {
        Ok(fd) => fd,
        Err(error) => {
            // Still blocked: they stay pending and harmless, unlogged.
            warn!(%error, "no signalfd for stray signals: they are ignored without a log");
            return std::future::pending().await;
        }
    };
    let mut limit = RateLimit::default();
    loop {
        let summary_due = limit.summary_due();
        tokio::select! {
            ready = fd.readable() => {
                let Ok(mut guard) = ready else {
                    return std::future::pending().await;
                };
                // Until EAGAIN, which clears the readiness.
                while let Ok(read) = guard.try_io(|fd| spawn::read_stray_signal(fd.get_ref())) {
                    match read {
                        Ok(signal) => log_one(signal, limit.admit(Instant::now())),
                        Err(error) => {
                            warn!(%error, "cannot read stray signals: they are ignored without a log");
                            return std::future::pending().await;
                        }
                    }
                }
            }
            () = sleep_until(summary_due), if summary_due.is_some() => {
                if let Some(count) = limit.close_window() {
                    info!(count, window_secs = LOG_WINDOW.as_secs(), "ignored more signals with no meaning here");
                }
            }
        }
    }
}

async fn sleep_until(when: Option<Instant>) {
    if let Some(when) = when {
        tokio::time::sleep_until(when.into()).await;
    }
}

fn log_one(signal: StraySignal, admitted: Admitted) {
    if admitted == Admitted::Counted {
        return;
    }
    // The sender may be gone already; then it has no name to give.
    let sender = std::fs::read_to_string(format!("/proc/{}/comm", signal.sender_pid))
        .map(|comm| comm.trim_end().to_owned())
        .unwrap_or_default();
    info!(
        signal = %format_args!("SIG{}", spawn::signal_name(signal.signal)),
        number = signal.signal,
        sender_pid = signal.sender_pid,
        sender_uid = signal.sender_uid,
        sender = %sender,
        "ignored a signal that has no meaning here"
    );
    if admitted == Admitted::LastLogged {
        info!(
            limit = LOG_LIMIT,
            window_secs = LOG_WINDOW.as_secs(),
            "more such signals in this window are counted, not logged one by one"
        );
    }
}

/// What [`RateLimit::admit`] decided for one signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admitted {
    /// Log it.
    Logged,
    /// Log it: the last one of this window.
    LastLogged,
    /// Count it only.
    Counted,
}

/// At most [`LOG_LIMIT`] logged per [`LOG_WINDOW`], the rest counted.
#[derive(Debug, Default)]
struct RateLimit {
    /// When the current window started; `None` between windows.
    window_start: Option<Instant>,
    logged: u32,
    counted: u64,
}

impl RateLimit {
    fn admit(&mut self, now: Instant) -> Admitted {
        let start = *self.window_start.get_or_insert(now);
        if now.duration_since(start) >= LOG_WINDOW && self.counted == 0 {
            // A window with nothing counted ends quietly.
            self.window_start = Some(now);
            self.logged = 0;
        }
        if self.logged < LOG_LIMIT {
            self.logged += 1;
            return if self.logged == LOG_LIMIT {
                Admitted::LastLogged
            } else {
                Admitted::Logged
            };
        }
        self.counted += 1;
        Admitted::Counted
    }

    /// When the count must be logged: the end of a window that counted.
    fn summary_due(&self) -> Option<Instant> {
        self.window_start
            .filter(|_| self.counted > 0)
            .map(|start| start + LOG_WINDOW)
    }

    /// Ends the window: the count to log, if any.
    fn close_window(&mut self) -> Option<u64> {
        let counted = std::mem::take(&mut self.counted);
        self.window_start = None;
        self.logged = 0;
        (counted > 0).then_some(counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_limit_then_counts_until_the_window_ends() {
        let mut limit = RateLimit::default();
        let start = Instant::now();
        let decisions: Vec<_> = (0..LOG_LIMIT + 5).map(|_| limit.admit(start)).collect();
        let logged = decisions
            .iter()
            .filter(|admitted| **admitted != Admitted::Counted)
            .count();
        assert_eq!(logged, LOG_LIMIT as usize);
        assert_eq!(decisions[LOG_LIMIT as usize - 1], Admitted::LastLogged);
        assert_eq!(limit.summary_due(), Some(start + LOG_WINDOW));
        assert_eq!(limit.close_window(), Some(5));
        assert_eq!(limit.summary_due(), None);
        assert_eq!(limit.admit(start + LOG_WINDOW), Admitted::Logged);
    }

    #[test]
    fn a_quiet_window_ends_without_a_count() {
        let mut limit = RateLimit::default();
        let start = Instant::now();
        for _ in 0..3 {
            assert_eq!(limit.admit(start), Admitted::Logged);
        }
        assert_eq!(limit.summary_due(), None);
        // Later signals open a new window with the whole limit.
        for _ in 0..LOG_LIMIT - 1 {
            assert_eq!(limit.admit(start + LOG_WINDOW), Admitted::Logged);
        }
        assert_eq!(limit.admit(start + LOG_WINDOW), Admitted::LastLogged);
    }
}
