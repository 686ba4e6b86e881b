//! The daemon's own scheduling policy, and its children's.
//!
//! A daemon thread woken by its client's `sendmsg` on the client's CPU
//! preempts the client inside that call, so the daemon's work counts as
//! the client's blocked time (measured: 0.41 involuntary context switches
//! of the client's thread per spawn, blocked 34 to 36 µs p50; 0.01 and 27
//! to 29 under `SCHED_BATCH`). The kernel never lets a `SCHED_BATCH` task
//! preempt on wake-up (Linux 2.6.16 and later), so the daemon's threads run
//! under it, and every child goes back to `SCHED_OTHER` before exec: a
//! child never inherits a scheduling disadvantage it did not ask for
//! (`SCHED_RESET_ON_FORK` resets only real-time policies and negative nice
//! values, not `SCHED_BATCH`).

use std::ffi::c_int;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set while the daemon runs under `SCHED_BATCH`: its children then reset
/// their policy to `SCHED_OTHER` before exec.
static CHILDREN_RESET_POLICY: AtomicBool = AtomicBool::new(false);

/// The environment variable that keeps the daemon under the policy it was
/// started with: `0` (or `no`, `off`, `false`).
pub const NO_BATCH_ENV: &str = "ZYGOTE_SCHED_BATCH";

/// What [`run_daemon_as_batch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonPolicy {
    /// The calling thread moved from `SCHED_OTHER` to `SCHED_BATCH`.
    Batch,
    /// It was under `SCHED_BATCH` already (`chrt -b`, or an earlier image
    /// of a live upgrade).
    AlreadyBatch,
    /// [`NO_BATCH_ENV`] asked to keep `SCHED_OTHER`.
    Disabled,
    /// It runs under another policy (real-time, `SCHED_IDLE`), which is
    /// left as whoever started the daemon chose.
    Other(c_int),
}

/// Whether the environment asks to keep the daemon's policy.
fn batch_disabled() -> bool {
    std::env::var(NO_BATCH_ENV).is_ok_and(|value| {
        matches!(
            value.trim().to_ascii_lowercase().as_str(),
            "0" | "no" | "off" | "false"
        )
    })
}

/// Puts the calling thread, and so every thread it creates later, under
/// `SCHED_BATCH` (nice value and `SCHED_RESET_ON_FORK` kept), unless
/// [`NO_BATCH_ENV`] says no; from then on, or when it already was under
/// `SCHED_BATCH`, children reset their policy to `SCHED_OTHER` before
/// exec. Call it first, while the process has one thread.
///
/// # Errors
///
/// The `sched_setscheduler` error (a seccomp filter, say); the thread and
/// its children then keep the policy it was started with.
pub fn run_daemon_as_batch() -> io::Result<DaemonPolicy> {
    let policy = thread_policy()?;
    let reset_on_fork = policy & libc::SCHED_RESET_ON_FORK;
    match policy & !libc::SCHED_RESET_ON_FORK {
        libc::SCHED_BATCH => {
            // Whether children will be able to leave it (a seccomp filter
            // refusing the call would otherwise fail every spawn).
            set_thread_policy(policy)?;
            CHILDREN_RESET_POLICY.store(true, Ordering::Relaxed);
            Ok(DaemonPolicy::AlreadyBatch)
        }
        libc::SCHED_OTHER if batch_disabled() => Ok(DaemonPolicy::Disabled),
        libc::SCHED_OTHER => {
            // Before the switch: no child may start under it unreset.
            CHILDREN_RESET_POLICY.store(true, Ordering::Relaxed);
            if let Err(error) = set_thread_policy(libc::SCHED_BATCH | reset_on_fork) {
                CHILDREN_RESET_POLICY.store(false, Ordering::Relaxed);
                return Err(error);
            }
            Ok(DaemonPolicy::Batch)
        }
        other => Ok(DaemonPolicy::Other(other)),
    }
}

/// Logs what [`run_daemon_as_batch`] did, once logging is set up: at INFO
/// when the daemon could not or would not move to `SCHED_BATCH`.
pub fn log_daemon_policy(policy: &io::Result<DaemonPolicy>) {
    match policy {
        Ok(DaemonPolicy::Batch | DaemonPolicy::AlreadyBatch) => tracing::debug!(
            "daemon threads run under SCHED_BATCH (no wake-up preemption); children start under \
             SCHED_OTHER"
        ),
        Ok(DaemonPolicy::Disabled) => {
            tracing::info!("{NO_BATCH_ENV} is off: daemon threads keep SCHED_OTHER");
        }
        Ok(DaemonPolicy::Other(policy)) => tracing::info!(
            policy,
            "daemon started under a scheduling policy other than SCHED_OTHER or SCHED_BATCH; kept, \
             and inherited by children"
        ),
        Err(error) => tracing::info!(
            %error,
            "cannot set the daemon's scheduling policy (sched_setscheduler); its threads keep \
             the policy they were started with, and its children inherit it"
        ),
    }
}

/// Whether children must reset their policy to `SCHED_OTHER`.
pub(super) fn children_reset_policy() -> bool {
    CHILDREN_RESET_POLICY.load(Ordering::Relaxed)
}

/// Forgets [`run_daemon_as_batch`] (tests: other tests' children then
/// skip the reset).
#[cfg(test)]
pub(super) fn forget_batch() {
    CHILDREN_RESET_POLICY.store(false, Ordering::Relaxed);
}

