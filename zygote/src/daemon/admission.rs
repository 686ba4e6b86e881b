//! Admission control: a slot per child, counted per peer uid and in total,
//! and a slot per connection, counted per peer uid. A spawn or connection
//! over a limit is refused at once ("busy"), never queued.

use std::sync::Arc;

use crate::daemon::state::Daemon;

/// One reserved child slot, released on drop (after the child is reaped,
/// or when its spawn failed).
#[derive(Debug)]
pub struct Slot {
    daemon: Arc<Daemon>,
    uid: u32,
}

/// Whether `uid` may use the places kept in reserve: root's, and the
/// daemon's own.
fn privileged(daemon: &Daemon, uid: u32) -> bool {
    uid == 0 || uid == daemon.uid
}

/// Reserves a slot for a child of a peer of `uid`, allowed `per_peer`
/// children at once. Peers other than root and the daemon's own uid may
/// not take the last [`Limits::child_reserve`](crate::daemon::policy::Limits::child_reserve)
/// slots.
///
/// # Errors
///
/// A sentence naming the limit that was hit.
pub fn reserve(daemon: &Arc<Daemon>, uid: u32, per_peer: usize) -> Result<Slot, String> {
    let limits = &daemon.policy.limits;
    let total_limit = if privileged(daemon, uid) {
        limits.max_children
    } else {
        limits.max_children - limits.child_reserve()
    };
    let mut counts = daemon.child_counts.lock().expect("child counts poisoned");
    if counts.total >= total_limit {
        return Err(format!(
            "busy: the zygote runs {} children, its limit for uid {uid} (limits.max_children)",
            counts.total
        ));
    }
    let own = counts.by_uid.get(&uid).copied().unwrap_or(0);
    if own >= per_peer {
        return Err(format!(
            "busy: uid {uid} already runs {own} children through this zygote, its limit \
             (limits.max_children_per_peer)"
        ));
    }
    counts.add(uid, per_peer);
    Ok(Slot {
        daemon: Arc::clone(daemon),
        uid,
    })
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.daemon
            .child_counts
            .lock()
            .expect("child counts poisoned")
            .remove(self.uid);
    }
}

/// A place in the connection table, counted per peer uid and in total;
/// released on drop.
#[derive(Debug)]
pub struct ConnectionSlot {
    daemon: Arc<Daemon>,
    uid: u32,
}

/// Reserves a place in the connection table for a peer of `uid`, allowed
/// `per_peer` connections at once. Peers other than root and the
/// daemon's own uid may not take the last [`Limits::root_reserve`](crate::daemon::policy::Limits::root_reserve)
/// places.
///
/// # Errors
///
/// A sentence naming the limit that was hit.
pub fn reserve_connection(
    daemon: &Arc<Daemon>,
    uid: u32,
    per_peer: usize,
) -> Result<ConnectionSlot, String> {
    let limits = &daemon.policy.limits;
    let limit = if privileged(daemon, uid) {
        limits.max_connections
    } else {
        limits.max_connections - limits.root_reserve()
    };
    let mut counts = daemon
        .connection_counts
        .lock()
        .expect("connection counts poisoned");
    if counts.total >= limit {
        return Err(format!(
            "busy: the zygote has {} connections open, its limit for uid {uid} \
             (limits.max_connections); try again later",
            counts.total
        ));
    }
    let own = counts.by_uid.get(&uid).copied().unwrap_or(0);
    if own >= per_peer {
        return Err(format!(
            "busy: uid {uid} already has {own} connections open to this zygote, its limit \
             (limits.max_connections_per_peer); close some, or try again later"
        ));
    }
    counts.add(uid, per_peer);
    Ok(ConnectionSlot {
        daemon: Arc::clone(daemon),
        uid,
    })
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let last = {
            let mut counts = self
                .daemon
                .connection_counts
                .lock()
                .expect("connection counts poisoned");
            counts.remove(self.uid);
            !counts.by_uid.contains_key(&self.uid)
        };
        // A uid's templates live while it has a connection.
        if last {
            self.daemon.templates.owner_left(self.uid);
        }
    }
}
