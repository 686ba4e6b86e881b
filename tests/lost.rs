//! A client that loses its zygote (SIGKILL, restart): children spawned
//! before keep their exit status (read from the pidfd on Linux 6.15+),
//! and a client of a socket path reconnects for new spawns.

use std::path::{Path, PathBuf};
use std::process::{Child as Process, Command as StdCommand, Stdio as StdStdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use zygote_client::blocking::{Client, Command};
use zygote_client::{Error, Stdio};

use crate::util::{eventually, process_state, start_daemon, within, zygote_bin};

/// Whether orphans of this process's children get reaped (by init or a
/// subreaper above us): the kernel keeps a child's exit status for its
/// pidfd only once it is reaped. Probed once, with an orphaned `sleep`.
fn orphans_are_reaped() -> bool {
    static REAPED: OnceLock<bool> = OnceLock::new();
    *REAPED.get_or_init(|| {
        let output = StdCommand::new("sh")
            .args(["-c", "sleep 0.05 >/dev/null & echo $!"])
            .output()
            .expect("run sh");
        let pid: u32 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("the orphan's pid");
        let reaped = eventually(Duration::from_secs(15), || process_state(pid).is_none());
        if !reaped {
            eprintln!(
                "orphans are not reaped here: pid {pid} stayed a zombie for 15 s under init \
                 or the subreaper above this test"
            );
        }
        reaped
    })
}

/// Whether this kernel keeps a reaped child's exit status for its pidfd
/// (`PIDFD_INFO_EXIT`, Linux 6.15). Says so loudly when it does not.
fn kernel_keeps_exit_status(test: &str) -> bool {
    let (release, version) = crate::util::kernel_release();
    let keeps = version >= (6, 15);
    if !keeps {
        crate::util::skip(&format!(
            "part of {test}: kernel {release} predates 6.15 (no PIDFD_INFO_EXIT); \
             checking that ZygoteLost stays the error instead"
        ));
    }
    keeps
}

/// `Some(keeps)` when the test can run: orphans are reaped, or the kernel
/// keeps no status anyway (then `ZygoteLost` is checked).
fn fallback_testable(test: &str) -> Option<bool> {
    let keeps = kernel_keeps_exit_status(test);
    if keeps && !orphans_are_reaped() {
        crate::util::skip(&format!(
            "{test}: orphans are not reaped here, so the kernel never hands over their exit \
             status"
        ));
        return None;
    }
    Some(keeps)
}

/// A second `zygote serve` on an existing socket path, as a restart
/// brings; killed and reaped on drop, its log printed if the test failed.
struct Restarted {
    process: Process,
    log: PathBuf,
}

impl Restarted {
    fn start(socket: &Path) -> Self {
        let log = socket.with_file_name("restarted.log");
        let file = std::fs::File::create(&log).expect("create the log");
        let process = StdCommand::new(zygote_bin())
            .arg("serve")
            .arg("--socket")
            .arg(socket)
            .env("ZYGOTE_LOG", "info")
            .stdin(StdStdio::null())
            .stdout(file.try_clone().expect("dup the log"))
            .stderr(file)
            .spawn()
            .expect("start zygote serve again");
        assert!(
            eventually(Duration::from_secs(10), || {
                zygote_proto::socket::connect_to(socket, false).is_ok()
            }),
            "the restarted zygote did not listen"
        );
        Self { process, log }
    }
}

impl Drop for Restarted {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- log of the restarted zygote ---\n{}--- end ---",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

fn shell(client: &Client, script: &str) -> zygote_client::blocking::Child {
    Command::new(client, "sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn")
}

#[test]
fn wait_after_the_zygote_is_sigkilled_gives_the_exact_exit_code() {
    let Some(keeps) = fallback_testable("wait_after_the_zygote_is_sigkilled") else {
        return;
    };
    for round in 0..3u64 {
        let mut daemon = start_daemon("lost-exit-code");
        let client = Client::connect(daemon.socket()).expect("connect");
        let mut exits = shell(&client, "sleep 0.3; exit 7");
        let mut killed = shell(&client, "sleep 0.3; kill -SEGV $$");
        let mut quick = shell(&client, "exit 3");
        // `quick` may be reported before the kill, or not: both must work.
        std::thread::sleep(Duration::from_millis(round * 20));
        daemon.kill();
        let started = Instant::now();
        for (child, code, signal) in [
            (&mut exits, Some(7), None),
            (&mut killed, None, Some(libc::SIGSEGV)),
            (&mut quick, Some(3), None),
        ] {
            match child.wait() {
                Ok(status) if keeps => {
                    assert_eq!((status.code(), status.signal()), (code, signal), "{status}");
                    if status.zygote_lost() {
                        assert_eq!(child.usage(), None, "no usage without the zygote");
                    } else {
                        assert!(child.usage().is_some());
                    }
                }
                Err(Error::ZygoteLost { reason, .. }) if !keeps => {
                    assert!(reason.contains("6.15"), "{reason}");
                }
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert!(exits.wait().unwrap().zygote_lost(), "exits after the kill");
        // Generous: the orphans' new parent reaps them on its own schedule.
        assert!(started.elapsed() < Duration::from_secs(40), "no hang");
    }
}

#[test]
fn a_wait_in_progress_survives_the_zygote_sigkill() {
    let Some(keeps) = fallback_testable("a_wait_in_progress_survives") else {
        return;
    };
    let runtime = crate::util::runtime();
    runtime.block_on(async {
        for _ in 0..3 {
            let mut daemon = start_daemon("lost-during-wait");
            let client = zygote_client::Client::connect(daemon.socket())
                .await
                .expect("connect");
            let mut child = zygote_client::Command::new(&client, "sh")
                .args(["-c", "sleep 0.5; exit 42"])
                .stdin(Stdio::null())
                .spawn()
                .await
                .expect("spawn");
            let killer = tokio::task::spawn_blocking(move || {
                std::thread::sleep(Duration::from_millis(100));
                daemon.kill();
                daemon
            });
            let waited = within(Duration::from_secs(60), "wait", child.wait()).await;
            let _daemon = killer.await.unwrap();
            match waited {
                Ok(status) if keeps => {
                    assert_eq!(status.code(), Some(42), "{status}");
                    assert!(status.zygote_lost());
                    assert!(!status.timed_out());
                    assert_eq!(child.usage(), None);
                }
                Err(error) if !keeps => assert!(error.is_zygote_lost(), "{error}"),
                other => panic!("unexpected {other:?}"),
            }
        }
    });
}

#[test]
fn signals_and_kill_go_through_the_pidfd_once_the_zygote_is_lost() {
    let Some(keeps) = fallback_testable("signals_and_kill_go_through_the_pidfd") else {
        return;
    };
    let mut daemon = start_daemon("lost-signal");
    let client = Client::connect(daemon.socket()).expect("connect");
    // `exec`: the signals reach the sleeper, which dash would otherwise
    // leave running after its shell.
    let mut termed = shell(&client, "exec sleep 30");
    let mut killed = shell(&client, "exec sleep 30");
    daemon.kill();
    assert!(
        eventually(Duration::from_secs(5), || !client.is_connected()),
        "the client sees the loss"
    );
    assert!(
        matches!(termed.try_wait(), Ok(None)),
        "still running: no status, no error"
    );
    termed
        .signal(libc::SIGTERM)
        .expect("SIGTERM through the pidfd");
    killed.kill().expect("SIGKILL through the pidfd");
    for (child, signal) in [(&mut termed, libc::SIGTERM), (&mut killed, libc::SIGKILL)] {
        match child.wait() {
            Ok(status) if keeps => {
                assert_eq!(status.signal(), Some(signal), "{status}");
                assert!(status.zygote_lost());
            }
            Err(error) if !keeps => assert!(error.is_zygote_lost(), "{error}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    match termed.signal(libc::SIGTERM) {
        Err(error) => assert_eq!(error.raw_os_error(), Some(libc::ESRCH), "{error}"),
        Ok(()) => panic!("signalling a reaped child succeeded"),
    }
}

#[test]
fn a_client_reconnects_after_a_restart_on_the_same_path() {
    // Reconnecting is tested everywhere; the old child's status where the
    // environment gives it.
    let fallback = fallback_testable("a_client_reconnects");
    for _ in 0..3 {
        let mut daemon = start_daemon("reconnect");
        let client = Client::connect(daemon.socket()).expect("connect");
        assert!(Command::new(&client, "true").status().unwrap().success());
        let mut old = shell(&client, "sleep 0.5; exit 5");
        daemon.kill();
        assert!(eventually(Duration::from_secs(5), || !client.is_connected()));
        let restarted = Restarted::start(daemon.socket());
        // The same client, and a clone made before the loss, spawn again.
        let clone = client.clone();
        let output = Command::new(&client, "echo")
            .arg("again")
            .output()
            .expect("spawn after the restart");
        assert_eq!(output.stdout, b"again\n");
        assert!(client.is_connected());
        let status = Command::new(&clone, "sh")
            .args(["-c", "exit 4"])
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(4));
        assert!(!status.zygote_lost(), "reported by the new zygote");
        assert!(client.status().is_ok(), "status requests reconnect too");
        // The child of the old zygote still gives its status.
        if let Some(keeps) = fallback {
            match old.wait() {
                Ok(status) if keeps => assert_eq!(status.code(), Some(5), "{status}"),
                Err(error) if !keeps => assert!(error.is_zygote_lost(), "{error}"),
                other => panic!("unexpected {other:?}"),
            }
        }
        drop(restarted);
    }
}

#[test]
fn no_zygote_coming_back_fails_after_the_bound() {
    let mut daemon = start_daemon("reconnect-never");
    let client = Client::connect(daemon.socket()).expect("connect");
    daemon.kill();
    assert!(eventually(Duration::from_secs(5), || !client.is_connected()));
    let started = Instant::now();
    let error = Command::new(&client, "true")
        .status()
        .expect_err("no zygote to spawn with");
    let elapsed = started.elapsed();
    assert!(error.is_zygote_lost(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "reconnecting failed {} times",
            zygote_client::RECONNECT_ATTEMPTS
        )),
        "{text}"
    );
    assert!(text.contains("no zygote is listening"), "{text}");
    // The backoff sums to about 4.6 s; generous bounds prove it retried
    // and did not hang.
    assert!(
        elapsed >= Duration::from_secs(2),
        "gave up early: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(30), "hung: {elapsed:?}");
}

#[test]
fn a_client_of_an_inherited_socket_cannot_reconnect_and_says_so() {
    let mut daemon = start_daemon("reconnect-fd");
    let socket = zygote_proto::socket::connect_to(daemon.socket(), false).expect("connect");
    let client = Client::from_fd(socket).expect("handshake");
    assert!(Command::new(&client, "true").status().unwrap().success());
    daemon.kill();
    assert!(eventually(Duration::from_secs(5), || !client.is_connected()));
    let started = Instant::now();
    let error = Command::new(&client, "true").status().unwrap_err();
    assert!(error.is_zygote_lost(), "{error}");
    assert!(error.to_string().contains("cannot reconnect"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(1), "fails at once");
}

/// The zygote is stopped, so the client's reader cannot have seen the
/// loss: only the send finds it (EPIPE). The request never left, so the
/// client reconnects and sends it again.
#[test]
fn a_loss_found_by_the_send_itself_reconnects_and_sends_again() {
    let daemon = start_daemon("resend");
    let client = Client::connect(daemon.socket()).expect("connect");
    assert!(Command::new(&client, "true").status().unwrap().success());
    let pid = rustix::process::Pid::from_raw(i32::try_from(daemon.pid()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    });
    shut_down_writes_to(daemon.pid());
    assert!(
        client.is_connected(),
        "the reader cannot have seen anything yet"
    );
    let status = Command::new(&client, "sh")
        .args(["-c", "exit 3"])
        .status()
        .expect("the request is sent again on a new connection");
    resume.join().unwrap();
    assert_eq!(status.code(), Some(3));
    assert!(client.is_connected());
}

/// Shuts down the writing side of this process's one connection to the
/// zygote `daemon_pid`, found by its peer's pid: a send on it then fails
/// with EPIPE, while the zygote (stopped) has not closed anything.
fn shut_down_writes_to(daemon_pid: u32) {
    let mut found = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: only used for the two calls below; another test's fd
        // closed and reused meanwhile has another peer and is skipped.
        let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let peer = rustix::net::sockopt::socket_peercred(socket);
        if peer.is_ok_and(|cred| cred.pid.as_raw_nonzero().get().unsigned_abs() == daemon_pid) {
            rustix::net::shutdown(socket, rustix::net::Shutdown::Write).unwrap();
            found += 1;
        }
    }
    assert_eq!(found, 1, "connections to zygote {daemon_pid}");
}