/// The calling thread's policy, `SCHED_RESET_ON_FORK` included.
pub(super) fn thread_policy() -> io::Result<c_int> {
    // The raw syscall, as in every call here: musl's `sched_getscheduler()`
    // is a stub that fails with ENOSYS.
    // SAFETY: plain syscall on the calling thread (pid 0); no memory.
    let policy = unsafe { libc::syscall(libc::SYS_sched_getscheduler, 0) };
    if policy < 0 {
        return Err(io::Error::last_os_error());
    }
    c_int::try_from(policy).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// The kernel's `struct sched_param`. libc's may be larger (musl's has
/// more fields); the kernel reads only this one.
#[repr(C)]
struct SchedParam {
    sched_priority: c_int,
}

/// Priority 0, the only one `SCHED_OTHER` and `SCHED_BATCH` take.
const NO_PRIORITY: SchedParam = SchedParam { sched_priority: 0 };

/// Sets the calling thread's policy (`SCHED_OTHER` or `SCHED_BATCH`,
/// possibly with `SCHED_RESET_ON_FORK`); its nice value is kept.
pub(super) fn set_thread_policy(policy: c_int) -> io::Result<()> {
    let param = NO_PRIORITY;
    // The raw syscall: musl's `sched_setscheduler()` is a stub that fails
    // with ENOSYS. glibc's wrapper is this same syscall.
    // SAFETY: `param` is a valid kernel sched_param for the call's
    // duration; pid 0 is the calling thread only.
    if unsafe { libc::syscall(libc::SYS_sched_setscheduler, 0, policy, &raw const param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's `struct sched_attr`, first version (`SCHED_ATTR_SIZE_VER0`).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// `SCHED_FLAG_RESET_ON_FORK`.
const FLAG_RESET_ON_FORK: u64 = 0x01;

/// Sets the calling thread's policy (`SCHED_BATCH` or `SCHED_OTHER`) and
/// nice value in one `sched_setattr(2)` (Linux 3.14).
pub(super) fn set_thread_scheduling(batch: bool, nice: i32, reset_on_fork: bool) -> io::Result<()> {
    let policy = if batch {
        libc::SCHED_BATCH
    } else {
        libc::SCHED_OTHER
    };
    let attr = SchedAttr {
        size: u32::try_from(std::mem::size_of::<SchedAttr>()).unwrap_or(48),
        policy: u32::try_from(policy).unwrap_or(0),
        flags: if reset_on_fork { FLAG_RESET_ON_FORK } else { 0 },
        nice,
        priority: 0,
        runtime: 0,
        deadline: 0,
        period: 0,
    };
    // SAFETY: the kernel reads `attr.size` bytes from a valid struct of
    // its layout; pid 0 is the calling thread only; flags 0.
    let ret = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adds `SCHED_RESET_ON_FORK` to the calling thread's policy, keeping the
/// policy itself (`SCHED_OTHER` or `SCHED_BATCH`): the children and threads
/// it creates start at nice 0 whatever its own (negative) nice value.
pub(super) fn set_reset_on_fork() -> io::Result<()> {
    let policy = thread_policy()? & !libc::SCHED_RESET_ON_FORK;
    let policy = match policy {
        libc::SCHED_BATCH => libc::SCHED_BATCH,
        _ => libc::SCHED_OTHER,
    };
    set_thread_policy(policy | libc::SCHED_RESET_ON_FORK)
}

/// Whether [`run_in_background`] may move this process: it ran under
/// `SCHED_BATCH` when first asked.
static BACKGROUND_ALLOWED: AtomicBool = AtomicBool::new(false);

/// Whether [`run_in_background`] was asked already.
static BACKGROUND_ASKED: AtomicBool = AtomicBool::new(false);

/// Moves the calling process, single-threaded, to `SCHED_IDLE` (with
/// `background`) or back to `SCHED_BATCH`: for work done ahead of spawns
/// (parked inits and mount templates), which must not delay one. Under
/// `SCHED_IDLE` it runs only on CPU time no other task wants, and every
/// task woken on its CPU preempts it, the daemon's `SCHED_BATCH` threads
/// included (which preempt nothing else). Its children still start under
/// `SCHED_OTHER`: their own steps (mounts, which hold kernel locks other
/// processes wait for, and their end) never run starved of CPU. Only a
/// process that ran under `SCHED_BATCH` when first asked moves; one under
/// another policy (the daemon kept `SCHED_OTHER`, [`NO_BATCH_ENV`]) keeps
/// it.
///
/// # Errors
///
/// When the policy cannot be read or set.
pub fn run_in_background(background: bool) -> io::Result<()> {
    if !BACKGROUND_ASKED.swap(true, Ordering::Relaxed) {
        let policy = thread_policy()? & !libc::SCHED_RESET_ON_FORK;
        BACKGROUND_ALLOWED.store(policy == libc::SCHED_BATCH, Ordering::Relaxed);
    }
    if !BACKGROUND_ALLOWED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let reset_on_fork = thread_policy()? & libc::SCHED_RESET_ON_FORK;
    let policy = if background {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_BATCH
    };
    set_thread_policy(policy | reset_on_fork)
}

/// Puts the calling (child) process under `SCHED_OTHER`, its nice value
/// kept; async-signal-safe (one syscall). Returns the errno on failure.
pub(super) fn reset_child_policy() -> Result<(), c_int> {
    let param = NO_PRIORITY;
    // The raw syscall (async-signal-safe: no lock, no allocation), not
    // musl's `sched_setscheduler()` stub.
    // SAFETY: `param` is a valid kernel sched_param on this stack for the
    // call's duration; pid 0 is this (child) process only.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            libc::SCHED_OTHER,
            &raw const param,
        )
    };
    if ret != 0 {
        // SAFETY: reads this thread's errno slot, always valid.
        return Err(unsafe { *libc::__errno_location() });
    }
    Ok(())
}
