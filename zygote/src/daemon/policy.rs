//! Who may connect and what each peer may ask for: the policy file and its
//! decisions. Pure: the peer's identity comes in as data (`Peer`), so
//! every rule is unit-tested without sockets or other users.
//!
//! The invariant this enforces: a child never has more privilege than the
//! peer that asked for it, unless the policy file says so for that peer.

use crate::daemon::cgroup::PeerCaps;
use std::path::Path;

pub mod v2;

use serde::{Deserialize, Serialize};
use zygote_proto::{ResourceLimit, SpawnRequest};

use crate::Error;
use crate::daemon::peer::Peer;
use crate::daemon::sandbox::Profiles;
use crate::daemon::sandbox::profile::ProfileFile;
use crate::spawn::Credentials;
use std::collections::BTreeMap;

/// Default cap on open connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default cap on open connections from the peers of one uid: an eighth
/// of `max_connections` (see [`CONNECTION_SHARE`]).
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = DEFAULT_MAX_CONNECTIONS / CONNECTION_SHARE;
/// The peers of one uid get `1 / CONNECTION_SHARE` of the connection
/// table unless the policy says otherwise.
pub const CONNECTION_SHARE: usize = 8;
/// Connections kept for root and the daemon's own uid (at most a quarter
/// of `max_connections`): an admin can run `zygote status` however many
/// connections other peers hold.
pub const ROOT_RESERVED_CONNECTIONS: usize = 16;
/// Default cap on children running at once, over all peers.
pub const DEFAULT_MAX_CHILDREN: usize = 4096;
/// The peers of one uid get `1 / CHILD_SHARE` of the child table unless
/// the policy says otherwise: no one peer can take it all.
pub const CHILD_SHARE: usize = 4;
/// Default cap on children running at once for the peers of one uid: a
/// quarter of `max_children`.
pub const DEFAULT_MAX_CHILDREN_PER_PEER: usize = DEFAULT_MAX_CHILDREN / CHILD_SHARE;
/// Children kept for root and the daemon's own uid (at most a quarter of
/// `max_children`): however many other peers run, they can spawn.
pub const ROOT_RESERVED_CHILDREN: usize = 64;
/// Default cap on argv plus environment, counted as the kernel counts them
/// (each string with its NUL, plus one pointer each): the kernel's own
/// `ARG_MAX` with the default 8 MiB stack limit (a quarter of it). Larger
/// than a frame: clients send big lists in a sealed memfd.
pub const DEFAULT_MAX_ARGV_ENV_BYTES: usize = 2 * 1024 * 1024;

/// The policy file, as written. Unknown keys are errors: a typo in a
/// security policy must not silently mean "default".
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    connect: Option<ConnectFile>,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    peer: Vec<Rule>,
    #[serde(default)]
    sandbox: BTreeMap<String, ProfileFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectFile {
    #[serde(default)]
    any: Option<bool>,
    #[serde(default)]
    uids: Vec<u32>,
    #[serde(default)]
    gids: Vec<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    max_connections: Option<usize>,
    max_connections_per_peer: Option<usize>,
    max_children: Option<usize>,
    max_children_per_peer: Option<usize>,
    max_argv_env_bytes: Option<usize>,
    peer_memory_max: Option<u64>,
    peer_pids_max: Option<u64>,
}

/// Daemon-wide limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Connections open at once; one more gets `ProtocolError::Busy`.
    /// Peers other than root and the daemon's own uid get all but
    /// [`Limits::root_reserve`] of them.
    pub max_connections: usize,
    /// Connections open at once from the peers of one uid, unless a rule
    /// says otherwise.
    pub max_connections_per_peer: usize,
    /// Children running at once, over all peers.
    pub max_children: usize,
    /// Children running at once for the peers of one uid, unless a rule
    /// says otherwise.
    pub max_children_per_peer: usize,
    /// argv plus environment of one request, in bytes.
    pub max_argv_env_bytes: usize,
    /// Caps on each peer uid's cgroup subtree, unless a rule says
    /// otherwise.
    pub peer_caps: PeerCaps,
}

