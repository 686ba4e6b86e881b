use std::io;

/// Everything that can go wrong while speaking the protocol.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// serde refused to encode a value.
    #[error("failed to encode message: {0}")]
    Encode(#[source] postcard::Error),
    /// The frame ended before the message did.
    #[error("frame is truncated: the message ends early")]
    Truncated,
    /// The frame is not a valid message.
    #[error("frame is malformed: {0}")]
    Malformed(#[source] postcard::Error),
    /// The message decoded but did not use the whole frame.
    #[error("frame has {count} bytes after the message")]
    TrailingBytes {
        /// How many bytes were left.
        count: usize,
    },
    /// A frame is larger than the limit.
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// The frame's size, or at least the limit plus one when the kernel
        /// truncated it.
        size: usize,
        /// The limit in force.
        limit: usize,
    },
    /// A frame carried more fds than allowed, or the kernel truncated its
    /// control data.
    #[error("frame carries more than {limit} fds (control data was truncated)")]
    TooManyFds {
        /// The limit in force.
        limit: usize,
    },
    /// The socket failed.
    #[error("socket {op} failed: {source}")]
    Io {
        /// The operation, e.g. "sendmsg".
        op: &'static str,
        /// The error from the kernel.
        #[source]
        source: io::Error,
    },
}

impl ProtoError {
    pub(crate) fn io(op: &'static str, source: impl Into<io::Error>) -> Self {
        Self::Io {
            op,
            source: source.into(),
        }
    }

    /// True when the error means "the peer is gone" rather than "the peer
    /// misbehaved".
    pub fn is_disconnect(&self) -> bool {
        matches!(self, Self::Io { source, .. } if matches!(
            source.kind(),
            io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::NotConnected
        ))
    }
}
