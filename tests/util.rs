//! The harness: a real `zygote serve` per test, on its own socket.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A daemon started for one test; killed and reaped on drop.
pub struct Daemon {
    process: Child,
    /// Stopped on purpose with [`Daemon::terminate`].
    terminated: bool,
    socket: PathBuf,
    /// Its stderr and stdout: the log, printed when the test fails.
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The `zygote` binary: `$ZYGOTE_BIN`, else the one cargo built next to
/// this test binary (`target/<profile>/zygote`).
pub fn zygote_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("ZYGOTE_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/integration-HASH -> target/<profile>/zygote
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .join("zygote");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` before the tests (scripts/test does)",
        path.display()
    );
    path
}

/// Starts `zygote serve` on a fresh socket in a temp dir and waits until
/// it accepts connections.
pub fn start_daemon(test_name: &str) -> Daemon {
    start_daemon_with(test_name, None, &[])
}

/// As [`start_daemon`], with a policy file of this text and extra `serve`
/// flags. The temp dir is world-searchable, so that a client of another
/// uid can reach a socket whose mode lets it in.
pub fn start_daemon_with(test_name: &str, policy: Option<&str>, flags: &[&str]) -> Daemon {
    start_daemon_as(test_name, None, policy, flags)
}

/// As [`start_daemon_with`], with the daemon running as `uid` (and gid
/// `uid`) when given; needs root for that.
pub fn start_daemon_as(
    test_name: &str,
    uid: Option<u32>,
    policy: Option<&str>,
    flags: &[&str],
) -> Daemon {
    start_daemon_custom(test_name, uid, policy, flags, &zygote_bin(), &[])
}

/// As [`start_daemon_as`], from the binary at `binary`, with `envs` added
/// to the daemon's environment.
pub fn start_daemon_custom(
    test_name: &str,
    uid: Option<u32>,
    policy: Option<&str>,
    flags: &[&str],
    binary: &Path,
    envs: &[(&str, &str)],
) -> Daemon {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::Builder::new()
        .prefix(&format!("zygote-{test_name}-"))
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod tempdir");
    // The daemon's own directory, where it may create its socket.
    let run = dir.path().join("run");
    std::fs::create_dir(&run).expect("mkdir run");
    if let Some(uid) = uid {
        std::os::unix::fs::chown(&run, Some(uid), Some(uid)).expect("chown run dir");
    }
    let socket = run.join("zygote.sock");
    let mut command = Command::new(binary);
    command.envs(envs.iter().copied());
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    command
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .args(flags);
    if let Some(policy) = policy {
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, policy).expect("write policy");
        command.arg("--policy").arg(path);
    }
    // The log goes to a file, shown only when the test fails, so that the
    // test output is the results. ZYGOTE_TEST_LOG=debug logs more.
    let log = dir.path().join("daemon.log");
    let log_file = std::fs::File::create(&log).expect("create the daemon log");
    let process = command
        .env(
            "ZYGOTE_LOG",
            std::env::var("ZYGOTE_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("dup the daemon log"))
        .stderr(log_file)
        .spawn()
        .expect("start zygote serve");
    let daemon = Daemon {
        process,
        terminated: false,
        socket,
        log,
        _dir: dir,
    };
    daemon.wait_ready();
    daemon
}

impl Daemon {
    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// What the daemon has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|error| format!("(no log: {error})"))
    }

    /// Sends `signal` to the daemon, which may exit on its own from now on.
    pub fn signal_stop(&mut self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).expect("pid");
        rustix::process::kill_process(pid, signal).expect("signal the daemon");
        self.terminated = true;
    }

    /// How the daemon exited, if it does within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if zygote_proto::socket::connect_to(&self.socket, false).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "zygote did not listen on {} within 10 s; its log:\n{}",
            self.socket.display(),
            self.log()
        );
    }

    /// Number of fds the daemon has open.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("read daemon fds")
            .count()
    }

    /// The daemon's fd count once it has stopped changing (five equal
    /// reads 20 ms apart, within 5 s): connections a client just closed
    /// take the daemon a moment to notice.
    pub fn settled_fd_count(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = self.fd_count();
        let mut same = 0;
        while same < 5 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.fd_count();
            same = if now == last { same + 1 } else { 0 };
            last = now;
        }
        last
    }

    /// The daemon's resident set size in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read daemon status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// Pids of the daemon's zombie children.
    pub fn zombies(&self) -> Vec<u32> {
        children_of(self.pid())
            .into_iter()
            .filter(|pid| process_state(*pid) == Some('Z'))
            .collect()
    }

    /// SIGKILLs the daemon and reaps it.
    pub fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }

    /// Stops the daemon with SIGTERM, as systemd would, and returns how it
    /// exited.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.start_stop();
        self.process.wait().expect("wait for the daemon")
    }

    /// Sends SIGTERM without waiting: from now on the daemon may exit on
    /// its own.
    pub fn start_stop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        self.terminated = true;
    }

    /// True while the daemon process runs.
    pub fn is_alive(&mut self) -> bool {
        self.process.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.process.kill();
        if let Ok(status) = self.process.wait() {
            if std::thread::panicking() {
                // The test failed: its output (captured by the harness and
                // shown with the failure) gets the daemon's log.
                eprintln!(
                    "--- log of zygote serve on {} ({status}) ---\n{}--- end of log ---",
                    self.socket.display(),
                    self.log()
                );
            } else if status.signal() != Some(libc::SIGKILL) && !self.terminated {
                // A daemon that died on its own (not by our SIGKILL) is a bug.
                panic!(
                    "zygote exited unexpectedly: {status}; its log:\n{}",
                    self.log()
                );
            }
        }
    }
}

/// Direct children of `pid`, from /proc.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return children;
    };
    for entry in entries.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if parent_of(child) == Some(pid) {
            children.push(child);
        }
    }
    children
}

/// `/proc/PID/stat` fields after the command name.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    Some(after_comm.split_whitespace().map(str::to_owned).collect())
}

/// The parent pid of `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The state letter of `pid` (R, S, Z, ...).
pub fn process_state(pid: u32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// The fd numbers open in process `pid`, sorted.
pub fn open_fds(pid: u32) -> Vec<i32> {
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/PID/fd")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    fds
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A two-worker tokio runtime, as a client program would have.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A signal mask line (`SigBlk`, `SigCgt`, ...) of `/proc/PID/task/TID/status`
/// for each thread of `pid`, by thread id.
pub fn thread_masks(pid: u32, field: &str) -> Vec<(u32, u64)> {
    let mut masks = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return masks;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        if let Some(mask) = mask_in(&status, field) {
            masks.push((tid, mask));
        }
    }
    masks
}

/// The hex mask on the `field:` line of a `/proc/.../status` text.
pub fn mask_in(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Bit `signal - 1`: `signal`'s place in a `/proc` signal mask.
pub fn signal_bit(signal: i32) -> u64 {
    1 << (signal - 1)
}

/// Where a process stands with its stop signals, from the
/// `/proc/PID/status` of its main thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignals {
    /// SIGHUP, SIGTERM and SIGINT blocked, and not as glibc blocks every
    /// signal for a moment (while it starts a thread): held pending.
    Held,
    /// SIGTERM or SIGINT has a handler, and they are not held.
    Caught,
    /// Neither yet (or no such process): a stop signal would kill it.
    Default,
}

/// [`StopSignals`] of `pid` now.
pub fn stop_signals(pid: u32) -> StopSignals {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return StopSignals::Default;
    };
    let stop = signal_bit(libc::SIGHUP) | signal_bit(libc::SIGTERM) | signal_bit(libc::SIGINT);
    let blocked = mask_in(&status, "SigBlk").unwrap_or(0);
    let caught = mask_in(&status, "SigCgt").unwrap_or(0);
    // SIGQUIT is never blocked by a zygote (the signals with no meaning
    // to it, such as SIGUSR1, are, for its whole life).
    if blocked & stop == stop && blocked & signal_bit(libc::SIGQUIT) == 0 {
        StopSignals::Held
    } else if caught & (signal_bit(libc::SIGTERM) | signal_bit(libc::SIGINT)) != 0 {
        StopSignals::Caught
    } else {
        StopSignals::Default
    }
}

/// Polls [`stop_signals`] of `pid` as fast as it can until they are held
/// or caught, within 10 s; true when it saw them held.
pub fn wait_stop_signals_handled(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match stop_signals(pid) {
            StopSignals::Held => return true,
            StopSignals::Caught => return false,
            StopSignals::Default => assert!(
                Instant::now() < deadline,
                "process {pid} neither holds nor catches its stop signals after 10 s"
            ),
        }
    }
}
