//! Code that runs in the cloned child, between `clone` and `execve`.
//!
//! ASYNC-SIGNAL-SAFE ONLY. The child shares the daemon's memory (`CLONE_VM`)
//! while the calling thread is suspended and every other thread keeps
//! running. So nothing here may allocate, take a lock, panic, format, or
//! touch thread-locals other than `errno`: a malloc or tracing lock held by
//! another thread would never be released in this copy. Everything is
//! prepared by the parent in [`ChildArgs`]; the child only makes syscalls
//! and reads that data. Loops go over slices with iterators, never indexing.

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::AtomicU32;

use zygote_proto::SpawnStage;

use super::sandbox::{self, SandboxFailure, SandboxPlan};

/// What `clone` hands the child: the plan as raw, ready-to-use data.
///
/// Lives on the parent's stack during `clone`; the parent is suspended
/// until the child has exec'd or exited, so the borrows stay valid.
pub(super) struct ChildArgs<'a> {
    /// Paths to try with `execve`, in order.
    pub(super) candidates: &'a [*const c_char],
    /// NULL-terminated `argv`.
    pub(super) argv: &'a [*const c_char],
    /// NULL-terminated `envp`.
    pub(super) envp: &'a [*const c_char],
    /// Working directory to change to.
    pub(super) cwd: Option<&'a CStr>,
    /// `(source, target)` fd pairs.
    pub(super) fds: &'a [(RawFd, RawFd)],
    /// Scratch space, one slot per pair in `fds`, for the temporary copies.
    pub(super) temps: &'a [Cell<RawFd>],
    /// Lowest fd number above every target: temporaries go here.
    pub(super) dup_floor: RawFd,
    /// Inclusive fd ranges to close: the gaps between targets and above.
    pub(super) close_ranges: &'a [(c_uint, c_uint)],
    /// Call `setsid`.
    pub(super) new_session: bool,
    /// Make fd 0 the controlling terminal (after `setsid`).
    pub(super) controlling_terminal: bool,
    /// Call `setpgid(0, pgid)` (only without `new_session`).
    pub(super) process_group: Option<libc::pid_t>,
    /// Call `umask`.
    pub(super) umask: Option<libc::mode_t>,
    /// `(resource, limit)` pairs for `prlimit64`.
    pub(super) rlimits: &'a [(c_int, Rlimit64)],
    /// `(uid, gid, groups)` to switch to.
    pub(super) credentials: Option<(libc::uid_t, libc::gid_t, &'a [libc::gid_t])>,
    /// An open `cgroup.procs` to write `0` to, joining that cgroup first.
    pub(super) join_cgroup: Option<RawFd>,
    /// Prebuilt signal data, since building a `sigaction` needs zeroing.
    pub(super) signals: &'a SignalReset,
    /// Signals to leave ignored (bit `n - 1` for signal `n`).
    pub(super) ignored_signals: u64,
    /// Go back to `SCHED_OTHER` (the daemon runs under `SCHED_BATCH`).
    pub(super) reset_policy: bool,
    /// Call `setpriority`.
    pub(super) nice: Option<c_int>,
    /// `sched_setaffinity` mask words; empty: leave it.
    pub(super) cpu_affinity: &'a [u64],
    /// Decimal text to write to `/proc/self/oom_score_adj`.
    pub(super) oom_score_adj: Option<&'a [u8]>,
    /// Where the child reports the step that failed.
    pub(super) failure: &'a Failure,
    /// On the fork path, which shares no memory: the write end of the
    /// close-on-exec status pipe, where the child also writes the failed
    /// step (see [`encode_failure`]).
    pub(super) report: Option<RawFd>,
    /// The confinement to apply (fork path only).
    pub(super) sandbox: Option<&'a SandboxPlan>,
    /// With a new pid namespace: where its init reports the program's
    /// exit (see [`sandbox::run_init`]).
    pub(super) init_report: Option<RawFd>,
    /// How the init starts its program without copying its memory (the
    /// parent side's, passed in: this module calls nothing of it).
    pub(super) start_program: Option<StartProgram>,
    /// The sandbox's fds as the child sees them (see
    /// [`sandbox::copy_fds`]).
    pub(super) sandbox_fds: &'a [RawFd],
    /// The cloning thread's namespaces (sandboxed children only).
    pub(super) parent_namespaces: sandbox::ParentNamespaces,
    /// A parked init's: the read end of the pipe whose closing releases
    /// it (see [`sandbox::park`]). The child parks instead of switching
    /// credentials and exec'ing.
    pub(super) park: Option<RawFd>,
    /// A parked init sharing its maker's memory: the word it hands off on
    /// once it no longer uses that memory (see `clone::clone_parked`).
    pub(super) hand_off: Option<&'a AtomicU32>,
}

