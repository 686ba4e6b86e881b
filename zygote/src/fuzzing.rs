//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`):
//! the daemon's request handling, minus the spawn itself.

use std::fs::File;
use std::os::fd::OwnedFd;

use zygote_proto::{ClientMessage, decode};

use crate::daemon::peer::Peer;
use crate::daemon::policy::{DEFAULT_MAX_ARGV_ENV_BYTES, Policy};
use crate::spawn::Credentials;

/// Decodes `bytes` as a client frame carrying `attached` fds (each
/// `/dev/null`), and runs what the daemon runs on a spawn request before
/// creating a process: the policy check for an unprivileged peer of a root
/// daemon, then validation and planning. Must never panic.
pub fn handle_frame(bytes: &[u8], attached: u8) {
    let Ok(ClientMessage::Spawn(mut request)) = decode::<ClientMessage>(bytes) else {
        return;
    };
    let peer = Peer {
        pid: 1,
        uid: 1000,
        gid: 1000,
        groups: vec![1000, 27],
        hard_limits: vec![(7, 4096), (3, u64::MAX)],
        can_setid: false,
        can_raise_limits: false,
        nice: 0,
        can_nice: false,
        oom_score_adj: 0,
    };
    let policy = Policy::default_for(0);
    let root = Credentials {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    };
    if let Ok(grant) = policy.admit(&peer, 0) {
        let _ = grant.check(&peer, &request, &root);
    }
    let fds: Vec<OwnedFd> = (0..attached % 8)
        .filter_map(|_| File::open("/dev/null").ok().map(OwnedFd::from))
        .collect();
    let _ = crate::daemon::plan::prepare(
        &mut request,
        fds,
        DEFAULT_MAX_ARGV_ENV_BYTES,
        &crate::daemon::plan::DevNull::default(),
    );
}
