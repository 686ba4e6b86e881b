//! Waits for one child's exit on its pidfd and reaps it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use tokio::io::unix::AsyncFd;
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