/// The status pipe's failure report: the stage's index in
/// [`SpawnStage::ALL`] (low 16 bits) with the sandbox step, if any (high
/// 16 bits, [`SandboxFailure::pack`]), and the errno, native-endian.
/// Eight bytes, under `PIPE_BUF`, so written and read whole.
pub(super) fn encode_failure(stage: SpawnStage, errno: c_int, detail: u16) -> [u8; 8] {
    let index = SpawnStage::ALL
        .iter()
        .position(|known| *known == stage)
        .and_then(|index| u32::try_from(index).ok())
        .map_or(u32::MAX, |index| index | u32::from(detail) << 16);
    let mut bytes = [0u8; 8];
    let (first, second) = bytes.split_at_mut(4);
    first.copy_from_slice(&index.to_ne_bytes());
    second.copy_from_slice(&errno.to_ne_bytes());
    bytes
}

/// Reverses [`encode_failure`]; `None` for an unknown stage.
pub(super) fn decode_failure(
    bytes: [u8; 8],
) -> Option<(SpawnStage, c_int, Option<SandboxFailure>)> {
    let [a, b, c, d, e, f, g, h] = bytes;
    let word = u32::from_ne_bytes([a, b, c, d]);
    let index = usize::try_from(word & 0xffff).ok()?;
    let stage = *SpawnStage::ALL.get(index)?;
    let detail = SandboxFailure::unpack(u16::try_from(word >> 16).unwrap_or(0));
    Some((stage, c_int::from_ne_bytes([e, f, g, h]), detail))
}

/// The kernel's `struct rlimit64`, as `prlimit64(2)` takes it on every
/// architecture; `u64::MAX` is `RLIM64_INFINITY`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct Rlimit64 {
    /// Soft limit.
    pub(super) cur: u64,
    /// Hard limit.
    pub(super) max: u64,
}

/// A `SIG_DFL` action and an empty mask, built by the parent.
pub(super) struct SignalReset {
    /// Where the child learns which signals are caught or ignored.
    status_path: &'static CStr,
    /// The caught or ignored signals, when the parent already knows them:
    /// the child then skips reading `status_path`.
    known: Option<u128>,
    default_action: libc::sigaction,
    ignore_action: libc::sigaction,
    empty_mask: libc::sigset_t,
    max_signal: c_int,
    /// The kernel's `sizeof(sigset_t)`, as `rt_sigaction` wants it.
    sigset_bytes: usize,
}

impl SignalReset {
    /// Builds the data; runs in the parent.
    pub(super) fn new() -> Self {
        // SAFETY: `sigaction` and `sigset_t` are plain C structs for which
        // all-zero bytes are valid: handler SIG_DFL (0), no flags, no mask.
        let (default_action, mut empty_mask) = unsafe {
            (
                std::mem::zeroed::<libc::sigaction>(),
                std::mem::zeroed::<libc::sigset_t>(),
            )
        };
        // SAFETY: `empty_mask` is a valid, writable sigset_t.
        unsafe { libc::sigemptyset(&raw mut empty_mask) };
        let mut ignore_action = default_action;
        ignore_action.sa_sigaction = libc::SIG_IGN;
        let max_signal = libc::SIGRTMAX();
        Self {
            status_path: c"/proc/self/status",
            known: None,
            default_action,
            ignore_action,
            empty_mask,
            max_signal,
            // One bit per signal 1..=max: 8 bytes on most, 16 on MIPS.
            sigset_bytes: usize::try_from(max_signal).unwrap_or(64).div_ceil(8),
        }
    }
}

