//! Waits for one child's exit on its pidfd and reaps it, and follows its
//! stops and continues for the requests that ask.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Once;

use rustix::process::{WaitId, WaitIdOptions, waitid};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};
use zygote_proto::{ExitStatus, ResourceUsage};

use crate::spawn;

/// Resolves once the child behind `pidfd` has exited, and reaps it.
///
/// A pidfd polls readable when its process exits (Linux 5.3); the reap
/// itself is `waitid(P_PIDFD)` (5.4), so no other child is disturbed.
///
/// # Errors
///
/// When polling or `waitid` fails, which means the child was reaped
/// elsewhere: a bug, logged by the caller.
pub async fn wait_exit(pidfd: &AsyncFd<OwnedFd>) -> io::Result<(ExitStatus, ResourceUsage)> {
    loop {
        let mut guard = pidfd.readable().await?;
        match spawn::try_reap(pidfd.get_ref().as_fd())? {
            Some(exit) => return Ok(exit),
            None => guard.clear_ready(),
        }
    }
}

/// A child stopped (by this signal) or continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobChange {
    /// Stopped by this signal.
    Stopped(i32),
    /// Continued after a stop.
    Continued,
}

/// Installs the daemon's `SIGCHLD` handler, once. Call it before the first
/// spawn: the spawner reads the handlers then, so that children reset
/// this one too before exec.
///
/// A pidfd wakes only on exit; a stop or continue is signalled to the
/// parent alone, by `SIGCHLD`. The handler stays installed for the
/// process's life (tokio never removes one), and costs nothing when no
/// child stops.
pub fn install_child_handler() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        if let Err(error) = signal(SignalKind::child()) {
            tracing::warn!(%error, "no SIGCHLD handler: stops of children will not be reported");
        }
    });
}

/// Calls `report` for each stop and continue of the child behind `pidfd`,
/// until the future is dropped (it never ends by itself).
///
/// Each `SIGCHLD` wakes every watcher; each asks the kernel only about its
/// own child (`waitid(P_PIDFD, WSTOPPED | WCONTINUED | WNOHANG)`, which
/// never reaps), so another child's exit is never taken.
pub async fn follow_stops<F, Fut>(pidfd: BorrowedFd<'_>, mut report: F)
where
    F: FnMut(JobChange) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut children = match signal(SignalKind::child()) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%error, "cannot follow a child's stops");
            return std::future::pending().await;
        }
    };
    // A stop before the stream existed is still pending in the kernel:
    // look once before the first wake-up.
    loop {
        while let Some(change) = job_change(pidfd) {
            report(change).await;
        }
        if children.recv().await.is_none() {
            return std::future::pending().await;
        }
    }
}

fn job_change(pidfd: BorrowedFd<'_>) -> Option<JobChange> {
    let options = WaitIdOptions::STOPPED | WaitIdOptions::CONTINUED | WaitIdOptions::NOHANG;
    let status = waitid(WaitId::PidFd(pidfd), options).ok()??;
    if status.continued() {
        Some(JobChange::Continued)
    } else {
        status.stopping_signal().map(JobChange::Stopped)
    }
}
