//! The sandbox's data for the child ([`SandboxPlan`]) and the code that
//! applies it between `clone` and `execve`.
//!
//! Sandboxed children always start on the fork path (see
//! [`super::Spawner::start`]): resolving a peer's paths can block (a FUSE
//! mount, a stopped process's file), and only a forked child may block
//! without holding a daemon thread. The fork path's child is still a copy
//! of a multi-threaded process, so everything here is async-signal-safe
//! as in `child`: raw syscalls on data the daemon prepared, no allocation.
//!
//! # Order
//!
//! As root (the daemon's ids), after the fds are placed: join the network
//! namespace, set the hostname, build the filesystem and `pivot_root`
//! into it, clear the capability bounding set. Then the credentials
//! switch (`child`). With a new pid namespace the child is its init and
//! forks the program ([`run_init`]). Then, as the peer: `chdir`,
//! `no_new_privs`, all capabilities dropped, Landlock, and seccomp last.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_int, c_long, c_uint, c_void};
use std::os::fd::{OwnedFd, RawFd};
use std::ptr;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use zygote_proto::{ExitStatus, SpawnStage};

/// The stage a failed sandbox step reports; the step says which.
pub const SANDBOX_STAGE: SpawnStage = SpawnStage::Sandbox;

/// Most mounts a filesystem may list (the daemon refuses more): the
/// child's report names a mount by index in one byte.
pub const MAX_MOUNTS: usize = 64;

/// Everything the child applies to confine itself, prepared by the
/// daemon.
#[derive(Debug, Default)]
pub struct SandboxPlan {
    /// `CLONE_NEW*` flags given to `clone`: mount, pid, ipc, uts, and net
    /// for a fresh network namespace, user for a rootless daemon.
    pub clone_flags: c_int,
    /// A network namespace to join with `setns`: the daemon's empty one.
    pub netns: Option<Arc<OwnedFd>>,
    /// The hostname inside (needs a new uts namespace).
    pub hostname: Option<Vec<u8>>,
    /// The filesystem view: a new root; `None`: the host's.
    pub filesystem: Option<Vec<Mount>>,
    /// seccomp programs, installed in order last before exec (stacked
    /// filters: the strictest answer wins).
    pub seccomp: Vec<Arc<SeccompProgram>>,
    /// Landlock rulesets, each enforced in turn (stacked: each one only
    /// takes rights away).
    pub landlock: Vec<LandlockPlan>,
    /// Rootless: map the peer's uid and gid to themselves in the new user
    /// namespace.
    pub map_ids: Option<(u32, u32)>,
    /// Mount a fresh `/proc` over the host's (a new pid namespace without
    /// a filesystem of its own: the child's own mount namespace).
    pub fresh_proc: bool,
    /// Clear the capability bounding and ambient sets (needs
    /// `CAP_SETPCAP`: a root daemon, or a user namespace of the child's
    /// own; a rootless child without one has no capability to lose).
    pub clear_bounding_set: bool,
}

/// One mount of a sandbox's filesystem.
#[derive(Debug)]
pub struct Mount {
    /// What to mount.
    pub kind: MountKind,
    /// The source (a host path) for binds.
    pub source: CString,
    /// Inside the new root, relative (no leading `/`), checked: no `..`,
    /// no empty component.
    pub destination: CString,
}

/// How a [`Mount`] is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// A read-only, nosuid, nodev recursive bind.
    ReadOnlyBind,
    /// A read-write, nosuid, nodev recursive bind.
    Bind,
    /// A fresh tmpfs.
    Tmpfs,
    /// A fresh procfs (of the child's pid namespace).
    Proc,
}

/// A compiled seccomp filter.
pub struct SeccompProgram {
    /// The name reported: a profile's, or "custom".
    pub name: String,
    /// The BPF instructions.
    pub filter: Vec<libc::sock_filter>,
}

impl std::fmt::Debug for SeccompProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeccompProgram")
            .field("name", &self.name)
            .field("instructions", &self.filter.len())
            .finish()
    }
}

/// A Landlock ruleset the daemon created (network rules included), and
/// the path rules the child adds, each path opened as the peer.
#[derive(Debug)]
pub struct LandlockPlan {
    /// The ruleset's fd.
    pub ruleset: OwnedFd,
    /// `(path, allowed access)` for `LANDLOCK_RULE_PATH_BENEATH`.
    pub paths: Vec<(CString, u64)>,
    /// The access rights that apply to a file (not a directory): the
    /// others are dropped from a rule on a file, as the kernel wants.
    pub file_access: u64,
}

