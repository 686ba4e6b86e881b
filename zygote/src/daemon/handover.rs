//! What a live upgrade hands from one image of the daemon to the next: the
//! pause that brings every task to a safe point, and the saved state with
//! its versioned, checked encoding.
//!
//! This module sits at the bottom of the daemon's layers: it only defines
//! the state and the pause; `upgrade` (at the top) collects, writes, execs
//! and restores.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::{Notify, watch};
use zygote_proto::{ExitStatus, ResourceLimit, ResourceUsage};

use crate::daemon::cgroup::{SavedCgroup, SavedSubtree};
use crate::daemon::peer::Peer;
use crate::daemon::policy::{Grant, Policy};

#[allow(missing_docs)]
mod v1;

/// The first bytes of a state file.
pub const MAGIC: [u8; 8] = *b"ZYGSTATE";

/// The state format's own version, independent of the package version. A
/// newer binary must keep reading every older version: add a variant to
/// [`Versioned`] and convert, never change a released one.
///
/// The body embeds, through serde, the policy (`Policy`, `Grant`, their
/// `Rule`, `Limits`, `PeerCaps`), `CgroupSpec`, `ExitStatus`,
/// `ResourceUsage` and `ResourceLimit`: a change to any of them is a
/// format change too. `tests/fixtures/upgrade-state-v1.bin` fails to read
/// until it is handled.
///
/// Version 2 adds each connection's negotiated protocol version
/// ([`SavedClient::protocol_version`]).
pub const STATE_VERSION: u32 = 2;

/// Header: magic, version (u32 LE), body length (u64 LE), FNV-1a 64 of the
/// body (u64 LE).
const HEADER_BYTES: usize = 8 + 4 + 8 + 8;

/// The largest state accepted (a full daemon is a few MiB).
const MAX_STATE_BYTES: u64 = 256 << 20;

/// Why a state file cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Fewer bytes than the header, or than the header announces.
    #[error("state truncated: {have} bytes, expected {want}")]
    Truncated {
        /// Bytes present.
        have: u64,
        /// Bytes the header (or the header itself) needs.
        want: u64,
    },
    /// Not a zygote state file.
    #[error("not a zygote state file (bad magic)")]
    Magic,
    /// Written by a newer zygote.
    #[error("state format version {0} is newer than this zygote reads (up to {STATE_VERSION})")]
    Version(u32),
    /// The body does not match its checksum.
    #[error("state checksum mismatch: the state is corrupt")]
    Checksum,
    /// The body does not decode.
    #[error("state does not decode: {0}")]
    Decode(String),
    /// Reading the state failed.
    #[error("cannot read the state: {0}")]
    Io(#[from] std::io::Error),
}

/// Every state format this binary reads, by version.
#[derive(Debug)]
pub enum Versioned {
    /// Version 1, frozen: connections without their protocol version.
    V1(v1::SavedDaemon),
    /// Version 2.
    V2(SavedDaemon),
}

impl Versioned {
    /// The format version it was read in.
    pub fn format(&self) -> u32 {
        match self {
            Self::V1(_) => 1,
            Self::V2(_) => 2,
        }
    }
}

/// The daemon's whole state at the moment of the upgrade.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedDaemon {
    /// The version of the image that wrote it, for the log.
    pub written_by: String,
    /// When the daemon first started serving, in `CLOCK_MONOTONIC`
    /// nanoseconds: the uptime origin survives upgrades.
    pub started_mono_ns: u64,
    /// The listening socket.
    pub listener: i32,
    /// The socket path the daemon bound itself (removed at its stop).
    pub bound_path: Option<PathBuf>,
    /// The `/metrics` listener.
    pub metrics_listener: Option<i32>,
    /// The service manager's notify socket, connected.
    pub notify_socket: Option<i32>,
    /// The watchdog interval, in microseconds.
    pub watchdog_usec: Option<u64>,
    /// The policy in force (the file is not read again).
    pub policy: Policy,
    /// The fd limit children get when their request leaves it unset.
    pub child_nofile: Option<ResourceLimit>,
    /// The delegated cgroup subtree.
    pub cgroups: Option<SavedSubtree>,
    /// Why there is no subtree.
    pub no_cgroups: String,
    /// Counters: `(metric, labels, value)`.
    pub counters: Vec<SavedCounter>,
    /// Every connection, and the children of those whose client left.
    pub connections: Vec<SavedConnection>,
    /// Cgroups of reaped children whose tree lives on, removed once empty.
    pub leftover_cgroups: Vec<SavedCgroup>,
    /// The `Upgrade` request to answer from the new image: `(index in
    /// connections, request id)`.
    pub reply_to: Option<(usize, u64)>,
}

