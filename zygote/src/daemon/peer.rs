//! Who is on the other end of a connection, as the kernel tells it.
//!
//! The uid, gid and pid come from `SO_PEERCRED`: the peer's credentials
//! when it called `connect`, which it cannot forge. Supplementary groups,
//! capabilities and hard resource limits are not in `SO_PEERCRED`; they
//! are read from `/proc/<pid>/status` and `/proc/<pid>/limits`.
//!
//! Reading `/proc` by pid races with the peer exiting and its pid being
//! reused. So we hold a pidfd of the peer (`SO_PEERPIDFD`, Linux 6.5; on
//! older kernels `pidfd_open` right after accept) and, after reading,
//! check through it that the process is still alive: a live process keeps
//! its pid, so what we read was its own. The `pidfd_open` fallback leaves
//! a window between accept and open in which the peer could exit and its
//! pid be reused; the uid read from `/proc` must then still match
//! `SO_PEERCRED`'s, so the most a reused pid could lend is the groups of
//! another process of the same uid.
//!
//! Groups and limits are read once, at connect time; a peer that later
//! lowers its own limits or drops groups keeps what it had when it
//! connected, no more.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use zygote_proto::UCred;

use crate::spawn;

/// `CAP_SETGID` and `CAP_SETUID`, bits of `CapEff`.
const CAP_SETID_MASK: u64 = (1 << 6) | (1 << 7);
/// `CAP_SYS_RESOURCE`.
const CAP_SYS_RESOURCE_MASK: u64 = 1 << 24;
/// `CAP_SYS_NICE`.
const CAP_SYS_NICE_MASK: u64 = 1 << 23;

/// Whether `SO_PEERPIDFD` worked so far; cleared, and logged once, when the
/// kernel lacks it.
static PEERPIDFD_WORKS: AtomicBool = AtomicBool::new(true);

/// A connected peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its pid in the daemon's pid namespace.
    pub pid: i32,
    /// Its effective uid at connect time.
    pub uid: u32,
    /// Its effective gid at connect time.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
    /// `(RLIMIT_* number, hard limit)`; `u64::MAX` is unlimited.
    pub hard_limits: Vec<(u32, u64)>,
    /// It holds `CAP_SETUID` and `CAP_SETGID`.
    pub can_setid: bool,
    /// It holds `CAP_SYS_RESOURCE` (and so may also lower its OOM score
    /// adjustment).
    pub can_raise_limits: bool,
    /// Its nice value at connect time: the lowest its children get
    /// without `can_nice`.
    pub nice: i32,
    /// It holds `CAP_SYS_NICE`.
    pub can_nice: bool,
    /// Its `oom_score_adj` at connect time: the lowest its children get
    /// without `can_raise_limits`.
    pub oom_score_adj: i32,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} uid {} gid {}", self.pid, self.uid, self.gid)
    }
}

/// Why a peer could not be identified.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Reading its `/proc` files failed, usually because it already exited.
    #[error("failed to read {path} of peer pid {pid}: {source}")]
    Proc {
        /// The peer's pid.
        pid: i32,
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A `/proc` file did not have the expected lines.
    #[error("cannot parse {path} of peer pid {pid}")]
    Parse {
        /// The peer's pid.
        pid: i32,
        /// The file.
        path: String,
    },
    /// The process behind the pid is not the one that connected.
    #[error("peer pid {pid} exited or changed its uid since it connected")]
    Changed {
        /// The peer's pid.
        pid: i32,
    },
}

impl Peer {
    /// The hard limit of `resource`, if known.
    pub fn hard_limit(&self, resource: u32) -> Option<u64> {
        self.hard_limits
            .iter()
            .find(|(number, _)| *number == resource)
            .map(|(_, hard)| *hard)
    }

    /// Identifies the peer of `socket`, reading `/proc` under `proc_root`.
    ///
    /// # Errors
    ///
    /// [`PeerError`] when the peer has gone or its files are unreadable.
    pub fn identify(
        socket: BorrowedFd<'_>,
        cred: &UCred,
        proc_root: &Path,
    ) -> Result<Self, PeerError> {
        let pid = cred.pid.as_raw_nonzero().get();
        let pidfd = peer_pidfd(socket, pid);
        let dir = proc_root.join(pid.to_string());
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| PeerError::Proc {
                pid,
                path: path.display().to_string(),
                source,
            })
        };
        let parse_error = |name: &str| PeerError::Parse {
            pid,
            path: dir.join(name).display().to_string(),
        };
        let status = parse_status(&read("status")?).ok_or_else(|| parse_error("status"))?;
        let nice = parse_nice(&read("stat")?).ok_or_else(|| parse_error("stat"))?;
        let oom_score_adj = read("oom_score_adj")?
            .trim()
            .parse()
            .map_err(|_| parse_error("oom_score_adj"))?;
        let hard_limits = parse_limits(&read("limits")?)
            .ok_or_else(|| parse_error("limits"))?
            .into_iter()
            .map(|(resource, _, hard)| (resource, hard))
            .collect();
        // Signal 0 checks existence only; EPERM also proves it exists.
        let alive =
            pidfd
                .as_ref()
                .is_some_and(|pidfd| match spawn::send_signal(pidfd.as_fd(), 0) {
                    Ok(()) => true,
                    Err(error) => error.raw_os_error() == Some(libc::EPERM),
                });
        if !alive || status.uid != cred.uid.as_raw() {
            return Err(PeerError::Changed { pid });
        }
        Ok(Self {
            pid,
            uid: cred.uid.as_raw(),
            gid: cred.gid.as_raw(),
            groups: status.groups,
            hard_limits,
            can_setid: status.cap_eff & CAP_SETID_MASK == CAP_SETID_MASK,
            can_raise_limits: status.cap_eff & CAP_SYS_RESOURCE_MASK != 0,
            nice,
            can_nice: status.cap_eff & CAP_SYS_NICE_MASK != 0,
            oom_score_adj,
        })
    }
}

