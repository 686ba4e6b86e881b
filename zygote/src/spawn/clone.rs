//! The parent's side of child creation: the child's stack, the `clone(2)`
//! call, and the raw pidfd syscalls (`waitid`, `pidfd_send_signal`,
//! `pidfd_open`) that libc or rustix do not wrap the way we need.

use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use zygote_proto::{ExitStatus, ResourceUsage, SpawnStage};

use super::child::{self, ChildArgs};

/// Usable stack for the child, above one guard page. The child only makes
/// syscalls through thin libc wrappers; glibc's `posix_spawn` uses ~32 KiB.
const STACK_BYTES: usize = 256 * 1024;

/// Whether `clone` fills in a pidfd (`CLONE_PIDFD`, Linux 5.2). Cleared
/// once if the kernel or a seccomp filter refuses it; we then fall back to
/// `pidfd_open` (Linux 5.3).
static CLONE_PIDFD_WORKS: AtomicBool = AtomicBool::new(true);

thread_local! {
    /// One stack per thread, reused: `spawn` blocks its thread until the
    /// child has exec'd, so a thread never needs two at once; a forked
    /// child runs on its own copy.
    static STACK: Cell<Option<Stack>> = const { Cell::new(None) };
}

/// An mmap'd stack with a `PROT_NONE` guard page at its low end.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    fn new() -> io::Result<Self> {
        let guard = rustix::param::page_size();
        let len = STACK_BYTES + guard;
        // SAFETY: a fresh anonymous private mapping; it touches no existing
        // memory.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the lowest page of the mapping we just made and own.
        if unsafe { libc::mprotect(base, guard, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The initial stack pointer: stacks grow down on every Linux target
    /// Rust supports. Page-aligned, so 16-byte aligned as the ABI wants.
    fn top(&self) -> *mut c_void {
        self.base.cast::<u8>().wrapping_add(self.len).cast()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly our own mapping; no child still runs on it
        // (a vfork'd child has exec'd or exited when clone returns; a
        // forked one runs on its own copy).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Where a fresh stack was mapped, once it is dropped.
#[cfg(test)]
pub(super) fn stack_mapping_after_drop() -> (*mut c_void, usize) {
    let stack = Stack::new().unwrap();
    let mapping = (stack.base, stack.len);
    drop(stack);
    mapping
}

/// Blocks every signal in the calling thread until dropped.
///
/// The child starts with this mask, so none of the daemon's handlers can
/// run in it on shared memory before it has reset them.
struct BlockedSignals {
    old: libc::sigset_t,
}

impl BlockedSignals {
    fn block_all() -> io::Result<Self> {
        // SAFETY: sigset_t is a plain C struct; all-zero bytes are valid.
        let (mut all, mut old) = unsafe {
            (
                std::mem::zeroed::<libc::sigset_t>(),
                std::mem::zeroed::<libc::sigset_t>(),
            )
        };
        // SAFETY: `all` is a valid, writable sigset_t.
        unsafe { libc::sigfillset(&raw mut all) };
        // SAFETY: both sets are valid; this changes only this thread's mask.
        let ret = unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &raw const all, &raw mut old) };
        if ret != 0 {
            return Err(io::Error::from_raw_os_error(ret));
        }
        Ok(Self { old })
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `block_all` on this thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &raw const self.old, ptr::null_mut()) };
    }
}

/// Starts a child running [`child::child_main`] on `args`, and returns once
/// it has exec'd or exited: its pid and a close-on-exec pidfd.
///
/// # Errors
///
/// The errno of the stack allocation, `clone` or `pidfd_open`; no child is
/// left behind then.
pub(super) fn clone_child(args: &ChildArgs<'_>) -> Result<(libc::pid_t, OwnedFd), c_int> {
    let arg = ptr::from_ref(args).cast_mut().cast::<c_void>();
    // SAFETY: `child_main` reads a `ChildArgs` through `arg`, which the
    // borrow keeps alive for the whole (vfork-blocking) call; it runs only
    // async-signal-safe code and never returns.
    unsafe { clone_vfork(child::child_main, arg) }
}

