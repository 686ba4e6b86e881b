//! The blocking [`Child`] and its `std::fs::File`-like pipe ends.

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use tokio::net::unix::pipe;

use super::Runtime;
use crate::child::{ChildCore, SpawnedParts, read_all};
use crate::{Error, ExitStatus, Output, ResourceUsage, Result, Stdio};

/// A child started by the zygote, as [`std::process::Child`].
///
/// Dropping it neither kills nor waits for the child: it runs on, and the
/// zygote reaps it.
#[derive(Debug)]
pub struct Child {
    /// The write end of the child's stdin, when it was piped.
    pub stdin: Option<ChildStdin>,
    /// The read end of the child's stdout, when it was piped.
    pub stdout: Option<ChildStdout>,
    /// The read end of the child's stderr, when it was piped.
    pub stderr: Option<ChildStderr>,
    /// The master end of the child's pseudo-terminal, when asked for with
    /// [`Command::pty`](super::Command::pty). Close-on-exec, blocking.
    pub pty: Option<OwnedFd>,
    core: ChildCore,
    runtime: Arc<Runtime>,
}

/// Makes a received pipe end blocking, whatever mode the zygote left it
/// in: these are read and written with plain `read`/`write`.
fn blocking_file(fd: OwnedFd) -> io::Result<File> {
    rustix::io::ioctl_fionbio(&fd, false)?;
    Ok(File::from(fd))
}

impl Child {
    pub(super) fn from_parts(parts: SpawnedParts, runtime: Arc<Runtime>) -> Result<Self> {
        let SpawnedParts {
            core,
            stdin,
            stdout,
            stderr,
            pty,
        } = parts;
        let wrapped = (|| {
            io::Result::Ok((
                stdin.map(blocking_file).transpose()?,
                stdout.map(blocking_file).transpose()?,
                stderr.map(blocking_file).transpose()?,
            ))
        })();
        match wrapped {
            Ok((stdin, stdout, stderr)) => Ok(Self {
                stdin: stdin.map(ChildStdin),
                stdout: stdout.map(ChildStdout),
                stderr: stderr.map(ChildStderr),
                pty,
                core,
                runtime,
            }),
            Err(error) => {
                // The caller would get no handle on the child.
                let _ = core.start_kill();
                Err(Error::io("setting up the child's pipes", error))
            }
        }
    }

    /// The child's pid, in the zygote's pid namespace.
    pub fn id(&self) -> u32 {
        self.core.id()
    }

    /// What confined the child, as the zygote reported it; `None` when
    /// nothing did. See [`Child::sandbox`](crate::Child::sandbox).
    pub fn sandbox(&self) -> Option<&crate::AppliedSandbox> {
        self.core.sandbox()
    }

    /// A pidfd for the child, to poll or signal it without pid-reuse
    /// races.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.core.pidfd()
    }

    /// Waits for the child to exit, closing its stdin first as std does.
    /// When the zygote is lost first, reads the status from the pidfd; see
    /// [`crate::Child::wait`].
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteLost`] when the connection ends before the exit is
    /// reported and the pidfd cannot stand in (before Linux 6.15).
    pub fn wait(&mut self) -> Result<ExitStatus> {
        drop(self.stdin.take());
        self.runtime.block_on(self.core.wait())
    }

    /// The exit status if the zygote has already reported it (or, once the
    /// zygote is lost, the pidfd has it); never blocks.
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteLost`] when the connection ended first and the pidfd
    /// cannot stand in.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        self.core.try_wait()
    }

    /// Sends SIGKILL through the pidfd, as std's `Child::kill` (it does not
    /// wait). Works even when the zygote has died; a child already gone is
    /// not an error. With [`kill_tree`](crate::Command::kill_tree), the
    /// zygote ends the whole cgroup instead (the pidfd when that fails).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when `pidfd_send_signal` fails.
    pub fn kill(&mut self) -> Result<()> {
        if self.core.kills_tree()
            && self
                .runtime
                .block_on(self.core.signal(libc::SIGKILL))
                .is_ok()
        {
            return Ok(());
        }
        self.core.start_kill()
    }

    /// Asks the zygote, the child's parent, to send `signal`; once the
    /// zygote is lost, sends it through the pidfd.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] with the errno.
    pub fn signal(&self, signal: i32) -> Result<()> {
        self.runtime.block_on(self.core.signal(signal))
    }

    /// CPU time and peak memory, once the exit has been seen; `None` when
    /// the zygote was lost before it reported them.
    pub fn usage(&self) -> Option<ResourceUsage> {
        self.core.usage()
    }

    /// Closes stdin, then reads stdout and stderr to their ends
    /// concurrently (on the client's runtime, so a child filling one pipe
    /// while we read the other cannot deadlock) and waits for the exit.
    ///
    /// # Errors
    ///
    /// As [`wait`](Child::wait), and [`Error::Io`] when reading fails.
    pub fn wait_with_output(mut self) -> Result<Output> {
        drop(self.stdin.take());
        let stdout = self.stdout.take().map(OwnedFd::from);
        let stderr = self.stderr.take().map(OwnedFd::from);
        let Self {
            mut core, runtime, ..
        } = self;
        runtime.block_on(async move {
            let register = |fd: Option<OwnedFd>, stream: &str| {
                fd.map(pipe::Receiver::from_owned_fd)
                    .transpose()
                    .map_err(|error| Error::io(format!("registering the child's {stream}"), error))
            };
            let stdout = register(stdout, "stdout")?;
            let stderr = register(stderr, "stderr")?;
            let (status, stdout, stderr) = tokio::try_join!(
                core.wait(),
                read_all(stdout, "stdout"),
                read_all(stderr, "stderr"),
            )?;
            Ok(Output {
                status,
                stdout,
                stderr,
            })
        })
    }
}

macro_rules! pipe_end {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(File);

        impl AsFd for $name {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.0.as_fd()
            }
        }

        impl AsRawFd for $name {
            fn as_raw_fd(&self) -> RawFd {
                self.0.as_raw_fd()
            }
        }

        impl From<$name> for OwnedFd {
            fn from(pipe: $name) -> OwnedFd {
                pipe.0.into()
            }
        }

        #[doc = concat!("Connects another child's stream to this ", $what, " pipe.")]
        impl From<$name> for Stdio {
            fn from(pipe: $name) -> Stdio {
                Stdio::from(pipe.0)
            }
        }
    };
}

pipe_end!(
    /// The parent's end of a child's stdin: [`Write`]. Dropping it closes
    /// the pipe.
    ChildStdin,
    "stdin"
);
pipe_end!(
    /// The parent's end of a child's stdout: [`Read`].
    ChildStdout,
    "stdout"
);
pipe_end!(
    /// The parent's end of a child's stderr: [`Read`].
    ChildStderr,
    "stderr"
);

impl Write for ChildStdin {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Read for ChildStdout {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.0.read_vectored(bufs)
    }

    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        self.0.read_to_end(buf)
    }
}

impl Read for ChildStderr {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.0.read_vectored(bufs)
    }

    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        self.0.read_to_end(buf)
    }
}