impl SignalReset {
    /// As [`SignalReset::new`], with the caught or ignored signals read
    /// here, in the parent, once: `None` when procfs cannot say.
    pub(super) fn with_current_dispositions() -> Option<Self> {
        let signals = Self::new();
        let known = non_default_signals(&signals)?;
        Some(Self {
            known: Some(known),
            ..signals
        })
    }

    /// The signals a child resets: all when not known beforehand.
    pub(super) fn known(&self) -> u128 {
        self.known.unwrap_or(u128::MAX)
    }
}

#[cfg(test)]
impl SignalReset {
    /// As [`SignalReset::new`], but the child cannot read its status and
    /// resets every signal.
    pub(super) fn without_proc() -> Self {
        Self {
            status_path: c"/nonexistent/status",
            ..Self::new()
        }
    }
}

/// The child's error report: the failing stage and its errno.
///
/// Written by the child through shared memory, read by the parent after
/// `clone` returns. The accesses never overlap: the parent is suspended
/// (`CLONE_VFORK`) until the child has exec'd or exited.
#[derive(Default)]
pub(super) struct Failure {
    stage: Cell<Option<SpawnStage>>,
    errno: Cell<c_int>,
    /// The sandbox step ([`SandboxFailure::pack`]); 0 for none.
    detail: Cell<u16>,
}

impl Failure {
    /// The stage, errno and sandbox step the child reported, if it failed.
    pub(super) fn get(&self) -> Option<(SpawnStage, c_int, Option<SandboxFailure>)> {
        self.stage.get().map(|stage| {
            (
                stage,
                self.errno.get(),
                SandboxFailure::unpack(self.detail.get()),
            )
        })
    }
}

/// A failed step: its stage and errno.
type Failed = (SpawnStage, c_int);

/// Starts `entry(arg)` in a child that shares the caller's memory while
/// the caller waits (vfork), on a stack of its own; returns its pid.
///
/// # Safety
///
/// `entry` must be async-signal-safe and never return; `arg` must stay
/// valid for it.
pub(super) type StartProgram =
    unsafe fn(extern "C" fn(*mut c_void) -> c_int, *mut c_void) -> Result<libc::pid_t, c_int>;

/// The child's entry point, called by `clone` on the mmap'd stack.
///
/// Never returns: it execs, or reports the failure and exits with 127.
pub(super) extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `clone::clone_child` passes a pointer to a live `ChildArgs`;
    // the parent thread is suspended until we exec or exit, so it stays
    // valid and nobody else reads or writes it meanwhile. On the fork path
    // (`clone::fork_child`) it points into our own copy of the memory.
    let args = unsafe { &*arg.cast::<ChildArgs<'_>>() };
    report_and_exit(args, setup_and_exec(args))
}

