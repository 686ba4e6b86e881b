//! Creating children: the only module with unsafe process code.
//!
//! # Layout
//!
//! - this file: the safe API, and turning a [`SpawnPlan`] into the raw,
//!   ready-made data the child needs (pointer arrays, sorted fd ranges), so
//!   that the child only applies it.
//! - `clone`: the parent's side: the child's stack, `clone(2)`, and the raw
//!   pidfd syscalls.
//! - `child`: what runs in the child until exec; async-signal-safe only.
//! - `sandbox`: a [`SandboxPlan`]'s data and the child's steps to apply
//!   it (namespaces, the new root, Landlock, seccomp, the pid namespace's
//!   init); async-signal-safe as `child` is. Its `libseccomp` module
//!   loads libseccomp, for the daemon, to compile filters as trees.
//! - `fork`: whole-process operations of the private zygote: `fork(2)` of
//!   a single-threaded program into a template, and taking over an
//!   inherited socket.
//! - `sigchld`: the daemon's `SIGCHLD`, blocked everywhere and read from
//!   a signalfd.
//! - `stray`: the signals that mean nothing to a zygote, blocked
//!   everywhere and read from a signalfd, so that none can end it.
//! - `sched`: the daemon's threads under `SCHED_BATCH`, its children back
//!   under `SCHED_OTHER`.
//! - `sibling`: children a per-uid spawner process starts for the daemon
//!   (`CLONE_PARENT`), and what keeps the orphan reaper off them.
//!
//! # Primitive, decided by measurement
//!
//! `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)` on a small stack of our
//! own: no page tables are copied, the pidfd comes with the child, and we
//! run our own setup between clone and exec (which `posix_spawn` cannot).
//! p50 in µs, 1000 runs each, release build, kernel 6.18, 2 vCPUs; the C
//! column is glibc `posix_spawn` + `waitpid` from a tiny C program (the
//! floor that zygote-bench measures against):
//!
//! | child | this module | std `Command::status` | C posix_spawn |
//! |---|---|---|---|
//! | `/bin/true`, spawn + reap | 527 | 600 | 600 |
//! | static `true`, spawn + reap | 360 | 440 | 420 |
//! | `/bin/true`, spawn alone (caller blocked) | 94 | | 158 |
//! | static `true`, spawn alone (caller blocked) | 85 | | 147 |
//!
//! Exec and exit dominate. Syscalls cost ~0.7 µs here, so the child learns
//! which signals need resetting from one read of `/proc/self/status`
//! (~10 µs) rather than 62 `sigaction` calls (~43 µs); the daemon goes
//! further and reads them once for all its children ([`Spawner`]).
//! Rerun with `ZYGOTE_BENCH_STATIC=/path/to/static-true cargo test -p
//! zygote --release --lib spawn::tests::measure -- --ignored --nocapture`.

mod child;
mod clone;
mod fork;
mod handover;
mod sandbox;
mod sched;
mod selfsignal;
mod sibling;
mod sigchld;
mod stray;

pub use sibling::{
    ExpectedSibling, SiblingChild, expect_sibling, kill_pre_exec_children, pre_exec_children,
};

pub use sandbox::libseccomp;
pub use sandbox::{
    HeldLandlock, HeldPath, LandlockPlan, MAX_MOUNTS, Mount, MountKind, SANDBOX_STAGE,
    SandboxFailure, SandboxPlan, SeccompProgram, Step as SandboxStep,
    confine_like_a_sandboxed_child, dev_template, empty_network_namespace, install_seccomp_filter,
    landlock_abi, user_namespaces_work,
};

pub use fork::{
    ForkError, Forked, close_fds_above_2_except, exit_now, fork_single_threaded, take_inherited_fd,
    thread_count,
};
pub use handover::{
    SignalMask, adopt_fd, exec_in_place, hold_stop_signals, inherited_fds, release_held_signals,
    run_own, set_inheritable,
};
pub use sched::{
    DaemonPolicy, NO_BATCH_ENV, log_daemon_policy, run_daemon_as_batch, run_in_background,
};
pub use selfsignal::{die_by, die_of_signal, stop_self, stop_self_by};
pub use sigchld::{
    SIGNALFD_SIGINFO_BYTES, block_child_signal, child_signal_fd, threads_taking_child_signal,
};
pub use stray::{
    STRAY_SIGNALS, StraySignal, block_stray_signals, read_stray_signal, signal_name,
    stray_signal_fd,
};

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{CString, c_char, c_int, c_uint};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError, RwLock};

use crate::strerror;
use zygote_proto::{Env, ExitStatus, ResourceLimit, ResourceUsage, SpawnStage};

use child::{ChildArgs, Failure, Rlimit64, SignalReset};

