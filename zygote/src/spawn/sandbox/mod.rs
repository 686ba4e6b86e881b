//! The sandbox's data for the child ([`SandboxPlan`]) and the code that
//! applies it between `clone` and `execve`.
//!
//! Sandboxed children never start on a daemon thread's vfork: resolving a
//! peer's paths can block (a FUSE mount, a stopped process's file). They
//! are vforked by a spawner process (see `Spawner::spawn_sibling`), whose
//! stall holds no daemon thread, or forked (see [`super::Spawner::start`])
//! when the spawner cannot take them: a new pid namespace, whose init
//! never execs, or a rootless daemon's. Either way the child shares or
//! copies another process's memory, so everything here is
//! async-signal-safe as in `child`: raw syscalls on data the daemon
//! prepared, no allocation.
//!
//! # Order
//!
//! As root (the daemon's ids), after the fds are placed: join the network
//! namespace, set the hostname, build the filesystem and `pivot_root`
//! into it, clear the capability bounding set. Then the credentials
//! switch (`child`). With a new pid namespace the child is its init and
//! forks the program ([`run_init`]). Then, as the peer: `chdir`,
//! `no_new_privs`, all capabilities dropped, Landlock, and seccomp last.

use std::ffi::{CStr, CString, c_int, c_long, c_uint, c_void};
use std::os::fd::{OwnedFd, RawFd};
use std::ptr;
use std::sync::Arc;

use zygote_proto::SpawnStage;

mod enter;
mod filters;
mod fs;
mod init;
pub mod libseccomp;

use filters::drop_capabilities;
pub(in crate::spawn) use filters::empty_capability_sets;
use filters::{check_inherited_landlock, clear_capability_sets, enforce_landlock, install_seccomp};

pub(in crate::spawn) use enter::Entered;
pub use fs::dev_template;
pub(in crate::spawn) use init::{expect_init_report, leave_init, park, run_init, take_init_report};

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
    /// The daemon's read-only `/dev` ([`dev_template`]) for a filesystem
    /// to clone; `None`: the child builds its own.
    pub dev_template: Option<Arc<OwnedFd>>,
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
    /// The paths of a Landlock domain the child inherits from the spawner
    /// process that vforks it ([`HeldLandlock`]), in place of the first
    /// ruleset above: each must still name, as the peer resolves it, the
    /// file the domain's rule was added on. Set only by that spawner.
    pub inherited_landlock: Vec<HeldPath>,
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
    /// The pidfd of a parked init ([`super::Spawner::park_sibling`]) made
    /// for this very plan: the child enters its namespaces, root included,
    /// instead of making its own. Only a spawner process starts such a child (see
    /// `Entered`).
    pub enter: Option<Arc<OwnedFd>>,
    /// Build the filesystem as a template for parked inits: the binds and
    /// `/dev` only (the tmpfs and proc mounts' destinations made, not
    /// mounted), no `/proc`, no devpts.
    pub build_template: bool,
    /// The pidfd of a process whose mount namespace holds the template
    /// built for this very plan ([`SandboxPlan::build_template`]): the
    /// child copies that namespace (`setns`, then `unshare`) and mounts
    /// only its own tmpfs, proc and devpts instances, instead of building
    /// the whole root.
    pub mount_template: Option<Arc<OwnedFd>>,
}

impl SandboxPlan {
    /// Whether a vforked child (a spawner's) can set it up: not one with a
    /// new pid namespace, whose child is an init that never execs and
    /// would hold the vfork for its whole life, nor one with a user
    /// namespace (a rootless daemon's, which has no spawners).
    pub fn suits_vfork(&self) -> bool {
        if self.enter.is_some() {
            return self.map_ids.is_none();
        }
        self.clone_flags & (libc::CLONE_NEWPID | libc::CLONE_NEWUSER) == 0
            && self.map_ids.is_none()
            && !self.fresh_proc
    }

    /// The `CLONE_NEW*` flags the child is cloned with: none when it
    /// enters a parked init's namespaces.
    pub fn namespaces_to_make(&self) -> c_int {
        if self.enter.is_some() {
            0
        } else if self.mount_template.is_some() {
            // Its mount namespace is a copy of the template's, made after.
            self.clone_flags & !libc::CLONE_NEWNS
        } else {
            self.clone_flags
        }
    }

    /// The namespaces a child entering a parked init joins: those the
    /// init made, and the network namespace it joined.
    fn namespaces_to_enter(&self) -> c_int {
        let made = libc::CLONE_NEWNS
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWNET;
        let joined = if self.netns.is_some() {
            libc::CLONE_NEWNET
        } else {
            0
        };
        (self.clone_flags & made) | joined
    }
}

