//! Entering a parked init's namespaces from a spawner process, for the
//! one clone of the child that runs in them, and coming back after.

use std::ffi::{CStr, c_int};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use super::{MAX_MOUNTS, Mount, MountKind, SandboxPlan};

/// This process's own namespaces, root and working directory, opened the
/// first time it enters a parked init's: where it comes back to.
struct Home {
    namespaces: Vec<(OwnedFd, c_int)>,
    root: OwnedFd,
    cwd: OwnedFd,
}

static HOME: OnceLock<Result<Home, c_int>> = OnceLock::new();

const NAMESPACES: [(&CStr, c_int); 5] = [
    (c"/proc/self/ns/mnt", libc::CLONE_NEWNS),
    // The active one: joining it sets where children start back to it.
    (c"/proc/self/ns/pid", libc::CLONE_NEWPID),
    (c"/proc/self/ns/ipc", libc::CLONE_NEWIPC),
    (c"/proc/self/ns/uts", libc::CLONE_NEWUTS),
    (c"/proc/self/ns/net", libc::CLONE_NEWNET),
];

fn open(path: &CStr, flags: c_int) -> Result<OwnedFd, c_int> {
    // SAFETY: opens a NUL-terminated path; the fd is owned from here.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(super::errno());
    }
    // SAFETY: a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn home() -> Result<&'static Home, c_int> {
    HOME.get_or_init(|| {
        let namespaces = NAMESPACES
            .iter()
            .map(|(path, kind)| Ok((open(path, libc::O_RDONLY)?, *kind)))
            .collect::<Result<Vec<_>, c_int>>()?;
        Ok(Home {
            namespaces,
            root: open(c"/", libc::O_PATH | libc::O_DIRECTORY)?,
            cwd: open(c".", libc::O_PATH | libc::O_DIRECTORY)?,
        })
    })
    .as_ref()
    .map_err(|errno| *errno)
}

/// Inside a parked init's namespaces (the pid namespace: for the children
/// started meanwhile) until dropped. Dropping comes back to this
/// process's own, or ends the process where it cannot: a spawner must
/// never start another child in a namespace made for one peer's plan.
#[derive(Debug)]
pub(in crate::spawn) struct Entered(());

impl Entered {
    /// Enters the namespaces of the init `plan` names, if it names one.
    /// Needs a single-threaded caller (`setns` of a mount namespace) with
    /// `CAP_SYS_ADMIN` and `CAP_SYS_CHROOT`.
    ///
    /// # Errors
    ///
    /// The errno of opening this process's own namespaces, or of `setns`
    /// (which changes nothing when it fails): `ESRCH` when the init has
    /// ended. `ESTALE` when a bind source names another file than the
    /// one bound (replaced since): the plan must make its own.
    ///
    /// A plan that copies a mount template instead (its child does) is
    /// checked the same way, in the template's mount namespace, and
    /// leaves this process in its own; any failure there is `ESTALE`.
    pub(in crate::spawn) fn enter(plan: &SandboxPlan) -> Result<Option<Self>, c_int> {
        let mounts = plan.filesystem.as_deref().unwrap_or(&[]);
        match (&plan.enter, &plan.mount_template) {
            (Some(init), _) => Self::checked(init, plan.namespaces_to_enter(), mounts).map(Some),
            // Back home at once. Whatever stops the check leaves the
            // template unused: the spawn builds its own root instead.
            (None, Some(template)) => Self::checked(template, libc::CLONE_NEWNS, mounts)
                .map(|_| None)
                .map_err(|_| libc::ESTALE),
            (None, None) => Ok(None),
        }
    }

    /// Joins the `namespaces` of the process `made` (an init, or a mount
    /// template's), once each bind of `mounts` a program would see there
    /// is what its source names now.
    fn checked(made: &OwnedFd, namespaces: c_int, mounts: &[Mount]) -> Result<Self, c_int> {
        home()?;
        let mut sources = [None; MAX_MOUNTS];
        for (index, slot) in sources.iter_mut().enumerate() {
            if let Some(mount) = seen_bind(mounts, index) {
                *slot = Some(identity(&mount.source, true).ok_or(libc::ESTALE)?);
            }
        }
        // SAFETY: plain syscall on a pidfd we hold.
        if unsafe { libc::setns(made.as_raw_fd(), namespaces) } != 0 {
            return Err(super::errno());
        }
        // Dropped, comes back home.
        let entered = Self(());
        for (index, source) in sources.iter().enumerate() {
            let Some(source) = source else { continue };
            let Some(mount) = mounts.get(index) else {
                continue;
            };
            // Relative: from the root `setns` moved us to.
            if identity(&mount.destination, false) != Some(*source) {
                return Err(libc::ESTALE);
            }
        }
        Ok(entered)
    }
}

