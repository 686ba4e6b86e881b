//! The calling process's own state, which a spawn request copies so that
//! the child looks as if this process had started it: environment, working
//! directory, umask, resource limits, ignored signals, nice value, CPU
//! affinity, OOM score adjustment, and (on request) inheritable fds.
//!
//! Host paths are parameters so tests can point them elsewhere.

use std::cell::RefCell;
use std::ffi::OsString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::process::{Resource, getrlimit};
use zygote_proto::ResourceLimit;

use crate::{Error, Result, sys};

/// Where the kernel reports this process's umask (Linux 4.7 and later).
pub(crate) const PROC_SELF_STATUS: &str = "/proc/self/status";
/// The directory listing this process's open fds.
pub(crate) const PROC_SELF_FD: &str = "/proc/self/fd";

/// Every resource `getrlimit(2)` knows, in `RLIMIT_*` order (0 to
/// `RLIM_NLIMITS - 1`).
const RESOURCES: [Resource; 16] = [
    Resource::Cpu,
    Resource::Fsize,
    Resource::Data,
    Resource::Stack,
    Resource::Core,
    Resource::Rss,
    Resource::Nproc,
    Resource::Nofile,
    Resource::Memlock,
    Resource::As,
    Resource::Locks,
    Resource::Sigpending,
    Resource::Msgqueue,
    Resource::Nice,
    Resource::Rtprio,
    Resource::Rttime,
];

/// The calling process's state at the moment of one spawn.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// `environ`, in order. It moves into the request (see
    /// [`Spec::prepare`](crate::request::Spec::prepare)) while the rest
    /// stays borrowed, hence the cell.
    pub env: RefCell<Vec<(OsString, OsString)>>,
    /// The working directory; an error is kept, not raised, because a
    /// command with an absolute `current_dir` does not need it.
    pub cwd: io::Result<PathBuf>,
    /// The client's umask, limits and attributes, shared, not copied:
    /// the request copies them once.
    pub settings: Arc<ProcessSettings>,
    /// Fds to pass at their own numbers; empty unless asked for.
    pub inherited_fds: Vec<(RawFd, OwnedFd)>,
}

/// Process attributes a child inherits across `fork` and `exec`, which a
/// request carries so that the zygote's child gets the caller's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Attributes {
    /// Ignored signals (bit `n - 1` for signal `n`), except SIGPIPE, which
    /// Rust programs ignore at start and std's `Command` resets for its
    /// children. glibc's internal signals 32 and 33 included: its
    /// `posix_spawn` leaves them ignored, so children of such a process
    /// inherit that.
    pub ignored_signals: u64,
    /// `None` when unknown (the zygote's applies).
    pub nice: Option<i32>,
    /// Allowed CPUs; empty when unknown.
    pub cpu_affinity: Vec<u32>,
    /// `None` when unknown.
    pub oom_score_adj: Option<i32>,
}

/// Where the kernel reports this process's OOM score adjustment.
const PROC_SELF_OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";

impl Attributes {
    /// This process's own, now.
    #[cfg(test)]
    pub fn read() -> Self {
        let status = std::fs::read_to_string(PROC_SELF_STATUS).unwrap_or_default();
        Self::read_with(&status)
    }

    /// As [`read`](Self::read), with `/proc/self/status` already read.
    fn read_with(status: &str) -> Self {
        let affinity = rustix::thread::sched_getaffinity(None)
            .map(|set| {
                (0..rustix::thread::CpuSet::MAX_CPU)
                    .filter(|cpu| set.is_set(*cpu))
                    .filter_map(|cpu| u32::try_from(cpu).ok())
                    .collect()
            })
            .unwrap_or_default();
        Self {
            ignored_signals: parse_ignored(status).unwrap_or(0),
            nice: rustix::process::getpriority_process(None).ok(),
            cpu_affinity: affinity,
            oom_score_adj: std::fs::read_to_string(PROC_SELF_OOM_SCORE_ADJ)
                .ok()
                .and_then(|text| text.trim().parse().ok()),
        }
    }
}

