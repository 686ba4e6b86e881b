//! The child's own restrictions, applied last: the capability sets,
//! Landlock's path rules and enforcement, the seccomp filter.

use std::ffi::{CStr, c_int, c_long, c_uint};
use std::os::fd::RawFd;

use super::{Failed, HeldPath, LandlockPlan, SeccompProgram, Step, check, close, errno, fail};

/// Clears the capability bounding set and the ambient set, while the
/// child still has `CAP_SETPCAP`: nothing it execs can regain a
/// capability, setuid binaries included.
pub(super) fn clear_capability_sets() -> Result<(), Failed> {
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
pub(super) fn drop_capabilities() -> Result<(), Failed> {
    check(empty_capability_sets(), Step::Capabilities, None).map(drop)
}

/// Empties this thread's effective, permitted and inheritable sets
/// (`capset`); the syscall's return value.
pub(in crate::spawn) fn empty_capability_sets() -> c_long {
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
    unsafe { libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) }
}

/// `struct landlock_path_beneath_attr`, packed as the kernel wants.
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

/// Adds the path rules (each path opened as the peer, which this child
/// now is) and enforces the ruleset. `first_path`: the index of the
/// ruleset's first path among every ruleset's, for a failure's report.
pub(super) fn enforce_landlock(
    plan: &LandlockPlan,
    ruleset: RawFd,
    first_path: usize,
) -> Result<(), Failed> {
    add_path_rules(plan, ruleset, first_path, |_, _| {})?;
    restrict_self(ruleset)
}

/// Opens each of `plan`'s paths and adds its rule to `ruleset`, calling
/// `added` with the path and what it names (`None` if `fstat` failed).
pub(super) fn add_path_rules(
    plan: &LandlockPlan,
    ruleset: RawFd,
    first_path: usize,
    mut added: impl FnMut(&CStr, Option<&libc::stat>),
) -> Result<(), Failed> {
    for (index, (path, access)) in plan.paths.iter().enumerate() {
        let item = Some(first_path + index);
        // SAFETY: opens a NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        check(fd.into(), Step::LandlockPath, item)?;
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
        let failed = (ret < 0).then(|| fail(Step::Landlock, item));
        close(fd);
        if let Some(failed) = failed {
            return Err(failed);
        }
        added(path, (ret == 0).then_some(&stat));
    }
    Ok(())
}

/// Enforces `ruleset` on the calling thread (and what it creates later).
pub(super) fn restrict_self(ruleset: RawFd) -> Result<(), Failed> {
    // SAFETY: plain syscall on the ruleset's fd.
    let ret = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0 as c_uint) };
    check(ret, Step::Landlock, None).map(drop)
}

/// The device and inode numbers of the file `path` names; the errno.
pub(super) fn identity(path: &CStr) -> Result<(u64, u64), c_int> {
    // SAFETY: stat writes into a valid struct.
    let mut stat = unsafe { std::mem::zeroed::<libc::stat>() };
    // SAFETY: a NUL-terminated path and a valid struct to write.
    if unsafe { libc::stat(path.as_ptr(), &raw mut stat) } != 0 {
        return Err(errno());
    }
    Ok((stat.st_dev, stat.st_ino))
}

/// Checks, as the peer, that each path of the domain inherited from the
/// spawner names the file the domain's rule was added on: an error
/// resolving it fails the spawn as opening it would; another file there
/// (replaced since the spawner's own check) fails it with `ESTALE`.
pub(super) fn check_inherited_landlock(paths: &[HeldPath]) -> Result<(), Failed> {
    for (index, held) in paths.iter().enumerate() {
        let found = identity(&held.path).map_err(|_| fail(Step::LandlockPath, Some(index)))?;
        if found != (held.dev, held.ino) {
            // SAFETY: writes this thread's errno slot, always valid.
            unsafe { *libc::__errno_location() = libc::ESTALE };
            return Err(fail(Step::LandlockPath, Some(index)));
        }
    }
    Ok(())
}

/// `struct sock_fprog`.
#[repr(C)]
struct Fprog {
    len: u16,
    filter: *const libc::sock_filter,
}

pub(super) fn install_seccomp(program: &SeccompProgram) -> Result<(), Failed> {
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
