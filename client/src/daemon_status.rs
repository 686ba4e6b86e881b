//! [`DaemonStatus`]: what the zygote says about itself.

use std::time::Duration;

use zygote_proto::{PeerUse, SpawnerInfo, StatusReply};

/// The zygote's version, uptime and counters, as [`Client::status`]
/// returns them.
///
/// [`Client::status`]: crate::Client::status
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DaemonStatus {
    /// The zygote's package version.
    pub server_version: String,
    /// The zygote's pid, in its own pid namespace.
    pub pid: i32,
    /// Time since the zygote started.
    pub uptime: Duration,
    /// Connections open now, the asking one included.
    pub connections_open: u64,
    /// Connections accepted since start.
    pub connections_accepted: u64,
    /// Children started and not yet reaped.
    pub children_running: u64,
    /// Spawns whose child exec'd, since start.
    pub spawns_succeeded: u64,
    /// Spawns that failed or were refused, since start.
    pub spawns_failed: u64,
    /// Use per peer uid: every uid's for root and the zygote's own uid,
    /// only the caller's own for any other. Empty from a zygote of
    /// protocol version 2 or older.
    pub peers: Vec<PeerUse>,
    /// The zygote's per-uid spawner processes; empty when it has none.
    pub spawners: Vec<SpawnerInfo>,
}

impl DaemonStatus {
    pub(crate) fn from_reply(reply: StatusReply) -> Self {
        Self {
            server_version: reply.server_version,
            pid: reply.pid,
            uptime: Duration::from_millis(reply.uptime_millis),
            connections_open: reply.connections_open,
            connections_accepted: reply.connections_accepted,
            children_running: reply.children_running,
            spawns_succeeded: reply.spawns_succeeded,
            spawns_failed: reply.spawns_failed,
            peers: reply.peers,
            spawners: reply.spawners,
        }
    }
}
