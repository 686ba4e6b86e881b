//! [`Stdio`]: what a child's stdin, stdout or stderr is connected to.

use std::fs::File;
use std::os::fd::OwnedFd;

/// What one of a child's standard streams is connected to, as
/// [`std::process::Stdio`].
///
/// Used by both the async [`Command`](crate::Command) and the
/// [`blocking`](crate::blocking) one.
#[derive(Debug)]
pub struct Stdio(pub(crate) StdioKind);

#[derive(Debug)]
pub(crate) enum StdioKind {
    /// The client's own fd 0, 1 or 2.
    Inherit,
    /// `/dev/null`, opened by the zygote.
    Null,
    /// A new pipe; the client gets the other end.
    Piped,
    /// This fd, passed to the zygote with the request.
    Fd(OwnedFd),
}

impl Stdio {
    /// The calling process's own stream (its fd 0, 1 or 2), passed to the
    /// zygote with the request. If that fd is closed, the child gets
    /// `/dev/null` instead (std would leave the child's fd closed).
    pub fn inherit() -> Self {
        Self(StdioKind::Inherit)
    }

    /// `/dev/null`.
    pub fn null() -> Self {
        Self(StdioKind::Null)
    }

    /// A new pipe; the parent's end appears on the
    /// [`Child`](crate::Child)'s `stdin`, `stdout` or `stderr` field.
    pub fn piped() -> Self {
        Self(StdioKind::Piped)
    }
}

/// Connects the stream to this fd (the request borrows it, so a
/// [`Command`](crate::Command) can be spawned again).
impl From<OwnedFd> for Stdio {
    fn from(fd: OwnedFd) -> Self {
        Self(StdioKind::Fd(fd))
    }
}

/// Connects the stream to this file.
impl From<File> for Stdio {
    fn from(file: File) -> Self {
        Self(StdioKind::Fd(file.into()))
    }
}

/// Pipes a std child's stdin into this child.
impl From<std::process::ChildStdin> for Stdio {
    fn from(pipe: std::process::ChildStdin) -> Self {
        Self(StdioKind::Fd(pipe.into()))
    }
}

/// Pipes a std child's stdout into this child.
impl From<std::process::ChildStdout> for Stdio {
    fn from(pipe: std::process::ChildStdout) -> Self {
        Self(StdioKind::Fd(pipe.into()))
    }
}

/// Pipes a std child's stderr into this child.
impl From<std::process::ChildStderr> for Stdio {
    fn from(pipe: std::process::ChildStderr) -> Self {
        Self(StdioKind::Fd(pipe.into()))
    }
}