/// One counter's value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedCounter {
    /// The metric's name.
    pub name: String,
    /// Its labels, as `(name, value)`.
    pub labels: Vec<(String, String)>,
    /// The count.
    pub value: u64,
}

/// One connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedConnection {
    /// The client's socket; `None` once the client has left (its children
    /// are still reaped).
    pub socket: Option<i32>,
    /// The peer and its grant, once the handshake is done; `None` for a
    /// connection that has not said hello yet, which the new image serves
    /// from the start.
    pub client: Option<SavedClient>,
}

/// A connection past its handshake.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedClient {
    /// Who the client is.
    pub peer: SavedPeer,
    /// What the policy lets it do.
    pub grant: Grant,
    /// Spawn ids in use (children running, or exited and not yet answered).
    pub ids: Vec<u64>,
    /// Whether the client has left.
    pub closed: bool,
    /// Its children not yet reaped or not yet reported.
    pub children: Vec<SavedChild>,
    /// The protocol version negotiated in its hello (state version 2).
    pub protocol_version: u32,
}

/// A connected peer, as saved.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedPeer {
    /// As the peer's `pid`.
    pub pid: i32,
    /// As the peer's `uid`.
    pub uid: u32,
    /// As the peer's `gid`.
    pub gid: u32,
    /// As the peer's `groups`.
    pub groups: Vec<u32>,
    /// As the peer's `hard_limits`.
    pub hard_limits: Vec<(u32, u64)>,
    /// As the peer's `can_setid`.
    pub can_setid: bool,
    /// As the peer's `can_raise_limits`.
    pub can_raise_limits: bool,
    /// As the peer's `nice`.
    pub nice: i32,
    /// As the peer's `can_nice`.
    pub can_nice: bool,
    /// As the peer's `oom_score_adj`.
    pub oom_score_adj: i32,
}

impl From<&Peer> for SavedPeer {
    fn from(peer: &Peer) -> Self {
        Self {
            pid: peer.pid,
            uid: peer.uid,
            gid: peer.gid,
            groups: peer.groups.clone(),
            hard_limits: peer.hard_limits.clone(),
            can_setid: peer.can_setid,
            can_raise_limits: peer.can_raise_limits,
            nice: peer.nice,
            can_nice: peer.can_nice,
            oom_score_adj: peer.oom_score_adj,
        }
    }
}

impl From<SavedPeer> for Peer {
    fn from(peer: SavedPeer) -> Self {
        Self {
            pid: peer.pid,
            uid: peer.uid,
            gid: peer.gid,
            groups: peer.groups,
            hard_limits: peer.hard_limits,
            can_setid: peer.can_setid,
            can_raise_limits: peer.can_raise_limits,
            nice: peer.nice,
            can_nice: peer.can_nice,
            oom_score_adj: peer.oom_score_adj,
        }
    }
}