/// The `SigIgn:` mask of a `/proc/<pid>/status` text, without SIGPIPE
/// (see [`Attributes`]).
pub(crate) fn parse_ignored(status: &str) -> Option<u64> {
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))?
        .trim();
    let mask = u64::from_str_radix(value, 16).ok()?;
    Some(mask & !(1 << (libc::SIGPIPE - 1)))
}

/// The process-wide settings a request copies that programs set at start
/// and rarely change: the umask and the resource limits. A client reads
/// them once and reuses them (see `Client::refresh_process_state`):
/// reading them costs ~35 µs per spawn on the calling thread (~20 µs for
/// `/proc/self/status`, ~13 µs for 16 `getrlimit`), measured on 2 CPUs,
/// which was most of the async API's per-spawn block.
#[derive(Debug, Clone)]
pub(crate) struct ProcessSettings {
    /// `None` when `/proc` does not say.
    pub umask: Option<u32>,
    /// Every resource limit.
    pub rlimits: Vec<ResourceLimit>,
    /// Ignored signals, nice value, CPU affinity, OOM score adjustment.
    pub attributes: Attributes,
}

impl ProcessSettings {
    /// Reads them now.
    pub fn read() -> Self {
        let status = std::fs::read_to_string(PROC_SELF_STATUS).unwrap_or_default();
        Self {
            umask: parse_umask(&status),
            rlimits: rlimits(),
            attributes: Attributes::read_with(&status),
        }
    }
}

impl Snapshot {
    /// Reads the calling process's per-spawn state (environment, working
    /// directory, inheritable fds) and takes `settings` as they are.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when `/proc/self/fd` cannot be listed and
    /// `inherit_fds` is set.
    pub fn capture(inherit_fds: bool, settings: Arc<ProcessSettings>) -> Result<Self> {
        Ok(Self {
            env: RefCell::new(std::env::vars_os().collect()),
            cwd: std::env::current_dir(),
            settings,
            inherited_fds: if inherit_fds {
                inheritable_fds(Path::new(PROC_SELF_FD))?
            } else {
                Vec::new()
            },
        })
    }
}

/// Reads the umask from a `/proc/<pid>/status` file.
///
/// umask(2) can only read the value by setting it, which would race with
/// other threads creating files, so the kernel's report is used instead.
#[cfg(test)]
pub(crate) fn umask_from(status_path: &Path) -> Option<u32> {
    parse_umask(&std::fs::read_to_string(status_path).ok()?)
}

/// Finds the `Umask:` line of a `/proc/<pid>/status` text (octal).
pub(crate) fn parse_umask(status: &str) -> Option<u32> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix("Umask:")?.trim();
        u32::from_str_radix(value, 8)
            .ok()
            .filter(|mask| *mask <= 0o777)
    })
}

/// Every resource limit of the calling process; `u64::MAX` is infinity.
pub(crate) fn rlimits() -> Vec<ResourceLimit> {
    RESOURCES
        .iter()
        .map(|&resource| {
            let limit = getrlimit(resource);
            ResourceLimit {
                resource: resource as u32,
                soft: limit.current.unwrap_or(u64::MAX),
                hard: limit.maximum.unwrap_or(u64::MAX),
            }
        })
        .collect()
}

