//! The crate's only `unsafe`: touching an fd known to us only by number.
//!
//! [`Command::inherit_fds`](crate::Command::inherit_fds) finds fds by
//! listing `/proc/self/fd`; nothing in the program hands them to us as
//! `OwnedFd` or `BorrowedFd`, so one raw borrow is unavoidable.

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
