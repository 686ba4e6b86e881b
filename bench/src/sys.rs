//! The bench's only `unsafe`: forcing std's fork path, reading another
//! process's CPU clock, and the calling thread's context switches.

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

/// Involuntary context switches of the calling thread so far
/// (`getrusage(RUSAGE_THREAD)`'s `ru_nivcsw`): each is a preemption, e.g.
/// by a task it woke on its own CPU.
pub fn thread_involuntary_switches() -> Option<u64> {
    // SAFETY: `rusage` is a plain C struct for which all-zero bytes are
    // valid.
    let mut usage = unsafe { std::mem::zeroed::<libc::rusage>() };
    // SAFETY: `usage` is a valid out-pointer for the call's duration.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return None;
    }
    u64::try_from(usage.ru_nivcsw).ok()
}

/// The name (`comm`) of a shared daemon's per-uid spawner processes.
const SPAWNER_NAME: &str = "zygote-spawner";

/// CPU time of the zygote `pid` and of its spawner processes, which start
/// the children that switch to another uid for it (the vfork of a
/// non-root peer's child is spent there): a spawner that exited meanwhile
/// is not counted.
pub fn zygote_cpu(pid: u32) -> Option<Duration> {
    let own = process_cpu(pid)?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = own;
    for task in tasks.flatten() {
        let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            let spawner = std::fs::read_to_string(format!("/proc/{child}/comm"))
                .is_ok_and(|comm| comm.trim_end() == SPAWNER_NAME);
            if spawner {
                total += process_cpu(child).unwrap_or_default();
            }
        }
    }
    Some(total)
}