/// Every fd above 2 in `fd_dir` (a `/proc/<pid>/fd` listing of this
/// process) that is not close-on-exec, each with a close-on-exec duplicate
/// that keeps it alive until the request is sent. Sorted by number.
///
/// # Errors
///
/// [`Error::Io`] when the directory cannot be read or an fd cannot be
/// duplicated.
pub(crate) fn inheritable_fds(fd_dir: &Path) -> Result<Vec<(RawFd, OwnedFd)>> {
    let list_error = |error| Error::io(format!("listing {}", fd_dir.display()), error);
    let mut found = Vec::new();
    for entry in std::fs::read_dir(fd_dir).map_err(list_error)? {
        let entry = entry.map_err(list_error)?;
        let Some(raw) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<RawFd>().ok())
        else {
            continue;
        };
        // 0 to 2 are the stdio settings' business. The listing's own
        // directory fd, and the duplicates made here, are close-on-exec
        // and so skip themselves.
        if raw <= 2 {
            continue;
        }
        if let Some(dup) = sys::dup_if_inheritable(raw)
            .map_err(|error| Error::io(format!("duplicating inheritable fd {raw}"), error))?
        {
            found.push((raw, dup));
        }
    }
    found.sort_by_key(|(raw, _)| *raw);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn parses_umask_line() {
        let status = "Name:\tcat\nUmask:\t0027\nState:\tR (running)\n";
        assert_eq!(parse_umask(status), Some(0o027));
        assert_eq!(parse_umask("Name:\tcat\n"), None);
        assert_eq!(parse_umask("Umask:\tzz\n"), None);
    }

    #[test]
    fn ignored_signals_skip_sigpipe() {
        // SIGHUP (1), SIGINT (2), SIGPIPE (13), 32 and 33 ignored.
        let status = "Name:\tx\nSigIgn:\t0000000180001003\n";
        assert_eq!(parse_ignored(status), Some(0x1_8000_0003));
        assert_eq!(parse_ignored("Name:\tx\n"), None);
    }

    #[test]
    fn reads_own_attributes() {
        let own = Attributes::read();
        assert_eq!(
            own.nice,
            Some(rustix::process::getpriority_process(None).unwrap())
        );
        assert!(!own.cpu_affinity.is_empty());
        let adj: i32 = std::fs::read_to_string(PROC_SELF_OOM_SCORE_ADJ)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(own.oom_score_adj, Some(adj));
    }

    #[test]
    fn reads_own_umask() {
        // Kernels since 4.7 report it; the test hosts are newer.
        assert!(umask_from(Path::new(PROC_SELF_STATUS)).is_some());
        assert_eq!(umask_from(Path::new("/nonexistent/status")), None);
    }

    #[test]
    fn collects_every_rlimit_in_order() {
        let limits = rlimits();
        let numbers: Vec<u32> = limits.iter().map(|limit| limit.resource).collect();
        assert_eq!(numbers, (0..16).collect::<Vec<u32>>());
        let nofile = limits
            .iter()
            .find(|limit| limit.resource == libc::RLIMIT_NOFILE)
            .unwrap();
        let own = getrlimit(Resource::Nofile);
        assert_eq!(Some(nofile.soft), own.current);
        assert!(nofile.soft <= nofile.hard);
    }

    #[test]
    fn lists_inheritable_fds_only() {
        let cloexec = std::fs::File::open("/dev/null").unwrap();
        // rustix's dup does not set close-on-exec.
        let inheritable = rustix::io::dup(&cloexec).unwrap();
        let listed = inheritable_fds(Path::new(PROC_SELF_FD)).unwrap();
        let numbers: Vec<RawFd> = listed.iter().map(|(raw, _)| *raw).collect();
        assert!(numbers.contains(&inheritable.as_raw_fd()), "{numbers:?}");
        assert!(!numbers.contains(&cloexec.as_raw_fd()), "{numbers:?}");
        assert!(numbers.iter().all(|raw| *raw > 2));
        // The duplicates are close-on-exec and distinct from the originals.
        for (raw, dup) in &listed {
            assert_ne!(*raw, dup.as_raw_fd());
            let flags = rustix::io::fcntl_getfd(dup).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        }
    }

    #[test]
    fn missing_fd_dir_is_an_error() {
        let error = inheritable_fds(Path::new("/nonexistent/fd")).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/fd"), "{error}");
    }
}