/// A sandbox step that failed, reported with stage `Sandbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// Mapping the peer's ids in the new user namespace.
    UserNamespace = 1,
    /// Joining the empty network namespace.
    Network,
    /// `sethostname`.
    Hostname,
    /// Making the mounts private.
    Propagation,
    /// Creating the new root.
    Root,
    /// Resolving a bind source as the peer.
    Source,
    /// Making a mount.
    Mount,
    /// Creating a destination inside.
    Destination,
    /// The minimal `/dev`.
    Dev,
    /// `pivot_root` and detaching the old root.
    PivotRoot,
    /// Clearing the capability bounding set and ambient set.
    Capabilities,
    /// Starting the program under the pid namespace's init.
    Init,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs,
    /// Opening a Landlock path as the peer.
    LandlockPath,
    /// Adding a Landlock rule or enforcing the ruleset.
    Landlock,
    /// Installing the seccomp filter.
    Seccomp,
}

impl Step {
    const ALL: [Self; 16] = [
        Self::UserNamespace,
        Self::Network,
        Self::Hostname,
        Self::Propagation,
        Self::Root,
        Self::Source,
        Self::Mount,
        Self::Destination,
        Self::Dev,
        Self::PivotRoot,
        Self::Capabilities,
        Self::Init,
        Self::NoNewPrivs,
        Self::LandlockPath,
        Self::Landlock,
        Self::Seccomp,
    ];

    /// Its name in messages and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::UserNamespace => "user namespace",
            Self::Network => "network namespace",
            Self::Hostname => "hostname",
            Self::Propagation => "mount propagation",
            Self::Root => "new root",
            Self::Source => "bind source",
            Self::Mount => "mount",
            Self::Destination => "mount destination",
            Self::Dev => "/dev",
            Self::PivotRoot => "pivot_root",
            Self::Capabilities => "capabilities",
            Self::Init => "init",
            Self::NoNewPrivs => "no_new_privs",
            Self::LandlockPath => "landlock path",
            Self::Landlock => "landlock",
            Self::Seccomp => "seccomp",
        }
    }

    fn from_u8(value: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|step| *step as u8 == value)
    }
}

/// Which sandbox step failed, and on which item (a mount's or Landlock
/// path's index in the plan), if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxFailure {
    /// The step.
    pub step: Step,
    /// The mount or Landlock path's index.
    pub item: Option<u8>,
}

impl SandboxFailure {
    /// Packs it in 16 bits (0: none), for the child's report.
    pub(super) fn pack(failure: Option<Self>) -> u16 {
        failure.map_or(0, |failure| {
            u16::from(failure.step as u8) << 8 | u16::from(failure.item.map_or(0xff, |item| item))
        })
    }

    /// Reverses [`SandboxFailure::pack`].
    pub(super) fn unpack(bits: u16) -> Option<Self> {
        let [step, item] = bits.to_be_bytes();
        Some(Self {
            step: Step::from_u8(step)?,
            item: (item != 0xff).then_some(item),
        })
    }
}

/// A failed step in the child: the stage's errno plus the sandbox detail.
pub(super) type Failed = (SpawnStage, c_int, Option<SandboxFailure>);

fn fail(step: Step, item: Option<usize>) -> Failed {
    let item = item.and_then(|item| u8::try_from(item).ok());
    (SANDBOX_STAGE, errno(), Some(SandboxFailure { step, item }))
}

fn check(ret: c_long, step: Step, item: Option<usize>) -> Result<c_long, Failed> {
    if ret < 0 {
        Err(fail(step, item))
    } else {
        Ok(ret)
    }
}

fn errno() -> c_int {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn close(fd: c_int) {
    // SAFETY: closes an fd this child opened and no one else uses.
    unsafe { libc::close(fd) };
}

/// What the child needs from the rest of its plan for the sandbox.
pub(super) struct Peer<'a> {
    /// The credentials the child switches to (uid, gid, groups), under
    /// which paths are resolved; `None`: the daemon's own.
    pub(super) credentials: Option<(libc::uid_t, libc::gid_t, &'a [libc::gid_t])>,
    /// The sandbox's fds ([`copy_fds`]).
    pub(super) fds: &'a [RawFd],
}

/// Copies of the plan's fds above every target of the child (`floor`),
/// which the child's closing of other fds leaves open: the network
/// namespace (or -1's place taken by nothing: the list starts with it
/// only when there is one), then each Landlock ruleset.
///
/// # Errors
///
/// When an fd cannot be duplicated.
pub(super) fn copy_fds(plan: &SandboxPlan, floor: RawFd) -> rustix::io::Result<Vec<OwnedFd>> {
    let netns = plan.netns.iter().map(|fd| &**fd);
    let rulesets = plan.landlock.iter().map(|landlock| &landlock.ruleset);
    netns
        .chain(rulesets)
        .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, floor))
        .collect()
}