/// One child of a connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedChild {
    /// The spawn id.
    pub id: u64,
    /// Its pid.
    pub pid: i32,
    /// Its pidfd; `None` once it was reaped (its exit waits in `exited`).
    pub pidfd: Option<i32>,
    /// Kill-on-close: the signal, and whether its own group gets it.
    pub on_close: Option<(i32, bool)>,
    /// Its cgroup.
    pub cgroup: Option<SavedCgroup>,
    /// Stops and continues are reported.
    pub report_stops: bool,
    /// It leads its own process group (timeouts signal the group).
    pub leads_own_group: bool,
    /// Its timeout, in absolute `CLOCK_MONOTONIC` times.
    pub timer: Option<SavedTimer>,
    /// Reaped, its exit notice not sent yet (its tree is being waited
    /// for).
    pub exited: Option<SavedExit>,
}

/// A timeout's deadlines.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SavedTimer {
    /// When SIGTERM goes out.
    pub term_at_ns: u64,
    /// The grace between SIGTERM and SIGKILL, in milliseconds.
    pub grace_millis: u64,
    /// When SIGKILL goes out, once SIGTERM went.
    pub kill_at_ns: Option<u64>,
}

/// A reaped child's exit, not reported yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedExit {
    /// How it ended.
    pub status: ExitStatus,
    /// What it used.
    pub usage: ResourceUsage,
    /// Whether its timeout fired.
    pub timed_out: bool,
}

/// A timeout's deadlines, shared by the task waiting for the child and the
/// upgrade that saves them.
#[derive(Debug, Clone, Copy)]
pub struct Timer {
    /// When SIGTERM goes out.
    pub term_at: Instant,
    /// The grace between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// When SIGKILL goes out, once SIGTERM went.
    pub kill_at: Option<Instant>,
}

impl Timer {
    /// As saved.
    pub fn save(&self) -> SavedTimer {
        SavedTimer {
            term_at_ns: to_mono_ns(self.term_at),
            grace_millis: self.grace.as_millis() as u64,
            kill_at_ns: self.kill_at.map(to_mono_ns),
        }
    }

