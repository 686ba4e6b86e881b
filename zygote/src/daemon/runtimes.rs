//! The shared daemon's runtimes: one current-thread tokio runtime per
//! core, each on its own thread, and the choice of one for each
//! connection.
//!
//! A connection and everything it starts (its spawns, their watchers and
//! timers) stay on one runtime: its socket and its children's pidfds are
//! registered in that runtime's epoll, so a request, its clone and its
//! replies run on one thread without a hop. On tokio's work-stealing
//! runtime a second worker woke for each event and tasks moved between
//! CPUs (~20 µs of daemon CPU per spawn on the 2-CPU VM, see the README).
//! Many connections spread over the runtimes, so the daemon still uses
//! every core.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::Error;

/// The runtimes connections are served on, and how many each serves.
#[derive(Debug, Clone)]
pub struct Runtimes {
    shards: Arc<[Shard]>,
}

#[derive(Debug)]
struct Shard {
    handle: Handle,
    /// Connections served there now.
    connections: AtomicUsize,
}

impl Runtimes {
    /// Only the runtime this is called in (a private zygote, or a test).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn current() -> Self {
        Self::from_handles(vec![Handle::current()])
    }

    fn from_handles(handles: Vec<Handle>) -> Self {
        let shards = handles
            .into_iter()
            .map(|handle| Shard {
                handle,
                connections: AtomicUsize::new(0),
            })
            .collect();
        Self { shards }
    }

    /// How many runtimes there are.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether there is none (never, once built).
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Runs `serve`, a new connection's task, on the runtime serving the
    /// fewest connections now (the first of equals). `serve` gets the
    /// accepted socket there, so that the socket is registered in that
    /// runtime's epoll, not in the accepting one's.
    pub(crate) fn spawn_connection<F, Fut>(&self, serve: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (index, shard) = self
            .shards
            .iter()
            .enumerate()
            .min_by_key(|(_, shard)| shard.connections.load(Ordering::Relaxed))
            .expect("at least one runtime");
        shard.connections.fetch_add(1, Ordering::Relaxed);
        let load = Load {
            runtimes: self.clone(),
            index,
        };
        shard.handle.spawn(async move {
            // Counted down however the task ends, dropped with its
            // runtime included.
            let _load = load;
            serve().await;
        });
    }

    /// Connections each runtime serves now, in runtime order.
    pub fn connections(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|shard| shard.connections.load(Ordering::Relaxed))
            .collect()
    }
}

/// A connection's count on its runtime, given back on drop.
struct Load {
    runtimes: Runtimes,
    index: usize,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.runtimes.shards[self.index]
            .connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// The threads of the runtimes besides the caller's: [`Threads::stop`]
/// ends them, and each drops its runtime's tasks on its own thread.
#[derive(Debug)]
pub struct Threads {
    running: Vec<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Threads {
    /// Ends every runtime thread and waits for it: the tasks left on each
    /// (connections still open, their children's watchers) are dropped
    /// there, as a runtime's drop does.
    pub fn stop(self) {
        let threads: Vec<_> = self
            .running
            .into_iter()
            .map(|(stop, thread)| {
                let _ = stop.send(());
                thread
            })
            .collect();
        for thread in threads {
            if thread.join().is_err() {
                warn!("a runtime thread panicked");
            }
        }
    }
}

/// The runtime `count` is resolved against when the `serve` flag leaves it
/// unset: the cgroup-aware CPU count, since threads a CPU quota cannot run
/// only add latency.
pub fn default_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Builds the caller's current-thread runtime and `count - 1` more, each
/// on a thread of its own named `zygote-rt-N` (N from 1). `prepare` runs
/// first on every thread that will serve connections, the caller's
/// included (a spawner's priority set-up).
///
/// Returns the caller's runtime (shard 0, to `block_on`), every runtime's
/// handle, and the other threads.
///
/// # Errors
///
/// [`Error::Runtime`] when a runtime or a thread cannot be started.
pub fn build(
    count: usize,
    prepare: fn(usize),
) -> Result<(tokio::runtime::Runtime, Runtimes, Threads), Error> {
    let count = count.max(1);
    let build = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)
    };
    prepare(0);
    let main = build()?;
    let mut handles = vec![main.handle().clone()];
    let mut threads = Threads {
        running: Vec::new(),
    };
    for index in 1..count {
        let runtime = build()?;
        handles.push(runtime.handle().clone());
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("zygote-rt-{index}"))
            .spawn(move || {
                prepare(index);
                // Tasks spawned here from other threads run while this
                // thread drives the runtime; an error means the daemon's
                // thread is gone, which is a stop too.
                let _ = runtime.block_on(stop_rx);
                drop(runtime);
                debug!(runtime = index, "runtime stopped");
            });
        match thread {
            Ok(thread) => threads.running.push((stop_tx, thread)),
            Err(error) => {
                threads.stop();
                return Err(Error::Runtime(error));
            }
        }
    }
    Ok((main, Runtimes::from_handles(handles), threads))
}

/// Takes an accepted socket's fd into the runtime the task runs on.
pub(crate) fn adopt_socket(fd: OwnedFd) -> Option<zygote_proto::AsyncSeqpacket> {
    match zygote_proto::AsyncSeqpacket::new(fd) {
        Ok(socket) => Some(socket),
        Err(error) => {
            warn!(%error, "cannot serve an accepted connection; it is closed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_the_least_loaded_runtime_and_stay_there() {
        let (main, runtimes, threads) = build(3, |_| {}).unwrap();
        assert_eq!(runtimes.len(), 3);
        let names = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        for _ in 0..6 {
            let names = Arc::clone(&names);
            let mut release = release_rx.clone();
            runtimes.spawn_connection(move || async move {
                let before = std::thread::current().id();
                let _ = release.wait_for(|released| *released).await;
                // Still on the same thread after waiting.
                let after = std::thread::current().id();
                names.lock().unwrap().push((before, after));
            });
        }
        assert_eq!(runtimes.connections(), vec![2, 2, 2]);
        release_tx.send_replace(true);
        main.block_on(async {
            while names.lock().unwrap().len() < 6 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        });
        let seen = names.lock().unwrap().clone();
        assert!(
            seen.iter().all(|(before, after)| before == after),
            "a task moved"
        );
        let mut threads_used: Vec<_> = seen.iter().map(|(thread, _)| *thread).collect();
        threads_used.sort_by_key(|id| format!("{id:?}"));
        threads_used.dedup();
        assert_eq!(threads_used.len(), 3, "three threads served: {seen:?}");
        threads.stop();
        assert_eq!(runtimes.connections(), vec![0, 0, 0], "counted down");
    }
}
