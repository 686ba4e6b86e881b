//! Rate limits on what one peer can make the daemon log: refusals,
//! protocol errors and closed connections are logged at most
//! [`BURST`] times per uid in each [`WINDOW`]; the rest are counted, and
//! the next line logged for that uid says how many were suppressed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines one uid may cause in a window.
pub const BURST: u32 = 10;

/// The window.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Uids remembered at most; past this, windows that ended are forgotten.
const MAX_UIDS: usize = 1024;

#[derive(Debug)]
struct Window {
    started: Instant,
    logged: u32,
    suppressed: u64,
}

/// Per-uid log budget.
#[derive(Debug, Default)]
pub struct LogLimit {
    windows: Mutex<HashMap<u32, Window>>,
}

impl LogLimit {
    /// Whether a line caused by `uid` may be logged now: `Some(n)` with
    /// the lines suppressed since the last one logged, or `None` (then it
    /// is counted as suppressed).
    pub fn allow(&self, uid: u32) -> Option<u64> {
        self.allow_at(uid, Instant::now())
    }

    fn allow_at(&self, uid: u32, now: Instant) -> Option<u64> {
        let mut windows = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if windows.len() >= MAX_UIDS && !windows.contains_key(&uid) {
            // Forget ended windows with nothing suppressed; the rest keep
            // their count until they log again.
            windows.retain(|_, window| {
                now.duration_since(window.started) < WINDOW || window.suppressed > 0
            });
            if windows.len() >= MAX_UIDS {
                return None;
            }
        }
        let window = windows.entry(uid).or_insert(Window {
            started: now,
            logged: 0,
            suppressed: 0,
        });
        if now.duration_since(window.started) >= WINDOW {
            window.started = now;
            window.logged = 0;
        }
        if window.logged >= BURST {
            window.suppressed += 1;
            return None;
        }
        window.logged += 1;
        Some(std::mem::take(&mut window.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_uid_gets_a_burst_per_window_and_learns_what_was_suppressed() {
        let limit = LogLimit::default();
        let start = Instant::now();
        for _ in 0..BURST {
            assert_eq!(limit.allow_at(1901, start), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(limit.allow_at(1901, start), None);
        }
        // Another uid is not held back by the first.
        assert_eq!(limit.allow_at(0, start), Some(0));
        // The next window logs again, and says how many were dropped.
        let later = start + WINDOW;
        assert_eq!(limit.allow_at(1901, later), Some(5));
        assert_eq!(limit.allow_at(1901, later), Some(0));
    }
}
