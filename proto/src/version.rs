//! Protocol versions, the optional features a daemon offers, and how a
//! hello picks the version both sides speak.
//!
//! The protocol version moves independently of the crates' versions, on
//! any change to the bytes of a message that a peer of the previous version
//! could not read (`PROTOCOL.md` §8). A daemon serves every version ever
//! released: it answers each client in the version that client asked for.
//! What a daemon can do beyond the layout (cgroups, terminals, ...) is a
//! [`Feature`], announced in [`HelloAck`](crate::HelloAck) from version 2.

use std::fmt;

/// The newest protocol version this crate speaks, and the one its clients
/// send in [`Hello`](crate::Hello).
pub const PROTOCOL_VERSION: u32 = 4;

/// The oldest protocol version a daemon serves: version 1, the layout that
/// was declared protocol 1.0. It is never raised.
pub const OLDEST_PROTOCOL_VERSION: u32 = 1;

/// The first version whose [`HelloAck`](crate::HelloAck) lists the
/// daemon's features.
pub const FEATURES_SINCE: u32 = 2;

/// The first version whose [`SpawnRequest`](crate::SpawnRequest) carries
/// a sandbox, whose [`Spawned`](crate::Spawned) reports it, whose
/// [`StatusReply`](crate::StatusReply) lists the use per peer, and which
/// has [`SpawnStage::Sandbox`](crate::SpawnStage::Sandbox). Older versions
/// use the layouts of [`v2`](crate::v2).
pub const SANDBOX_SINCE: u32 = 3;

/// The first version with warm templates: the client messages
/// [`Template`](crate::ClientMessage::Template),
/// [`SpawnFromTemplate`](crate::ClientMessage::SpawnFromTemplate) and
/// [`ListTemplates`](crate::ClientMessage::ListTemplates), their replies,
/// and [`SpawnStage::Template`](crate::SpawnStage::Template). Every other
/// layout is version 3's: version 4 only appends variants.
pub const TEMPLATES_SINCE: u32 = 4;

/// The version a daemon speaks with a client whose `Hello` says
/// `client_newest`: the newest version both know.
///
/// # Errors
///
/// [`VersionMismatch`] when the client's newest version is older than the
/// oldest this side serves.
pub fn negotiate(client_newest: u32) -> Result<u32, VersionMismatch> {
    if client_newest < OLDEST_PROTOCOL_VERSION {
        return Err(VersionMismatch {
            client: client_newest,
        });
    }
    Ok(client_newest.min(PROTOCOL_VERSION))
}

/// A client's version that this side does not serve; its message names
/// both sides' versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionMismatch {
    /// The newest version the client speaks.
    pub client: u32,
}

impl fmt::Display for VersionMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the client speaks protocol version {} at most; this zygote speaks versions {} to {}",
            self.client, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION
        )
    }
}

/// An optional capability of a daemon, named in
/// [`HelloAck::features`](crate::HelloAck::features) when offered. A
/// request that uses a feature the daemon does not offer is refused with
/// `EOPNOTSUPP` and a message naming the feature, never as malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// Each child in a cgroup of its own, with the limits of
    /// [`SpawnRequest::cgroup`](crate::SpawnRequest::cgroup).
    Cgroups,
    /// [`SpawnRequest::pty`](crate::SpawnRequest::pty): a new
    /// pseudo-terminal for the child.
    Pty,
    /// [`SpawnRequest::sandbox`](crate::SpawnRequest::sandbox): a sandbox
    /// for the child (version 3).
    Sandbox,
    /// Warm templates (version 4): [`TemplateRequest`](crate::TemplateRequest)
    /// and spawns that fork a template instead of exec'ing a program.
    Templates,
    /// [`SpawnRequest::large_args`](crate::SpawnRequest::large_args):
    /// arguments and environment in a sealed memfd.
    LargeArgs,
}

impl Feature {
    /// Every feature this crate knows, in the order `HelloAck` lists them.
    pub const ALL: [Self; 5] = [
        Self::Cgroups,
        Self::Pty,
        Self::Sandbox,
        Self::Templates,
        Self::LargeArgs,
    ];

    /// The feature's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cgroups => "cgroups",
            Self::Pty => "pty",
            Self::Sandbox => "sandbox",
            Self::Templates => "templates",
            Self::LargeArgs => "large_args",
        }
    }

    /// The feature of that wire name; `None` for a name this crate does not
    /// know (a newer daemon's), which a client ignores.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|feature| feature.name() == name)
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_picks_the_newest_common_version() {
        assert_eq!(negotiate(1), Ok(1));
        assert_eq!(negotiate(2), Ok(2));
        assert_eq!(negotiate(3), Ok(3));
        assert_eq!(negotiate(4), Ok(4));
        assert_eq!(negotiate(u32::MAX), Ok(PROTOCOL_VERSION));
        let refused = negotiate(0).expect_err("version 0 was never released");
        assert_eq!(
            refused.to_string(),
            "the client speaks protocol version 0 at most; this zygote speaks versions 1 to 4"
        );
    }

    #[test]
    fn feature_names_round_trip() {
        for feature in Feature::ALL {
            assert_eq!(Feature::from_name(feature.name()), Some(feature));
        }
        assert_eq!(Feature::from_name("teleport"), None);
    }
}