/// One mount of a sandbox's filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// A fingerprint of the rules, set on a policy profile's ruleset: a
    /// spawner process may then hold them, enforced on itself, for its
    /// children to inherit ([`HeldLandlock`]).
    pub held: Option<u64>,
}

/// A Landlock path rule's file, as it was when a domain was built on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPath {
    /// The path, as the rule names it.
    pub path: CString,
    /// The file's device number.
    pub dev: u64,
    /// The file's inode number.
    pub ino: u64,
}

/// A Landlock domain a spawner process enforced on itself, which each of
/// its children inherits at clone instead of building and enforcing its
/// own (~20 µs less per child here). Landlock binds a rule to the file a
/// path named when the rule was added, so before each child the spawner
/// checks that every path still names that file
/// ([`HeldLandlock::still_names_its_files`]), and the child checks again
/// as the peer ([`SandboxPlan::inherited_landlock`]): a path out of the
/// peer's reach fails the spawn by name, as without a held domain.
#[derive(Debug)]
pub struct HeldLandlock {
    paths: Vec<HeldPath>,
    access: Vec<u64>,
}

impl HeldLandlock {
    /// Adds `plan`'s path rules to its ruleset and enforces it on the
    /// calling process, for good: every process it creates afterwards is
    /// confined by it. Call it with no thread besides the caller's.
    ///
    /// # Errors
    ///
    /// The step's errno (a path that does not resolve, a kernel that
    /// refuses); nothing is enforced then.
    pub fn hold(plan: &LandlockPlan) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        let mut paths = Vec::with_capacity(plan.paths.len());
        filters::add_path_rules(plan, plan.ruleset.as_raw_fd(), 0, |path, stat| {
            if let Some(stat) = stat {
                paths.push(HeldPath {
                    path: path.to_owned(),
                    dev: stat.st_dev,
                    ino: stat.st_ino,
                });
            }
        })
        .map_err(|(_, errno, _)| std::io::Error::from_raw_os_error(errno))?;
        // A path whose file could not be told: it could not be checked.
        if paths.len() != plan.paths.len() {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        filters::restrict_self(plan.ruleset.as_raw_fd())
            .map_err(|(_, errno, _)| std::io::Error::from_raw_os_error(errno))?;
        Ok(Self {
            paths,
            access: plan.paths.iter().map(|(_, access)| *access).collect(),
        })
    }

    /// Whether `plan` has the very rules held (the same paths and rights).
    pub fn holds(&self, plan: &LandlockPlan) -> bool {
        self.paths.len() == plan.paths.len()
            && self
                .paths
                .iter()
                .zip(&self.access)
                .zip(&plan.paths)
                .all(|((held, access), (path, wanted))| held.path == *path && access == wanted)
    }

    /// Whether each path still names the file its rule was added on.
    pub fn still_names_its_files(&self) -> bool {
        self.paths.iter().all(|held| {
            filters::identity(&held.path).is_ok_and(|found| found == (held.dev, held.ino))
        })
    }

    /// The paths, for a child to check as the peer.
    pub fn paths(&self) -> &[HeldPath] {
        &self.paths
    }
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
    pub fn pack(failure: Option<Self>) -> u16 {
        failure.map_or(0, |failure| {
            u16::from(failure.step as u8) << 8 | u16::from(failure.item.map_or(0xff, |item| item))
        })
    }

    /// Reverses [`SandboxFailure::pack`].
    pub fn unpack(bits: u16) -> Option<Self> {
        let [step, item] = bits.to_be_bytes();
        Some(Self {
            step: Step::from_u8(step)?,
            item: (item != 0xff).then_some(item),
        })
    }
}

/// A failed step in the child: the stage's errno plus the sandbox detail.
pub(super) type Failed = (SpawnStage, c_int, Option<SandboxFailure>);

pub(super) fn fail(step: Step, item: Option<usize>) -> Failed {
    let item = item.and_then(|item| u8::try_from(item).ok());
    (SANDBOX_STAGE, errno(), Some(SandboxFailure { step, item }))
}

pub(super) fn check(ret: c_long, step: Step, item: Option<usize>) -> Result<c_long, Failed> {
    if ret < 0 {
        Err(fail(step, item))
    } else {
        Ok(ret)
    }
}

