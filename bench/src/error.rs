use std::io;

/// Everything that stops a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Building a helper program with `cc` failed.
    #[error("failed to compile {what} with `cc`: {reason} (is gcc installed? static needs libc.a)")]
    Compile {
        /// Which program.
        what: &'static str,
        /// What `cc` said, or why it could not run.
        reason: String,
    },
    /// A local operation failed.
    #[error("{op} failed: {source}")]
    Io {
        /// What we were doing.
        op: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Forking the template zygote failed.
    #[error("{0}")]
    Zygote(#[from] zygote::Error),
    /// A zygote client call failed.
    #[error("{0}")]
    Client(#[from] zygote_client::Error),
    /// The floor helper misbehaved.
    #[error("the floor helper: {0}")]
    Floor(String),
    /// A flag value makes no sense.
    #[error("invalid --{flag} value {value:?}: {reason}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
}

impl Error {
    /// An [`Error::Io`] for `op`.
    pub fn io(op: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let op = op.into();
        move |source| Self::Io { op, source }
    }
}

/// A `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
