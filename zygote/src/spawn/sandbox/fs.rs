//! The sandbox's filesystem: every bind source resolved as the peer, a
//! tmpfs root built from the mounts, a minimal `/dev`, a fresh `/proc`,
//! then `pivot_root`. Async-signal-safe, as the rest of the child's code.

use std::ffi::{CStr, c_int, c_long, c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use super::{
    Failed, MAX_MOUNTS, Mount, MountKind, Peer, SANDBOX_STAGE, SandboxFailure, Step, check, close,
    errno, fail,
};

/// Mounts a fresh procfs of the child's pid namespace over `/proc`, in
/// its own mount namespace, made private first.
pub(super) fn remount_proc() -> Result<(), Failed> {
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

/// Which mounts of a filesystem a step makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// All of them: a root of its own.
    Whole,
    /// Those a template's copies share: the binds and `/dev`; the other
    /// mounts' destinations are made, for [`Part::Own`].
    Template,
    /// Those each copy of a template makes: the tmpfs and proc mounts,
    /// `/proc`, and a devpts instance.
    Own,
}

impl Part {
    fn makes(self, kind: MountKind) -> bool {
        let shared = matches!(kind, MountKind::ReadOnlyBind | MountKind::Bind);
        match self {
            Self::Whole => true,
            Self::Template => shared,
            Self::Own => !shared,
        }
    }
}

/// Builds the new root on a tmpfs, read-only, and pivots into it (all of
/// it, or a template's part).
///
/// Every bind source is resolved (as the peer) and copied into a detached
/// tree first, before anything is mounted over the host's paths (the
/// staging tmpfs covers `/tmp`, where a source may be).
pub(super) fn build_root(
    mounts: &[Mount],
    peer: &Peer<'_>,
    dev_template: Option<c_int>,
    part: Part,
) -> Result<(), Failed> {
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
        let built = mount_all(root, mounts, &trees, part);
        let built = built.and_then(|()| make_dev(root, dev_template, part));
        // Nothing is written to the root itself: a template's copies share
        // its tmpfs.
        let built = built.and_then(|()| {
            check(
                set_attributes(root, libc::MOUNT_ATTR_RDONLY, 0),
                Step::Root,
                None,
            )
            .map(drop)
        });
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
            let tree = clone_tree(source, bind_attributes(mount.kind), index);
            close(source);
            *slot = tree?;
        }
    }
    Ok(())
}

/// Copies the mount namespace of the process `template` (a template
/// built for this plan, [`Part::Template`]) as this child's own, and
/// mounts its [`Part::Own`] in the copy.
pub(super) fn copy_template(template: c_int, mounts: &[Mount]) -> Result<(), Failed> {
    // SAFETY: plain syscall on a pidfd kept open for us.
    let ret = unsafe { libc::setns(template, libc::CLONE_NEWNS) };
    check(ret.into(), Step::Root, None)?;
    // Never mount in the template itself: the copy, or nothing. (Its
    // success is the proof: the template has no `/proc` to compare
    // namespaces by.)
    // SAFETY: plain syscall.
    let ret = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    check(ret.into(), Step::Root, None)?;
    // SAFETY: opens a NUL-terminated path.
    let root = unsafe {
        libc::open(
            c"/".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    let root = check(root.into(), Step::Root, None)? as c_int;
    let trees = [-1; MAX_MOUNTS];
    let mounted = mount_all(root, mounts, &trees, Part::Own);
    close(root);
    mounted?;
    devpts(c"/dev/pts")?;
    // SAFETY: a NUL-terminated path.
    check(
        unsafe { libc::chdir(c"/".as_ptr()) }.into(),
        Step::Root,
        None,
    )
    .map(drop)
}

fn mount_all(
    root: c_int,
    mounts: &[Mount],
    trees: &[c_int; MAX_MOUNTS],
    part: Part,
) -> Result<(), Failed> {
    for ((index, mount), tree) in mounts.iter().enumerate().zip(trees) {
        if !part.makes(mount.kind) {
            if part == Part::Template {
                // Made now: a copy's root is read-only.
                close(open_destination(root, &mount.destination, true, index)?);
            }
            continue;
        }
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
                let fresh = new_fs(fstype, None, index)?;
                let attached = attach(fresh, root, &mount.destination, index);
                close(fresh);
                attached
            }
        };
        attached?;
    }
    if part == Part::Template {
        // Each copy mounts its own, of its pid namespace.
        close(open_destination(root, c"proc", true, mounts.len())?);
        return Ok(());
    }
    // A fresh /proc always: of the new pid namespace when there is one
    // (this child is its init), else of the host's, as the peer sees it.
    let proc = new_fs(c"proc", None, mounts.len())?;
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

/// The attributes of a bind of `kind`: never suid or device files, and
/// read-only when asked.
fn bind_attributes(kind: MountKind) -> u64 {
    let set = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if kind == MountKind::ReadOnlyBind {
        set | libc::MOUNT_ATTR_RDONLY
    } else {
        set
    }
}

/// A detached copy of the tree at `source`, with the attributes `set`.
fn clone_tree(source: c_int, set: u64, index: usize) -> Result<c_int, Failed> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as c_uint;
    // SAFETY: an fd and an empty NUL-terminated path.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, source, c"".as_ptr(), flags) };
    let tree = check(tree, Step::Mount, Some(index))? as c_int;
    if set == 0 {
        return Ok(tree);
    }
    if set_attributes(tree, set, libc::AT_RECURSIVE) < 0 {
        let failed = fail(Step::Mount, Some(index));
        close(tree);
        return Err(failed);
    }
    Ok(tree)
}