pub(super) fn errno() -> c_int {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

pub(super) fn close(fd: c_int) {
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
    /// The namespaces of the thread that cloned the child.
    pub(super) parent: ParentNamespaces,
}

/// A namespace's identity: the device and inode of its `/proc` link.
type NamespaceId = (u64, u64);

/// The mount and uts namespaces of the thread that clones a sandboxed
/// child, read before `clone`. The child checks that it is in others
/// before it mounts anything or sets a hostname: a wrong clone flag must
/// fail the spawn, never mount over the host's `/tmp`, pivot the host's
/// root or rename the host.
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::spawn) struct ParentNamespaces {
    mount: Option<NamespaceId>,
    uts: Option<NamespaceId>,
}

const OWN_MOUNT_NAMESPACE: &CStr = c"/proc/thread-self/ns/mnt";
const OWN_UTS_NAMESPACE: &CStr = c"/proc/thread-self/ns/uts";

impl ParentNamespaces {
    /// This thread's, those `plan` will check (none for a sandbox that
    /// neither mounts nor sets a hostname); runs in the parent.
    pub(in crate::spawn) fn of_this_thread(plan: &SandboxPlan) -> Self {
        if plan.enter.is_some() {
            // It makes no namespace, and mounts nothing.
            return Self::default();
        }
        let mounts = plan.filesystem.is_some() || plan.fresh_proc;
        Self {
            mount: mounts.then(|| namespace_id(OWN_MOUNT_NAMESPACE)).flatten(),
            uts: plan
                .hostname
                .as_ref()
                .and_then(|_| namespace_id(OWN_UTS_NAMESPACE)),
        }
    }
}

fn namespace_id(link: &CStr) -> Option<NamespaceId> {
    // SAFETY: all-zero bytes are a valid `stat`, which the call fills from
    // a NUL-terminated path; async-signal-safe.
    let mut stat = unsafe { std::mem::zeroed::<libc::stat>() };
    // SAFETY: as above.
    let ret = unsafe { libc::stat(link.as_ptr(), &raw mut stat) };
    (ret == 0).then_some((stat.st_dev, stat.st_ino))
}

/// Fails `step` unless this child's namespace behind `link` is not its
/// parent's (`EPERM`; also when either cannot be read).
fn in_own_namespace(link: &CStr, parent: Option<NamespaceId>, step: Step) -> Result<(), Failed> {
    match (parent, namespace_id(link)) {
        (Some(parent), Some(own)) if parent != own => Ok(()),
        _ => Err((
            SANDBOX_STAGE,
            libc::EPERM,
            Some(SandboxFailure { step, item: None }),
        )),
    }
}

/// Copies of the plan's fds above every target of the child (`floor`),
/// which the child's closing of other fds leaves open: the network
/// namespace, the `/dev` template and the mount template, each only when
/// there is one, then each Landlock ruleset ([`SandboxFds`]).
///
/// # Errors
///
/// When an fd cannot be duplicated.
pub(super) fn copy_fds(plan: &SandboxPlan, floor: RawFd) -> rustix::io::Result<Vec<OwnedFd>> {
    let netns = plan.netns.iter().map(|fd| &**fd);
    let dev = plan.dev_template.iter().map(|fd| &**fd);
    let template = plan.mount_template.iter().map(|fd| &**fd);
    let rulesets = plan.landlock.iter().map(|landlock| &landlock.ruleset);
    netns
        .chain(dev)
        .chain(template)
        .chain(rulesets)
        .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, floor))
        .collect()
}

/// The child's copies of the plan's fds, as [`copy_fds`] lays them out.
struct SandboxFds<'a> {
    netns: Option<RawFd>,
    dev_template: Option<RawFd>,
    mount_template: Option<RawFd>,
    rulesets: &'a [RawFd],
}

impl<'a> SandboxFds<'a> {
    fn of(plan: &SandboxPlan, fds: &'a [RawFd]) -> Self {
        let mut rest = fds;
        let mut next = |present: bool| {
            let (first, others) = rest.split_first()?;
            if !present {
                return None;
            }
            rest = others;
            Some(*first)
        };
        let netns = next(plan.netns.is_some());
        let dev_template = next(plan.dev_template.is_some());
        let mount_template = next(plan.mount_template.is_some());
        Self {
            netns,
            dev_template,
            mount_template,
            rulesets: rest,
        }
    }
}