/// The steps taken with the daemon's privileges, before the credentials
/// switch.
pub(super) fn before_credentials(plan: &SandboxPlan, peer: &Peer<'_>) -> Result<(), Failed> {
    if let Some((uid, gid)) = plan.map_ids {
        map_ids(uid, gid)?;
    }
    if plan.netns.is_some() {
        let netns = peer.fds.first().copied().unwrap_or(-1);
        // SAFETY: plain syscall on an fd kept open for us.
        let ret = unsafe { libc::setns(netns, libc::CLONE_NEWNET) };
        check(ret.into(), Step::Network, None)?;
    }
    if let Some(hostname) = &plan.hostname {
        // SAFETY: the kernel reads `len` bytes from a valid slice.
        let ret = unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) };
        check(ret.into(), Step::Hostname, None)?;
    }
    if let Some(mounts) = &plan.filesystem {
        build_root(mounts, peer, plan.clone_flags & libc::CLONE_NEWPID != 0)?;
    } else if plan.fresh_proc {
        remount_proc()?;
    }
    if plan.clear_bounding_set {
        clear_capability_sets()?;
    }
    Ok(())
}

/// The steps taken as the peer, last before exec.
pub(super) fn before_exec(plan: &SandboxPlan, fds: &[RawFd]) -> Result<(), Failed> {
    // SAFETY: plain prctl with integer arguments.
    let ret = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    check(ret.into(), Step::NoNewPrivs, None)?;
    drop_capabilities()?;
    let rulesets = fds.iter().skip(usize::from(plan.netns.is_some()));
    for (landlock, ruleset) in plan.landlock.iter().zip(rulesets) {
        enforce_landlock(landlock, *ruleset)?;
    }
    for program in &plan.seccomp {
        install_seccomp(program)?;
    }
    Ok(())
}

/// Writes `setgroups`, `uid_map` and `gid_map` of this child's new user
/// namespace: the peer's ids map to themselves, nothing else exists.
fn map_ids(uid: u32, gid: u32) -> Result<(), Failed> {
    write_file(c"/proc/self/setgroups", b"deny", Step::UserNamespace)?;
    let mut line = [0u8; 32];
    let len = id_map_line(uid, &mut line);
    write_file(c"/proc/self/uid_map", &line[..len], Step::UserNamespace)?;
    let len = id_map_line(gid, &mut line);
    write_file(c"/proc/self/gid_map", &line[..len], Step::UserNamespace)
}

/// `"ID ID 1"` in `buffer`; returns its length.
fn id_map_line(id: u32, buffer: &mut [u8; 32]) -> usize {
    let mut digits = [0u8; 10];
    let mut count = 0;
    let mut rest = id;
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + u8::try_from(rest % 10).unwrap_or(0);
        rest /= 10;
        count += 1;
        if rest == 0 {
            break;
        }
    }
    let number = digits.get(10 - count..).unwrap_or(&[]);
    let mut len = 0;
    for part in [number, b" ", number, b" 1"] {
        for byte in part {
            if let Some(slot) = buffer.get_mut(len) {
                *slot = *byte;
                len += 1;
            }
        }
    }
    len
}

fn write_file(path: &CStr, text: &[u8], step: Step) -> Result<(), Failed> {
    // SAFETY: opens a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    check(fd.into(), step, None)?;
    // SAFETY: writes from a valid slice.
    let written = unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) };
    let failed = (written < 0).then(|| fail(step, None));
    close(fd);
    failed.map_or(Ok(()), Err)
}

/// Mounts a fresh procfs of the child's pid namespace over `/proc`, in
/// its own mount namespace, made private first.
fn remount_proc() -> Result<(), Failed> {
    // SAFETY: NULL source/type/data are allowed for a propagation change.
    let ret = unsafe {
        libc::mount(
            ptr::null(),
            c"/".as_ptr(),
            ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            ptr::null(),
        )
    };
    check(ret.into(), Step::Propagation, None)?;
    // SAFETY: NUL-terminated strings, no data.
    let ret = unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            ptr::null(),
        )
    };
    check(ret.into(), Step::Mount, None).map(drop)
}

/// Where the new root is built, in this child's own mount namespace.
const STAGING: &CStr = c"/tmp";