/// The program under a pid namespace's init, which starts it sharing its
/// memory ([`StartProgram`]): copying the init's memory, a copy of the
/// daemon's, for a child that execs at once cost more than the
/// namespaces. Runs the steps after the init's, then execs.
///
/// Never returns: it execs, or reports the failure and exits with 127.
extern "C" fn program_main(arg: *mut c_void) -> c_int {
    // SAFETY: the init passes its own live `ChildArgs` and waits, suspended,
    // until this child has exec'd or exited.
    let args = unsafe { &*arg.cast::<ChildArgs<'_>>() };
    sandbox::leave_init();
    if let Some(report) = args.init_report {
        // SAFETY: our copy of the init's report pipe, which only the init
        // writes.
        unsafe { libc::close(report) };
    }
    let failed = match after_init(args) {
        Ok(()) => exec(args),
        Err(failed) => failed,
    };
    report_and_exit(args, failed)
}

/// Records and reports the step that failed, then exits with 127.
fn report_and_exit(args: &ChildArgs<'_>, (stage, errno): Failed) -> ! {
    args.failure.errno.set(errno);
    args.failure.stage.set(Some(stage));
    if let Some(fd) = args.report {
        let report = encode_failure(stage, errno, args.failure.detail.get());
        // SAFETY: writes 8 bytes from a valid buffer to our own pipe end;
        // a failed write leaves the parent to see a plain exit.
        unsafe { libc::write(fd, report.as_ptr().cast(), report.len()) };
    }
    // SAFETY: `_exit` is async-signal-safe and ends only this process (no
    // CLONE_THREAD); it skips atexit handlers, which belong to the parent.
    unsafe { libc::_exit(127) }
}

/// Applies the plan and execs; returns only on failure.
///
/// Order matters: signals first, so nothing of the parent's runs here;
/// rlimits after the fd juggling, so a low `RLIMIT_NOFILE` cannot refuse
/// it, and before the credentials, so that limits a policy allowed above
/// the peer's can still be raised; credentials before `chdir` and exec, so
/// that those are checked with the child's permissions, not the daemon's.
fn setup_and_exec(args: &ChildArgs<'_>) -> Failed {
    if let Err(failed) = setup(args) {
        return failed;
    }
    exec(args)
}

fn setup(args: &ChildArgs<'_>) -> Result<(), Failed> {
    if let Some(procs) = args.join_cgroup {
        // SAFETY: writes two bytes from a static string to an open fd.
        let written = unsafe { libc::write(procs, c"0".as_ptr().cast(), 1) };
        check(if written == 1 { 0 } else { -1 }, SpawnStage::Cgroup)?;
    }
    reset_signals(args.signals)?;
    ignore_signals(args.signals, args.ignored_signals)?;

    if args.new_session {
        // SAFETY: plain syscall wrapper.
        check(unsafe { libc::setsid() }, SpawnStage::Setsid)?;
    } else if let Some(pgid) = args.process_group {
        // SAFETY: plain syscall wrapper.
        check(unsafe { libc::setpgid(0, pgid) }, SpawnStage::Setpgid)?;
    }

    if let Some(mask) = args.umask {
        // SAFETY: plain syscall wrapper; cannot fail.
        unsafe { libc::umask(mask) };
    }

    place_fds(args)?;
    close_others(args)?;

    if args.controlling_terminal {
        take_terminal(args)?;
    }

    for (resource, limit) in args.rlimits {
        // SAFETY: prlimit64 on ourselves (pid 0), reading a valid struct
        // with the kernel's layout; the old value is not asked for.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_prlimit64,
                0 as libc::pid_t,
                *resource,
                ptr::from_ref(limit),
                ptr::null_mut::<Rlimit64>(),
            )
        };
        check_long(ret, SpawnStage::Setrlimit)?;
    }

    // With the daemon's rights, before the credentials change: the daemon
    // has already kept a peer without privilege from lowering either.
    set_attributes(args)?;

    if let Some(plan) = args.sandbox {
        let peer = sandbox::Peer {
            credentials: args.credentials,
            fds: args.sandbox_fds,
            parent: args.parent_namespaces,
        };
        sandboxed(args, sandbox::before_credentials(plan, &peer))?;
        if let Some(release) = args.park {
            let name = if plan.build_template {
                c"zygote-template"
            } else {
                c"zygote-init"
            };
            let parked = sandbox::park(release, args.report, name, args.hand_off);
            return sandboxed(args, Err(parked));
        }
    }

    if let Some((uid, gid, groups)) = args.credentials {
        switch_credentials(uid, gid, groups)?;
    }

    if let Some(report) = args.init_report {
        let arg = ptr::from_ref(args).cast_mut().cast::<c_void>();
        let start = args.start_program.map(|start| {
            move || {
                // SAFETY: `program_main` is async-signal-safe and never
                // returns; `args` outlives the init, which never returns.
                unsafe { start(program_main, arg) }
            }
        });
        sandboxed(args, sandbox::run_init(report, args.report, start))?;
    }
    after_init(args)
}

/// The steps after a pid namespace's init (if any): as the peer, last
/// before exec.
fn after_init(args: &ChildArgs<'_>) -> Result<(), Failed> {
    if let Some(cwd) = args.cwd {
        // SAFETY: `cwd` is a NUL-terminated string owned by the plan.
        check(unsafe { libc::chdir(cwd.as_ptr()) }, SpawnStage::Chdir)?;
    }

    if let Some(plan) = args.sandbox {
        sandboxed(args, sandbox::before_exec(plan, args.sandbox_fds))?;
    }
    Ok(())
}