/// The bind at `index` in `mounts`, if a program inside sees it: one
/// that no later mount (nor `/dev` or `/proc`, mounted after all) covers
/// at its destination or above.
fn seen_bind(mounts: &[Mount], index: usize) -> Option<&Mount> {
    let mount = mounts.get(index)?;
    if !matches!(mount.kind, MountKind::ReadOnlyBind | MountKind::Bind) {
        return None;
    }
    let destination = mount.destination.to_bytes();
    let covers = |over: &[u8]| {
        destination.starts_with(over) && matches!(destination.get(over.len()), None | Some(b'/'))
    };
    let covered = mounts
        .iter()
        .skip(index + 1)
        .any(|later| covers(later.destination.to_bytes()))
        || covers(b"dev")
        || covers(b"proc");
    (!covered).then_some(mount)
}

/// The device and inode of the file at `path`, following a final symlink
/// when `follow` (a bind source's is followed when it is bound).
fn identity(path: &CStr, follow: bool) -> Option<(u64, u64)> {
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: all-zero bytes are a valid `stat`, which the call fills
    // from a NUL-terminated path.
    let mut stat = unsafe { std::mem::zeroed::<libc::stat>() };
    // SAFETY: as above.
    let ret = unsafe { libc::fstatat(libc::AT_FDCWD, path.as_ptr(), &raw mut stat, flags) };
    (ret == 0).then_some((stat.st_dev, stat.st_ino))
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Err(errno) = come_home() {
            eprintln!(
                "zygote: cannot leave a sandbox's namespaces ({}); stopping",
                crate::strerror(errno)
            );
            // SAFETY: ends this single-threaded process at once.
            unsafe { libc::_exit(70) };
        }
    }
}

fn come_home() -> Result<(), c_int> {
    let home = home()?;
    let check = |ret: c_int| {
        if ret == 0 {
            Ok(())
        } else {
            Err(super::errno())
        }
    };
    for (namespace, kind) in &home.namespaces {
        // SAFETY: plain syscall on a namespace fd we hold.
        check(unsafe { libc::setns(namespace.as_raw_fd(), *kind) })?;
    }
    // Joining a mount namespace moved the root and working directory to
    // its root: back to those this process had.
    // SAFETY: plain syscalls on O_PATH directory fds we hold, and a
    // NUL-terminated path.
    unsafe {
        check(libc::fchdir(home.root.as_raw_fd()))?;
        check(libc::chroot(c".".as_ptr()))?;
        check(libc::fchdir(home.cwd.as_raw_fd()))
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use super::{Mount, MountKind, seen_bind};

    fn mount(kind: MountKind, destination: &str) -> Mount {
        Mount {
            kind,
            source: CString::new(format!("/{destination}")).unwrap(),
            destination: CString::new(destination).unwrap(),
        }
    }

    /// A bind is checked only where the program sees it: not under a
    /// later mount at its destination or above, nor under /dev or /proc.
    #[test]
    fn only_the_binds_a_program_sees_are_checked() {
        use MountKind::{Bind, ReadOnlyBind, Tmpfs};
        let mounts = [
            mount(ReadOnlyBind, "usr"),
            mount(Bind, "work"),
            mount(Tmpfs, "work"),
            mount(Bind, "data/in"),
            mount(ReadOnlyBind, "data"),
            mount(Bind, "dev/shm"),
            mount(Bind, "proc2"),
            mount(Tmpfs, "tmp"),
        ];
        let seen: Vec<usize> = (0..mounts.len())
            .filter(|index| seen_bind(&mounts, *index).is_some())
            .collect();
        assert_eq!(seen, [0, 4, 6]);
    }
}
