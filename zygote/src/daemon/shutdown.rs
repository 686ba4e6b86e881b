//! Graceful stop, in the mini-redis way: a notice that every task can
//! await, and a completion guard that every task holds until its work is
//! done; the server waits for the last guard to drop.

use tokio::sync::{mpsc, watch};

/// A task's view of the stop: wait for the notice, and hold the guard.
///
/// Cloning it clones the guard: the server's [`Coordinator::stop`] waits
/// until every clone is dropped.
#[derive(Debug, Clone)]
pub struct Shutdown {
    notice: watch::Receiver<bool>,
    /// Never used to send; its drop is the signal.
    _done: mpsc::Sender<()>,
}

impl Shutdown {
    /// Resolves once the stop has begun (at once if it already has).
    pub async fn stopping(&mut self) {
        // An error means the coordinator is gone, which is a stop too.
        let _ = self.notice.wait_for(|stopping| *stopping).await;
    }
}

/// The server's end: hands out [`Shutdown`]s, then announces the stop and
/// waits for them.
#[derive(Debug)]
pub struct Coordinator {
    notice: watch::Sender<bool>,
    done_tx: mpsc::Sender<()>,
    done_rx: mpsc::Receiver<()>,
}

impl Coordinator {
    /// A coordinator with no tasks yet.
    pub fn new() -> Self {
        let (notice, _) = watch::channel(false);
        let (done_tx, done_rx) = mpsc::channel(1);
        Self {
            notice,
            done_tx,
            done_rx,
        }
    }

    /// A handle for a new task.
    pub fn handle(&self) -> Shutdown {
        Shutdown {
            notice: self.notice.subscribe(),
            _done: self.done_tx.clone(),
        }
    }

    /// Announces the stop and resolves once every [`Shutdown`] handed out
    /// has been dropped.
    pub async fn stop(self) {
        let Self {
            notice,
            done_tx,
            mut done_rx,
        } = self;
        notice.send_replace(true);
        drop(done_tx);
        // Nobody sends; `None` comes when the last sender is dropped.
        let _ = done_rx.recv().await;
    }
}

impl Default for Coordinator {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn stop_waits_for_every_handle() {
        let coordinator = Coordinator::new();
        let mut handle = coordinator.handle();
        let task = tokio::spawn(async move {
            handle.stopping().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(handle);
            std::time::Instant::now()
        });
        coordinator.stop().await;
        let stopped = std::time::Instant::now();
        let released = task.await.unwrap();
        assert!(released <= stopped);
    }
}