/// A sandbox step's result, its detail kept for the report.
fn sandboxed(args: &ChildArgs<'_>, result: Result<(), sandbox::Failed>) -> Result<(), Failed> {
    result.map_err(|(stage, errno, detail)| {
        args.failure.detail.set(SandboxFailure::pack(detail));
        (stage, errno)
    })
}

/// Makes the terminal on fd 0 the controlling terminal of the session this
/// child leads, and gives it to the user the child will run as, as
/// `grantpt(3)` would: programs that reopen their tty by name need that.
/// Failures report the `Setsid` stage: both steps make the session.
fn take_terminal(args: &ChildArgs<'_>) -> Result<(), Failed> {
    // SAFETY: ioctl on fd 0 with an integer argument (0: do not steal a
    // terminal that is already another session's).
    let ret = unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0 as c_int) };
    check(ret, SpawnStage::Setsid)?;
    if let Some((uid, _, _)) = args.credentials {
        // SAFETY: plain syscall on fd 0; -1 keeps the group (devpts' own).
        let ret = unsafe { libc::fchown(0, uid, libc::gid_t::MAX) };
        check(ret, SpawnStage::Setsid)?;
    }
    Ok(())
}

/// Resets the policy, then sets the nice value, CPU affinity and OOM score
/// adjustment the plan asks for.
fn set_attributes(args: &ChildArgs<'_>) -> Result<(), Failed> {
    if args.reset_policy {
        // Keeps the nice value, which `setpriority` below then sets.
        super::sched::reset_child_policy().map_err(|errno| (SpawnStage::Nice, errno))?;
    }
    if let Some(nice) = args.nice {
        // SAFETY: plain syscall on ourselves (who 0); no memory is passed.
        let ret = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
        check(ret, SpawnStage::Nice)?;
    }
    if !args.cpu_affinity.is_empty() {
        // SAFETY: the kernel reads `len * 8` bytes from a valid slice of
        // u64 mask words (the layout of a cpu mask of unsigned longs on
        // the 64-bit targets we build for).
        let ret = unsafe {
            libc::syscall(
                libc::SYS_sched_setaffinity,
                0 as libc::pid_t,
                args.cpu_affinity.len() * 8,
                args.cpu_affinity.as_ptr(),
            )
        };
        check_long(ret, SpawnStage::Affinity)?;
    }
    if let Some(text) = args.oom_score_adj {
        // SAFETY: opens a NUL-terminated path; the fd is closed below.
        let fd = unsafe {
            libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            )
        };
        let fd = check(fd, SpawnStage::OomScoreAdj)?;
        // SAFETY: writes `text.len()` bytes from a valid slice.
        let written = unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) };
        let failed = (written < 0).then(errno);
        // SAFETY: closes the fd opened above, which nothing else uses.
        unsafe { libc::close(fd) };
        if let Some(errno) = failed {
            return Err((SpawnStage::OomScoreAdj, errno));
        }
    }
    Ok(())
}

/// Sets `SIG_IGN` for each signal in `mask`, as exec keeps a caller's
/// ignored signals. SIGKILL and SIGSTOP cannot be ignored; those bits are
/// skipped. glibc refuses its internal signals (32, 33), which the raw
/// syscall sets.
fn ignore_signals(signals: &SignalReset, mask: u64) -> Result<(), Failed> {
    for signal in 1..=signals.max_signal.min(64) {
        let bit = u32::try_from(signal - 1).unwrap_or(0);
        if (mask >> bit) & 1 == 0 || signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sets a SIG_IGN action from a valid struct; this process
        // has its own copy of the handler table (no CLONE_SIGHAND).
        let ret =
            unsafe { libc::sigaction(signal, &raw const signals.ignore_action, ptr::null_mut()) };
        if ret == 0 {
            continue;
        }
        if errno() != libc::EINVAL {
            return Err((SpawnStage::Signals, errno()));
        }
        ignore_signal_raw(signal, signals.sigset_bytes)?;
    }
    Ok(())
}