/// Builds the new root on a tmpfs and pivots into it.
///
/// Every bind source is resolved (as the peer) and copied into a detached
/// tree first, before anything is mounted over the host's paths (the
/// staging tmpfs covers `/tmp`, where a source may be).
fn build_root(mounts: &[Mount], peer: &Peer<'_>, new_pid_ns: bool) -> Result<(), Failed> {
    let mut trees = [-1 as c_int; MAX_MOUNTS];
    let built = detach_sources(mounts, peer, &mut trees).and_then(|()| {
        // SAFETY: NULL source/type/data are allowed for a propagation change.
        let ret = unsafe {
            libc::mount(
                ptr::null(),
                c"/".as_ptr(),
                ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                ptr::null(),
            )
        };
        check(ret.into(), Step::Propagation, None)?;
        // SAFETY: NUL-terminated strings.
        let ret = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                STAGING.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755".as_ptr().cast(),
            )
        };
        check(ret.into(), Step::Root, None)?;
        // SAFETY: opens a NUL-terminated path.
        let root = unsafe {
            libc::open(
                STAGING.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        let root = check(root.into(), Step::Root, None)? as c_int;
        let built = mount_all(root, mounts, &trees, new_pid_ns);
        let built = built.and_then(|()| make_dev(root));
        let built = built.and_then(|()| pivot(root));
        close(root);
        built
    });
    for tree in trees {
        if tree >= 0 {
            close(tree);
        }
    }
    built
}

/// Opens each bind's source as the peer and clones it into a detached
/// tree, in `trees` at the mount's index.
fn detach_sources(
    mounts: &[Mount],
    peer: &Peer<'_>,
    trees: &mut [c_int; MAX_MOUNTS],
) -> Result<(), Failed> {
    for ((index, mount), slot) in mounts.iter().enumerate().zip(trees.iter_mut()) {
        if matches!(mount.kind, MountKind::ReadOnlyBind | MountKind::Bind) {
            let source = open_as_peer(&mount.source, peer, index)?;
            let tree = clone_tree(source, mount.kind, index);
            close(source);
            *slot = tree?;
        }
    }
    Ok(())
}

fn mount_all(
    root: c_int,
    mounts: &[Mount],
    trees: &[c_int; MAX_MOUNTS],
    new_pid_ns: bool,
) -> Result<(), Failed> {
    for ((index, mount), tree) in mounts.iter().enumerate().zip(trees) {
        let attached = match mount.kind {
            MountKind::ReadOnlyBind | MountKind::Bind => {
                attach(*tree, root, &mount.destination, index)
            }
            MountKind::Tmpfs | MountKind::Proc => {
                let fstype = if mount.kind == MountKind::Tmpfs {
                    c"tmpfs"
                } else {
                    c"proc"
                };
                let fresh = new_fs(fstype, index)?;
                let attached = attach(fresh, root, &mount.destination, index);
                close(fresh);
                attached
            }
        };
        attached?;
    }
    // A fresh /proc always: of the new pid namespace when there is one
    // (this child is its init), else of the host's, as the peer sees it.
    let _ = new_pid_ns;
    let proc = new_fs(c"proc", mounts.len())?;
    let attached = attach(proc, root, c"proc", mounts.len());
    close(proc);
    attached
}

/// Opens `path` with `O_PATH` under the peer's filesystem ids and groups,
/// so that it reaches only what the peer could (the daemon is root). A
/// final symlink is followed, as bwrap does.
fn open_as_peer(path: &CStr, peer: &Peer<'_>, index: usize) -> Result<c_int, Failed> {
    let Some((uid, gid, groups)) = peer.credentials else {
        // SAFETY: opens a NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        return check(fd.into(), Step::Source, Some(index)).map(|fd| fd as c_int);
    };
    // SAFETY: the kernel reads `groups.len()` ids from a valid slice; the
    // switch credentials step sets them again (to the same) later.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    check(ret, Step::Source, Some(index))?;
    // SAFETY: plain syscalls on ids (setfsuid cannot fail visibly).
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
    }
    // SAFETY: opens a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    let failed = (fd < 0).then(|| fail(Step::Source, Some(index)));
    // SAFETY: back to the real ids for the mounts (fsuid follows euid).
    unsafe {
        libc::syscall(libc::SYS_setfsuid, 0 as c_uint);
        libc::syscall(libc::SYS_setfsgid, 0 as c_uint);
    }
    failed.map_or(Ok(fd), Err)
}