/// A checked spawn request: everything the child applies, prepared before
/// any process exists.
#[derive(Debug)]
pub struct SpawnPlan {
    /// Paths to try in order with execve, as execvp does: PATH lookup is
    /// already done by the caller. On ENOENT/ENOTDIR try the next; remember
    /// EACCES and try the next; any other errno stops. If all fail, report
    /// EACCES if seen, else the last errno. Never empty (caller guarantees).
    pub exec_candidates: Vec<CString>,
    /// `argv[0..]`.
    pub argv: Vec<CString>,
    /// The whole environment, each variable `KEY=VALUE` with its NUL in
    /// one buffer, which the child's `envp` points into. Neither a key nor
    /// a value may hold a NUL (the caller checks), or the child sees that
    /// string cut short.
    pub envp: Env,
    /// Working directory; the daemon's own when absent.
    pub cwd: Option<CString>,
    /// The fds the child gets: (source fd owned by the daemon, fd number in
    /// the child). Always contains targets 0, 1 and 2; other targets >= 3,
    /// all distinct. Sources are close-on-exec daemon fds, and a source
    /// number may equal another mapping's target.
    pub fds: Vec<(OwnedFd, RawFd)>,
    /// Start a new session (`setsid(2)`).
    pub new_session: bool,
    /// Make fd 0, a terminal, the controlling terminal (`TIOCSCTTY`) of
    /// the new session; needs `new_session`.
    pub controlling_terminal: bool,
    /// `setpgid(0, pgid)`; ignored if `new_session`.
    pub process_group: Option<i32>,
    /// The child's umask; the daemon's when absent.
    pub umask: Option<u32>,
    /// Resource limits (`RLIMIT_*` numbers; `u64::MAX` is `RLIM_INFINITY`).
    pub rlimits: Vec<ResourceLimit>,
    /// Credentials to switch to before `chdir` and exec; the daemon's own
    /// when absent.
    pub credentials: Option<Credentials>,
    /// The cgroup directory to start the child in: `clone3` with
    /// `CLONE_INTO_CGROUP` (Linux 5.7), else the child joins it through
    /// `cgroup.procs` before anything else; the daemon's own when absent.
    pub cgroup: Option<OwnedFd>,
    /// Signals the child starts with ignored, bit `n - 1` for signal `n`
    /// (SIGKILL and SIGSTOP cannot be); every other one is reset.
    pub ignored_signals: u64,
    /// `setpriority(2)` value; the daemon's when absent.
    pub nice: Option<i32>,
    /// `sched_setaffinity(2)` mask words (CPU `n` is bit `n % 64` of word
    /// `n / 64`); the daemon's affinity when empty.
    pub cpu_affinity: Vec<u64>,
    /// Written to `/proc/self/oom_score_adj`; the daemon's when absent.
    pub oom_score_adj: Option<i32>,
    /// The confinement the child applies; such a child always starts on
    /// the fork path ([`Spawner::start`]).
    pub sandbox: Option<SandboxPlan>,
}

/// Who a child runs as: set with `setgroups`, `setresgid` and `setresuid`,
/// in that order (dropping the uid last, while we may still set groups).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    /// Real, effective and saved uid.
    pub uid: u32,
    /// Real, effective and saved gid.
    pub gid: u32,
    /// Supplementary groups, replacing the daemon's.
    pub groups: Vec<u32>,
}

/// A child that has exec'd.
#[derive(Debug)]
pub struct SpawnedChild {
    /// Its pid in the daemon's pid namespace.
    pub pid: i32,
    /// A close-on-exec pidfd: to reap it with [`try_reap`] and signal it
    /// with [`send_signal`] without pid-reuse races.
    pub pidfd: OwnedFd,
}

/// A child started on the fork path ([`Spawner::start`]), not yet known to
/// have exec'd: nothing waited for it. Read [`StartedChild::status`] with
/// [`read_exec_report`] until it says how the start ended.
#[derive(Debug)]
pub struct StartedChild {
    /// Its pid in the daemon's pid namespace.
    pub pid: i32,
    /// A close-on-exec pidfd.
    pub pidfd: OwnedFd,
    /// The read end of the child's close-on-exec status pipe,
    /// non-blocking and close-on-exec.
    pub status: OwnedFd,
}

/// What a [`StartedChild`]'s status pipe said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecReport {
    /// End of file without a report: the child exec'd, or died before
    /// (killed); its exit status tells which.
    Execd,
    /// The child failed at this step and is exiting with 127; reap it.
    Failed(SpawnError),
}

/// A spawn that failed: the step and its errno. No child is left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{} failed: {}", .stage.name(), strerror(*.errno))]
pub struct SpawnError {
    /// The step that failed.
    pub stage: SpawnStage,
    /// Its `errno` value.
    pub errno: i32,
    /// Which sandbox step, when the stage is the sandbox's.
    pub sandbox: Option<SandboxFailure>,
}

impl SpawnError {
    /// A failure outside the sandbox.
    pub fn new(stage: SpawnStage, errno: i32) -> Self {
        Self {
            stage,
            errno,
            sandbox: None,
        }
    }
}

/// Starts a child as `plan` says and returns once it has exec'd, like
/// `std::process::Command::spawn`. Blocks the calling thread (only) until
/// then, typically for well under a millisecond.
///
/// # Errors
///
/// The failing stage and errno, whether in the daemon (`Validate`, `Clone`)
/// or in the child before exec (`Signals` to `Exec`). A child that failed
/// has been reaped.
pub fn spawn(plan: &SpawnPlan) -> Result<SpawnedChild, SpawnError> {
    spawn_with(plan, &SignalReset::new())
}

/// This process's caught and ignored signals, read once, so that children
/// need not read them again (saving each child a procfs read, ~10 µs, on
/// the spawn's critical path).
///
/// Read it once every signal handler the process will install is in
/// place: a handler installed afterwards is not reset in children
/// started through [`Spawner::spawn`], and could run in a child between
/// its signal reset and its exec.
pub struct Spawner {
    signals: SignalReset,
}

impl Spawner {
    /// Reads the dispositions now; `None` when procfs cannot tell them
    /// (then use [`spawn`], whose children reset every signal).
    pub fn with_current_dispositions() -> Option<Self> {
        SignalReset::with_current_dispositions().map(|signals| Self { signals })
    }

    /// As [`spawn`].
    ///
    /// # Errors
    ///
    /// As [`spawn`].
    pub fn spawn(&self, plan: &SpawnPlan) -> Result<SpawnedChild, SpawnError> {
        spawn_with(plan, &self.signals)
    }

    /// Starts a child as `plan` says and returns at once, before its exec
    /// (the fork path): the caller learns from [`StartedChild::status`]
    /// whether it exec'd. For children whose owner could stop them before
    /// exec: [`spawn`] would block its thread until they go on.
    ///
    /// # Errors
    ///
    /// `Validate`, `Pipe` or `Clone`; later steps are reported on the
    /// status pipe.
    pub fn start(&self, plan: &SpawnPlan) -> Result<StartedChild, SpawnError> {
        start_with(plan, &self.signals)
    }