/// `rt_sigaction(signal, SIG_IGN)` without libc.
fn ignore_signal_raw(signal: c_int, sigset_bytes: usize) -> Result<(), Failed> {
    // The kernel's struct sigaction starts with the handler on the 64-bit
    // targets we build for; no flags, no restorer, an empty mask follow.
    let ignore_action: [u64; 8] = [libc::SIG_IGN as u64, 0, 0, 0, 0, 0, 0, 0];
    // SAFETY: the kernel reads at most 64 bytes from a valid buffer and
    // writes nothing (no old action pointer).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signal,
            ignore_action.as_ptr(),
            ptr::null_mut::<c_void>(),
            sigset_bytes,
        )
    };
    check_long(ret, SpawnStage::Signals)
}

/// Sets groups, then gid, then uid: each later step removes the right to
/// take the earlier ones.
///
/// Raw syscalls, never glibc's wrappers: those apply the change to every
/// thread of what glibc believes is our process (the daemon's threads,
/// since we share its memory) by signalling them, which would hang or
/// change the daemon's own credentials. The syscalls act on this process
/// alone. (`SYS_setgroups` etc. take 32-bit ids on the 64-bit targets we
/// build for.)
fn switch_credentials(
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: &[libc::gid_t],
) -> Result<(), Failed> {
    // SAFETY: the kernel reads `groups.len()` ids from a valid slice.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    check_long(ret, SpawnStage::Setgroups)?;
    // SAFETY: plain syscall on ids; no memory is passed.
    let ret = unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) };
    check_long(ret, SpawnStage::Setgid)?;
    // SAFETY: plain syscall on ids; no memory is passed.
    let ret = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
    check_long(ret, SpawnStage::Setuid)?;
    // Leaving uid 0 empties the effective, permitted and ambient sets, but
    // not the inheritable one: a daemon holding some (a unit's
    // AmbientCapabilities=) would pass them on to a program with file
    // capabilities, which the peer need not hold.
    if uid != 0 {
        check_long(sandbox::empty_capability_sets(), SpawnStage::Setuid)?;
    }
    Ok(())
}

/// Gives every caught or ignored signal its default action, then unblocks
/// them all.
///
/// The parent blocked all signals before `clone`, so none of its handlers
/// can run here on shared memory. Ignored signals are reset too: an
/// inherited `SIG_IGN` survives exec (SIGPIPE above all, as std does).
/// With no handler left, no later syscall can fail with EINTR.
fn reset_signals(signals: &SignalReset) -> Result<(), Failed> {
    // One read of /proc costs ~10 us; a sigaction for each of the 62
    // signals costs ~45 us (measured here, 0.7 us per syscall). Without
    // /proc, reset them all.
    let to_reset = signals
        .known
        .or_else(|| non_default_signals(signals))
        .unwrap_or(u128::MAX);
    for signal in 1..=signals.max_signal {
        let bit = u32::try_from(signal - 1).unwrap_or(0);
        let set = to_reset.checked_shr(bit).is_none_or(|rest| rest & 1 == 1);
        if !set || signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sets a SIG_DFL action from a valid struct; this process
        // has its own copy of the handler table (no CLONE_SIGHAND).
        let ret =
            unsafe { libc::sigaction(signal, &raw const signals.default_action, ptr::null_mut()) };
        if ret == 0 {
            continue;
        }
        if errno() != libc::EINVAL {
            return Err((SpawnStage::Signals, errno()));
        }
        // glibc refuses its internal signals (32, 33) with EINVAL, yet
        // its posix_spawn leaves them SIG_IGN in children (std's included),
        // so we may have inherited that: reset them with the raw syscall.
        reset_signal_raw(signal, signals.sigset_bytes)?;
    }
    // SAFETY: sets this thread's mask from a valid, empty set.
    let ret = unsafe {
        libc::sigprocmask(
            libc::SIG_SETMASK,
            &raw const signals.empty_mask,
            ptr::null_mut(),
        )
    };
    check(ret, SpawnStage::Signals).map(drop)
}