/// A detached copy of the tree at `source`, with its attributes set.
fn clone_tree(source: c_int, kind: MountKind, index: usize) -> Result<c_int, Failed> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as c_uint;
    // SAFETY: an fd and an empty NUL-terminated path.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, source, c"".as_ptr(), flags) };
    let tree = check(tree, Step::Mount, Some(index))? as c_int;
    let mut set = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if kind == MountKind::ReadOnlyBind {
        set |= libc::MOUNT_ATTR_RDONLY;
    }
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the kernel reads a valid mount_attr of the given size.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &raw const attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if ret < 0 {
        let failed = fail(Step::Mount, Some(index));
        close(tree);
        return Err(failed);
    }
    Ok(tree)
}

/// A new detached mount of `fstype` (tmpfs or proc), nosuid and nodev.
fn new_fs(fstype: &CStr, index: usize) -> Result<c_int, Failed> {
    // SAFETY: a NUL-terminated name.
    let context = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), libc::FSOPEN_CLOEXEC) };
    let context = check(context, Step::Mount, Some(index))? as c_int;
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context,
            libc::FSCONFIG_CMD_CREATE,
            ptr::null::<c_void>(),
            ptr::null::<c_void>(),
            0,
        )
    };
    let created = check(ret, Step::Mount, Some(index));
    let mounted = created.and_then(|_| {
        let flags = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
        // SAFETY: plain syscall on an fs context fd.
        let fd = unsafe { libc::syscall(libc::SYS_fsmount, context, libc::FSMOUNT_CLOEXEC, flags) };
        check(fd, Step::Mount, Some(index))
    });
    close(context);
    mounted.map(|fd| fd as c_int)
}

/// Attaches the detached `tree` at `destination` under `root`, creating
/// the destination (a directory, or an empty file for a file's bind).
fn attach(tree: c_int, root: c_int, destination: &CStr, index: usize) -> Result<(), Failed> {
    // SAFETY: statx-free check of what the tree's root is.
    let mut stat = unsafe { std::mem::zeroed::<libc::stat>() };
    // SAFETY: fstat writes into a valid struct.
    let ret = unsafe { libc::fstat(tree, &raw mut stat) };
    check(ret.into(), Step::Mount, Some(index))?;
    let is_dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let target = open_destination(root, destination, is_dir, index)?;
    let flags = libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: two fds and empty NUL-terminated paths.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            target,
            c"".as_ptr(),
            flags,
        )
    };
    let moved = check(ret, Step::Mount, Some(index));
    close(target);
    moved.map(drop)
}

/// Walks `destination` from `root` one component at a time, never
/// following a symlink (a bound directory may hold the peer's), making
/// each missing directory, and the last one as a directory or file.
fn open_destination(
    root: c_int,
    destination: &CStr,
    is_dir: bool,
    index: usize,
) -> Result<c_int, Failed> {
    let bytes = destination.to_bytes();
    let mut current = root;
    let mut component = [0u8; 256];
    let mut parts = bytes.split(|byte| *byte == b'/').peekable();
    while let Some(part) = parts.next() {
        let last = parts.peek().is_none();
        let Some(name) = component.get_mut(..=part.len()) else {
            return Err((
                SANDBOX_STAGE,
                libc::ENAMETOOLONG,
                Some(SandboxFailure {
                    step: Step::Destination,
                    item: u8::try_from(index).ok(),
                }),
            ));
        };
        let (text, nul) = name.split_at_mut(part.len());
        text.copy_from_slice(part);
        nul.fill(0);
        let name = name.as_ptr().cast::<libc::c_char>();
        // SAFETY: a NUL-terminated component under an fd we own.
        let created = unsafe {
            if last && !is_dir {
                let fd = libc::openat(
                    current,
                    name,
                    libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_WRONLY
                        | libc::O_CLOEXEC
                        | libc::O_NOFOLLOW,
                    0o644,
                );
                if fd >= 0 {
                    libc::close(fd);
                }
                fd
            } else {
                libc::mkdirat(current, name, 0o755)
            }
        };
        if created < 0 && errno() != libc::EEXIST {
            let failed = fail(Step::Destination, Some(index));
            if current != root {
                close(current);
            }
            return Err(failed);
        }
        let mut flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        if !last || is_dir {
            flags |= libc::O_DIRECTORY;
        }
        // SAFETY: a NUL-terminated component under an fd we own.
        let next = unsafe { libc::openat(current, name, flags) };
        let failed = (next < 0).then(|| fail(Step::Destination, Some(index)));
        if current != root {
            close(current);
        }
        if let Some(failed) = failed {
            return Err(failed);
        }
        current = next;
    }
    Ok(current)
}

/// The device nodes bound from the host into the minimal `/dev`.
const DEVICES: [&CStr; 6] = [c"null", c"zero", c"full", c"random", c"urandom", c"tty"];