    /// As restored.
    pub fn restore(saved: SavedTimer) -> Self {
        Self {
            term_at: from_mono_ns(saved.term_at_ns),
            grace: Duration::from_millis(saved.grace_millis),
            kill_at: saved.kill_at_ns.map(from_mono_ns),
        }
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock behind [`Instant`], and
/// the same in every image of one boot.
pub fn mono_now_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

/// An [`Instant`] as `CLOCK_MONOTONIC` nanoseconds.
pub fn to_mono_ns(instant: Instant) -> u64 {
    let (mono, now) = (mono_now_ns(), Instant::now());
    match instant.checked_duration_since(now) {
        Some(ahead) => mono.saturating_add(ahead.as_nanos() as u64),
        None => mono.saturating_sub(now.duration_since(instant).as_nanos() as u64),
    }
}

/// `CLOCK_MONOTONIC` nanoseconds as an [`Instant`].
pub fn from_mono_ns(ns: u64) -> Instant {
    let (mono, now) = (mono_now_ns(), Instant::now());
    if ns >= mono {
        now + Duration::from_nanos(ns - mono)
    } else {
        let ago = Duration::from_nanos(mono - ns);
        now.checked_sub(ago).unwrap_or(now)
    }
}

/// Encodes the state: header, then the postcard body.
///
/// # Errors
///
/// When the state does not encode (a bug).
pub fn encode(state: &SavedDaemon) -> Result<Vec<u8>, String> {
    let body = postcard::to_stdvec(state).map_err(|error| error.to_string())?;
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&STATE_VERSION.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&fnv1a(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    Ok(bytes)
}

/// Decodes and checks a state: magic, version, length, checksum, body.
///
/// # Errors
///
/// [`StateError`] naming what is wrong.
pub fn decode(bytes: &[u8]) -> Result<Versioned, StateError> {
    let have = bytes.len() as u64;
    if bytes.len() < HEADER_BYTES {
        return Err(StateError::Truncated {
            have,
            want: HEADER_BYTES as u64,
        });
    }
    if bytes[..8] != MAGIC {
        return Err(StateError::Magic);
    }
    let word = |range: std::ops::Range<usize>| {
        let mut buf = [0u8; 8];
        buf[..range.len()].copy_from_slice(&bytes[range]);
        u64::from_le_bytes(buf)
    };
    let version = word(8..12) as u32;
    let length = word(12..20);
    let checksum = word(20..28);
    if version == 0 || version > STATE_VERSION {
        return Err(StateError::Version(version));
    }
    let want = (HEADER_BYTES as u64).saturating_add(length);
    if have != want {
        return Err(StateError::Truncated { have, want });
    }
    let body = &bytes[HEADER_BYTES..];
    if fnv1a(body) != checksum {
        return Err(StateError::Checksum);
    }
    match version {
        1 => postcard::from_bytes(body)
            .map(Versioned::V1)
            .map_err(|error| StateError::Decode(error.to_string())),
        2 => postcard::from_bytes(body)
            .map(Versioned::V2)
            .map_err(|error| StateError::Decode(error.to_string())),
        _ => Err(StateError::Version(version)),
    }
}

/// Reads a whole state file from `file` (from offset 0, whatever the fd's
/// position).
///
/// # Errors
///
/// [`StateError`].
pub fn read(file: &std::fs::File) -> Result<Versioned, StateError> {
    use std::os::unix::fs::FileExt;
    let size = file.metadata()?.len();
    if size > MAX_STATE_BYTES {
        return Err(StateError::Decode(format!(
            "{size} bytes is more than a state can be"
        )));
    }
    let mut bytes = vec![0u8; size as usize];
    file.read_exact_at(&mut bytes, 0)?;
    decode(&bytes)
}

/// The newest format, converted from whichever version was read.
pub fn latest(state: Versioned) -> SavedDaemon {
    match state {
        Versioned::V1(state) => state.into(),
        Versioned::V2(state) => state,
    }
}

/// FNV-1a, 64 bits: catches truncation and stray bytes, not an attacker
/// (the memfd is sealed and private to the daemon).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Brings every task that touches clients or children to a safe point
/// before the state is saved.
///
/// Tasks hold an [`Active`] while they work; [`Pause::pause`] resolves once
/// none is held, and new work waits until the upgrade is over. A task
/// waiting for something that may take long (a frame, a child's exit)
/// watches [`Active::requested`] and, at a safe point, [`Active::park`]s:
/// it gives its share back and waits for the upgrade to fail (it then
/// carries on where it stopped) or to exec.
#[derive(Debug)]
pub struct Pause {
    inner: Arc<PauseInner>,
}

#[derive(Debug)]
struct PauseInner {
    /// Set while an upgrade wants the daemon paused (SeqCst with `busy`).
    requested: AtomicBool,
    /// The same, for waiting.
    changed: watch::Sender<bool>,
    /// Shares held.
    busy: AtomicUsize,
    /// Woken when `busy` drops to zero.
    idle: Notify,
}

impl Default for Pause {
    fn default() -> Self {
        Self {
            inner: Arc::new(PauseInner {
                requested: AtomicBool::new(false),
                changed: watch::channel(false).0,
                busy: AtomicUsize::new(0),
                idle: Notify::new(),
            }),
        }
    }
}

impl PauseInner {
    /// Takes a share once no upgrade is under way.
    async fn enter(&self) {
        let mut changed = self.changed.subscribe();
        loop {
            // Count first, then look: either the upgrade sees the share,
            // or this sees its request.
            self.busy.fetch_add(1, Ordering::SeqCst);
            if !self.requested.load(Ordering::SeqCst) {
                return;
            }
            self.leave();
            let _ = changed.wait_for(|requested| !*requested).await;
        }
    }

    fn leave(&self) {
        if self.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }
}

impl Pause {
    /// A task's share, held while it works; waits while an upgrade holds
    /// the daemon paused.
    pub async fn enter(&self) -> Active {
        self.inner.enter().await;
        Active {
            inner: Arc::clone(&self.inner),
            requested: self.inner.changed.subscribe(),
            held: true,
        }
    }

    /// A share for work a task hands on, such as a reply it queued for
    /// sending: taken at once, so only a task that holds a share may take
    /// one (no upgrade can have paused meanwhile). An upgrade then waits
    /// for the reply to be sent, as it would for the task sending it.
    pub fn hold(&self) -> Active {
        self.inner.busy.fetch_add(1, Ordering::SeqCst);
        Active {
            inner: Arc::clone(&self.inner),
            requested: self.inner.changed.subscribe(),
            held: true,
        }
    }

    /// Asks every task to park, and resolves once all have.
    pub async fn pause(&self) -> Paused<'_> {
        let inner = &*self.inner;
        inner.requested.store(true, Ordering::SeqCst);
        inner.changed.send_replace(true);
        let paused = Paused { pause: self };
        loop {
            let idle = inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if inner.busy.load(Ordering::SeqCst) == 0 {
                return paused;
            }
            idle.await;
        }
    }
}

/// The daemon paused: no task works until this is dropped.
#[derive(Debug)]
pub struct Paused<'a> {
    pause: &'a Pause,
}

impl Drop for Paused<'_> {
    /// Resumes: parked tasks carry on where they stopped.
    fn drop(&mut self) {
        self.pause.inner.requested.store(false, Ordering::SeqCst);
        self.pause.inner.changed.send_replace(false);
    }
}

