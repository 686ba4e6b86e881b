//! Whole-process operations for the private zygote: `fork(2)` of a
//! still-single-threaded program into a template, and taking over an
//! inherited socket while closing every other inherited fd.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::io::fcntl_dupfd_cloexec;

/// Which side of a [`fork_single_threaded`] we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The original process; the child has this pid.
    Parent {
        /// The child's pid.
        pid: i32,
    },
    /// The new process, a copy of the caller's single thread.
    Child,
}

/// Why [`fork_single_threaded`] refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// More than one thread exists, so a forked copy could inherit locks
    /// held by threads that do not exist in it.
    #[error("the process already has {threads} threads")]
    Threads {
        /// Entries in `/proc/self/task`.
        threads: usize,
    },
    /// Listing `/proc/self/task` failed.
    #[error("failed to count threads in /proc/self/task: {0}")]
    CountThreads(#[source] io::Error),
    /// `fork(2)` failed.
    #[error("fork failed: {0}")]
    Fork(#[source] io::Error),
}

/// Threads of this process, from `/proc/self/task`.
///
/// # Errors
///
/// When the directory cannot be read (no `/proc`).
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// `fork(2)`, only while this process has exactly one thread.
///
/// # Errors
///
/// [`ForkError::Threads`] when another thread exists, else the failure to
/// count threads or to fork.
pub fn fork_single_threaded() -> Result<Forked, ForkError> {
    let threads = thread_count().map_err(ForkError::CountThreads)?;
    if threads != 1 {
        return Err(ForkError::Threads { threads });
    }
    // SAFETY: this thread is the only one (checked just above; only this
    // thread could start another in between, and it did not), so no lock,
    // allocator arena or runtime state is held by a thread that would be
    // missing in the child. The child is an exact copy that goes on with
    // ordinary Rust code, as after any single-threaded fork.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(ForkError::Fork(io::Error::last_os_error())),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent { pid }),
    }
}

/// Ends the process at once with `code`, without running `atexit`
/// handlers or flushing stdio buffers, which in a forked template belong
/// to the original program and must run there only.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` only ends the process; it touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// Takes over the socket inherited at `raw` (as `zygote serve
/// --private-fd` does): moves it to a close-on-exec fd above 2, puts
/// `/dev/null` in its place when `raw` is 0, 1 or 2, and closes every
/// other fd above 2, so nothing the launching program leaked stays open.
///
/// Call it at startup, before anything else has opened fds.
///
/// # Errors
///
/// `EBADF` when nothing is open at `raw`, or the error of `dup`, `open`
/// or `close_range`.
pub fn take_inherited_fd(raw: RawFd) -> io::Result<OwnedFd> {
    if raw < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: `raw` is non-negative; the borrow only lives for the dup.
    // Nothing else in this process uses the inherited fd: it was handed to
    // us, by number, on the command line.
    let inherited = unsafe { BorrowedFd::borrow_raw(raw) };
    let socket = fcntl_dupfd_cloexec(inherited, 3)?;
    if raw <= 2 {
        let null = std::fs::File::open("/dev/null")?;
        // SAFETY: replaces the stdio fd `raw` with /dev/null; the std
        // handles for 0-2 keep working on whatever fd holds that number.
        if unsafe { libc::dup2(null.as_raw_fd(), raw) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    close_fds_above_2_except(&socket)?;
    Ok(socket)
}

/// Closes every fd above 2 except `keep`.
///
/// Used where this process starts a new life (a private zygote at
/// startup, a template just after fork): no code that owns those fds
/// will run again, so closing them under their owners is safe.
///
/// # Errors
///
/// The error of `close_range(2)` (Linux 5.9).
pub fn close_fds_above_2_except(keep: &OwnedFd) -> io::Result<()> {
    let keep = u32::try_from(keep.as_raw_fd()).map_err(|_| io::Error::other("negative fd"))?;
    let mut ranges = Vec::with_capacity(2);
    if keep > 3 {
        ranges.push((3, keep - 1));
    }
    ranges.push((keep.max(2) + 1, u32::MAX));
    for (first, last) in ranges {
        // SAFETY: closes only fds of this process in the range; `keep` is
        // outside it. See the function's doc for why no owner is hurt.
        let ret = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