/// A tmpfs `/dev` with the host's harmless devices, a private devpts
/// instance and the usual links.
fn make_dev(root: c_int) -> Result<(), Failed> {
    let dev = new_fs(c"tmpfs", 0).map_err(|(stage, errno, _)| {
        (
            stage,
            errno,
            Some(SandboxFailure {
                step: Step::Dev,
                item: None,
            }),
        )
    })?;
    let attached = attach(dev, root, c"dev", 0);
    close(dev);
    let dev_failed = || fail(Step::Dev, None);
    attached.map_err(|_| dev_failed())?;
    for (index, name) in DEVICES.iter().enumerate() {
        let mut path = [0u8; 32];
        let host = join(b"/dev/", name.to_bytes(), &mut path);
        // SAFETY: a NUL-terminated path the daemon trusts (the host's /dev).
        let node = unsafe { libc::open(host.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if node < 0 {
            continue; // a host without it gives none
        }
        let tree = clone_tree(node, MountKind::Bind, index);
        close(node);
        let tree = tree.map_err(|_| dev_failed())?;
        let mut inside = [0u8; 32];
        let inside = join(b"dev/", name.to_bytes(), &mut inside);
        let attached = attach(tree, root, inside, index);
        close(tree);
        attached.map_err(|_| dev_failed())?;
    }
    devpts(root)?;
    for (target, link) in [
        (c"pts/ptmx", c"dev/ptmx"),
        (c"/proc/self/fd", c"dev/fd"),
        (c"/proc/self/fd/0", c"dev/stdin"),
        (c"/proc/self/fd/1", c"dev/stdout"),
        (c"/proc/self/fd/2", c"dev/stderr"),
    ] {
        // SAFETY: NUL-terminated strings under an fd we own.
        let ret = unsafe { libc::symlinkat(target.as_ptr(), root, link.as_ptr()) };
        check(ret.into(), Step::Dev, None)?;
    }
    Ok(())
}

/// A private devpts instance at `dev/pts`, for terminals made inside.
fn devpts(root: c_int) -> Result<(), Failed> {
    // SAFETY: a NUL-terminated name under an fd we own.
    let ret = unsafe { libc::mkdirat(root, c"dev/pts".as_ptr(), 0o755) };
    check(ret.into(), Step::Dev, None)?;
    let mut path = [0u8; 32];
    let target = join(STAGING.to_bytes(), b"/dev/pts", &mut path);
    // SAFETY: NUL-terminated strings.
    let ret = unsafe {
        libc::mount(
            c"devpts".as_ptr(),
            target.as_ptr(),
            c"devpts".as_ptr(),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
        )
    };
    check(ret.into(), Step::Dev, None).map(drop)
}

/// `a` then `b` and a NUL in `buffer` (both short, daemon constants).
fn join<'b>(a: &[u8], b: &[u8], buffer: &'b mut [u8; 32]) -> &'b CStr {
    let mut len = 0;
    for byte in a.iter().chain(b) {
        if let Some(slot) = buffer.get_mut(len) {
            *slot = *byte;
            len += 1;
        }
    }
    if let Some(last) = buffer.last_mut() {
        *last = 0;
    }
    if let Some(slot) = buffer.get_mut(len) {
        *slot = 0;
    }
    CStr::from_bytes_until_nul(buffer).unwrap_or(c"")
}

/// Makes the new root `/`, detaching the old one entirely.
fn pivot(root: c_int) -> Result<(), Failed> {
    // SAFETY: fchdir to an fd we own.
    check(unsafe { libc::fchdir(root) }.into(), Step::PivotRoot, None)?;
    // pivot_root(".", "."): the old root ends up on top of the new one,
    // and is then detached: no directory for it is needed.
    // SAFETY: NUL-terminated strings.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    check(ret, Step::PivotRoot, None)?;
    // SAFETY: a NUL-terminated path.
    let ret = unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) };
    check(ret.into(), Step::PivotRoot, None)?;
    // SAFETY: a NUL-terminated path.
    check(
        unsafe { libc::chdir(c"/".as_ptr()) }.into(),
        Step::PivotRoot,
        None,
    )
    .map(drop)
}

/// Clears the capability bounding set and the ambient set, while the
/// child still has `CAP_SETPCAP`: nothing it execs can regain a
/// capability, setuid binaries included.
fn clear_capability_sets() -> Result<(), Failed> {
    let mut cap = 0;
    loop {
        // SAFETY: plain prctl with integer arguments.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if ret < 0 {
            if errno() == libc::EINVAL && cap > 0 {
                break; // past the last capability this kernel knows
            }
            return Err(fail(Step::Capabilities, None));
        }
        cap += 1;
    }
    // SAFETY: plain prctl with integer arguments.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    check(ret.into(), Step::Capabilities, None).map(drop)
}

