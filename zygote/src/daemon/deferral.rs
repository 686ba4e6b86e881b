//! When a deferred `Spawned` falls due.
//!
//! tokio wakes its parked IO driver (an `epoll_wait`, often on the other
//! worker) whenever a timer is added that is earlier than every one it
//! holds. A deferred spawn's own 10 ms timer was such a timer on every
//! spawn of a daemon with nothing else pending. Here deadlines fall on a
//! 10 ms grid, and while spawns defer, one task keeps a timer on the next
//! grid point: a spawn's timer is never the earliest, and wakes nobody.
//!
//! Each runtime has its own timer wheel and driver, so the shared
//! daemon's runtimes (one thread each, see `runtimes`) keep one such task
//! each: the grid's timer is kept per thread that defers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
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
    /// The grid's timer of each thread that deferred (one per runtime in
    /// the shared daemon; bounded by its threads).
    anchors: Mutex<HashMap<ThreadId, Arc<Anchor>>>,
}

/// One thread's (runtime's) task keeping a timer on the grid.
#[derive(Debug, Default)]
struct Anchor {
    /// Milliseconds from the clock's origin to this thread's latest
    /// deferral.
    last_deferral_ms: AtomicU64,
    /// Whether the task holding the grid's timer runs.
    anchored: AtomicBool,
}

impl DeferralClock {
    /// A clock whose grid starts now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            anchors: Mutex::default(),
        }
    }

    /// The deadline of a spawn deferred now for at least `after`: the
    /// first grid point past it (so up to one grid step later). Call it
    /// inside the runtime: it starts the grid's timer in this runtime
    /// when none runs there.
    pub fn deadline(self: &Arc<Self>, after: Duration) -> Instant {
        let now = Instant::now();
        let due = self.grid_point_after(now + after);
        let anchor = self.anchor_here();
        anchor
            .last_deferral_ms
            .store(self.millis(now), Ordering::Relaxed);
        if !anchor.anchored.swap(true, Ordering::AcqRel) {
            let clock = Arc::clone(self);
            tokio::spawn(async move { clock.anchor(&anchor).await });
        }
        due
    }

    /// This thread's anchor.
    fn anchor_here(&self) -> Arc<Anchor> {
        let mut anchors = self.anchors.lock().expect("anchors poisoned");
        Arc::clone(anchors.entry(std::thread::current().id()).or_default())
    }

    /// Keeps a timer on the next grid point until no spawn has deferred
    /// on this thread for [`LINGER`]. A deferral racing its end only
    /// costs that spawn a wake-up of the driver; the next one starts a
    /// new anchor.
    async fn anchor(&self, anchor: &Anchor) {
        loop {
            let now = Instant::now();
            let idle = self
                .millis(now)
                .saturating_sub(anchor.last_deferral_ms.load(Ordering::Relaxed));
            if u128::from(idle) > LINGER.as_millis() {
                anchor.anchored.store(false, Ordering::Release);
                return;
            }
            tokio::time::sleep_until(self.grid_point_after(now)).await;
        }
    }

    /// Whether this thread's grid timer runs.
    #[cfg(test)]
    fn anchored_here(&self) -> bool {
        self.anchor_here().anchored.load(Ordering::Acquire)
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
        assert!(clock.anchored_here(), "the grid's timer runs");
    }

    #[tokio::test]
    async fn the_grid_timer_stops_once_nothing_defers() {
        let clock = Arc::new(DeferralClock::new());
        clock.deadline(Duration::from_millis(10));
        assert!(clock.anchored_here());
        tokio::time::sleep(LINGER + GRID * 3).await;
        assert!(!clock.anchored_here(), "still anchored");
        clock.deadline(Duration::from_millis(10));
        assert!(clock.anchored_here(), "restarted");
    }

    #[test]
    fn each_runtime_keeps_its_own_grid_timer() {
        let clock = Arc::new(DeferralClock::new());
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let first = runtime();
        first.block_on(async { clock.deadline(Duration::from_millis(10)) });
        let other = Arc::clone(&clock);
        let second_thread = std::thread::spawn(move || {
            let second = runtime();
            second.block_on(async {
                other.deadline(Duration::from_millis(10));
                // The anchor task runs on this runtime: it holds a timer.
                tokio::task::yield_now().await;
                let tasks = tokio::runtime::Handle::current()
                    .metrics()
                    .num_alive_tasks();
                (other.anchored_here(), tasks)
            })
        });
        let (anchored, tasks) = second_thread.join().unwrap();
        assert!(anchored, "the second runtime's grid timer runs");
        assert_eq!(tasks, 1, "its anchor task is on the second runtime");
        assert_eq!(
            clock.anchors.lock().unwrap().len(),
            2,
            "one anchor per thread"
        );
        let tasks = first.metrics().num_alive_tasks();
        assert_eq!(tasks, 1, "the first runtime has its own anchor task");
    }
}