    /// Starts a parked init, for a spawner process: a child that makes the
    /// namespaces and the root of `plan`'s sandbox (which must have a new
    /// pid namespace), as `plan`'s credentials for its paths, then waits
    /// in them as their init (see [`ParkedInit`]). It is a sibling of this
    /// process (`CLONE_PARENT`), which its parent reaps, and shares this
    /// process's memory for life (see `clone::clone_parked`; a fork where
    /// `clone3` is not ours): returns once it no longer uses that memory
    /// but its own stack. Its status pipe reads as an exec's once it is
    /// ready ([`read_exec_report`]). Only for a single-threaded process
    /// (a spawner).
    ///
    /// # Errors
    ///
    /// As [`Spawner::start`]; `Validate` for a plan without a sandbox
    /// with a new pid namespace of its own (or in a user namespace).
    pub fn park_sibling(&self, plan: &SpawnPlan) -> Result<ParkedInit, SpawnError> {
        let parkable = plan.sandbox.as_ref().is_some_and(|sandbox| {
            sandbox.clone_flags & libc::CLONE_NEWPID != 0
                && sandbox.map_ids.is_none()
                && sandbox.enter.is_none()
        });
        if !parkable {
            return Err(SpawnError::new(SpawnStage::Validate, libc::EINVAL));
        }
        let (child, release) = fork_start(plan, &self.signals, Fork::ParkSibling)?;
        let release = release.ok_or(SpawnError::new(SpawnStage::Pipe, libc::EIO))?;
        Ok(ParkedInit {
            pid: child.pid,
            pidfd: child.pidfd,
            status: child.status,
            release,
        })
    }
}

/// A parked init ([`Spawner::park_sibling`]): a sandbox's namespaces and
/// root, made ahead, whose init waits for one program to enter them (a
/// [`SandboxPlan::enter`] naming its pidfd, started by a spawner
/// process). Closing `release` lets the init go on: from then on it
/// lives as long as the program that entered (pid 2 of its namespace),
/// or ends at once when none did.
#[derive(Debug)]
pub struct ParkedInit {
    /// Its pid in the daemon's pid namespace.
    pub pid: i32,
    /// A close-on-exec pidfd: the daemon's child, to reap when it ends.
    pub pidfd: OwnedFd,
    /// Its status pipe: end of file once it is ready, or the step that
    /// failed (see [`read_exec_report`]).
    pub status: OwnedFd,
    /// The write end of its release pipe.
    pub release: OwnedFd,
}

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawner")
            .field("resets", &format_args!("{:#x}", self.signals.known()))
            .finish()
    }
}

fn spawn_with(plan: &SpawnPlan, signals: &SignalReset) -> Result<SpawnedChild, SpawnError> {
    if plan
        .sandbox
        .as_ref()
        .is_some_and(|sandbox| sandbox.enter.is_some())
    {
        // Only a spawner process enters a parked init's namespaces.
        return Err(SpawnError::new(SpawnStage::Validate, libc::EINVAL));
    }
    let prepared = Prepared::new(plan)?;
    let failure = Failure::default();
    let mut args = prepared.child_args(signals, &failure);

    let cgroup = plan.cgroup.as_ref().map(AsFd::as_fd);
    // Below 5.7 (or where clone3 is filtered) the child joins by itself.
    let procs = match cgroup {
        Some(dir) if !clone::into_cgroup_works() => Some(
            clone::open_cgroup_procs(dir)
                .map_err(|errno| SpawnError::new(SpawnStage::Cgroup, errno))?,
        ),
        _ => None,
    };
    args.join_cgroup = procs.as_ref().map(AsRawFd::as_raw_fd);
    let gate = OWN.gate.read().unwrap_or_else(PoisonError::into_inner);
    let cloned = match (cgroup, &procs) {
        (Some(dir), None) => clone::clone_child_into(&args, dir),
        _ => clone::clone_child(&args).map_err(|errno| (SpawnStage::Clone, errno)),
    };
    let (pid, pidfd) = cloned.map_err(|(stage, errno)| SpawnError::new(stage, errno))?;
    OWN.pids
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pid);
    drop(gate);
    if let Some((stage, errno, sandbox)) = failure.get() {
        // The child has already _exit'ed: reap it now, so no zombie stays.
        if let Err(error) = clone::waitid(pidfd.as_fd(), true) {
            tracing::warn!(pid, %error, "failed to reap a child that failed to exec");
        }
        return Err(SpawnError {
            stage,
            errno,
            sandbox,
        });
    }
    Ok(SpawnedChild { pid, pidfd })
}

/// Starts a child as `plan` says without waiting for its exec, on the fork
/// path: see [`Spawner::start`].
///
/// # Errors
///
/// As [`Spawner::start`].
pub fn start(plan: &SpawnPlan) -> Result<StartedChild, SpawnError> {
    start_with(plan, &SignalReset::new())
}

/// Reads a [`StartedChild`]'s status pipe once.
///
/// # Errors
///
/// `WouldBlock` while the child has neither exec'd nor failed yet; any
/// other read error.
pub fn read_exec_report(status: BorrowedFd<'_>) -> io::Result<ExecReport> {
    let mut report = [0u8; 8];
    loop {
        match rustix::io::read(status, &mut report) {
            Ok(0) => return Ok(ExecReport::Execd),
            Ok(8) => {
                let (stage, errno, sandbox) =
                    child::decode_failure(report).unwrap_or((SpawnStage::Exec, libc::EIO, None));
                return Ok(ExecReport::Failed(SpawnError {
                    stage,
                    errno,
                    sandbox,
                }));
            }
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a partial report on the status pipe",
                ));
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// The fork path: the child gets a copy of our memory and runs as its
/// own process while the calling thread carries on, so nothing the child
/// does before exec (stopped by its new owner, stuck on a slow
/// filesystem) can hold this thread. The price is copying the page tables.
fn start_with(plan: &SpawnPlan, signals: &SignalReset) -> Result<StartedChild, SpawnError> {
    fork_start(plan, signals, Fork::Child).map(|(child, _)| child)
}

/// What [`fork_start`] starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fork {
    /// A child of this process that execs.
    Child,
    /// A parked init, child of this process's parent (`CLONE_PARENT`).
    ParkSibling,
}

