//! The bench's only `unsafe`: forcing std's fork path.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Adds a no-op `pre_exec` hook, which makes std use `fork` + `exec`
/// instead of `posix_spawn`, as any `pre_exec`, uid, gid or groups does.
pub fn force_fork_path(command: &mut Command) {
    // SAFETY: the hook does nothing, so it is async-signal-safe and cannot
    // touch state the forked child shares with other threads.
    unsafe {
        command.pre_exec(|| Ok(()));
    }
}