impl Limits {
    /// Connections only root peers may take: [`ROOT_RESERVED_CONNECTIONS`],
    /// or a quarter of `max_connections` when that is smaller.
    pub fn root_reserve(&self) -> usize {
        ROOT_RESERVED_CONNECTIONS.min(self.max_connections / 4)
    }

    /// Children only root and the daemon's own uid may start:
    /// [`ROOT_RESERVED_CHILDREN`], or a quarter of `max_children` when
    /// that is smaller.
    pub fn child_reserve(&self) -> usize {
        ROOT_RESERVED_CHILDREN.min(self.max_children / 4)
    }
}

impl Limits {
    /// The children the peers of one uid may run at once, unless a rule
    /// says otherwise. Root and the daemon's own uid (`privileged`) are
    /// held to the default share only when the policy set it: theirs is
    /// the whole table, whose reserve they alone may use.
    pub fn children_per_peer(&self, privileged: bool) -> usize {
        let is_share = self.max_children_per_peer == share_of(self.max_children, CHILD_SHARE);
        if privileged && is_share {
            self.max_children
        } else {
            self.max_children_per_peer
        }
    }

    /// As [`Limits::children_per_peer`], for connections.
    pub fn connections_per_peer(&self, privileged: bool) -> usize {
        let is_share =
            self.max_connections_per_peer == share_of(self.max_connections, CONNECTION_SHARE);
        if privileged && is_share {
            self.max_connections
        } else {
            self.max_connections_per_peer
        }
    }
}

/// `total / share`, at least one.
fn share_of(total: usize, share: usize) -> usize {
    (total / share).max(1)
}

/// The fds of replies a client has not read on one connection, queued in
/// the daemon or in flight towards it, counting the most each spawn not
/// yet answered may bring: at this bound the connection stops reading
/// requests.
pub const MAX_UNREAD_FDS: usize = 64;

/// Fds one connection may hold at once: its socket, the registration of
/// a send waiting for room, its children's `/dev/null`, the fds of one
/// received frame (64), and those of its unread replies
/// ([`MAX_UNREAD_FDS`]). Counting the last keeps the fds in flight
/// towards all clients under the fd limit too, which is the kernel's
/// limit on fds in flight for the daemon's uid.
pub const FDS_PER_CONNECTION: usize = 67 + MAX_UNREAD_FDS;
/// Fds one child holds: its pidfd, and while its spawn is answered the
/// status pipe and the client's ends of its stdio pipes.
pub const FDS_PER_CHILD: usize = 5;
/// Fds kept for everything else: the listener, the metrics exporter,
/// logs, `/proc` reads.
pub const FDS_RESERVED: usize = 64;

impl Limits {
    /// Lowers `max_connections` and `max_children` (with the per-peer
    /// limits) where `defaulted` says they were not set in the policy,
    /// until every connection and child fits in `nofile`, the daemon's fd
    /// limit, so that a full table never starves `accept`. Values the
    /// policy set are kept. Returns whether anything was lowered.
    fn fit_fds(&mut self, nofile: u64, defaulted: Defaulted) -> bool {
        let budget = usize::try_from(nofile)
            .unwrap_or(usize::MAX)
            .saturating_sub(FDS_RESERVED);
        let connections = self.max_connections.saturating_mul(FDS_PER_CONNECTION);
        let children = self.max_children.saturating_mul(FDS_PER_CHILD);
        if connections.saturating_add(children) <= budget {
            return false;
        }
        let fixed = if defaulted.connections {
            0
        } else {
            connections
        } + if defaulted.children { 0 } else { children };
        let scalable = connections.saturating_add(children) - fixed;
        if scalable == 0 {
            return false;
        }
        let room = budget.saturating_sub(fixed);
        // Scale the defaulted ones by the same factor, keeping one of each.
        let scale = |value: usize| {
            let scaled = value as u128 * room as u128 / scalable as u128;
            usize::try_from(scaled).unwrap_or(usize::MAX).max(1)
        };
        // A per-peer limit that was its table's default share stays that
        // share of the lowered table; one the policy set is only capped.
        if defaulted.connections {
            let was_share =
                self.max_connections_per_peer == share_of(self.max_connections, CONNECTION_SHARE);
            self.max_connections = scale(self.max_connections);
            self.max_connections_per_peer = if was_share {
                share_of(self.max_connections, CONNECTION_SHARE)
            } else {
                self.max_connections_per_peer.min(self.max_connections)
            };
        }
        if defaulted.children {
            let was_share = self.max_children_per_peer == share_of(self.max_children, CHILD_SHARE);
            self.max_children = scale(self.max_children);
            self.max_children_per_peer = if was_share {
                share_of(self.max_children, CHILD_SHARE)
            } else {
                self.max_children_per_peer.min(self.max_children)
            };
        }
        true
    }
}