/// A pipe for the child, its end placed at or above `floor` and kept
/// open in the child: (the parent's end, the child's end).
fn pipe_for_child(
    prepared: &mut Prepared<'_>,
    floor: RawFd,
    child_writes: bool,
) -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let failed = |errno: rustix::io::Errno| SpawnError::new(SpawnStage::Pipe, errno.raw_os_error());
    let (read, write) = rustix::pipe::pipe_with(
        rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
    )
    .map_err(failed)?;
    let (ours, theirs) = if child_writes {
        (read, write)
    } else {
        (write, read)
    };
    let theirs = rustix::io::fcntl_dupfd_cloexec(&theirs, floor).map_err(failed)?;
    prepared.keep_open(theirs.as_raw_fd());
    Ok((ours, theirs))
}

/// [`start_with`], or a parked init's start: then the release pipe's
/// write end comes back too.
fn fork_start(
    plan: &SpawnPlan,
    signals: &SignalReset,
    fork: Fork,
) -> Result<(StartedChild, Option<OwnedFd>), SpawnError> {
    let park = fork != Fork::Child;
    if plan
        .sandbox
        .as_ref()
        .is_some_and(|sandbox| sandbox.enter.is_some())
    {
        // Only a spawner process enters a parked init's namespaces.
        return Err(SpawnError::new(SpawnStage::Validate, libc::EINVAL));
    }
    let mut prepared = Prepared::new(plan)?;
    // Above every target, so that placing the child's fds cannot
    // overwrite it, and kept open by the child's closing of the rest.
    let floor = prepared.dup_floor;
    let (status, write) = pipe_for_child(&mut prepared, floor, true)?;
    // With a new pid namespace the child is its init, which reports the
    // program's exact exit here (see `sandbox::run_init`); a parked init
    // waits for its release instead (see `sandbox::park`).
    let new_pid_ns = plan
        .sandbox
        .as_ref()
        .is_some_and(|sandbox| sandbox.clone_flags & libc::CLONE_NEWPID != 0);
    let above_status = write.as_raw_fd() + 1;
    let init_report = if new_pid_ns && !park {
        Some(pipe_for_child(&mut prepared, above_status, true)?)
    } else {
        None
    };
    let release = if park {
        Some(pipe_for_child(&mut prepared, above_status, false)?)
    } else {
        None
    };
    let sandbox_fds = prepared
        .sandbox_fds(plan)
        .map_err(|errno| SpawnError::new(SpawnStage::Pipe, errno.raw_os_error()))?;
    let sandbox_raw: Vec<RawFd> = sandbox_fds.iter().map(AsRawFd::as_raw_fd).collect();
    let failure = Failure::default();
    // A parked init shares the spawner's memory (see `clone::clone_parked`).
    let parked_stack = match fork {
        Fork::ParkSibling => Some(clone::ParkedStack::new().map_err(|error| {
            SpawnError::new(
                SpawnStage::Clone,
                error.raw_os_error().unwrap_or(libc::ENOMEM),
            )
        })?),
        Fork::Child => None,
    };
    let life = parked_stack.as_ref().map(clone::ParkedStack::life);
    let mut args = prepared.child_args(signals, &failure);
    args.hand_off = life.as_deref();
    args.report = Some(write.as_raw_fd());
    args.init_report = init_report.as_ref().map(|(_, theirs)| theirs.as_raw_fd());
    if args.init_report.is_some() {
        args.start_program = Some(clone::vfork_program);
    }
    args.park = release.as_ref().map(|(_, theirs)| theirs.as_raw_fd());
    args.sandbox_fds = &sandbox_raw;
    // Forked children join their cgroup themselves, first thing, while
    // they still have the daemon's ids (clone3's placement is used on the
    // vfork path only).
    let procs = match plan.cgroup.as_ref() {
        Some(dir) => Some(
            clone::open_cgroup_procs(dir.as_fd())
                .map_err(|errno| SpawnError::new(SpawnStage::Cgroup, errno))?,
        ),
        None => None,
    };
    args.join_cgroup = procs.as_ref().map(AsRawFd::as_raw_fd);
    // Listed before the orphan reaper can see it, as in `spawn_with`.
    let gate = OWN.gate.read().unwrap_or_else(PoisonError::into_inner);
    let clone_flags = plan
        .sandbox
        .as_ref()
        .map_or(0, SandboxPlan::namespaces_to_make);
    let sibling = if fork == Fork::ParkSibling {
        libc::CLONE_PARENT
    } else {
        0
    };
    let (pid, pidfd) = match parked_stack {
        Some(parked) => match clone::clone_parked(&args, clone_flags | sibling, parked) {
            Err(libc::ENOSYS) => clone::fork_child(&args, clone_flags | sibling),
            cloned => cloned,
        },
        None => clone::fork_child(&args, clone_flags | sibling),
    }
    .map_err(|errno| SpawnError::new(SpawnStage::Clone, errno))?;
    if let Some((report, _)) = init_report {
        sandbox::expect_init_report(pid, report);
    }
    OWN.pids
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pid);
    drop(gate);
    // Only the child may hold the write end: its exec (or exit) is the EOF.
    drop(write);
    drop(procs);
    let child = StartedChild { pid, pidfd, status };
    Ok((child, release.map(|(ours, _)| ours)))
}

/// The nice value children get when their plan sets none, once
/// [`prepare_boost`] set the spawner up: its former value. `i32::MIN`:
/// none (children inherit the spawner's).
static DEFAULT_CHILD_NICE: AtomicI32 = AtomicI32::new(i32::MIN);

/// The spawner's nice value while busy ([`set_busy`]); `i32::MIN` until
/// [`prepare_boost`] succeeded.
static BOOST_NICE: AtomicI32 = AtomicI32::new(i32::MIN);

