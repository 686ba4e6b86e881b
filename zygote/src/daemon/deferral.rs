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

use tokio::sync::Notify;
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
    /// Set by [`DeferralClock::close`]: no timer is kept any more.
    closed: AtomicBool,
    /// Wakes the grid's task to see `closed`.
    closing: Notify,
}

impl DeferralClock {
    /// A clock whose grid starts now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_deferral_ms: AtomicU64::new(0),
            anchored: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            closing: Notify::new(),
        }
    }

    /// Ends the grid's timer now and starts none again: for a daemon that
    /// is done serving (a private zygote whose owner left waits for its
    /// runtime to hold no task, and would wait out [`LINGER`]). Later
    /// deadlines still fall on the grid, with a timer of their own.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // A stored permit if the task is between its check and its wait.
        self.closing.notify_one();
    }

    /// The deadline of a spawn deferred now for at least `after`: the
    /// first grid point past it (so up to one grid step later). Call it
    /// inside the runtime: it starts the grid's timer when none runs.
    pub fn deadline(self: &Arc<Self>, after: Duration) -> Instant {
        let now = Instant::now();
        let due = self.grid_point_after(now + after);
        self.last_deferral_ms
            .store(self.millis(now), Ordering::Relaxed);
        if !self.closed.load(Ordering::Acquire) && !self.anchored.swap(true, Ordering::AcqRel) {
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
            if self.closed.load(Ordering::Acquire) {
                self.anchored.store(false, Ordering::Release);
                return;
            }
            let now = Instant::now();
            let idle = self
                .millis(now)
                .saturating_sub(self.last_deferral_ms.load(Ordering::Relaxed));
            if u128::from(idle) > LINGER.as_millis() {
                self.anchored.store(false, Ordering::Release);
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(self.grid_point_after(now)) => {}
                () = self.closing.notified() => {}
            }
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

    /// Paused time: the runtime's clock moves only when every task waits,
    /// so a task that lingered would show as a second of virtual time.
    #[tokio::test(start_paused = true)]
    async fn a_closed_clock_leaves_no_task_behind_at_once() {
        let clock = Arc::new(DeferralClock::new());
        clock.deadline(Duration::from_millis(10));
        let metrics = tokio::runtime::Handle::current().metrics();
        assert_eq!(metrics.num_alive_tasks(), 1, "the grid's timer runs");
        let closed_at = Instant::now();
        clock.close();
        while metrics.num_alive_tasks() > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let lingered = closed_at.elapsed();
        assert!(lingered < GRID, "the grid's timer lingered {lingered:?}");
        clock.deadline(Duration::from_millis(10));
        assert_eq!(
            metrics.num_alive_tasks(),
            0,
            "a closed clock started a timer"
        );
    }
}