/// As [`clone_child`], but the child starts in the cgroup `dir` (an open
/// cgroup v2 directory), with `clone3(CLONE_INTO_CGROUP)`, Linux 5.7.
///
/// # Errors
///
/// `(Cgroup, errno)` when the kernel refuses that cgroup, `(Clone, errno)`
/// for other failures. Where clone3 cannot place children (before 5.7,
/// a seccomp filter, an architecture without our clone3 entry) it fails
/// with `(Cgroup, ENOSYS)` once and [`into_cgroup_works`] turns false, so
/// that callers use the join-before-exec path from then on.
pub(super) fn clone_child_into(
    args: &ChildArgs<'_>,
    dir: BorrowedFd<'_>,
) -> Result<(libc::pid_t, OwnedFd), (SpawnStage, c_int)> {
    let arg = ptr::from_ref(args).cast_mut().cast::<c_void>();
    let stack = match STACK.take() {
        Some(stack) => stack,
        None => Stack::new().map_err(|error| (SpawnStage::Clone, errno_of(&error)))?,
    };
    let result = BlockedSignals::block_all()
        .map_err(|error| (SpawnStage::Clone, errno_of(&error)))
        .and_then(|_blocked| {
            // SAFETY: `child_main` reads the `ChildArgs` behind `arg`, which
            // the borrow keeps alive for the whole (vfork-blocking) call; it
            // is async-signal-safe and never returns. The stack is ours.
            unsafe { clone3_on(&stack, child::child_main, arg, 0, Some(dir.as_raw_fd())) }
        });
    STACK.set(Some(stack));
    result
}

/// As [`clone_child`], but the child is a sibling of the caller
/// (`clone3(CLONE_PARENT)`): the caller's parent is its parent, which
/// reaps it and gets its exit signal, the caller's own one (`SIGCHLD` for
/// a process started with it, or exec'd). Started in the cgroup `dir`
/// when given, as [`clone_child_into`].
///
/// # Errors
///
/// As [`clone_child_into`] with `dir`; `(Clone, errno)` otherwise
/// (`ENOSYS` where clone3 is missing or filtered).
///
/// `namespaces`: `CLONE_NEW*` flags for a sandboxed child (0 for none),
/// never a new pid or user namespace (see `SandboxPlan::suits_vfork`).
pub(super) fn clone_sibling(
    args: &ChildArgs<'_>,
    dir: Option<BorrowedFd<'_>>,
    namespaces: c_int,
) -> Result<(libc::pid_t, OwnedFd), (SpawnStage, c_int)> {
    let arg = ptr::from_ref(args).cast_mut().cast::<c_void>();
    let stack = match STACK.take() {
        Some(stack) => stack,
        None => Stack::new().map_err(|error| (SpawnStage::Clone, errno_of(&error)))?,
    };
    let cgroup = dir.map(|dir| dir.as_raw_fd());
    let result = BlockedSignals::block_all()
        .map_err(|error| (SpawnStage::Clone, errno_of(&error)))
        .and_then(|_blocked| {
            // SAFETY: as in `clone_child_into`: `child_main` reads the
            // `ChildArgs` behind `arg`, kept alive by the borrow for the
            // whole (vfork-blocking) call; the stack is ours.
            unsafe {
                clone3_on(
                    &stack,
                    child::child_main,
                    arg,
                    libc::CLONE_PARENT | namespaces,
                    cgroup,
                )
            }
        });
    STACK.set(Some(stack));
    result
}

/// A parked init's life, as its word says (see [`ParkedStack`]): making
/// its namespaces and root on this process's memory.
const PARKED_SETTING_UP: u32 = 1;

/// Its life word once it has handed off ([`hand_off`]): from then on it
/// touches only its own stack. The kernel writes 0 there when it exits
/// (`CLONE_CHILD_CLEARTID`).
const PARKED_HANDED_OFF: u32 = 2;

/// The stack a parked init runs on for its whole life, and its life word.
pub(super) struct ParkedStack {
    stack: Stack,
    life: Arc<AtomicU32>,
}

// SAFETY: the mapping is owned by this value alone (no Rust reference
// into it exists); moving it to another thread moves that ownership.
unsafe impl Send for ParkedStack {}

impl ParkedStack {
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            stack: Stack::new()?,
            life: Arc::new(AtomicU32::new(PARKED_SETTING_UP)),
        })
    }

    /// The word its init hands off on ([`hand_off`]).
    pub(super) fn life(&self) -> Arc<AtomicU32> {
        Arc::clone(&self.life)
    }
}

/// The stacks of this process's parked inits that may still run, each
/// unmapped once its init has exited.
static PARKED_STACKS: Mutex<Vec<ParkedStack>> = Mutex::new(Vec::new());