fn peer_pidfd(socket: BorrowedFd<'_>, pid: i32) -> Option<OwnedFd> {
    if PEERPIDFD_WORKS.load(Ordering::Relaxed) {
        match spawn::peer_pidfd(socket) {
            Ok(Some(pidfd)) => return Some(pidfd),
            Ok(None) => {
                if PEERPIDFD_WORKS.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        "SO_PEERPIDFD is unavailable (Linux 6.5); identifying peers by \
                         pidfd_open, which leaves a small pid-reuse window"
                    );
                }
            }
            Err(error) => tracing::warn!(pid, %error, "SO_PEERPIDFD failed; trying pidfd_open"),
        }
    }
    spawn::open_pidfd(pid).ok()
}

/// The fields of `/proc/<pid>/status` we use.
#[derive(Debug, PartialEq, Eq)]
struct Status {
    /// Effective uid.
    uid: u32,
    groups: Vec<u32>,
    cap_eff: u64,
}

fn parse_status(text: &str) -> Option<Status> {
    let field = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
    };
    // "Uid:\treal\teffective\tsaved\tfs"
    let uid = field("Uid")?.split_whitespace().nth(1)?.parse().ok()?;
    let groups = field("Groups")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let cap_eff = u64::from_str_radix(field("CapEff")?.trim(), 16).ok()?;
    Some(Status {
        uid,
        groups,
        cap_eff,
    })
}

/// The nice value in a `/proc/<pid>/stat` line: field 19, counting the
/// command name (which may hold spaces and parentheses) as field 2.
fn parse_nice(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3 onwards; the nice value is the 17th of them.
    after_name.split_whitespace().nth(16)?.parse().ok()
}

/// The daemon's own `(RLIMIT_* number, soft, hard)` limits, from
/// `/proc/self/limits`; empty if unreadable.
pub fn own_limits() -> Vec<(u32, u64, u64)> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| parse_limits(&text))
        .unwrap_or_default()
}

/// `(resource, soft, hard)` from `/proc/<pid>/limits`, whose rows follow
/// the header in `RLIMIT_*` number order (the kernel prints its rlimit
/// array).
fn parse_limits(text: &str) -> Option<Vec<(u32, u64, u64)>> {
    let value = |text: &str| {
        if text == "unlimited" {
            Some(u64::MAX)
        } else {
            text.parse().ok()
        }
    };
    let mut limits = Vec::new();
    for (resource, line) in (0u32..).zip(text.lines().skip(1)) {
        // "Max open files            1024                 524288               files"
        // The name column is 25 characters wide; values follow.
        let mut values = line.get(25..)?.split_whitespace();
        let soft = value(values.next()?)?;
        let hard = value(values.next()?)?;
        limits.push((resource, soft, hard));
    }
    (!limits.is_empty()).then_some(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\n\
        Uid:\t1000\t1001\t1000\t1000\nGid:\t100\t100\t100\t100\nFDSize:\t64\n\
        Groups:\t4 27 1000 \nCapInh:\t0000000000000000\nCapEff:\t00000000000000c0\n";

    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
        Max cpu time              unlimited            unlimited            seconds   \n\
        Max file size             unlimited            unlimited            bytes     \n\
        Max data size             unlimited            unlimited            bytes     \n\
        Max stack size            8388608              unlimited            bytes     \n\
        Max core file size        0                    unlimited            bytes     \n\
        Max resident set          unlimited            unlimited            bytes     \n\
        Max processes             62450                62450                processes \n\
        Max open files            1024                 524288               files     \n";

    #[test]
    fn status_gives_effective_uid_groups_and_caps() {
        let status = parse_status(STATUS).unwrap();
        assert_eq!(status.uid, 1001);
        assert_eq!(status.groups, vec![4, 27, 1000]);
        assert_eq!(status.cap_eff & CAP_SETID_MASK, CAP_SETID_MASK);
        let no_groups = STATUS.replace("Groups:\t4 27 1000 ", "Groups:\t");
        assert_eq!(parse_status(&no_groups).unwrap().groups, Vec::<u32>::new());
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    #[test]
    fn stat_gives_the_nice_value() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 7 1 0 5 1000 50";
        assert_eq!(parse_nice(stat), Some(7));
        assert_eq!(parse_nice("42 (x) S 1"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        let expected = rustix::process::getpriority_process(None).unwrap();
        assert_eq!(parse_nice(&own), Some(expected));
    }

    #[test]
    fn limits_are_numbered_by_row() {
        let limits = parse_limits(LIMITS).unwrap();
        assert_eq!(limits[0], (0, u64::MAX, u64::MAX));
        assert_eq!(limits[6], (6, 62450, 62450));
        assert_eq!(limits[7], (7, 1024, 524_288));
        assert!(own_limits().len() >= 16);
        assert_eq!(parse_limits("header only\n"), None);
    }

    #[test]
    fn own_process_is_identified() {
        let (ours, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let cred = rustix::net::sockopt::socket_peercred(&ours).unwrap();
        let peer = Peer::identify(ours.as_fd(), &cred, Path::new("/proc")).unwrap();
        assert_eq!(peer.pid, i32::try_from(std::process::id()).unwrap());
        assert_eq!(peer.uid, rustix::process::geteuid().as_raw());
        assert!(peer.hard_limit(7).is_some());
        drop(theirs);
    }
}
