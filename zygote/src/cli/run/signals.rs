//! The wrapper's signals: forward every catchable one to the child, leave
//! the ones this process started with ignored alone (the child ignores
//! them too), and mirror stop and continue.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use zygote_client::Child;

use crate::spawn;

/// Signals never forwarded: uncatchable, about this process's own children
/// (it has none but the zygote's), or refused by tokio because a handler
/// cannot return from them (synchronous faults: they kill the wrapper, and
/// kill-on-close then the child).
const NOT_FORWARDED: [i32; 6] = [
    libc::SIGKILL,
    libc::SIGSTOP,
    libc::SIGCHLD,
    libc::SIGSEGV,
    libc::SIGILL,
    libc::SIGFPE,
];

/// The signals this process ignores (`SigIgn`, bit `n - 1` for signal
/// `n`), read before any handler is installed; 0 if unknown. SIGPIPE is
/// left out: Rust programs ignore it at start themselves.
pub(super) fn ignored_at_start() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .map_or(0, |mask| mask & !(1 << (libc::SIGPIPE - 1)))
}

/// The forwarding tasks; dropping it stops them.
pub(super) struct Forwarding(Vec<JoinHandle<()>>);

impl Drop for Forwarding {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Forwards every catchable signal that is not in `ignored` to the child,
/// through a pidfd so that a recycled pid is never hit.
pub(super) fn forward(child: &Child, ignored: u64) -> Forwarding {
    let mut tasks = Vec::new();
    let pidfd = match child.pidfd().try_clone_to_owned() {
        Ok(pidfd) => Arc::new(pidfd),
        Err(error) => {
            eprintln!("zygote: signals will not be forwarded: {error}");
            return Forwarding(tasks);
        }
    };
    let pid = child.id();
    // Real-time signals included; glibc keeps 32 and 33 for itself.
    let last = libc::SIGRTMAX();
    let first_rt = libc::SIGRTMIN();
    for number in (1..libc::SIGRTMIN().min(32)).chain(first_rt..=last) {
        let bit = u32::try_from(number - 1).unwrap_or(63);
        let is_ignored = bit < 64 && ignored & (1 << bit) != 0;
        if is_ignored || NOT_FORWARDED.contains(&number) {
            continue;
        }
        let mut stream = match signal(SignalKind::from_raw(number)) {
            Ok(stream) => stream,
            Err(error) => {
                eprintln!(
                    "zygote: signal {} will not be forwarded: {error}",
                    signal_name(number)
                );
                continue;
            }
        };
        let pidfd = Arc::clone(&pidfd);
        tasks.push(tokio::spawn(async move {
            while stream.recv().await.is_some() {
                relay(&pidfd, pid, number).await;
            }
        }));
    }
    Forwarding(tasks)
}

/// Passes one signal on. The child may already be gone; nothing to do then.
async fn relay(pidfd: &OwnedFd, pid: u32, number: i32) {
    match number {
        libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU => {
            // The child is in the zygote's process group, which the kernel
            // often considers orphaned and then discards these three: so
            // a child that does not handle the signal gets SIGSTOP, which
            // is what its default action would do.
            let to_child = if handles(pid, number) {
                number
            } else {
                libc::SIGSTOP
            };
            if spawn::send_signal(pidfd.as_fd(), to_child).is_ok() {
                wait_until_stopped(pid).await;
            }
            // Then this process, by the same signal, so that the shell
            // sees a stopped job; a SIGCONT continues it here.
            let _ = spawn::stop_self_by(number);
        }
        _ => {
            let _ = spawn::send_signal(pidfd.as_fd(), number);
        }
    }
}

/// Whether process `pid` has a handler for `number` (`SigCgt`).
fn handles(pid: u32, number: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let mask = status
                .lines()
                .find_map(|line| line.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|caught| caught & (1 << (number - 1)) != 0)
}

/// Waits, briefly, until process `pid` shows as stopped, so that the child
/// stops before this process does.
async fn wait_until_stopped(pid: u32) {
    for _ in 0..100 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next());
        if matches!(state, Some("T" | "t") | None) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `SIGINT` etc. for messages.
fn signal_name(number: i32) -> String {
    rustix::process::Signal::from_named_raw(number)
        .map_or_else(|| number.to_string(), |signal| format!("{signal:?}"))
}