/// A task's share of the [`Pause`].
#[derive(Debug)]
pub struct Active {
    inner: Arc<PauseInner>,
    requested: watch::Receiver<bool>,
    held: bool,
}

impl Active {
    /// Another share, for a task this one starts: taken at once, since
    /// this one's share keeps any upgrade from having paused.
    pub fn share(&self) -> Self {
        self.inner.busy.fetch_add(1, Ordering::SeqCst);
        Self {
            inner: Arc::clone(&self.inner),
            requested: self.inner.changed.subscribe(),
            held: true,
        }
    }

    /// Resolves when an upgrade asks tasks to park.
    pub async fn requested(&mut self) {
        let _ = self.requested.wait_for(|requested| *requested).await;
    }

    /// Gives the share back and waits until the upgrade is over (if it
    /// succeeds, this never returns: the process is another image).
    pub async fn park(&mut self) {
        if self.held {
            self.held = false;
            self.inner.leave();
        }
        self.inner.enter().await;
        self.held = true;
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if self.held {
            self.inner.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_times_round_trip() {
        let now = Instant::now();
        for instant in [
            now,
            now + Duration::from_secs(5),
            now - Duration::from_millis(3),
        ] {
            let back = from_mono_ns(to_mono_ns(instant));
            let error = if back > instant {
                back - instant
            } else {
                instant - back
            };
            assert!(error < Duration::from_millis(5), "{error:?}");
        }
    }

    #[test]
    fn corrupt_states_are_refused_by_name() {
        let state = SavedDaemon {
            written_by: "test".into(),
            started_mono_ns: 1,
            listener: 3,
            bound_path: None,
            metrics_listener: None,
            notify_socket: None,
            watchdog_usec: None,
            policy: Policy::default_for(0),
            child_nofile: None,
            cgroups: None,
            no_cgroups: String::new(),
            counters: Vec::new(),
            connections: Vec::new(),
            leftover_cgroups: Vec::new(),
            reply_to: None,
        };
        let bytes = encode(&state).unwrap();
        assert!(matches!(decode(&bytes), Ok(Versioned::V2(_))));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(StateError::Truncated { .. })
        ));
        assert!(matches!(
            decode(&bytes[..10]),
            Err(StateError::Truncated { .. })
        ));
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(decode(&flipped), Err(StateError::Checksum)));
        let mut newer = bytes.clone();
        newer[8] = 99;
        assert!(matches!(decode(&newer), Err(StateError::Version(99))));
        let mut magic = bytes;
        magic[0] = b'X';
        assert!(matches!(decode(&magic), Err(StateError::Magic)));
    }
}