/// Starts a parked init, or a mount template's holder (`child_main` with
/// `args`, whose `hand_off` is `parked`'s life word), as this process's
/// sibling: `clone3(CLONE_VM | CLONE_PARENT | CLONE_PIDFD |
/// CLONE_CHILD_CLEARTID | namespaces)` on `parked`'s stack, which it keeps.
/// It shares this process's memory instead of copying it: no page tables
/// to copy at the clone, none to tear down at its end, and no page faults
/// on either side after (most of a parked init's cost otherwise). Returns
/// once it has handed off, or exited (a failed setup, reported on its
/// status pipe): until then it uses this process's memory (`args` among
/// it) as a vfork'd child does, so this thread waits, signals blocked.
/// Only for a single-threaded process (a spawner's).
///
/// # Errors
///
/// The errno of `clone3` (`ENOSYS` where it is not ours: fork instead).
pub(super) fn clone_parked(
    args: &ChildArgs<'_>,
    namespaces: c_int,
    parked: ParkedStack,
) -> Result<(libc::pid_t, OwnedFd), c_int> {
    let mut stacks = PARKED_STACKS.lock().unwrap_or_else(PoisonError::into_inner);
    stacks.retain(|stack| stack.life.load(Ordering::Acquire) != 0);
    parked.life.store(PARKED_SETTING_UP, Ordering::Release);
    let arg = ptr::from_ref(args).cast_mut().cast::<c_void>();
    let blocked = BlockedSignals::block_all().map_err(|error| errno_of(&error))?;
    let mut pidfd: c_int = -1;
    let flags = libc::CLONE_VM
        | libc::CLONE_PARENT
        | libc::CLONE_PIDFD
        | libc::CLONE_CHILD_CLEARTID
        | namespaces;
    let clone_args = CloneArgs {
        flags: u64::try_from(flags).unwrap_or(0),
        pidfd: (&raw mut pidfd) as u64,
        child_tid: parked.life.as_ptr() as u64,
        stack: parked.stack.base as u64,
        stack_size: parked.stack.len as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `child_main` reads the `ChildArgs` behind `arg`, which the
    // borrow keeps alive while this thread waits below until the child
    // no longer uses our memory; the stack is `parked`'s, unused, and kept
    // (listed below) for as long as the child may run on it; the life
    // word is shared, so it stays put while listed.
    let ret = unsafe { raw_clone3(&clone_args, child::child_main, arg) };
    if ret <= 0 {
        return Err(c_int::try_from(-ret).unwrap_or(libc::EIO));
    }
    while parked.life.load(Ordering::Acquire) == PARKED_SETTING_UP {
        // A shared (not private) futex: the kernel's wake at the child's
        // exit is one.
        let _ = rustix::thread::futex::wait(
            &parked.life,
            rustix::thread::futex::Flags::empty(),
            PARKED_SETTING_UP,
            None,
        );
    }
    drop(blocked);
    let pid = libc::pid_t::try_from(ret).unwrap_or(0);
    if parked.life.load(Ordering::Acquire) != 0 {
        stacks.push(parked);
    }
    // SAFETY: the kernel just gave us this fd; nobody else owns it.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }))
}

/// In a parked init made by [`clone_parked`]: says it no longer uses its
/// maker's memory, which may then go on. Async-signal-safe; no errno.
pub(super) fn hand_off(life: &AtomicU32) {
    life.store(PARKED_HANDED_OFF, Ordering::Release);
    let _ = rustix::thread::futex::wake(life, rustix::thread::futex::Flags::empty(), 1);
}

/// Whether `clone3(CLONE_INTO_CGROUP)` may work: false once it did not.
pub(super) fn into_cgroup_works() -> bool {
    cfg!(target_arch = "x86_64") && INTO_CGROUP_WORKS.load(Ordering::Relaxed)
}

/// Opens `cgroup.procs` of the cgroup directory `dir` for writing, for a
/// child that joins before exec.
pub(super) fn open_cgroup_procs(dir: BorrowedFd<'_>) -> Result<OwnedFd, c_int> {
    rustix::fs::openat(
        dir,
        "cgroup.procs",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|errno| errno.raw_os_error())
}

/// Cleared the first time clone3 cannot place a child in a cgroup.
static INTO_CGROUP_WORKS: AtomicBool = AtomicBool::new(true);

/// `CLONE_INTO_CGROUP` from `<linux/sched.h>` (Linux 5.7).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The kernel's `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `clone3(CLONE_VM | CLONE_VFORK | CLONE_PIDFD | extra [|
/// CLONE_INTO_CGROUP])`, into `cgroup` when given. With `CLONE_PARENT` in
/// `extra` the exit signal must be 0: the child gets the caller's own.
///
/// # Safety
///
/// As [`clone_vfork`], with all signals blocked in this thread.
unsafe fn clone3_on(
    stack: &Stack,
    entry: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    extra: c_int,
    cgroup: Option<c_int>,
) -> Result<(libc::pid_t, OwnedFd), (SpawnStage, c_int)> {
    let mut pidfd: c_int = -1;
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | extra;
    let into = if cgroup.is_some() {
        CLONE_INTO_CGROUP
    } else {
        0
    };
    let args = CloneArgs {
        flags: u64::try_from(flags).unwrap_or(0) | into,
        pidfd: (&raw mut pidfd) as u64,
        exit_signal: if extra & libc::CLONE_PARENT == 0 {
            CHILD_EXIT_SIGNAL
        } else {
            0
        },
        stack: stack.base as u64,
        stack_size: stack.len as u64,
        cgroup: cgroup.map_or(0, |fd| u64::try_from(fd).unwrap_or(u64::MAX)),
        ..CloneArgs::default()
    };
    // SAFETY: forwarded from our caller; `args` and `pidfd` outlive the call.
    let ret = unsafe { raw_clone3(&args, entry, arg) };
    if ret > 0 && pidfd >= 0 {
        let pid = libc::pid_t::try_from(ret).unwrap_or(0);
        // SAFETY: the kernel just gave us this fd; nobody else owns it.
        return Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }));
    }
    let errno = c_int::try_from(-ret).unwrap_or(libc::EIO);
    if cgroup.is_none() {
        return Err((SpawnStage::Clone, errno));
    }
    match errno {
        // No clone3 (before 5.3, or filtered), no cgroup field (before 5.7).
        libc::ENOSYS | libc::E2BIG | libc::EPERM | libc::EINVAL => {
            if INTO_CGROUP_WORKS.swap(false, Ordering::Relaxed) {
                tracing::info!(
                    errno,
                    "clone3 refused CLONE_INTO_CGROUP (Linux 5.7); children join their cgroup \
                     before exec instead"
                );
            }
            Err((SpawnStage::Cgroup, libc::ENOSYS))
        }
        libc::EBADF | libc::EBUSY | libc::EOPNOTSUPP | libc::ENOENT => {
            Err((SpawnStage::Cgroup, errno))
        }
        _ => Err((SpawnStage::Clone, errno)),
    }
}

