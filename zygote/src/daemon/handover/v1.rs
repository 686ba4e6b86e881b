//! Version 1 of the state format, as released: frozen. Its connections
//! carry no protocol version; the image that wrote it spoke versions 1 and
//! 2, whose layouts after the handshake are the same, so a connection it
//! hands over speaks version 2 from then on.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use zygote_proto::ResourceLimit;

use super::{SavedChild, SavedCounter, SavedPeer};
use crate::daemon::cgroup::{SavedCgroup, SavedSubtree};
use crate::daemon::policy::{Grant, Policy};

/// The protocol version of every connection a version-1 state hands over.
pub const HANDED_OVER_VERSION: u32 = 2;

/// As [`super::SavedDaemon`] in version 1.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedDaemon {
    pub written_by: String,
    pub started_mono_ns: u64,
    pub listener: i32,
    pub bound_path: Option<PathBuf>,
    pub metrics_listener: Option<i32>,
    pub notify_socket: Option<i32>,
    pub watchdog_usec: Option<u64>,
    pub policy: Policy,
    pub child_nofile: Option<ResourceLimit>,
    pub cgroups: Option<SavedSubtree>,
    pub no_cgroups: String,
    pub counters: Vec<SavedCounter>,
    pub connections: Vec<SavedConnection>,
    pub leftover_cgroups: Vec<SavedCgroup>,
    pub reply_to: Option<(usize, u64)>,
}

/// As [`super::SavedConnection`] in version 1.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedConnection {
    pub socket: Option<i32>,
    pub client: Option<SavedClient>,
}

/// As [`super::SavedClient`] in version 1: no protocol version.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedClient {
    pub peer: SavedPeer,
    pub grant: Grant,
    pub ids: Vec<u64>,
    pub closed: bool,
    pub children: Vec<SavedChild>,
}

impl From<SavedClient> for super::SavedClient {
    fn from(client: SavedClient) -> Self {
        Self {
            peer: client.peer,
            grant: client.grant,
            ids: client.ids,
            closed: client.closed,
            children: client.children,
            protocol_version: HANDED_OVER_VERSION,
        }
    }
}

impl From<SavedConnection> for super::SavedConnection {
    fn from(connection: SavedConnection) -> Self {
        Self {
            socket: connection.socket,
            client: connection.client.map(Into::into),
        }
    }
}

impl From<SavedDaemon> for super::SavedDaemon {
    fn from(state: SavedDaemon) -> Self {
        Self {
            written_by: state.written_by,
            started_mono_ns: state.started_mono_ns,
            listener: state.listener,
            bound_path: state.bound_path,
            metrics_listener: state.metrics_listener,
            notify_socket: state.notify_socket,
            watchdog_usec: state.watchdog_usec,
            policy: state.policy,
            child_nofile: state.child_nofile,
            cgroups: state.cgroups,
            no_cgroups: state.no_cgroups,
            counters: state.counters,
            connections: state.connections.into_iter().map(Into::into).collect(),
            leftover_cgroups: state.leftover_cgroups,
            reply_to: state.reply_to,
        }
    }
}
