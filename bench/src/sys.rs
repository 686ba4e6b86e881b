//! The bench's only `unsafe`: forcing std's fork path, and reading
//! another process's CPU clock.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// Adds a no-op `pre_exec` hook, which makes std use `fork` + `exec`
/// instead of `posix_spawn`, as any `pre_exec`, uid, gid or groups does.
pub fn force_fork_path(command: &mut Command) {
    // SAFETY: the hook does nothing, so it is async-signal-safe and cannot
    // touch state the forked child shares with other threads.
    unsafe {
        command.pre_exec(|| Ok(()));
    }
}

/// CPU time (user + system, every thread, ns precision) of process `pid`,
/// from its process CPU clock; `None` if it is gone. Its children's time
/// is not in it.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid out-pointer for the call's duration.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid out-pointer for the call's duration.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(now.tv_sec).ok()?,
        u32::try_from(now.tv_nsec).ok()?,
    ))
}

/// CPU time of this whole process (every thread).
pub fn own_cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}
