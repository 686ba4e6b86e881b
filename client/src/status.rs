//! How a child ended: [`ExitStatus`], [`ResourceUsage`] and [`Output`].

use std::fmt;
use std::time::Duration;

use zygote_proto as proto;

/// How a child ended, as the zygote (its parent) reaped it.
///
/// Mirrors [`std::process::ExitStatus`] plus the Unix `ExitStatusExt`
/// methods, and converts into it.
///
/// When the zygote was lost before it reported the exit, the status is
/// read from the child's pidfd instead (Linux 6.15 and later):
/// [`zygote_lost`](ExitStatus::zygote_lost) is then true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus(proto::ExitStatus, bool, Option<proto::TreeUsage>, bool);

impl ExitStatus {
    /// Whether the child exited with code 0.
    pub fn success(&self) -> bool {
        matches!(self.0, proto::ExitStatus::Exited(0))
    }

    /// The exit code, or `None` when a signal ended the child.
    pub fn code(&self) -> Option<i32> {
        match self.0 {
            proto::ExitStatus::Exited(code) => Some(code),
            proto::ExitStatus::Signaled { .. } => None,
        }
    }

    /// The signal that ended the child, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self.0 {
            proto::ExitStatus::Exited(_) => None,
            proto::ExitStatus::Signaled { signal, .. } => Some(signal),
        }
    }

    /// Whether the child dumped core.
    pub fn core_dumped(&self) -> bool {
        matches!(
            self.0,
            proto::ExitStatus::Signaled {
                core_dumped: true,
                ..
            }
        )
    }

    /// Whether the zygote ended the child because its
    /// [`timeout`](crate::Command::timeout) expired (the signal then is
    /// SIGTERM or SIGKILL, or the child's own exit if it handled SIGTERM).
    pub fn timed_out(&self) -> bool {
        self.1
    }

    /// What the child's whole cgroup used (grandchildren included), when
    /// the zygote placed it in one and the command asked for a cgroup
    /// feature (a limit, `kill_tree` or `wait_tree`): reading it costs the
    /// zygote ~40 µs, which plain spawns are spared.
    pub fn tree_usage(&self) -> Option<proto::TreeUsage> {
        self.2
    }

    /// Whether the zygote was lost (crashed, killed, restarted) before it
    /// reported this exit, so that the status was read from the child's
    /// pidfd (`PIDFD_GET_INFO`, Linux 6.15). The exit code or signal are
    /// exact; what only the zygote knew is not: resource usage
    /// ([`Child::usage`](crate::Child::usage) is `None`), the tree usage
    /// (`None`) and [`timed_out`](ExitStatus::timed_out) (`false`).
    pub fn zygote_lost(&self) -> bool {
        self.3
    }

    /// The status of a child whose zygote was lost, from the `wait(2)`
    /// status its pidfd gave.
    pub(crate) fn from_pidfd(raw: i32) -> Self {
        let status = if libc::WIFSIGNALED(raw) {
            proto::ExitStatus::Signaled {
                signal: libc::WTERMSIG(raw),
                core_dumped: libc::WCOREDUMP(raw),
            }
        } else {
            proto::ExitStatus::Exited(libc::WEXITSTATUS(raw))
        };
        Self(status, false, None, true)
    }

    /// Whether the OOM killer ended a process of the child's cgroup
    /// (`memory.events` `oom_kill`), which then shows as SIGKILL.
    pub fn oom_killed(&self) -> bool {
        self.2.is_some_and(|tree| tree.oom_kills > 0)
    }

    /// The status in `wait(2)` encoding, as `ExitStatusExt::into_raw`.
    pub fn into_raw(self) -> i32 {
        match self.0 {
            proto::ExitStatus::Exited(code) => (code & 0xff) << 8,
            proto::ExitStatus::Signaled {
                signal,
                core_dumped,
            } => (signal & 0x7f) | if core_dumped { 0x80 } else { 0 },
        }
    }
}

impl From<proto::ExitStatus> for ExitStatus {
    fn from(status: proto::ExitStatus) -> Self {
        Self(status, false, None, false)
    }
}

impl From<&proto::ExitNotice> for ExitStatus {
    fn from(notice: &proto::ExitNotice) -> Self {
        Self(notice.status, notice.timed_out, notice.tree, false)
    }
}

impl From<ExitStatus> for std::process::ExitStatus {
    fn from(status: ExitStatus) -> Self {
        std::os::unix::process::ExitStatusExt::from_raw(status.into_raw())
    }
}