/// The raw `clone3` syscall; in the child, calls `entry(arg)` on the new
/// stack and exits with its result.
///
/// # Safety
///
/// As [`clone3_on`]; `args` describes a valid, unused stack.
#[cfg(target_arch = "x86_64")]
unsafe fn raw_clone3(
    args: &CloneArgs,
    entry: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
) -> i64 {
    let ret: i64;
    // SAFETY: the caller's contract. The child runs on the new stack (the
    // kernel points rsp at its top, 16-byte aligned) and never comes back
    // into this function: it calls `entry`, then `exit`. `syscall` keeps
    // every register but rax, rcx and r11, so r12/r13 still hold `entry`
    // and `arg` in the child.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r13",
            "call r12",
            "mov edi, eax",
            "mov eax, 60",
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") ptr::from_ref(args),
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") entry,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    ret
}

/// Elsewhere children join their cgroup before exec.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn raw_clone3(_: &CloneArgs, _: extern "C" fn(*mut c_void) -> c_int, _: *mut c_void) -> i64 {
    -i64::from(libc::ENOSYS)
}

/// The signal a child sends its parent at exit (exec resets any other to
/// `SIGCHLD` anyway).
const CHILD_EXIT_SIGNAL: u64 = libc::SIGCHLD as u64;

/// `waitpid(pid, WNOHANG | __WALL)`: reaps `pid` if it has exited.
pub(super) fn reap_if_exited(pid: libc::pid_t) -> bool {
    // SAFETY: plain syscall; no status is wanted.
    unsafe { libc::waitpid(pid, ptr::null_mut(), libc::WNOHANG | libc::__WALL) == pid }
}

/// The pid and real uid of an exited child that nobody reaped yet, left
/// unreaped (`waitid(P_ALL, WEXITED | WNOHANG | WNOWAIT | __WALL)`).
pub(super) fn peek_exited_child() -> Option<(libc::pid_t, u32)> {
    peek_exited(libc::P_ALL, 0)
}