/// `capset` with every set empty: a root peer's child keeps uid 0 but no
/// capability.
fn drop_capabilities() -> Result<(), Failed> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let empty = Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    };
    let data = [empty; 2];
    // SAFETY: the kernel reads a valid header and two data structs.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) };
    check(ret, Step::Capabilities, None).map(drop)
}

/// `struct landlock_path_beneath_attr`, packed as the kernel wants.
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

/// Adds the path rules (each path opened as the peer, which this child
/// now is) and enforces the ruleset.
fn enforce_landlock(plan: &LandlockPlan, ruleset: RawFd) -> Result<(), Failed> {
    for (index, (path, access)) in plan.paths.iter().enumerate() {
        // SAFETY: opens a NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        check(fd.into(), Step::LandlockPath, Some(index))?;
        // SAFETY: fstat writes into a valid struct.
        let mut stat = unsafe { std::mem::zeroed::<libc::stat>() };
        // SAFETY: fstat writes into a valid struct.
        let ret = unsafe { libc::fstat(fd, &raw mut stat) };
        let is_dir = ret == 0 && stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let rule = PathBeneath {
            allowed_access: if is_dir {
                *access
            } else {
                *access & plan.file_access
            },
            parent_fd: fd,
        };
        // SAFETY: the kernel reads a valid, packed path-beneath struct.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset,
                1 as c_int, // LANDLOCK_RULE_PATH_BENEATH
                &raw const rule,
                0 as c_uint,
            )
        };
        let failed = (ret < 0).then(|| fail(Step::Landlock, Some(index)));
        close(fd);
        if let Some(failed) = failed {
            return Err(failed);
        }
    }
    // SAFETY: plain syscall on the ruleset's fd.
    let ret = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0 as c_uint) };
    check(ret, Step::Landlock, None).map(drop)
}

/// `struct sock_fprog`.
#[repr(C)]
struct Fprog {
    len: u16,
    filter: *const libc::sock_filter,
}

fn install_seccomp(program: &SeccompProgram) -> Result<(), Failed> {
    let prog = Fprog {
        len: u16::try_from(program.filter.len()).unwrap_or(u16::MAX),
        filter: program.filter.as_ptr(),
    };
    // SAFETY: the kernel reads a valid program of `len` instructions.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as c_uint,
            &raw const prog,
        )
    };
    check(ret, Step::Seccomp, None).map(drop)
}

/// The exit reports of the pid namespaces' inits: init pid (in the
/// daemon's namespace) to the read end of its report pipe.
static INIT_REPORTS: LazyLock<Mutex<HashMap<i32, OwnedFd>>> = LazyLock::new(Default::default);

/// Remembers where the init `pid` reports its program's exit.
pub(super) fn expect_init_report(pid: i32, report: OwnedFd) {
    INIT_REPORTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pid, report);
}

/// The exact exit of the program under the init `pid`, which has been
/// reaped: what the init reported, if it is one and reported.
pub(super) fn take_init_report(pid: i32) -> Option<ExitStatus> {
    let report = INIT_REPORTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&pid)?;
    let mut bytes = [0u8; 8];
    let read = rustix::io::read(&report, &mut bytes).ok()?;
    if read != 8 {
        return None;
    }
    let [a, b, c, d, e, f, g, h] = bytes;
    let code = c_int::from_ne_bytes([a, b, c, d]);
    let status = c_int::from_ne_bytes([e, f, g, h]);
    Some(match code {
        libc::CLD_EXITED => ExitStatus::Exited(status),
        libc::CLD_DUMPED => ExitStatus::Signaled {
            signal: status,
            core_dumped: true,
        },
        _ => ExitStatus::Signaled {
            signal: status,
            core_dumped: false,
        },
    })
}

/// In a new pid namespace this child is its init (pid 1): a program run
/// as pid 1 would ignore every signal it has no handler for (`SIGTERM`
/// sent through its pidfd would do nothing). So the child forks the
/// program, and stays as a minimal init: it forwards every signal it
/// gets to the program, reaps orphans, and when the program ends writes
/// its exact exit (code or signal) to `report` and exits with its code
/// (or 128 + signal), which the daemon replaces by the report.
///
/// Returns in the program's process; never in the init's.
pub(super) fn run_init(report: RawFd, status_pipe: Option<RawFd>) -> Result<(), Failed> {
    // SAFETY: a raw fork (no CLONE_VM): glibc's fork would take locks that
    // other daemon threads may have held when this child was copied.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as c_long, 0, 0, 0, 0) };
    let program = check(pid, Step::Init, None)? as libc::pid_t;
    if program == 0 {
        close(report);
        return Ok(());
    }
    // The program's exec closes the last copy of the status pipe.
    if let Some(fd) = status_pipe {
        close(fd);
    }
    init_loop(program, report)
}