/// The spawner's nice value while idle.
static IDLE_NICE: AtomicI32 = AtomicI32::new(0);

/// Whether the spawner runs at [`BOOST_NICE`] (or leaves `SCHED_BATCH`)
/// now.
static BOOSTED: AtomicBool = AtomicBool::new(false);

/// Whether the spawner runs under `SCHED_BATCH` only while idle
/// ([`batch_only_while_idle`]).
static IDLE_BATCH: AtomicBool = AtomicBool::new(false);

/// Whether the spawner has `SCHED_RESET_ON_FORK`, kept when [`set_busy`]
/// changes its policy (unprivileged threads may not clear it).
static SPAWNER_RESET_ON_FORK: AtomicBool = AtomicBool::new(false);

/// Prepares the calling thread, a single-threaded zygote's spawner, to
/// get priority over the children it starts while many run
/// ([`set_busy`]), so that at high concurrency it is not queued behind
/// them: sets `SCHED_RESET_ON_FORK` (keeping the thread's `SCHED_BATCH`
/// or `SCHED_OTHER`), so that its children start at nice 0 whatever its
/// own, and children whose plan sets no nice value get the
/// thread's present one. Checks it may raise itself to `nice`.
///
/// Only while busy: a raised spawner also preempts its own client on
/// every request (measured at concurrency 1: the client's thread blocked
/// 80 µs instead of 22 per spawn).
///
/// # Returns
///
/// The present nice value, or `None` when it is already at or below
/// `nice` (then nothing changes).
///
/// # Errors
///
/// `EPERM` without `CAP_SYS_NICE` (or a high enough `RLIMIT_NICE`); the
/// thread is left as it was then.
pub fn prepare_boost(nice: i32) -> io::Result<Option<i32>> {
    let former = rustix::process::getpriority_process(None)?;
    if former <= nice {
        return Ok(None);
    }
    // Whether raising works at all (lowering back always does), before
    // the flag, which an unprivileged thread could not clear again.
    rustix::process::setpriority_process(None, nice)?;
    rustix::process::setpriority_process(None, former)?;
    sched::set_reset_on_fork()?;
    if former != 0 {
        DEFAULT_CHILD_NICE.store(former, Ordering::Relaxed);
    }
    IDLE_NICE.store(former, Ordering::Relaxed);
    BOOST_NICE.store(nice, Ordering::Relaxed);
    Ok(Some(former))
}

/// Makes a single-threaded zygote's spawner, under `SCHED_BATCH` (see
/// [`run_daemon_as_batch`]), leave it while busy ([`set_busy`]): at high
/// concurrency a `SCHED_BATCH` spawner, which may not preempt the running
/// children when woken, lost a third of its throughput (0.6 of
/// posix_spawn's instead of 0.9 at 50 in flight). Call it after
/// [`prepare_boost`], on the spawning thread.
///
/// # Returns
///
/// Whether the thread is under `SCHED_BATCH` (else nothing changes).
///
/// # Errors
///
/// When its policy or nice value cannot be read.
pub fn batch_only_while_idle() -> io::Result<bool> {
    let policy = sched::thread_policy()?;
    if policy & !libc::SCHED_RESET_ON_FORK != libc::SCHED_BATCH {
        return Ok(false);
    }
    if BOOST_NICE.load(Ordering::Relaxed) == i32::MIN {
        IDLE_NICE.store(
            rustix::process::getpriority_process(None)?,
            Ordering::Relaxed,
        );
    }
    SPAWNER_RESET_ON_FORK.store(policy & libc::SCHED_RESET_ON_FORK != 0, Ordering::Relaxed);
    IDLE_BATCH.store(true, Ordering::Relaxed);
    Ok(true)
}

/// Raises the spawner prepared by [`prepare_boost`] while `busy`, lowers
/// it back when not, and with [`batch_only_while_idle`] moves it to
/// `SCHED_OTHER` while busy and back to `SCHED_BATCH` when not; one
/// syscall on a change, nothing otherwise or without either. Call it on
/// the spawning thread.
pub fn set_busy(busy: bool) {
    let boost = BOOST_NICE.load(Ordering::Relaxed);
    let switch_policy = IDLE_BATCH.load(Ordering::Relaxed);
    if (boost == i32::MIN && !switch_policy) || BOOSTED.swap(busy, Ordering::Relaxed) == busy {
        return;
    }
    let nice = if busy && boost != i32::MIN {
        boost
    } else {
        IDLE_NICE.load(Ordering::Relaxed)
    };
    let changed = if switch_policy {
        let reset_on_fork = SPAWNER_RESET_ON_FORK.load(Ordering::Relaxed);
        sched::set_thread_scheduling(!busy, nice, reset_on_fork)
    } else {
        rustix::process::setpriority_process(None, nice).map_err(io::Error::from)
    };
    if let Err(error) = changed {
        tracing::debug!(nice, busy, %error, "failed to change the spawner's priority");
    }
}

/// Forgets [`prepare_boost`], so that other tests' children keep their
/// own nice values.
#[cfg(test)]
fn forget_boost() {
    BOOST_NICE.store(i32::MIN, Ordering::Relaxed);
    IDLE_NICE.store(0, Ordering::Relaxed);
    DEFAULT_CHILD_NICE.store(i32::MIN, Ordering::Relaxed);
    BOOSTED.store(false, Ordering::Relaxed);
    IDLE_BATCH.store(false, Ordering::Relaxed);
}

fn default_child_nice() -> Option<i32> {
    let nice = DEFAULT_CHILD_NICE.load(Ordering::Relaxed);
    (nice != i32::MIN).then_some(nice)
}

/// Non-blocking reap via `waitid(P_PIDFD, pidfd, WEXITED | WNOHANG)`, with
/// the child's rusage (raw syscall: glibc's wrapper has no rusage).
///
/// # Returns
///
/// `Ok(None)` while the child is still running.
///
/// # Errors
///
/// `ECHILD` if it is not our child or was already reaped.
pub fn try_reap(pidfd: BorrowedFd<'_>) -> io::Result<Option<(ExitStatus, ResourceUsage)>> {
    clone::waitid(pidfd, false)
}