/// The real uid of the child `pid` if it has exited, left unreaped.
pub(super) fn exited_uid(pid: libc::pid_t) -> Option<u32> {
    let id = libc::id_t::try_from(pid).ok()?;
    peek_exited(libc::P_PID, id).map(|(_, uid)| uid)
}

fn peek_exited(idtype: libc::idtype_t, id: libc::id_t) -> Option<(libc::pid_t, u32)> {
    // SAFETY: an all-zero siginfo_t is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
    // SAFETY: plain syscall writing into `info`, which outlives it.
    let ret = unsafe { libc::waitid(idtype, id, &mut info, options) };
    // SAFETY: waitid filled a SIGCHLD siginfo, or left it zeroed.
    let (pid, uid) = unsafe { (info.si_pid(), info.si_uid()) };
    (ret == 0 && pid > 0).then_some((pid, uid))
}

/// `prctl(PR_SET_CHILD_SUBREAPER, 1)`: orphaned descendants are re-parented
/// to this process instead of init (Linux 3.4).
pub(super) fn become_subreaper() -> io::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Starts a child running [`child::child_main`] on `args` in a copy of
/// this process's memory (`clone` without `CLONE_VM`, a fork), and returns
/// at once, without waiting for its exec: its pid and a close-on-exec
/// pidfd. The child reports a failure through `args.report`.
///
/// # Errors
///
/// As [`clone_child`].
///
/// `namespaces`: `CLONE_NEW*` flags for a sandboxed child (0 for none).
pub(super) fn fork_child(
    args: &ChildArgs<'_>,
    namespaces: c_int,
) -> Result<(libc::pid_t, OwnedFd), c_int> {
    let arg = ptr::from_ref(args).cast_mut().cast::<c_void>();
    // SAFETY: the child gets its own copy of our memory, `args` included,
    // valid in it as here; `child_main` runs only async-signal-safe code
    // (locks other threads held stay held in the copy) and never returns.
    unsafe { clone_with(child::child_main, arg, Sharing::Fork(namespaces)) }
}

/// Starts the program under a pid namespace's init (see
/// [`child::StartProgram`]): `clone(CLONE_VM | CLONE_VFORK)` on a fresh
/// stack, unmapped once the child has exec'd or exited. No pidfd: the
/// init waits with `waitid`, and logs nothing (it is a copy of the
/// daemon, whose other threads' locks stay held in it).
///
/// # Safety
///
/// As [`child::StartProgram`].
pub(super) unsafe fn vfork_program(
    entry: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
) -> Result<libc::pid_t, c_int> {
    let stack = Stack::new().map_err(|error| errno_of(&error))?;
    // SAFETY: forwarded from our caller; the stack is ours and unused, and
    // outlives the child's use of it (this thread waits until its exec).
    let pid = unsafe {
        libc::clone(
            entry,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg,
        )
    };
    if pid < 0 {
        return Err(last_errno());
    }
    Ok(pid)
}

/// How the child relates to our memory.
#[derive(Clone, Copy)]
enum Sharing {
    /// `CLONE_VM | CLONE_VFORK`: shares it, while this thread waits.
    Vfork,
    /// Neither: gets a copy, and this thread carries on; in new
    /// namespaces when these `CLONE_NEW*` flags say so.
    Fork(c_int),
}

/// `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)` on a reusable stack.
///
/// # Safety
///
/// `entry` runs in a child that shares our memory while this thread is
/// suspended: it must be async-signal-safe, must not return, and `arg`
/// must be valid for what it does with it.
unsafe fn clone_vfork(
    entry: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
) -> Result<(libc::pid_t, OwnedFd), c_int> {
    // SAFETY: forwarded from our caller.
    unsafe { clone_with(entry, arg, Sharing::Vfork) }
}

/// # Safety
///
/// As [`clone_vfork`]; for [`Sharing::Fork`], `entry` and `arg` run on a
/// copy of our memory instead.
unsafe fn clone_with(
    entry: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    sharing: Sharing,
) -> Result<(libc::pid_t, OwnedFd), c_int> {
    let stack = match STACK.take() {
        Some(stack) => stack,
        None => Stack::new().map_err(|error| errno_of(&error))?,
    };
    let result = {
        let _blocked = BlockedSignals::block_all().map_err(|error| errno_of(&error))?;
        // SAFETY: forwarded from our caller; the stack is ours and unused.
        unsafe { clone_on(&stack, entry, arg, sharing) }
    };
    STACK.set(Some(stack));
    result
}