/// A new detached mount of `fstype` (tmpfs or proc), nosuid and nodev,
/// its root of `mode` when given (a tmpfs's is 1777 otherwise).
fn new_fs(fstype: &CStr, mode: Option<&CStr>, index: usize) -> Result<c_int, Failed> {
    // SAFETY: a NUL-terminated name.
    let context = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), libc::FSOPEN_CLOEXEC) };
    let context = check(context, Step::Mount, Some(index))? as c_int;
    if let Some(mode) = mode {
        // SAFETY: NUL-terminated key and value.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                context,
                libc::FSCONFIG_SET_STRING,
                c"mode".as_ptr(),
                mode.as_ptr(),
                0,
            )
        };
        if ret < 0 {
            let failed = fail(Step::Mount, Some(index));
            close(context);
            return Err(failed);
        }
    }
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
        // Not made (a read-only root's copy already has it, or it fails
        // below): the error to report if it cannot be opened either.
        let not_made = (created < 0 && errno() != libc::EEXIST).then(errno);
        let mut flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        if !last || is_dir {
            flags |= libc::O_DIRECTORY;
        }
        // SAFETY: a NUL-terminated component under an fd we own.
        let next = unsafe { libc::openat(current, name, flags) };
        let failed = (next < 0).then(|| {
            let (stage, opened, failure) = fail(Step::Destination, Some(index));
            (stage, not_made.unwrap_or(opened), failure)
        });
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

/// The mode of `/dev`: not sticky and world-writable (1777, a tmpfs's
/// default), where the kernel refuses to open for writing, with
/// `O_CREAT` as a shell's `>` does, a device node owned by another uid
/// than the directory: every node in a rootless sandbox's `/dev`.
const DEV_MODE: &CStr = c"0755";

/// The links of the minimal `/dev`: (target, name).
const DEV_LINKS: [(&CStr, &CStr); 5] = [
    (c"pts/ptmx", c"ptmx"),
    (c"/proc/self/fd", c"fd"),
    (c"/proc/self/fd/0", c"stdin"),
    (c"/proc/self/fd/1", c"stdout"),
    (c"/proc/self/fd/2", c"stderr"),
];

/// The minimal `/dev` as a detached, read-only tree, built once by the
/// daemon: a sandbox clones it whole instead of binding each device in
/// turn (about a fifth of a sandbox's filesystem work). Its tmpfs is
/// shared by every clone, hence read-only; each sandbox still mounts a
/// devpts instance of its own over `pts`.
///
/// # Errors
///
/// Without `CAP_SYS_ADMIN`, or on a kernel that cannot mount into a
/// detached tree; sandboxes then build their `/dev` themselves.
pub fn dev_template() -> std::io::Result<OwnedFd> {
    let io_error = |(_, errno, _): Failed| std::io::Error::from_raw_os_error(errno);
    let dev = new_fs(c"tmpfs", Some(DEV_MODE), 0).map_err(io_error)?;
    // SAFETY: `dev` is an fd this function just opened and owns.
    let dev = unsafe { OwnedFd::from_raw_fd(dev) };
    fill_dev(dev.as_raw_fd()).map_err(io_error)?;
    read_only(dev.as_raw_fd()).map_err(io_error)?;
    Ok(dev)
}

