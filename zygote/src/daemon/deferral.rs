//! When a deferred `Spawned` falls due.
//!
//! tokio wakes its parked IO driver (an `epoll_wait`, often on the other
//! worker) whenever a timer is added that is earlier than every one it
//! holds. A deferred spawn's own 10 ms timer was such a timer on every
//! spawn of a daemon with nothing else pending. Here deadlines fall on a
//! 10 ms grid, and while spawns defer, one task keeps a timer on the next
//! grid point: a spawn's timer is never the earliest, and wakes nobody.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The grid deadlines are rounded up to.
const GRID: Duration = Duration::from_millis(10);

/// How long the grid's timer is kept after the last deferral.
const LINGER: Duration = Duration::from_secs(1);

/// Deadlines of deferred `Spawned` replies, on a grid kept warm.
#[derive(Debug)]
pub struct DeferralClock {
    origin: Instant,
    /// Milliseconds from `origin` to the latest deferral.
    last_deferral_ms: AtomicU64,
    /// Whether the task holding the grid's timer runs.
    anchored: AtomicBool,
}

impl DeferralClock {
    /// A clock whose grid starts now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_deferral_ms: AtomicU64::new(0),
            anchored: AtomicBool::new(false),
        }
    }

    /// The deadline of a spawn deferred now for at least `after`: the
    /// first grid point past it (so up to one grid step later). Call it
    /// inside the runtime: it starts the grid's timer when none runs.
    pub fn deadline(self: &Arc<Self>, after: Duration) -> Instant {
        let now = Instant::now();
        let due = self.grid_point_after(now + after);
        self.last_deferral_ms
            .store(self.millis(now), Ordering::Relaxed);
        if !self.anchored.swap(true, Ordering::AcqRel) {
            let clock = Arc::clone(self);
            tokio::spawn(async move { clock.anchor().await });
        }
        due
    }

    /// Keeps a timer on the next grid point until no spawn has deferred
    /// for [`LINGER`]. A deferral racing its end only costs that spawn a
    /// wake-up of the driver; the next one starts a new anchor.
    async fn anchor(&self) {
        loop {
            let now = Instant::now();
            let idle = self
                .millis(now)
                .saturating_sub(self.last_deferral_ms.load(Ordering::Relaxed));
            if u128::from(idle) > LINGER.as_millis() {
                self.anchored.store(false, Ordering::Release);
                return;
            }
            tokio::time::sleep_until(self.grid_point_after(now)).await;
        }
    }

    fn grid_point_after(&self, at: Instant) -> Instant {
        let since = at.duration_since(self.origin).as_nanos();
        let steps = since / GRID.as_nanos() + 1;
        let nanos = u64::try_from(steps * GRID.as_nanos()).unwrap_or(u64::MAX);
        self.origin + Duration::from_nanos(nanos)
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }
}

impl Default for DeferralClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deadlines_fall_on_the_grid_at_least_the_delay_away() {
        let clock = Arc::new(DeferralClock::new());
        for _ in 0..50 {
            let before = Instant::now();
            let due = clock.deadline(Duration::from_millis(10));
            let offset = due.duration_since(clock.origin).as_nanos();
            assert_eq!(offset % GRID.as_nanos(), 0, "{offset} ns is off the grid");
            let wait = due.duration_since(before);
            assert!(wait >= Duration::from_millis(10), "{wait:?}");
            assert!(wait <= Duration::from_millis(21), "{wait:?}");
            tokio::time::sleep(Duration::from_micros(700)).await;
        }
        assert!(
            clock.anchored.load(Ordering::Acquire),
            "the grid's timer runs"
        );
    }

    #[tokio::test]
    async fn the_grid_timer_stops_once_nothing_defers() {
        let clock = Arc::new(DeferralClock::new());
        clock.deadline(Duration::from_millis(10));
        assert!(clock.anchored.load(Ordering::Acquire));
        tokio::time::sleep(LINGER + GRID * 3).await;
        assert!(!clock.anchored.load(Ordering::Acquire), "still anchored");
        clock.deadline(Duration::from_millis(10));
        assert!(clock.anchored.load(Ordering::Acquire), "restarted");
    }
}