/// Same text as std: `exit status: 3`, `signal: 9 (SIGKILL)`,
/// `signal: 11 (SIGSEGV) (core dumped)`.
impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            proto::ExitStatus::Exited(code) => write!(f, "exit status: {code}"),
            proto::ExitStatus::Signaled {
                signal,
                core_dumped,
            } => {
                write!(f, "signal: {signal}")?;
                if let Some(name) = signal_name(signal) {
                    write!(f, " ({name})")?;
                }
                if core_dumped {
                    f.write_str(" (core dumped)")?;
                }
                if let Some(tree) = self.2.filter(|tree| tree.oom_kills > 0) {
                    f.write_str(" (killed by the OOM killer")?;
                    if let Some(max) = tree.memory_max {
                        write!(f, ": memory.max {max}")?;
                    }
                    f.write_str(")")?;
                }
                Ok(())
            }
        }
    }
}

/// The Linux name of a standard signal.
fn signal_name(signal: i32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    let index = usize::try_from(signal).ok()?.checked_sub(1)?;
    NAMES.get(index).copied()
}

/// What a child used, from the zygote's `waitid(2)` rusage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResourceUsage {
    /// CPU time in user mode.
    pub user_time: Duration,
    /// CPU time in the kernel.
    pub system_time: Duration,
    /// Peak resident set size, in KiB.
    pub max_rss_kib: u64,
}

impl From<proto::ResourceUsage> for ResourceUsage {
    fn from(usage: proto::ResourceUsage) -> Self {
        Self {
            user_time: Duration::from_micros(usage.user_micros),
            system_time: Duration::from_micros(usage.system_micros),
            max_rss_kib: usage.max_rss_kib,
        }
    }
}

/// A finished child's status and everything it wrote, as
/// [`std::process::Output`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// How it ended.
    pub status: ExitStatus,
    /// All it wrote to stdout.
    pub stdout: Vec<u8>,
    /// All it wrote to stderr.
    pub stderr: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signaled(signal: i32, core_dumped: bool) -> ExitStatus {
        ExitStatus::from(proto::ExitStatus::Signaled {
            signal,
            core_dumped,
        })
    }

    #[test]
    fn display_matches_std() {
        assert_eq!(
            ExitStatus::from(proto::ExitStatus::Exited(3)).to_string(),
            "exit status: 3"
        );
        assert_eq!(signaled(9, false).to_string(), "signal: 9 (SIGKILL)");
        assert_eq!(
            signaled(11, true).to_string(),
            "signal: 11 (SIGSEGV) (core dumped)"
        );
        assert_eq!(signaled(64, false).to_string(), "signal: 64");
    }

    #[test]
    fn agrees_with_std_exit_status() {
        for status in [
            ExitStatus::from(proto::ExitStatus::Exited(0)),
            ExitStatus::from(proto::ExitStatus::Exited(3)),
            ExitStatus::from(proto::ExitStatus::Exited(255)),
            signaled(9, false),
            signaled(6, true),
        ] {
            let std_status = std::process::ExitStatus::from(status);
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(std_status.success(), status.success());
            assert_eq!(std_status.code(), status.code());
            assert_eq!(std_status.signal(), status.signal());
            assert_eq!(std_status.core_dumped(), status.core_dumped());
            assert_eq!(std_status.to_string(), status.to_string());
        }
    }

    #[test]
    fn pidfd_status_decodes_wait_encoding() {
        let exited = ExitStatus::from_pidfd(3 << 8);
        assert_eq!(exited.code(), Some(3));
        assert!(exited.zygote_lost());
        assert!(!exited.timed_out());
        assert_eq!(exited.tree_usage(), None);
        let killed = ExitStatus::from_pidfd(libc::SIGKILL);
        assert_eq!(killed.signal(), Some(libc::SIGKILL));
        assert_eq!(killed.to_string(), "signal: 9 (SIGKILL)");
        let dumped = ExitStatus::from_pidfd(libc::SIGSEGV | 0x80);
        assert!(dumped.core_dumped());
        assert!(!ExitStatus::from(proto::ExitStatus::Exited(0)).zygote_lost());
    }

    #[test]
    fn usage_converts_micros() {
        let usage = ResourceUsage::from(proto::ResourceUsage {
            user_micros: 1_500_000,
            system_micros: 20,
            max_rss_kib: 4096,
        });
        assert_eq!(usage.user_time, Duration::from_millis(1500));
        assert_eq!(usage.system_time, Duration::from_micros(20));
        assert_eq!(usage.max_rss_kib, 4096);
    }
}