/// Makes the mount tree at `tree` read-only.
fn read_only(tree: c_int) -> Result<(), Failed> {
    check(
        set_attributes(tree, libc::MOUNT_ATTR_RDONLY, libc::AT_RECURSIVE),
        Step::Dev,
        None,
    )
    .map(drop)
}

/// `mount_setattr` setting `set` on the mount at `tree`, and with
/// `AT_RECURSIVE` in `recursive` on all below it; its return.
fn set_attributes(tree: c_int, set: u64, recursive: c_int) -> c_long {
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the kernel reads a valid mount_attr of the given size.
    unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | recursive,
            &raw const attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    }
}

/// The device nodes, `pts` and the links, in the `/dev` directory `dev`.
fn fill_dev(dev: c_int) -> Result<(), Failed> {
    let dev_failed = || fail(Step::Dev, None);
    for (index, name) in DEVICES.iter().enumerate() {
        let mut path = [0u8; 32];
        let host = join(b"/dev/", name.to_bytes(), &mut path);
        // SAFETY: a NUL-terminated path the daemon trusts (the host's /dev).
        let node = unsafe { libc::open(host.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if node < 0 {
            continue; // a host without it gives none
        }
        // A device node's bind must allow devices: `nodev` would refuse
        // every open of it.
        let tree = clone_tree(
            node,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
            index,
        );
        close(node);
        let tree = tree.map_err(|_| dev_failed())?;
        let attached = attach(tree, dev, name, index);
        close(tree);
        attached.map_err(|_| dev_failed())?;
    }
    // SAFETY: a NUL-terminated name under an fd we own.
    let ret = unsafe { libc::mkdirat(dev, c"pts".as_ptr(), 0o755) };
    check(ret.into(), Step::Dev, None)?;
    for (target, link) in DEV_LINKS {
        // SAFETY: NUL-terminated strings under an fd we own.
        let ret = unsafe { libc::symlinkat(target.as_ptr(), dev, link.as_ptr()) };
        check(ret.into(), Step::Dev, None)?;
    }
    Ok(())
}

/// A `/dev` at `dev` under `root`: a clone of the daemon's `template`
/// when there is one and the kernel clones it, else built here; then a
/// private devpts over its `pts`.
fn make_dev(root: c_int, template: Option<c_int>, part: Part) -> Result<(), Failed> {
    let dev_failed = || fail(Step::Dev, None);
    let cloned = match template {
        Some(template) => match clone_tree(template, 0, 0) {
            Ok(tree) => {
                let attached = attach(tree, root, c"dev", 0);
                close(tree);
                attached.map_err(|_| dev_failed())?;
                true
            }
            // A kernel that cannot clone a detached tree from here.
            Err((_, libc::EINVAL, _)) => false,
            Err(_) => return Err(dev_failed()),
        },
        None => false,
    };
    if !cloned {
        let dev = new_fs(c"tmpfs", Some(DEV_MODE), 0).map_err(|_| dev_failed())?;
        let attached = attach(dev, root, c"dev", 0);
        close(dev);
        attached.map_err(|_| dev_failed())?;
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated name under an fd we own.
        let dev = unsafe { libc::openat(root, c"dev".as_ptr(), flags) };
        let dev = check(dev.into(), Step::Dev, None)? as c_int;
        // Read-only as a template's clone is.
        let filled = fill_dev(dev).and_then(|()| read_only(dev));
        close(dev);
        filled?;
    }
    if part == Part::Template {
        // Each copy mounts its own.
        return Ok(());
    }
    let mut path = [0u8; 32];
    devpts(join(STAGING.to_bytes(), b"/dev/pts", &mut path))
}

/// A private devpts instance at `target`, for terminals made inside.
fn devpts(target: &CStr) -> Result<(), Failed> {
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
