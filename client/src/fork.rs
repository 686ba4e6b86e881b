//! A client in a forked copy of the process that made it.
//!
//! `fork(2)` copies a client's memory, its socket fd and its children's
//! pidfds, but not its threads. A request sent on the copied socket would
//! go out on the parent's connection: the reply would reach the parent's
//! reader (which does not know its id) and never the child's, so the
//! child would hang and the parent would see a reply it did not ask for.
//! Every connection, blocking runtime and child therefore remembers the
//! process that made it, and a forked copy never uses it:
//!
//! - an async [`Client`](crate::Client) of a socket path connects again,
//!   on a connection of the copy's own, at its first request;
//! - a client of a private zygote or an inherited socket, and every
//!   [`blocking::Client`](crate::blocking::Client) (whose runtime and
//!   background thread belong to the parent), fail with
//!   [`Error::Forked`]; a new client made in the copy works;
//! - a [`Child`](crate::Child) copied into the fork cannot be waited for
//!   or signalled through the zygote there ([`Error::Forked`]), and its
//!   `kill_on_drop` does not kill the parent's child when the copy drops
//!   it. `start_kill` still works, through the pidfd.

use crate::{Error, Result};

/// The process that made a connection, runtime or child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner(u32);

impl Owner {
    /// This process.
    pub(crate) fn current() -> Self {
        Self(std::process::id())
    }

    /// Whether this process is the owner (not a forked copy of it).
    pub(crate) fn is_current(self) -> bool {
        std::process::id() == self.0
    }

    /// `Ok` in the owner; [`Error::Forked`] in a forked copy of it.
    pub(crate) fn check(self) -> Result<()> {
        if self.is_current() {
            Ok(())
        } else {
            Err(self.forked())
        }
    }

    /// The error for using, in this process, what the owner made.
    pub(crate) fn forked(self) -> Error {
        Error::Forked {
            owner: self.0,
            pid: std::process::id(),
        }
    }
}
