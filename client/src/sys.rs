//! The crate's only `unsafe`: touching an fd known to us only by number,
//! and the one ioctl no safe wrapper offers.
//!
//! [`Command::inherit_fds`](crate::Command::inherit_fds) finds fds by
//! listing `/proc/self/fd`; nothing in the program hands them to us as
//! `OwnedFd` or `BorrowedFd`, so one raw borrow is unavoidable.
//! [`pidfd_exit_status`] reads a child's exit status from its pidfd when
//! the zygote that would have reported it is gone.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

use rustix::io::{Errno, FdFlags, fcntl_dupfd_cloexec, fcntl_getfd};

/// Duplicates fd `raw` (close-on-exec) when it is open and not
/// close-on-exec itself; `Ok(None)` when it is close-on-exec or was closed
/// meanwhile.
///
/// Duplicating at once means the caller holds its own reference to the open
/// file from here on, whatever the rest of the program does with `raw`.
pub(crate) fn dup_if_inheritable(raw: RawFd) -> io::Result<Option<OwnedFd>> {
    if raw < 0 {
        return Ok(None);
    }
    // SAFETY: `raw` is non-negative, as `borrow_raw` requires. The borrow is
    // used for two fcntl calls and dropped before returning. I/O safety asks
    // that the fd stay open while borrowed; another thread could close it
    // in between, and then these calls fail with EBADF (handled below) or,
    // if the number was reused, duplicate whatever now has it. That is the
    // same race `fork` + `exec` inheritance has in std, which this function
    // reproduces: neither call can touch memory or invalidate a live
    // `OwnedFd`, since both only read flags or add a new fd.
    let fd = unsafe { BorrowedFd::borrow_raw(raw) };
    let flags = match fcntl_getfd(fd) {
        Ok(flags) => flags,
        Err(Errno::BADF) => return Ok(None),
        Err(errno) => return Err(errno.into()),
    };
    if flags.contains(FdFlags::CLOEXEC) {
        return Ok(None);
    }
    match fcntl_dupfd_cloexec(fd, 3) {
        Ok(owned) => Ok(Some(owned)),
        Err(Errno::BADF) => Ok(None),
        Err(errno) => Err(errno.into()),
    }
}

/// `struct pidfd_info` of `linux/pidfd.h` in its first version
/// (`PIDFD_INFO_SIZE_VER0`, 64 bytes), which has `exit_code`; the kernel
/// fills what fits of later versions.
#[repr(C)]
#[derive(Debug, Default)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    pid: u32,
    tgid: u32,
    ppid: u32,
    ruid: u32,
    rgid: u32,
    euid: u32,
    egid: u32,
    suid: u32,
    sgid: u32,
    fsuid: u32,
    fsgid: u32,
    exit_code: i32,
}

/// `PIDFD_INFO_EXIT` (Linux 6.15): `exit_code` is set.
const PIDFD_INFO_EXIT: u64 = 1 << 3;

/// `PIDFD_GET_INFO` = `_IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, struct pidfd_info)`
/// with the 64-byte struct: direction read|write (3 << 30), size 64 << 16.
const PIDFD_GET_INFO: u32 = (3 << 30) | (64 << 16) | (0xFF << 8) | 11;

const _: () = assert!(std::mem::size_of::<PidfdInfo>() == 64);

/// The `wait(2)` status the kernel recorded for the process of `pidfd`
/// (`PIDFD_GET_INFO` with `PIDFD_INFO_EXIT`). `Ok(None)` when the ioctl
/// answers without it: the process has not been reaped yet, or the kernel
/// predates 6.15 (6.13 and 6.14 have the ioctl but not the exit field).
///
/// # Errors
///
/// The ioctl's errno: `ENOTTY`/`EINVAL` before 6.13, `ESRCH` for a reaped
/// process on a kernel that kept no exit status.
pub(crate) fn pidfd_exit_status(pidfd: BorrowedFd<'_>) -> io::Result<Option<i32>> {
    use std::os::fd::AsRawFd;
    let mut info = PidfdInfo {
        mask: PIDFD_INFO_EXIT,
        ..PidfdInfo::default()
    };
    // SAFETY: `pidfd` is a live fd for the duration of the call, and `info`
    // is a writable `repr(C)` struct of exactly the size the request number
    // encodes (checked at compile time above), so the kernel reads and
    // writes only within it.
    let result = unsafe {
        libc::ioctl(
            pidfd.as_raw_fd(),
            PIDFD_GET_INFO as _,
            &mut info as *mut PidfdInfo,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((info.mask & PIDFD_INFO_EXIT != 0).then_some(info.exit_code))
}