/// Which limits the policy file left to their defaults.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Defaulted {
    connections: bool,
    children: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            max_children: DEFAULT_MAX_CHILDREN,
            max_children_per_peer: DEFAULT_MAX_CHILDREN_PER_PEER,
            max_argv_env_bytes: DEFAULT_MAX_ARGV_ENV_BYTES,
            peer_caps: PeerCaps::default(),
        }
    }
}

/// One `[[peer]]` table: extra rights and limits for matching peers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Matches peers of these uids.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Matches peers with any of these gids (primary or supplementary).
    #[serde(default)]
    pub gids: Vec<u32>,
    /// Uids the peer may run children as, besides its own.
    #[serde(default)]
    pub run_as_uids: Vec<u32>,
    /// Gids (primary or supplementary) the peer may give children, besides
    /// its own.
    #[serde(default)]
    pub run_as_gids: Vec<u32>,
    /// The peer may run children as anyone.
    #[serde(default)]
    pub run_as_any: bool,
    /// The peer may ask for resource limits above its own hard limits.
    #[serde(default)]
    pub raise_rlimits: bool,
    /// Children running at once for this peer's uid.
    pub max_children: Option<usize>,
    /// `memory.max` of this peer uid's cgroup subtree, in bytes.
    pub memory_max: Option<u64>,
    /// `pids.max` of this peer uid's cgroup subtree.
    pub pids_max: Option<u64>,
    /// Connections open at once for this peer's uid.
    pub max_connections: Option<usize>,
    /// argv plus environment of one request from this peer, in bytes.
    pub max_argv_env_bytes: Option<usize>,
    /// The sandbox profile every child of this peer runs in: a request
    /// can only tighten it.
    pub sandbox: Option<String>,
}

impl Rule {
    fn matches(&self, peer: &Peer) -> bool {
        self.uids.contains(&peer.uid)
            || self
                .gids
                .iter()
                .any(|gid| *gid == peer.gid || peer.groups.contains(gid))
    }
}

/// The checked policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Policy {
    /// Whether any uid may connect (the socket's mode still applies).
    connect_any: bool,
    /// Uids that may connect besides the daemon's own and root.
    connect_uids: Vec<u32>,
    /// Gids whose members may connect.
    connect_gids: Vec<u32>,
    /// Daemon-wide limits.
    pub limits: Limits,
    rules: Vec<Rule>,
    defaulted: Defaulted,
    /// The `[sandbox.NAME]` profiles, as written (checked at parse).
    #[serde(default)]
    sandbox: BTreeMap<String, ProfileFile>,
}

/// What one connected peer may do: its matching rule, or the defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    rule: Rule,
    /// Children running at once for this peer's uid.
    pub max_children: usize,
    /// Caps on this peer uid's cgroup subtree, which its children cannot
    /// lift: the files belong to the daemon.
    pub caps: PeerCaps,
    /// Connections open at once for this peer's uid.
    pub max_connections: usize,
    /// argv plus environment of one request, in bytes.
    pub max_argv_env_bytes: usize,
}

/// Why a request was refused by policy; becomes `SpawnFailed` with stage
/// `Admission` and `EPERM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied(pub String);

impl Policy {
    /// The policy when no file is given: a root zygote serves any peer
    /// that can open its socket (each child runs as its peer); any other
    /// zygote serves its own uid and root. Peers run children only as
    /// themselves, within their own hard limits.
    pub fn default_for(daemon_uid: u32) -> Self {
        Self::from_file(PolicyFile::default(), daemon_uid)
    }