/// # Safety
///
/// As [`clone_with`], with all signals blocked in this thread.
unsafe fn clone_on(
    stack: &Stack,
    entry: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    sharing: Sharing,
) -> Result<(libc::pid_t, OwnedFd), c_int> {
    let flags = match sharing {
        Sharing::Vfork => libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
        Sharing::Fork(namespaces) => libc::SIGCHLD | namespaces,
    };
    if CLONE_PIDFD_WORKS.load(Ordering::Relaxed) {
        let mut pidfd: c_int = -1;
        // SAFETY: see the function's contract. With CLONE_PIDFD the kernel
        // stores the new pidfd through the parent_tid pointer; tls and
        // child_tid are unused without their flags.
        let pid = unsafe {
            libc::clone(
                entry,
                stack.top(),
                flags | libc::CLONE_PIDFD,
                arg,
                &raw mut pidfd,
                ptr::null_mut::<c_void>(),
                ptr::null_mut::<c_int>(),
            )
        };
        if pid > 0 && pidfd >= 0 {
            // SAFETY: the kernel just gave us this fd; nobody else owns it.
            return Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }));
        }
        if pid > 0 {
            // Before 5.2 clone ignores the unknown flag and leaves pidfd unset.
            disable_clone_pidfd(0);
            return open_pidfd(pid);
        }
        let errno = last_errno();
        if !matches!(errno, libc::EINVAL | libc::ENOSYS | libc::EPERM) {
            return Err(errno);
        }
        disable_clone_pidfd(errno);
    }
    // SAFETY: see the function's contract; parent_tid, tls and child_tid
    // are unused without their flags.
    let pid = unsafe {
        libc::clone(
            entry,
            stack.top(),
            flags,
            arg,
            ptr::null_mut::<c_int>(),
            ptr::null_mut::<c_void>(),
            ptr::null_mut::<c_int>(),
        )
    };
    if pid < 0 {
        return Err(last_errno());
    }
    open_pidfd(pid)
}

fn disable_clone_pidfd(errno: c_int) {
    if CLONE_PIDFD_WORKS.swap(false, Ordering::Relaxed) {
        tracing::info!(
            errno,
            "clone refused CLONE_PIDFD (Linux 5.2); falling back to pidfd_open (Linux 5.3)"
        );
    }
}

/// `pidfd_open` for a child we just created. The pid cannot be reused
/// meanwhile: an unreaped child keeps it, and only we reap our children.
fn open_pidfd(pid: libc::pid_t) -> Result<(libc::pid_t, OwnedFd), c_int> {
    match pidfd_open(pid) {
        Ok(pidfd) => Ok((pid, pidfd)),
        Err(error) => {
            // Without a pidfd nobody could watch the child: end it here.
            // SAFETY: signals and reaps our own child, by a pid still ours.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                while libc::waitpid(pid, ptr::null_mut(), 0) < 0 && last_errno() == libc::EINTR {}
            }
            Err(errno_of(&error))
        }
    }
}

pub(super) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: the syscall takes a pid and flags; no memory is passed.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as c_uint) };
    let fd = c_int::try_from(ret).map_err(|_| io::Error::last_os_error())?;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this fd (close-on-exec by default).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `waitid(P_PIDFD, pidfd, WEXITED [| WNOHANG])` with rusage, through the
