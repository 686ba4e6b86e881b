//! A private zygote forked from the program itself, the Chromium/Android
//! pattern: call [`fork_template`] first in `main`, while the process is
//! still small and single-threaded, and spawn through the client it gives.
//!
//! ```no_run
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // First line: before any thread, runtime or sensitive fd exists.
//!     let template = zygote::template::fork_template()?;
//!     let client = template.blocking_client()?;
//!     // ... the program grows; its children still start from the template.
//!     let status = zygote_client::blocking::Command::new(&client, "true").status()?;
//!     assert!(status.success());
//!     Ok(())
//! }
//! ```
//!
//! # "Before any thread"
//!
//! `fork(2)` copies only the calling thread. Any other thread's locks
//! (the allocator's, stdio's, a runtime's) would stay locked forever in
//! the copy, so the call must come while the process has exactly one
//! thread: before `std::thread::spawn`, before building a tokio runtime
//! (including `#[tokio::main]`, which builds one before your `main` body
//! runs: use a plain `fn main` and build the runtime after this call), and
//! before any library call that starts a thread (a logger with a
//! background writer, a blocking client, a thread pool). The call counts
//! the entries of `/proc/self/task` and refuses with
//! [`Error::TemplateTooLate`] when there is more than one.
//!
//! The template is a copy of the program at that moment: whatever it has
//! in memory then, the template has too. It closes every fd above 2 except
//! its socket at once, puts `/dev/null` on its stdin and stdout (keeping
//! stderr for its errors), runs no code of the program, and exits
//! (via `_exit`, so the program's exit handlers never run twice) once the
//! handle's socket closes and its children are reaped; see
//! [`crate::daemon::private`].

use std::os::fd::OwnedFd;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::Error;
use crate::daemon::private;
use crate::spawn::{self, ForkError, Forked};

/// The owner's side of a forked template: its socket and pid. Turn it into
/// a client with [`client`](Template::client) or
/// [`blocking_client`](Template::blocking_client).
#[derive(Debug)]
pub struct Template {
    socket: OwnedFd,
    pid: i32,
}

impl Template {
    /// The template's pid; the parent of every child spawned through it.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// An async client of the template.
    ///
    /// # Errors
    ///
    /// As [`zygote_client::Client::from_fd`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub async fn client(self) -> zygote_client::Result<zygote_client::Client> {
        zygote_client::Client::from_fd(self.socket).await
    }

    /// A blocking client of the template (it starts one background
    /// thread, so call it after [`fork_template`], never before).
    ///
    /// # Errors
    ///
    /// As [`zygote_client::blocking::Client::from_fd`].
    pub fn blocking_client(self) -> zygote_client::Result<zygote_client::blocking::Client> {
        zygote_client::blocking::Client::from_fd(self.socket)
    }

    /// The owner's end of the socket, for a client built by hand.
    pub fn into_socket(self) -> OwnedFd {
        self.socket
    }
}

/// Forks this process into a single-threaded template zygote and returns
/// the owner's handle on it. Call it first in `main`; see the module docs
/// for exactly what must not have happened before.
///
/// # Errors
///
/// [`Error::TemplateTooLate`] when the process already has more than one
/// thread; [`Error::Fork`] when the socketpair or the fork fails.
pub fn fork_template() -> Result<Template, Error> {
    let (ours, theirs) = zygote_proto::socket::pair(false).map_err(Error::PrivateSocket)?;
    // The template starts with the stop signals held, until its handlers
    // exist (a terminal's ^C at that moment must not kill it); the
    // program gets its own mask back at once.
    let program_mask = spawn::hold_stop_signals();
    // And the signals with no meaning to it, for its whole life (the
    // restore below undoes this too in the program).
    let _ = spawn::block_stray_signals();
    let forked = spawn::fork_single_threaded();
    if !matches!(forked, Ok(Forked::Child)) {
        program_mask.restore();
    }
    match forked {
        Ok(Forked::Parent { pid }) => {
            drop(theirs);
            Ok(Template { socket: ours, pid })
        }
        Ok(Forked::Child) => {
            drop(ours);
            run_template(theirs)
        }
        Err(ForkError::Threads { threads }) => Err(Error::TemplateTooLate { threads }),
        Err(error) => Err(Error::Fork(error)),
    }
}

/// Lets go of what the template inherited: every fd above 2 but its
/// socket, and stdin and stdout (replaced by `/dev/null`), so that a pipe
/// on the program's stdout sees EOF when the program exits, not when the
/// template does. stderr stays, for the template's own errors. Children
/// never get these: `Stdio::inherit` passes the client's own fds.
fn detach_from_program(socket: &OwnedFd) -> std::io::Result<()> {
    spawn::close_fds_above_2_except(socket)?;
    let null = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    Ok(())
}

/// The template's whole life; never returns into the program's code.
fn run_template(socket: OwnedFd) -> ! {
    let code = catch_unwind(AssertUnwindSafe(|| {
        if let Err(error) = detach_from_program(&socket) {
            eprintln!("zygote template: failed to let go of inherited fds: {error}");
            return 1;
        }
        match private::serve_private(socket) {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("zygote template: {error}");
                1
            }
        }
    }))
    .unwrap_or(101);
    spawn::exit_now(code)
}