/// The caught or ignored signals (bit `n - 1` for signal `n`), from the
/// `SigCgt` and `SigIgn` lines of our procfs status; `None` if unreadable.
fn non_default_signals(signals: &SignalReset) -> Option<u128> {
    // SAFETY: opens a NUL-terminated path; the fd is closed below.
    let fd = unsafe {
        libc::open(
            signals.status_path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buffer = [0u8; 4096];
    let text = read_procfs(fd, &mut buffer);
    // SAFETY: closes the fd opened above, which nothing else uses.
    unsafe { libc::close(fd) };
    let text = text?;
    Some(hex_field(text, b"\nSigIgn:")? | hex_field(text, b"\nSigCgt:")?)
}

/// Reads `fd` into `buffer` if it is on procfs: a file anywhere else could
/// hide a handler from us. `None` on any error.
fn read_procfs(fd: c_int, buffer: &mut [u8]) -> Option<&[u8]> {
    // SAFETY: statfs is a plain C struct; all-zero bytes are valid.
    let mut fs = unsafe { std::mem::zeroed::<libc::statfs>() };
    // SAFETY: fstatfs writes into a valid, correctly typed struct.
    if unsafe { libc::fstatfs(fd, &raw mut fs) } != 0 {
        return None;
    }
    // f_type is signed on glibc and unsigned on musl; the magic fits both.
    #[allow(clippy::unnecessary_cast)]
    if fs.f_type as u64 != libc::PROC_SUPER_MAGIC as u64 {
        return None;
    }
    let mut len = 0;
    loop {
        let rest = buffer.get_mut(len..)?;
        if rest.is_empty() {
            break;
        }
        // SAFETY: reads at most `rest.len()` bytes into `rest`.
        let read = unsafe { libc::read(fd, rest.as_mut_ptr().cast(), rest.len()) };
        match usize::try_from(read) {
            Ok(0) => break,
            Ok(read) => len += read,
            Err(_) => return None,
        }
    }
    buffer.get(..len)
}

/// The hex number after `key` in `text` (e.g. `"\nSigCgt:\t0000000000000400"`).
/// `None` if the key is missing or the number is empty or too wide.
fn hex_field(text: &[u8], key: &[u8]) -> Option<u128> {
    if key.is_empty() {
        return None; // `windows(0)` would panic
    }
    let start = text.windows(key.len()).position(|window| window == key)? + key.len();
    let mut value: u128 = 0;
    let mut digits = 0;
    for &byte in text.get(start..)?.iter().skip_while(|byte| **byte == b'\t') {
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => break,
        };
        digits += 1;
        if digits > 32 {
            return None;
        }
        value = (value << 4) | u128::from(digit);
    }
    (digits > 0).then_some(value)
}

/// `rt_sigaction(signal, SIG_DFL)` without libc.
fn reset_signal_raw(signal: c_int, sigset_bytes: usize) -> Result<(), Failed> {
    // All-zero is SIG_DFL, no flags, no restorer and an empty mask in any
    // architecture's field order; 64 bytes cover every kernel layout.
    let default_action = [0u64; 8];
    // SAFETY: the kernel reads at most 64 bytes from a valid buffer and
    // writes nothing (no old action pointer).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signal,
            default_action.as_ptr(),
            ptr::null_mut::<c_void>(),
            sigset_bytes,
        )
    };
    check_long(ret, SpawnStage::Signals)
}

/// Puts each source at its target number.
///
/// First every source is copied above all targets, so a source whose number
/// is another mapping's target survives; then each copy is `dup2`'d into
/// place, which also clears close-on-exec on the target.
fn place_fds(args: &ChildArgs<'_>) -> Result<(), Failed> {
    for ((source, _), temp) in args.fds.iter().zip(args.temps) {
        // SAFETY: fcntl on an fd number; a bad one fails with EBADF.
        let copy = unsafe { libc::fcntl(*source, libc::F_DUPFD_CLOEXEC, args.dup_floor) };
        temp.set(check(copy, SpawnStage::Dup)?);
    }
    for ((_, target), temp) in args.fds.iter().zip(args.temps) {
        // SAFETY: dup2 between fd numbers; the temporary is above every
        // target, so it is never the target itself.
        check(unsafe { libc::dup2(temp.get(), *target) }, SpawnStage::Dup)?;
    }
    Ok(())
}

/// Closes every fd that is not a target, temporaries included.
///
/// Defence in depth: the daemon's fds are all close-on-exec already.
fn close_others(args: &ChildArgs<'_>) -> Result<(), Failed> {
    for (first, last) in args.close_ranges {
        // SAFETY: close_range closes fds of this process only (we have our
        // own fd table: no CLONE_FILES); the targets are outside the ranges.
        let ret = unsafe { libc::syscall(libc::SYS_close_range, *first, *last, 0 as c_uint) };
        check_long(ret, SpawnStage::CloseFds)?;
    }
    Ok(())
}