/// The init's life: see [`run_init`]. Never returns.
fn init_loop(program: libc::pid_t, report: RawFd) -> ! {
    // SAFETY: prctl with integer arguments: a program under the same uid
    // must not read this copy of the daemon's memory.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    }
    let _ = drop_capabilities();
    // SAFETY: zeroed sigset_t is valid; sigfillset fills it.
    let mut all = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    // SAFETY: valid pointers to our own sets.
    unsafe {
        libc::sigfillset(&raw mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &raw const all, ptr::null_mut());
    }
    loop {
        // SAFETY: siginfo_t is a plain C struct; zeroed is valid.
        let mut info = unsafe { std::mem::zeroed::<libc::siginfo_t>() };
        // SAFETY: waits on a valid set, writing into a valid siginfo.
        let signal = unsafe { libc::sigwaitinfo(&raw const all, &raw mut info) };
        if signal < 0 {
            continue;
        }
        if signal != libc::SIGCHLD {
            // SAFETY: plain syscall; the program may have gone already.
            unsafe { libc::kill(program, signal) };
            continue;
        }
        reap_children(program, report);
    }
}

/// Reaps every exited child; when the program is one, reports and exits.
fn reap_children(program: libc::pid_t, report: RawFd) {
    loop {
        // SAFETY: siginfo_t is a plain C struct; zeroed is valid.
        let mut info = unsafe { std::mem::zeroed::<libc::siginfo_t>() };
        // SAFETY: writes into a valid siginfo.
        let ret =
            unsafe { libc::waitid(libc::P_ALL, 0, &raw mut info, libc::WEXITED | libc::WNOHANG) };
        // SAFETY: a SIGCHLD siginfo (or zeroed), whose pid/status are valid.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if ret < 0 || pid == 0 {
            return;
        }
        if pid != program {
            continue;
        }
        let mut bytes = [0u8; 8];
        let (first, second) = bytes.split_at_mut(4);
        first.copy_from_slice(&info.si_code.to_ne_bytes());
        second.copy_from_slice(&status.to_ne_bytes());
        // SAFETY: writes 8 bytes from a valid buffer to our pipe end.
        unsafe { libc::write(report, bytes.as_ptr().cast(), bytes.len()) };
        let code = if info.si_code == libc::CLD_EXITED {
            status
        } else {
            128 + status
        };
        // SAFETY: ends the init, and with it the namespace.
        unsafe { libc::_exit(code) };
    }
}

/// The kernel's Landlock ABI version; 0 when Landlock is unavailable.
pub fn landlock_abi() -> u32 {
    // SAFETY: with LANDLOCK_CREATE_RULESET_VERSION the kernel reads no
    // attribute (NULL, size 0) and returns the version.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            ptr::null::<c_void>(),
            0usize,
            1 as c_uint, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    u32::try_from(version).unwrap_or(0)
}

/// A new, empty network namespace (only a loopback, down), made once by
/// the daemon: sandboxes with network `none` join it, which costs a
/// `setns` instead of a namespace per child.
///
/// # Errors
///
/// Without `CAP_SYS_ADMIN`, or when the thread cannot start.
pub fn empty_network_namespace() -> std::io::Result<OwnedFd> {
    // A thread of its own: unshare moves only the calling thread, which
    // then ends, leaving the namespace alive through the fd.
    std::thread::Builder::new()
        .name("zygote-netns".into())
        .spawn(|| {
            // SAFETY: plain syscall; only this short-lived thread moves.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let file = std::fs::File::open("/proc/thread-self/ns/net")?;
            Ok(OwnedFd::from(file))
        })?
        .join()
        .map_err(|_| std::io::Error::other("the network namespace thread panicked"))?
}

/// Whether an unprivileged process may create user namespaces here (what
/// a rootless daemon's sandboxes need).
pub fn user_namespaces_work() -> bool {
    let read = |path| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
    };
    read("/proc/sys/user/max_user_namespaces").is_some_and(|max| max > 0)
        && read("/proc/sys/kernel/unprivileged_userns_clone").is_none_or(|on| on == 1)
}
