//! The addon's `unsafe` code: taking a copy of an fd that JavaScript knows
//! only by number.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A close-on-exec duplicate of `fd`, numbered 3 or above so that it can
/// never land on a standard stream's number while requests are built.
///
/// # Errors
///
/// `EBADF` when `fd` is not open, `EMFILE` when the table is full.
pub fn dup_cloexec(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC reads no memory of ours; on a closed or
    // invalid fd it fails with EBADF and creates nothing.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `copy` was just created by fcntl and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}