/// Tries each candidate with `execve`, as `execvp` does.
fn exec(args: &ChildArgs<'_>) -> Failed {
    let mut saw_eacces = false;
    let mut last = libc::ENOENT;
    for path in args.candidates {
        // SAFETY: `path` and the NULL-terminated `argv`/`envp` arrays point
        // to strings owned by the plan, alive while the parent waits.
        unsafe { libc::execve(*path, args.argv.as_ptr(), args.envp.as_ptr()) };
        last = errno();
        match last {
            libc::EACCES => saw_eacces = true,
            libc::ENOENT | libc::ENOTDIR => {}
            _ => return (SpawnStage::Exec, last),
        }
    }
    let errno = if saw_eacces { libc::EACCES } else { last };
    (SpawnStage::Exec, errno)
}

fn check(ret: c_int, stage: SpawnStage) -> Result<c_int, Failed> {
    if ret < 0 {
        Err((stage, errno()))
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long, stage: SpawnStage) -> Result<(), Failed> {
    if ret < 0 {
        Err((stage, errno()))
    } else {
        Ok(())
    }
}

fn errno() -> c_int {
    // SAFETY: `__errno_location` returns this thread's errno slot, always
    // valid to read. (The child runs on the parent thread's TLS, which is
    // harmless: that thread is suspended and rereads nothing of it.)
    unsafe { *libc::__errno_location() }
}

#[cfg(test)]
mod tests {
    use zygote_proto::SpawnStage;

    use super::{SignalReset, decode_failure, encode_failure, hex_field, non_default_signals};
    use crate::spawn::sandbox::{SandboxFailure, Step};

    #[test]
    fn a_failure_report_keeps_its_stage_errno_and_sandbox_step() {
        let mount = SandboxFailure {
            step: Step::Mount,
            item: Some(3),
        };
        let report = encode_failure(
            SpawnStage::Sandbox,
            libc::EACCES,
            SandboxFailure::pack(Some(mount)),
        );
        assert_eq!(
            decode_failure(report),
            Some((SpawnStage::Sandbox, libc::EACCES, Some(mount)))
        );
        let report = encode_failure(SpawnStage::Exec, libc::ENOENT, 0);
        assert_eq!(
            decode_failure(report),
            Some((SpawnStage::Exec, libc::ENOENT, None))
        );
    }

    #[test]
    fn the_parent_reads_the_dispositions_for_its_children() {
        // The Rust runtime ignores SIGPIPE, so this process has at least one.
        let reset = SignalReset::with_current_dispositions().expect("procfs is readable");
        let read_here = non_default_signals(&SignalReset::new()).expect("procfs is readable");
        assert_eq!(
            reset.known,
            Some(read_here),
            "the child would read /proc itself"
        );
        assert_ne!(reset.known() & (1 << (libc::SIGPIPE - 1)), 0);
        assert_eq!(
            SignalReset::new().known(),
            u128::MAX,
            "unknown: reset them all"
        );
    }

    #[test]
    fn hex_fields_are_parsed() {
        let status = b"Name:\tx\nSigIgn:\t0000000080001000\nSigCgt:\t0000000100000440\n";
        assert_eq!(hex_field(status, b"\nSigIgn:"), Some(0x8000_1000));
        assert_eq!(hex_field(status, b"\nSigCgt:"), Some(0x1_0000_0440));
        assert_eq!(hex_field(status, b"\nSigPnd:"), None);
        assert_eq!(hex_field(b"\nSigIgn:\t\n", b"\nSigIgn:"), None);
        let wide = b"\nSigIgn:\tffffffffffffffffffffffffffffffff";
        assert_eq!(hex_field(wide, b"\nSigIgn:"), Some(u128::MAX));
        let too_wide = b"\nSigIgn:\t0ffffffffffffffffffffffffffffffff";
        assert_eq!(hex_field(too_wide, b"\nSigIgn:"), None);
    }
}