/// The steps taken with the daemon's privileges, before the credentials
/// switch.
pub(super) fn before_credentials(plan: &SandboxPlan, peer: &Peer<'_>) -> Result<(), Failed> {
    if plan.enter.is_some() {
        // The parked init made the namespaces and the root it entered.
        if plan.clear_bounding_set {
            clear_capability_sets()?;
        }
        return Ok(());
    }
    if let Some((uid, gid)) = plan.map_ids {
        map_ids(uid, gid)?;
    }
    let fds = SandboxFds::of(plan, peer.fds);
    if plan.netns.is_some() {
        let netns = fds.netns.unwrap_or(-1);
        // SAFETY: plain syscall on an fd kept open for us.
        let ret = unsafe { libc::setns(netns, libc::CLONE_NEWNET) };
        check(ret.into(), Step::Network, None)?;
    }
    if let Some(hostname) = &plan.hostname {
        in_own_namespace(OWN_UTS_NAMESPACE, peer.parent.uts, Step::Hostname)?;
        // SAFETY: the kernel reads `len` bytes from a valid slice.
        let ret = unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) };
        check(ret.into(), Step::Hostname, None)?;
    }
    if let (Some(mounts), Some(template)) = (&plan.filesystem, fds.mount_template) {
        fs::copy_template(template, mounts)?;
    } else if plan.filesystem.is_some() || plan.fresh_proc {
        in_own_namespace(OWN_MOUNT_NAMESPACE, peer.parent.mount, Step::Propagation)?;
    }
    if plan.mount_template.is_some() {
        // Copied above.
    } else if let Some(mounts) = &plan.filesystem {
        let part = if plan.build_template {
            fs::Part::Template
        } else {
            fs::Part::Whole
        };
        fs::build_root(mounts, peer, fds.dev_template, part)?;
    } else if plan.fresh_proc {
        fs::remount_proc()?;
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
    check_inherited_landlock(&plan.inherited_landlock)?;
    // Failures name a path by its index among every ruleset's paths.
    let mut first_path = plan.inherited_landlock.len();
    let rulesets = SandboxFds::of(plan, fds).rulesets;
    for (landlock, ruleset) in plan.landlock.iter().zip(rulesets) {
        enforce_landlock(landlock, *ruleset, first_path)?;
        first_path += landlock.paths.len();
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

/// Installs `program` on the calling thread (a spawner process's only
/// one), whose later children inherit it.
///
/// # Errors
///
/// The errno of `seccomp(2)`: `EACCES` without `CAP_SYS_ADMIN` or
/// `no_new_privs`, `EINVAL` for a program the kernel refuses.
pub fn install_seccomp_filter(program: &SeccompProgram) -> std::io::Result<()> {
    install_seccomp(program).map_err(|(_, errno, _)| std::io::Error::from_raw_os_error(errno))
}

/// Confines the calling thread as every sandboxed child is before its
/// seccomp filter: `no_new_privs`, the capability bounding and ambient
/// sets cleared; its effective capabilities stay. For a process whose
/// every child is sandboxed (root's spawner, or one holding a profile):
/// its children inherit this at clone instead of paying for it each (the
/// bounding set is dropped one capability at a time, ~50 µs per child).
///
/// # Errors
///
/// The errno of the `prctl` that failed (`EPERM` without
/// `CAP_SETPCAP`).
pub fn confine_like_a_sandboxed_child() -> std::io::Result<()> {
    let errno_of = |(_, errno, _): Failed| std::io::Error::from_raw_os_error(errno);
    // SAFETY: plain prctl with integer arguments.
    let ret = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    check(ret.into(), Step::NoNewPrivs, None).map_err(errno_of)?;
    clear_capability_sets().map_err(errno_of)
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

#[cfg(test)]
mod tests {
    use super::{OWN_MOUNT_NAMESPACE, SandboxFailure, Step, in_own_namespace, namespace_id};

    #[test]
    fn a_child_must_be_in_a_namespace_of_its_own() {
        let this = namespace_id(OWN_MOUNT_NAMESPACE).expect("our mount namespace");
        let shared = in_own_namespace(OWN_MOUNT_NAMESPACE, Some(this), Step::Propagation);
        let refused = Some(SandboxFailure {
            step: Step::Propagation,
            item: None,
        });
        assert_eq!(shared, Err((super::SANDBOX_STAGE, libc::EPERM, refused)));
        let unknown = in_own_namespace(OWN_MOUNT_NAMESPACE, None, Step::Propagation);
        assert_eq!(unknown, Err((super::SANDBOX_STAGE, libc::EPERM, refused)));
        let other = (this.0, this.1 + 1);
        assert_eq!(
            in_own_namespace(OWN_MOUNT_NAMESPACE, Some(other), Step::Propagation),
            Ok(())
        );
    }
}