/// Whether the process behind `pidfd` has exited (its pidfd reads
/// ready), without waiting.
pub fn has_exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut polled = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut polled, Some(&rustix::event::Timespec::default()))
        .is_ok_and(|ready| ready > 0)
}

/// Sends `signal` to the child with `pidfd_send_signal(2)`.
///
/// # Errors
///
/// `ESRCH` if it has exited, `EINVAL` for a bad signal number.
pub fn send_signal(pidfd: BorrowedFd<'_>, signal: i32) -> io::Result<()> {
    clone::pidfd_send_signal(pidfd, signal)
}

/// Marks every fd from 3 up close-on-exec, so that nothing the daemon's
/// parent left open can reach a child, even by a bug of ours.
///
/// # Errors
///
/// `EINVAL` before Linux 5.11, which lacks `CLOSE_RANGE_CLOEXEC`; children
/// are still safe then, because each child closes every fd it was not
/// given before exec.
pub fn mark_inherited_fds_cloexec() -> io::Result<()> {
    clone::cloexec_from(3)
}

/// Sends `signal` to the process group of the child behind `pidfd`
/// (`PIDFD_SIGNAL_PROCESS_GROUP`, Linux 6.9; on older kernels
/// `kill(-pgid)`, which races with the group's end: the caller checks the
/// child is alive, and a live member keeps the pgid from reuse), with the
/// permissions of `uid`: a root caller sends it from a short-lived thread
/// that first sets its own uids (and only its own: the raw syscall, not
/// glibc's process-wide wrapper) to `uid`, which drops its capabilities,
/// so that the kernel skips every member `uid` could not signal itself.
///
/// # Errors
///
/// `ESRCH` if the group is gone, `EINVAL` for a bad signal number,
/// `EPERM` when no member could be signalled.
pub fn send_group_signal_as(
    pidfd: BorrowedFd<'_>,
    pgid: i32,
    signal: i32,
    uid: u32,
) -> io::Result<()> {
    clone::pidfd_send_group_signal_as(pidfd, pgid, signal, uid)
}

/// The pidfd of a Unix socket's peer, from `SO_PEERPIDFD` (Linux 6.5).
///
/// # Returns
///
/// `Ok(None)` when the kernel does not know the option.
///
/// # Errors
///
/// Any other `getsockopt` failure.
pub fn peer_pidfd(socket: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    clone::peer_pidfd(socket)
}

/// The bytes a Unix socket sent that its peer has not read yet
/// (`SIOCOUTQ`); zero once the peer has read everything, or left.
///
/// # Errors
///
/// The `ioctl` error.
pub fn unread_bytes(socket: BorrowedFd<'_>) -> io::Result<usize> {
    clone::unread_bytes(socket)
}

/// `pidfd_open(2)` of any process (Linux 5.3): the fallback for kernels
/// without `SO_PEERPIDFD`.
///
/// # Errors
///
/// `ESRCH` if no such process exists.
pub fn open_pidfd(pid: i32) -> io::Result<OwnedFd> {
    clone::pidfd_open(pid)
}

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
/// that its children's orphans come to it, not to init.
///
/// # Errors
///
/// The `prctl` error.
pub fn become_subreaper() -> io::Result<()> {
    clone::become_subreaper()
}

/// Children that [`spawn`] started and that their pidfd's owner reaps: the
/// orphan reaper must never take one. Spawns hold `gate` for reading from
/// clone until their pid is listed; the orphan reaper holds it for writing,
/// so it never sees a child of ours that is not listed yet.
///
/// `expected` counts, per uid, the spawns a spawner process is making for
/// us ([`expect_sibling`]): such a child is ours from its clone, but
/// listed only once its pidfd reached us, so an exited child of that uid
/// is left alone meanwhile.
struct OwnChildren {
    gate: RwLock<()>,
    pids: Mutex<HashSet<i32>>,
    expected: Mutex<HashMap<u32, usize>>,
}

static OWN: LazyLock<OwnChildren> = LazyLock::new(|| OwnChildren {
    gate: RwLock::new(()),
    pids: Mutex::new(HashSet::new()),
    expected: Mutex::new(HashMap::new()),
});

/// Whether a spawner process may be starting a child of `uid` for us.
fn sibling_expected(uid: u32) -> bool {
    OWN.expected
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains_key(&uid)
}

/// Lists a child an earlier image of this daemon started (a live
/// upgrade): the orphan reaper must leave it to its pidfd's owner.
pub fn adopt_own(pid: i32) {
    OWN.pids
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pid);
}

/// Takes `pid` as a child of this process that another process started
/// for it (a warm template's clone with `CLONE_PARENT`), trusting nothing
/// that process said: the pid must be this process's own child, unreaped,
/// whose every uid (real, effective, saved, filesystem) is `uid`, and not
/// a child already listed as ours. Lists
/// it, and returns a pidfd this process opened itself.
///
/// # Errors
///
/// `ESRCH` when there is no such process; `ECHILD` when it is not this
/// process's child; `EPERM` when one of its uids is another; `EEXIST` when it
/// is already listed (another spawn's child).
pub fn claim_sibling(pid: i32, uid: u32) -> io::Result<OwnedFd> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    let pidfd = clone::pidfd_open(pid)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|value| value.parse::<u64>().ok())
    };
    // Still alive (or a zombie, unreaped) after the read: the pid named
    // the process behind the pidfd throughout.
    clone::pidfd_send_signal(pidfd.as_fd(), 0)?;
    if field("PPid:")
        != Some(u64::from(
            rustix::process::getpid()
                .as_raw_nonzero()
                .get()
                .unsigned_abs(),
        ))
    {
        return Err(io::Error::from_raw_os_error(libc::ECHILD));
    }
    // Real, effective, saved and filesystem uids alike: not a process
    // that gained another uid through a set-user-ID exec.
    let uids: Vec<&str> = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .map(|rest| rest.split_whitespace().collect())
        .unwrap_or_default();
    let uid = uid.to_string();
    if uids.len() != 4 || uids.iter().any(|each| *each != uid) {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    let _gate = OWN.gate.read().unwrap_or_else(PoisonError::into_inner);
    if !OWN
        .pids
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pid)
    {
        return Err(io::Error::from_raw_os_error(libc::EEXIST));
    }
    Ok(pidfd)
}