    /// Reads a policy file.
    ///
    /// # Errors
    ///
    /// [`Error::Policy`] naming the path, with the line and column of a
    /// parse error.
    pub fn load(path: &Path, daemon_uid: u32) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|error| Error::Policy {
            path: path.to_owned(),
            message: error.to_string(),
        })?;
        Self::parse(&text, daemon_uid).map_err(|message| Error::Policy {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses policy text; the error is toml's message, which names the
    /// line and column.
    pub fn parse(text: &str, daemon_uid: u32) -> Result<Self, String> {
        let file: PolicyFile = toml::from_str(text).map_err(|error| error.to_string())?;
        for (index, rule) in file.peer.iter().enumerate() {
            if rule.uids.is_empty() && rule.gids.is_empty() {
                return Err(format!(
                    "[[peer]] number {} matches nobody: give it uids or gids",
                    index + 1
                ));
            }
        }
        let profiles = Profiles::from_file(&file.sandbox)?;
        for (index, rule) in file.peer.iter().enumerate() {
            if let Some(name) = &rule.sandbox {
                if !profiles.contains(name) {
                    return Err(format!(
                        "[[peer]] number {} imposes sandbox profile {name:?}, which no \
                         [sandbox.{name}] table defines",
                        index + 1
                    ));
                }
            }
        }
        let policy = Self::from_file(file, daemon_uid);
        let limits = policy.limits;
        if limits.max_connections == 0 || limits.max_children == 0 {
            return Err("limits.max_connections and limits.max_children must be at least 1".into());
        }
        Ok(policy)
    }

    fn from_file(file: PolicyFile, daemon_uid: u32) -> Self {
        let defaults = Limits::default();
        let max_connections = file
            .limits
            .max_connections
            .unwrap_or(defaults.max_connections);
        let max_children = file.limits.max_children.unwrap_or(defaults.max_children);
        let limits = Limits {
            max_connections,
            // Unset, a share of the table as set.
            max_connections_per_peer: file
                .limits
                .max_connections_per_peer
                .unwrap_or_else(|| share_of(max_connections, CONNECTION_SHARE)),
            max_children,
            max_children_per_peer: file
                .limits
                .max_children_per_peer
                .unwrap_or_else(|| share_of(max_children, CHILD_SHARE)),
            max_argv_env_bytes: file
                .limits
                .max_argv_env_bytes
                .unwrap_or(defaults.max_argv_env_bytes),
            peer_caps: PeerCaps {
                memory_max: file.limits.peer_memory_max,
                pids_max: file.limits.peer_pids_max,
            },
        };
        let defaulted = Defaulted {
            connections: file.limits.max_connections.is_none(),
            children: file.limits.max_children.is_none(),
        };
        let connect = file.connect.unwrap_or_default();
        Self {
            defaulted,
            connect_any: connect.any.unwrap_or(daemon_uid == 0),
            connect_uids: connect.uids,
            connect_gids: connect.gids,
            limits,
            rules: file.peer,
            sandbox: file.sandbox,
        }
    }

    /// The sandbox profile a `[[peer]]` rule listing `uid` imposes, for
    /// `zygote status` (a rule matching by group alone is not seen here:
    /// admission, which knows the peer's groups, applies it all the same).
    pub fn imposed_profile_of_uid(&self, uid: u32) -> Option<String> {
        self.rules
            .iter()
            .find(|rule| rule.uids.contains(&uid))
            .and_then(|rule| rule.sandbox.clone())
    }

    /// The sandbox profiles the file defines (checked when it was parsed;
    /// empty if that check cannot pass any more).
    pub fn sandbox_profiles(&self) -> Profiles {
        Profiles::from_file(&self.sandbox).unwrap_or_default()
    }

    /// Every per-peer cap the policy can set, to check at start that the
    /// kernel can enforce them.
    pub fn peer_caps(&self) -> Vec<PeerCaps> {
        let mut caps = vec![self.limits.peer_caps];
        caps.extend(self.rules.iter().map(|rule| PeerCaps {
            memory_max: rule.memory_max,
            pids_max: rule.pids_max,
        }));
        caps
    }

    /// Lowers the connection and child limits the policy file left to
    /// their defaults until they fit in `nofile`, the daemon's fd limit
    /// (see [`FDS_PER_CONNECTION`], [`FDS_PER_CHILD`]). Returns whether it
    /// lowered any.
    pub fn fit_fds(&mut self, nofile: u64) -> bool {
        self.limits.fit_fds(nofile, self.defaulted)
    }

    /// Decides whether `peer` may use a daemon running as `daemon_uid`,
    /// and with what rights.
    ///
    /// # Errors
    ///
    /// A sentence saying who was refused and why.
    pub fn admit(&self, peer: &Peer, daemon_uid: u32) -> Result<Grant, Denied> {
        let rule = self.rules.iter().find(|rule| rule.matches(peer));
        let listed = self.connect_uids.contains(&peer.uid)
            || self
                .connect_gids
                .iter()
                .any(|gid| *gid == peer.gid || peer.groups.contains(gid));
        let allowed =
            self.connect_any || peer.uid == daemon_uid || peer.uid == 0 || listed || rule.is_some();
        if !allowed {
            return Err(Denied(format!(
                "uid {} may not use this zygote, which serves uid {daemon_uid} \
                 (a policy file can allow more peers)",
                peer.uid
            )));
        }
        let mut rule = rule.cloned().unwrap_or_default();
        let privileged = peer.uid == 0 || peer.uid == daemon_uid;
        // Root with the capabilities to switch ids or raise limits could
        // do it itself; a root without them (a capability-dropped service)
        // gets no more than anyone else.
        if peer.uid == 0 && peer.can_setid {
            rule.run_as_any = true;
        }
        if peer.uid == 0 && peer.can_raise_limits {
            rule.raise_rlimits = true;
        }
        Ok(Grant {
            caps: PeerCaps {
                memory_max: rule.memory_max.or(self.limits.peer_caps.memory_max),
                pids_max: rule.pids_max.or(self.limits.peer_caps.pids_max),
            },
            max_children: rule
                .max_children
                .unwrap_or_else(|| self.limits.children_per_peer(privileged)),
            max_connections: rule
                .max_connections
                .unwrap_or_else(|| self.limits.connections_per_peer(privileged)),
            max_argv_env_bytes: rule
                .max_argv_env_bytes
                .unwrap_or(self.limits.max_argv_env_bytes),
            rule,
        })
    }
}

impl Grant {
    /// The sandbox profile imposed on this peer's children, if any.
    pub fn sandbox_profile(&self) -> Option<&str> {
        self.rule.sandbox.as_deref()
    }

    /// Checks a spawn request's user and resource limits against the peer
    /// and this grant, and returns the credentials the child must switch
    /// to: `None` when it keeps the daemon's.
    ///
    /// A root daemon always switches (to the peer's own ids unless the
    /// request names others). A non-root daemon cannot switch; it runs
    /// children as itself unless the request names other ids, which the
    /// kernel will then refuse.
    ///
    /// # Errors
    ///
    /// [`Denied`] for ids or limits beyond the peer's own that the policy
    /// does not allow it.
    pub fn check(
        &self,
        peer: &Peer,
        request: &SpawnRequest,
        daemon: &Credentials,
    ) -> Result<Option<Credentials>, Denied> {
        let target = match &request.user {
            None => Credentials {
                uid: peer.uid,
                gid: peer.gid,
                groups: peer.groups.clone(),
            },
            Some(user) => {
                self.check_user(peer, user.uid, user.gid, &user.groups)?;
                Credentials {
                    uid: user.uid,
                    gid: user.gid,
                    groups: user.groups.clone(),
                }
            }
        };
        self.check_rlimits(peer, &request.rlimits)?;
        Ok(if daemon.uid == 0 {
            Some(target)
        } else if request.user.is_none() || target == *daemon {
            None
        } else {
            Some(target)
        })
    }

    /// Limits to add to a request that leaves some resources unset, so that
    /// the child does not inherit daemon limits above the peer's hard ones
    /// (the client library sets them all; a raw client need not).
    /// `daemon_limits` are the daemon's `(resource, soft, hard)`.
    pub fn clamp_unset_rlimits(
        &self,
        peer: &Peer,
        requested: &[ResourceLimit],
        daemon_limits: &[(u32, u64, u64)],
    ) -> Vec<ResourceLimit> {
        if self.rule.raise_rlimits {
            return Vec::new();
        }
        daemon_limits
            .iter()
            .filter(|(resource, _, _)| !requested.iter().any(|r| r.resource == *resource))
            .filter_map(|&(resource, soft, hard)| {
                let own = peer.hard_limit(resource)?;
                (hard > own).then_some(ResourceLimit {
                    resource,
                    soft: soft.min(own),
                    hard: own,
                })
            })
            .collect()
    }

    fn check_user(&self, peer: &Peer, uid: u32, gid: u32, groups: &[u32]) -> Result<(), Denied> {
        if self.rule.run_as_any {
            return Ok(());
        }
        if uid != peer.uid && !self.rule.run_as_uids.contains(&uid) {
            return Err(Denied(format!(
                "peer uid {} may not run children as uid {uid} (not allowed by policy)",
                peer.uid
            )));
        }
        let own = |gid: &u32| {
            *gid == peer.gid || peer.groups.contains(gid) || self.rule.run_as_gids.contains(gid)
        };
        if let Some(gid) = std::iter::once(&gid).chain(groups).find(|gid| !own(gid)) {
            return Err(Denied(format!(
                "peer uid {} is not in group {gid} and may not give it to a child \
                 (not allowed by policy)",
                peer.uid
            )));
        }
        Ok(())
    }

    fn check_rlimits(&self, peer: &Peer, rlimits: &[ResourceLimit]) -> Result<(), Denied> {
        if self.rule.raise_rlimits {
            return Ok(());
        }
        for limit in rlimits {
            let Some(own) = peer.hard_limit(limit.resource) else {
                continue;
            };
            if limit.hard > own || limit.soft > own {
                return Err(Denied(format!(
                    "resource limit {} of {}/{} (soft/hard) is above the peer's own hard \
                     limit {} (not allowed by policy)",
                    limit.resource,
                    show_limit(limit.soft),
                    show_limit(limit.hard),
                    show_limit(own)
                )));
            }
        }
        Ok(())
    }
}

fn show_limit(value: u64) -> String {
    if value == u64::MAX {
        "unlimited".into()
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn limits_are_fitted_to_the_fd_limit() {
        let mut roomy = Policy::default_for(0);
        assert!(!roomy.fit_fds(1 << 20), "the defaults fit a million fds");
        assert_eq!(roomy.limits, Limits::default());

        let mut policy = Policy::default_for(0);
        assert!(policy.fit_fds(1024));
        let tight = policy.limits;
        let used = tight.max_connections * FDS_PER_CONNECTION + tight.max_children * FDS_PER_CHILD;
        assert!(used + FDS_RESERVED <= 1024, "{tight:?} uses {used} fds");
        assert!(tight.max_connections >= 1 && tight.max_children >= 1);
        assert_eq!(
            tight.max_connections_per_peer,
            share_of(tight.max_connections, CONNECTION_SHARE),
            "the per-peer share is kept: {tight:?}"
        );
        assert_eq!(
            tight.max_children_per_peer,
            share_of(tight.max_children, CHILD_SHARE),
            "the per-peer share is kept: {tight:?}"
        );
        assert!(tight.max_children_per_peer < tight.max_children);
        assert!(tight.child_reserve() >= 1);

        // What the file sets is kept; only the defaults make room.
        let mut set = Policy::parse("[limits]\nmax_connections = 2\n", 0).unwrap();
        assert!(set.fit_fds(1024));
        assert_eq!(set.limits.max_connections, 2);
        assert!(set.limits.max_children * FDS_PER_CHILD + 2 * FDS_PER_CONNECTION <= 1024);

        // A per-peer limit the file sets is only capped by the lowered
        // table; an unset one is a share of the table the file sets.
        let mut own = Policy::parse("[limits]\nmax_children_per_peer = 3000\n", 0).unwrap();
        assert!(own.fit_fds(1024));
        assert_eq!(own.limits.max_children_per_peer, own.limits.max_children);
        let small = Policy::parse("[limits]\nmax_children = 64\n", 0).unwrap();
        assert_eq!(small.limits.max_children_per_peer, 16);
        assert_eq!(small.limits.child_reserve(), 16);

        // Root and the daemon's own uid are held to the table, not the
        // share; anyone else to the share.
        let daemon_uid = 1000;
        let grant = |uid| small.admit(&peer(uid, uid, &[]), daemon_uid).unwrap();
        assert_eq!(grant(0).max_children, 64);
        assert_eq!(grant(daemon_uid).max_children, 64);
        let small =
            Policy::parse("[limits]\nmax_children = 64\n[connect]\nany = true\n", 1000).unwrap();
        assert_eq!(
            small
                .admit(&peer(1901, 1901, &[]), 1000)
                .unwrap()
                .max_children,
            16
        );
    }

    use super::*;
    use zygote_proto::UserSpec;

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer {
            pid: 100,
            uid,
            gid,
            groups: groups.to_vec(),
            hard_limits: vec![(7, 1024)],
            can_setid: uid == 0,
            can_raise_limits: uid == 0,
            nice: 0,
            can_nice: false,
            oom_score_adj: 0,
        }
    }

    fn request() -> SpawnRequest {
        SpawnRequest::new(1, "true")
    }

    fn as_user(uid: u32, gid: u32, groups: &[u32]) -> SpawnRequest {
        SpawnRequest {
            user: Some(UserSpec {
                uid,
                gid,
                groups: groups.to_vec(),
            }),
            ..request()
        }
    }

    fn creds(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    const ROOT: Credentials = Credentials {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    };

    #[test]
    fn root_daemon_runs_children_as_the_peer_by_default() {
        let policy = Policy::default_for(0);
        let alice = peer(1000, 1000, &[1000, 27]);
        let grant = policy.admit(&alice, 0).expect("anyone may connect to root");
        let target = grant.check(&alice, &request(), &ROOT).unwrap();
        assert_eq!(target, Some(creds(1000, 1000, &[1000, 27])));
    }

    #[test]
    fn other_uids_are_refused_unless_allowed() {
        let policy = Policy::default_for(0);
        let alice = peer(1000, 1000, &[1000, 27]);
        let grant = policy.admit(&alice, 0).unwrap();
        let denied = grant.check(&alice, &as_user(0, 0, &[]), &ROOT).unwrap_err();
        assert!(denied.0.contains("uid 0"), "{}", denied.0);
        // Her own uid with a group she is not in.
        let denied = grant
            .check(&alice, &as_user(1000, 1000, &[4]), &ROOT)
            .unwrap_err();
        assert!(denied.0.contains("group 4"), "{}", denied.0);
        // Fewer groups, or one of her groups as primary, is less privilege.
        let target = grant.check(&alice, &as_user(1000, 27, &[]), &ROOT).unwrap();
        assert_eq!(target, Some(creds(1000, 27, &[])));
    }

    #[test]
    fn rlimits_above_the_peer_hard_limit_are_refused() {
        let policy = Policy::default_for(0);
        let alice = peer(1000, 1000, &[]);
        let grant = policy.admit(&alice, 0).unwrap();
        let mut within = request();
        within.rlimits = vec![ResourceLimit {
            resource: 7,
            soft: 512,
            hard: 1024,
        }];
        assert!(grant.check(&alice, &within, &ROOT).is_ok());
        let mut above = request();
        above.rlimits = vec![ResourceLimit {
            resource: 7,
            soft: 512,
            hard: u64::MAX,
        }];
        let denied = grant.check(&alice, &above, &ROOT).unwrap_err();
        assert!(denied.0.contains("unlimited"), "{}", denied.0);
    }

    #[test]
    fn unset_limits_above_the_peer_are_clamped() {
        let policy = Policy::default_for(0);
        let alice = peer(1000, 1000, &[]);
        let grant = policy.admit(&alice, 0).unwrap();
        // The daemon's NOFILE hard limit is above Alice's 1024.
        let daemon = [(7, 4096, 8192), (3, 100, 200)];
        let added = grant.clamp_unset_rlimits(&alice, &[], &daemon);
        assert_eq!(
            added,
            vec![ResourceLimit {
                resource: 7,
                soft: 1024,
                hard: 1024
            }]
        );
        // Set in the request: left to the request (checked elsewhere).
        let set = [ResourceLimit {
            resource: 7,
            soft: 10,
            hard: 10,
        }];
        assert!(grant.clamp_unset_rlimits(&alice, &set, &daemon).is_empty());
    }

    #[test]
    fn non_root_daemon_serves_only_its_uid_and_root() {
        let policy = Policy::default_for(1000);
        assert!(policy.admit(&peer(1000, 1000, &[]), 1000).is_ok());
        assert!(policy.admit(&peer(0, 0, &[]), 1000).is_ok());
        let denied = policy.admit(&peer(1001, 1001, &[]), 1000).unwrap_err();
        assert!(denied.0.contains("uid 1001"), "{}", denied.0);
        // Its children keep the daemon's credentials: no switch at all.
        let grant = policy.admit(&peer(1000, 1000, &[]), 1000).unwrap();
        let own = creds(1000, 1000, &[]);
        let target = grant.check(&peer(1000, 1000, &[]), &request(), &own);
        assert_eq!(target, Ok(None));
    }

    #[test]
    fn policy_file_grants_connect_run_as_and_limits() {
        let text = r#"
            [connect]
            gids = [50]

            [limits]
            max_connections = 8
            max_children_per_peer = 3

            [[peer]]
            uids = [1000]
            run_as_uids = [1001]
            run_as_gids = [1001]
            raise_rlimits = true
            max_children = 10
        "#;
        let policy = Policy::parse(text, 500).expect("valid policy");
        assert_eq!(policy.limits.max_connections, 8);
        assert_eq!(policy.limits.max_children, DEFAULT_MAX_CHILDREN);
        // A group member may connect to a non-root daemon.
        let member = peer(2000, 2000, &[50]);
        let grant = policy.admit(&member, 500).expect("member of gid 50");
        assert_eq!(grant.max_children, 3);
        // The rule's peer may run as 1001 and above its limits.
        let alice = peer(1000, 1000, &[]);
        let grant = policy.admit(&alice, 500).expect("rule matches");
        assert_eq!(grant.max_children, 10);
        let root = ROOT;
        assert_eq!(
            grant.check(&alice, &as_user(1001, 1001, &[]), &root),
            Ok(Some(creds(1001, 1001, &[])))
        );
        assert!(
            grant
                .check(&alice, &as_user(1002, 1001, &[]), &root)
                .is_err()
        );
        let mut above = request();
        above.rlimits = vec![ResourceLimit {
            resource: 7,
            soft: u64::MAX,
            hard: u64::MAX,
        }];
        assert!(grant.check(&alice, &above, &root).is_ok());
    }

    #[test]
    fn root_peer_needs_its_capabilities_to_run_as_others() {
        let policy = Policy::default_for(0);
        let root = peer(0, 0, &[]);
        let grant = policy.admit(&root, 0).unwrap();
        assert!(
            grant
                .check(&root, &as_user(65534, 65534, &[]), &ROOT)
                .is_ok()
        );
        let weak_root = Peer {
            can_setid: false,
            ..peer(0, 0, &[])
        };
        let grant = policy.admit(&weak_root, 0).unwrap();
        assert!(
            grant
                .check(&weak_root, &as_user(65534, 65534, &[]), &ROOT)
                .is_err()
        );
    }

    #[test]
    fn parse_errors_name_the_line() {
        let error = Policy::parse("[limits]\nmax_connections = \"many\"\n", 0).unwrap_err();
        assert!(error.contains("line 2"), "{error}");
        let error = Policy::parse("[limits]\nmax_conections = 3\n", 0).unwrap_err();
        assert!(error.contains("max_conections"), "{error}");
        let error = Policy::parse("[[peer]]\nrun_as_any = true\n", 0).unwrap_err();
        assert!(error.contains("matches nobody"), "{error}");
    }

    #[test]
    fn load_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, "[connect\n").unwrap();
        let error = Policy::load(&path, 0).unwrap_err().to_string();
        assert!(error.contains("policy.toml"), "{error}");
        assert!(error.contains("line 1"), "{error}");
    }
}