/// raw syscall: glibc's wrapper has no rusage argument.
///
/// # Errors
///
/// `ECHILD` if the process is not our child or was already reaped; `EINVAL`
/// on kernels before 5.4 (no `P_PIDFD`).
pub(super) fn waitid(
    pidfd: BorrowedFd<'_>,
    block: bool,
) -> io::Result<Option<(ExitStatus, ResourceUsage)>> {
    // SAFETY: plain C structs for which all-zero bytes are valid; a zero
    // si_pid is how WNOHANG says "still running".
    let (mut info, mut usage) = unsafe {
        (
            std::mem::zeroed::<libc::siginfo_t>(),
            std::mem::zeroed::<libc::rusage>(),
        )
    };
    let options = libc::WEXITED | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: both out-pointers are valid, writable and correctly typed.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_waitid,
                libc::P_PIDFD,
                pidfd.as_raw_fd(),
                &raw mut info,
                options,
                &raw mut usage,
            )
        };
        if ret == 0 {
            break;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    // SAFETY: waitid fills a SIGCHLD siginfo (or leaves it zeroed), for
    // which si_pid and si_status are the valid union fields.
    let (pid, code) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    super::forget_own(pid);
    let status = match info.si_code {
        libc::CLD_EXITED => ExitStatus::Exited(code),
        libc::CLD_KILLED => ExitStatus::Signaled {
            signal: code,
            core_dumped: false,
        },
        libc::CLD_DUMPED => ExitStatus::Signaled {
            signal: code,
            core_dumped: true,
        },
        other => {
            return Err(io::Error::other(format!(
                "waitid reported si_code {other}, not an exit"
            )));
        }
    };
    // A pid namespace's init reports its program's own exit.
    let status = super::sandbox::take_init_report(pid).unwrap_or(status);
    let usage = ResourceUsage {
        user_micros: micros(usage.ru_utime),
        system_micros: micros(usage.ru_stime),
        max_rss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
    };
    Ok(Some((status, usage)))
}

fn micros(time: libc::timeval) -> u64 {
    let secs = u64::try_from(time.tv_sec).unwrap_or(0);
    let micros = u64::try_from(time.tv_usec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

/// `pidfd_send_signal(pidfd, signal, NULL, 0)`.
pub(super) fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: c_int) -> io::Result<()> {
    // SAFETY: a NULL siginfo is allowed (the kernel fills in SI_USER).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            ptr::null::<libc::siginfo_t>(),
            0 as c_uint,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `close_range(first, ~0, CLOSE_RANGE_CLOEXEC)`: marks every fd from
/// `first` up close-on-exec without closing it (Linux 5.11).
pub(super) fn cloexec_from(first: c_uint) -> io::Result<()> {
    // SAFETY: with CLOSE_RANGE_CLOEXEC nothing is closed, so no owner of an
    // fd in the range is invalidated; only the flag changes.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PIDFD_SIGNAL_PROCESS_GROUP` from `<linux/pidfd.h>` (Linux 6.9).
const PIDFD_SIGNAL_PROCESS_GROUP: c_uint = 1 << 2;

/// Whether the kernel takes [`PIDFD_SIGNAL_PROCESS_GROUP`]; cleared on the
/// first `EINVAL`.
static GROUP_SIGNAL_WORKS: AtomicBool = AtomicBool::new(true);

/// Signals the process group of the pidfd's process, or `-pgid` on kernels
/// before 6.9.
pub(super) fn pidfd_send_group_signal(
    pidfd: BorrowedFd<'_>,
    pgid: libc::pid_t,
    signal: c_int,
) -> io::Result<()> {
    if GROUP_SIGNAL_WORKS.load(Ordering::Relaxed) {
        // SAFETY: a NULL siginfo is allowed (the kernel fills in SI_USER).
        let ret = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                signal,
                ptr::null::<libc::siginfo_t>(),
                PIDFD_SIGNAL_PROCESS_GROUP,
            )
        };
        if ret == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        // EINVAL is also a bad signal number: probe that before falling back.
        if error.raw_os_error() != Some(libc::EINVAL) || pidfd_send_signal(pidfd, 0).is_err() {
            return Err(error);
        }
        GROUP_SIGNAL_WORKS.store(false, Ordering::Relaxed);
    }
    if pgid <= 1 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: plain syscall; a negative pid names a process group.
    if unsafe { libc::kill(-pgid, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// [`pidfd_send_group_signal`] from a scoped thread that has switched its
/// own uids to `uid` first; directly when we already are `uid`, or when
/// `uid` is root.
pub(super) fn pidfd_send_group_signal_as(
    pidfd: BorrowedFd<'_>,
    pgid: libc::pid_t,
    signal: c_int,
    uid: u32,
) -> io::Result<()> {
    if uid == 0 || rustix::process::geteuid().as_raw() == uid {
        return pidfd_send_group_signal(pidfd, pgid, signal);
    }
    std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            // SAFETY: the raw syscall changes the credentials of this
            // thread alone (glibc's wrapper would change every thread's);
            // the thread ends right after the signal, never switching back.
            let ret = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
            if ret != 0 {
                return Err(io::Error::last_os_error());
            }
            pidfd_send_group_signal(pidfd, pgid, signal)
        });
        sender
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the signalling thread panicked")))
    })
}