/// Moves the process `pid` into the cgroup whose directory is `dir`, by
/// its `cgroup.procs`.
///
/// # Errors
///
/// The `open` or `write` error.
pub fn join_cgroup(dir: BorrowedFd<'_>, pid: i32) -> io::Result<()> {
    let procs = clone::open_cgroup_procs(dir).map_err(io::Error::from_raw_os_error)?;
    let written = rustix::io::write(&procs, pid.to_string().as_bytes())?;
    if written == 0 {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    Ok(())
}

fn forget_own(pid: i32) {
    OWN.pids
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&pid);
}

/// What [`reap_orphans`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrphanReaping {
    /// Orphans reaped.
    pub reaped: usize,
    /// From [`reap_orphans`]: an exited child of ours was first in line,
    /// so orphans behind it were not looked at. From
    /// [`reap_orphans_by_scan`]: an exited child of a uid a spawner is
    /// starting a child of was left. From either: a spawn held the gate
    /// (one in its vfork), so nothing was looked at. Each way: scan
    /// a little later.
    pub blocked_by_own: bool,
}

/// The spawns' gate for writing, if no spawn holds it: `None` while one
/// does. Never waits: a spawn on the vfork path holds it until its child
/// has exec'd, which the child's owner can delay (a stop, an exec on a
/// hung filesystem); a writer waiting meanwhile would hold back every
/// later spawn, the lock preferring writers, and its runtime worker too.
/// The caller looks again later instead.
fn try_close_gate() -> Option<std::sync::RwLockWriteGuard<'static, ()>> {
    match OWN.gate.try_write() {
        Ok(gate) => Some(gate),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Reaps the exited orphans this subreaper adopted, never a child that
/// [`spawn`] started (those are reaped by pidfd), as long as the first
/// exited child is an orphan. Runs on every `SIGCHLD`, so it asks the
/// kernel for one exited child and reads nothing in `/proc`, and takes the
/// spawns' gate only when that child is not listed as ours.
pub fn reap_orphans() -> OrphanReaping {
    let mut reaped = 0;
    while let Some((pid, uid)) = clone::peek_exited_child() {
        let ours = |pid| {
            OWN.pids
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&pid)
        };
        // Cloned but not listed yet? Under the gate every child is listed,
        // but a spawner's: its uid is expected until it is listed (in this
        // order, so that one of the two always covers it).
        if ours(pid) || {
            let Some(_gate) = try_close_gate() else {
                return OrphanReaping {
                    reaped,
                    blocked_by_own: true,
                };
            };
            sibling_expected(uid) || ours(pid)
        } {
            return OrphanReaping {
                reaped,
                blocked_by_own: true,
            };
        }
        if !clone::reap_if_exited(pid) {
            break;
        }
        reaped += 1;
    }
    OrphanReaping {
        reaped,
        blocked_by_own: false,
    }
}

/// Reaps every exited orphan, whatever the order of exits: lists our
/// children from `/proc/self/task/*/children` (needs
/// `CONFIG_PROC_CHILDREN`, which common kernels have). `blocked_by_own`:
/// an exited child of a uid a spawner is starting a child of was left,
/// ours or an orphan, which only a later scan can tell: scan again.
pub fn reap_orphans_by_scan() -> OrphanReaping {
    let Some(_gate) = try_close_gate() else {
        return OrphanReaping {
            reaped: 0,
            blocked_by_own: true,
        };
    };
    let children = children_of_self();
    let own = OWN.pids.lock().unwrap_or_else(PoisonError::into_inner);
    let mut scan = OrphanReaping {
        reaped: 0,
        blocked_by_own: false,
    };
    for pid in children.into_iter().filter(|pid| !own.contains(pid)) {
        let Some(uid) = clone::exited_uid(pid) else {
            continue;
        };
        if sibling_expected(uid) {
            scan.blocked_by_own = true;
        } else if clone::reap_if_exited(pid) {
            scan.reaped += 1;
        }
    }
    scan
}

/// The pids of this process's children, from
/// `/proc/self/task/*/children`; empty when procfs cannot tell.
fn children_of_self() -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            children.extend(
                list.split_whitespace()
                    .filter_map(|pid| pid.parse::<i32>().ok()),
            );
        }
    }
    children
}

/// Checks at daemon start that the kernel has what [`spawn`] needs: clone
/// with `CLONE_PIDFD` (5.2, else `pidfd_open`, 5.3), `waitid(P_PIDFD)`
/// (5.4) and `close_range` (5.9).
///
/// # Errors
///
/// A message naming the missing feature and the minimum kernel.
pub fn check_kernel_support() -> Result<(), String> {
    clone::check_kernel_support()
}

/// The plan as raw data for the child. The pointers are into the plan's
/// strings, which the borrow keeps alive.
struct Prepared<'a> {
    plan: &'a SpawnPlan,
    /// The exec candidates, then `argv` and `envp`, each of those two
    /// NULL-terminated: one allocation for the three.
    pointers: Vec<*const c_char>,
    /// Where `argv` starts in `pointers`.
    argv_at: usize,
    /// Where `envp` starts in `pointers`.
    envp_at: usize,
    fds: Vec<(RawFd, RawFd)>,
    temps: Vec<Cell<RawFd>>,
    dup_floor: RawFd,
    close_ranges: Vec<(c_uint, c_uint)>,
    rlimits: Vec<(c_int, Rlimit64)>,
    groups: Vec<libc::gid_t>,
    /// `oom_score_adj` as the decimal text the proc file takes.
    oom_score_adj: Option<Vec<u8>>,
}

