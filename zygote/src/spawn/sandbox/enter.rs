//! Entering a parked init's namespaces from a spawner process, for the
//! one clone of the child that runs in them, and coming back after.

use std::ffi::{CStr, c_int};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use super::SandboxPlan;

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
    /// (which changes nothing when it fails).
    pub(in crate::spawn) fn enter(plan: &SandboxPlan) -> Result<Option<Self>, c_int> {
        let Some(init) = &plan.enter else {
            return Ok(None);
        };
        home()?;
        // SAFETY: plain syscall on a pidfd we hold.
        if unsafe { libc::setns(init.as_raw_fd(), plan.namespaces_to_enter()) } != 0 {
            return Err(super::errno());
        }
        Ok(Some(Self(())))
    }
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