/// `SO_PEERPIDFD` from `<asm-generic/socket.h>`: 77 on every architecture
/// we build for (MIPS and SPARC differ).
const SO_PEERPIDFD: c_int = 77;

/// `SIOCOUTQ` of a Unix socket: the bytes it sent that its peer has not
/// read yet (as the kernel charges them, headers included).
pub(super) fn unread_bytes(socket: BorrowedFd<'_>) -> io::Result<usize> {
    let mut bytes: c_int = 0;
    // SAFETY: SIOCOUTQ (the same number as TIOCOUTQ) writes one int
    // through the pointer, which points at `bytes`.
    let ret = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &raw mut bytes) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(bytes).unwrap_or(0))
}

/// `getsockopt(SOL_SOCKET, SO_PEERPIDFD)`; `None` before Linux 6.5.
pub(super) fn peer_pidfd(socket: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let mut fd: c_int = -1;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<c_int>()).unwrap_or(4);
    // SAFETY: the kernel writes at most `len` bytes into `fd`, a c_int.
    let ret = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &raw mut len,
        )
    };
    if ret != 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOPROTOOPT) => Ok(None),
            _ => Err(error),
        };
    }
    if fd < 0 {
        return Ok(None);
    }
    // SAFETY: the kernel just gave us this fd (close-on-exec); nobody else
    // owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Probes, by using them, the kernel features `spawn` needs.
pub(super) fn check_kernel_support() -> Result<(), String> {
    // close_range (5.9): an empty range above any open fd closes nothing.
    // SAFETY: closes no fd (nothing is open at u32::MAX).
    let ret =
        unsafe { libc::syscall(libc::SYS_close_range, c_uint::MAX, c_uint::MAX, 0 as c_uint) };
    if ret != 0 {
        return Err(missing(
            "close_range(2)",
            "5.9",
            &io::Error::last_os_error(),
        ));
    }

    // pidfd_open (5.3): the fallback when clone refuses CLONE_PIDFD.
    let own = libc::pid_t::try_from(std::process::id()).unwrap_or(libc::pid_t::MAX);
    let pidfd = pidfd_open(own).map_err(|error| missing("pidfd_open(2)", "5.3", &error))?;

    // waitid(P_PIDFD) (5.4): on ourselves it must say ECHILD, not EINVAL.
    match waitid(pidfd.as_fd(), false) {
        Err(error) if error.raw_os_error() == Some(libc::ECHILD) => {}
        Ok(_) => {}
        Err(error) => return Err(missing("waitid(P_PIDFD)", "5.4", &error)),
    }

    // clone with CLONE_VM | CLONE_VFORK, with CLONE_PIDFD (5.2) if allowed.
    // SAFETY: `probe_child` only calls `_exit`; it uses no argument.
    let (_, child) = unsafe { clone_vfork(probe_child, ptr::null_mut()) }.map_err(|errno| {
        missing(
            "clone(CLONE_VM | CLONE_VFORK)",
            "5.2",
            &io::Error::from_raw_os_error(errno),
        )
    })?;
    waitid(child.as_fd(), true).map_err(|error| missing("waitid(P_PIDFD)", "5.4", &error))?;
    Ok(())
}

extern "C" fn probe_child(_: *mut c_void) -> c_int {
    // SAFETY: async-signal-safe; ends only the probe child.
    unsafe { libc::_exit(0) }
}

fn missing(feature: &str, kernel: &str, error: &io::Error) -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
        |_| "unknown".to_owned(),
        |release| release.trim().to_owned(),
    );
    format!(
        "this kernel ({release}) does not provide {feature}, which zygote needs; \
         Linux {kernel} or newer is required ({error})"
    )
}

fn last_errno() -> c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn errno_of(error: &io::Error) -> c_int {
    error.raw_os_error().unwrap_or(libc::EIO)
}

/// `KCMP_VM` from `<linux/kcmp.h>`.
const KCMP_VM: c_int = 1;

/// Whether processes `a` and `b` share one address space
/// (`kcmp(KCMP_VM)`, Linux 3.5 with `CONFIG_KCMP`): a vfork'd child that
/// has not exec'd yet shares its parent's. `false` when kcmp fails.
pub(super) fn share_memory(a: libc::pid_t, b: libc::pid_t) -> bool {
    // SAFETY: kcmp takes two pids, a type and two unused indexes; no
    // memory is passed.
    let ret = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_VM, 0 as c_uint, 0 as c_uint) };
    ret == 0
}