impl<'a> Prepared<'a> {
    fn new(plan: &'a SpawnPlan) -> Result<Self, SpawnError> {
        if plan.exec_candidates.is_empty() {
            return Err(SpawnError::new(SpawnStage::Exec, libc::ENOENT));
        }
        let invalid = SpawnError::new(SpawnStage::Validate, libc::EINVAL);

        let fds: Vec<(RawFd, RawFd)> = plan
            .fds
            .iter()
            .map(|(source, target)| (source.as_raw_fd(), *target))
            .collect();
        let mut targets = fds
            .iter()
            .map(|&(_, target)| c_uint::try_from(target))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| invalid)?;
        targets.sort_unstable();
        if targets.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(invalid);
        }
        // Close the gaps between targets and everything above the highest.
        let mut close_ranges = Vec::with_capacity(targets.len() + 1);
        let mut next = 0;
        for &target in &targets {
            if target > next {
                close_ranges.push((next, target - 1));
            }
            next = target + 1;
        }
        close_ranges.push((next, c_uint::MAX));
        let dup_floor = RawFd::try_from(next).map_err(|_| invalid)?;

        if let Some(credentials) = &plan.credentials {
            // -1 means "unchanged" to the set*id syscalls: never let it
            // through, or the child would keep the daemon's ids.
            let ids = [credentials.uid, credentials.gid];
            if ids
                .iter()
                .chain(&credentials.groups)
                .any(|id| *id == u32::MAX)
            {
                return Err(invalid);
            }
        }
        let rlimits = plan
            .rlimits
            .iter()
            .map(|limit| {
                let resource = c_int::try_from(limit.resource).map_err(|_| invalid)?;
                let limit = Rlimit64 {
                    cur: limit.soft,
                    max: limit.hard,
                };
                Ok((resource, limit))
            })
            .collect::<Result<_, SpawnError>>()?;

        let mut pointers =
            Vec::with_capacity(plan.exec_candidates.len() + plan.argv.len() + plan.envp.len() + 2);
        pointers.extend(plan.exec_candidates.iter().map(|c| c.as_ptr()));
        let argv_at = pointers.len();
        pointers.extend(plan.argv.iter().map(|arg| arg.as_ptr()));
        pointers.push(ptr::null());
        let envp_at = pointers.len();
        pointers.extend(
            plan.envp
                .entries()
                .map(|entry| entry.as_ptr().cast::<c_char>()),
        );
        pointers.push(ptr::null());
        Ok(Self {
            plan,
            pointers,
            argv_at,
            envp_at,
            temps: fds.iter().map(|_| Cell::new(-1)).collect(),
            fds,
            dup_floor,
            close_ranges,
            rlimits,
            groups: plan
                .credentials
                .as_ref()
                .map(|credentials| credentials.groups.clone())
                .unwrap_or_default(),
            oom_score_adj: plan.oom_score_adj.map(|adj| adj.to_string().into_bytes()),
        })
    }

    /// Copies of the plan's sandbox fds above every target, kept open in
    /// the child (see `sandbox::copy_fds`).
    fn sandbox_fds(&mut self, plan: &SpawnPlan) -> rustix::io::Result<Vec<OwnedFd>> {
        let fds = match &plan.sandbox {
            Some(sandbox) => sandbox::copy_fds(sandbox, self.dup_floor)?,
            None => Vec::new(),
        };
        for fd in &fds {
            self.keep_open(fd.as_raw_fd());
        }
        Ok(fds)
    }

    /// Leaves fd `keep`, at or above `dup_floor`, open in the child.
    fn keep_open(&mut self, keep: RawFd) {
        let Ok(keep) = c_uint::try_from(keep) else {
            return;
        };
        let mut ranges = Vec::with_capacity(self.close_ranges.len() + 1);
        for &(first, last) in &self.close_ranges {
            if keep < first || keep > last {
                ranges.push((first, last));
                continue;
            }
            if keep > first {
                ranges.push((first, keep - 1));
            }
            if keep < last {
                ranges.push((keep + 1, last));
            }
        }
        self.close_ranges = ranges;
    }

    fn child_args<'b>(&'b self, signals: &'b SignalReset, failure: &'b Failure) -> ChildArgs<'b> {
        let plan = self.plan;
        ChildArgs {
            candidates: &self.pointers[..self.argv_at],
            argv: &self.pointers[self.argv_at..self.envp_at],
            envp: &self.pointers[self.envp_at..],
            cwd: plan.cwd.as_deref(),
            fds: &self.fds,
            temps: &self.temps,
            dup_floor: self.dup_floor,
            close_ranges: &self.close_ranges,
            new_session: plan.new_session,
            controlling_terminal: plan.controlling_terminal,
            process_group: plan.process_group,
            umask: plan.umask,
            rlimits: &self.rlimits,
            credentials: plan
                .credentials
                .as_ref()
                .map(|credentials| (credentials.uid, credentials.gid, self.groups.as_slice())),
            join_cgroup: None,
            signals,
            ignored_signals: plan.ignored_signals,
            reset_policy: sched::children_reset_policy(),
            nice: plan.nice.or_else(default_child_nice),
            cpu_affinity: &plan.cpu_affinity,
            oom_score_adj: self.oom_score_adj.as_deref(),
            failure,
            report: None,
            sandbox: plan.sandbox.as_ref(),
            init_report: None,
            start_program: None,
            sandbox_fds: &[],
            parent_namespaces: plan
                .sandbox
                .as_ref()
                .map(sandbox::ParentNamespaces::of_this_thread)
                .unwrap_or_default(),
            park: None,
            hand_off: None,
        }
    }
}

#[cfg(test)]
mod alone_tests;
#[cfg(test)]
pub(crate) mod tests;
