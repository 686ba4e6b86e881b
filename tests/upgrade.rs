//! Live upgrade in place: the daemon re-executes a newer binary
//! installed at its path, keeping its pid, its clients' connections and
//! its children; and what happens to children when the daemon is killed.
//!
//! The "newer" binaries are copies of the built one with a build tag
//! patched into the file (`zygote::BUILD_TAG_MARKER`), so that `zygote
//! status` tells them apart without a second build.

use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use zygote_client::{Client, ExitStatus};

use crate::util::{
    Daemon, eventually, group_members, parent_of, process_state, runtime, signal_bit,
    start_daemon_custom, thread_masks, within, zygote_bin,
};

/// Copies of the built binary, one per tag, made once per test run.
///
/// They live under cargo's target directory, one directory per test
/// process, because a `static` is never dropped: a temporary directory
/// here would leave a few hundred MB behind every run. Directories of
/// test processes that are gone are removed on the way in.
fn tagged(tag: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let parent = Path::new(env!("CARGO_TARGET_TMPDIR")).join("upgrade-binaries");
        std::fs::create_dir_all(&parent).expect("create the tagged binaries' directory");
        for entry in std::fs::read_dir(&parent)
            .expect("list the tagged binaries")
            .flatten()
        {
            let name = entry.file_name();
            let gone = name
                .to_str()
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
            if gone {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = parent.join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("create this run's tagged binaries' directory");
        dir
    });
    let path = dir.join(format!("zygote-{tag}"));
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !path.exists() {
        let mut bytes = std::fs::read(zygote_bin()).expect("read the zygote binary");
        let marker = zygote::BUILD_TAG_MARKER;
        let mut empty = marker.to_vec();
        empty.extend_from_slice(&[0; 16]);
        let at = bytes
            .windows(empty.len())
            .position(|window| window == empty)
            .expect("the binary carries an empty build tag");
        let start = at + marker.len();
        bytes[start..start + tag.len()].copy_from_slice(tag.as_bytes());
        let partial = path.with_extension("partial");
        std::fs::write(&partial, &bytes).expect("write a tagged binary");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::rename(&partial, &path).expect("rename");
    }
    path
}

/// The path a test daemon is started from, where upgrades install newer
/// binaries the way a package manager does (a new file renamed over it).
struct Installed {
    dir: tempfile::TempDir,
}

impl Installed {
    fn new(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("zygote-upgrade-bin-")
            .tempdir()
            .expect("tempdir");
        let installed = Self { dir };
        installed.install(tag);
        installed
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("zygote")
    }

    fn install(&self, tag: &str) {
        let next = self.dir.path().join("zygote.next");
        let _ = std::fs::remove_file(&next);
        std::fs::hard_link(tagged(tag), &next).expect("link the new binary");
        std::fs::rename(&next, self.path()).expect("install the new binary");
    }
}

fn start(test: &str, installed: &Installed, envs: &[(&str, &str)]) -> Daemon {
    start_daemon_custom(test, None, None, &[], &installed.path(), envs)
}

/// `zygote upgrade` against `daemon`: its exit status and output.
fn upgrade(daemon: &Daemon) -> (bool, String) {
    upgrade_at(daemon.socket())
}

/// `zygote upgrade` against the daemon on `socket`, given 60 s: an
/// upgrade that never answers fails the test rather than hanging it.
fn upgrade_at(socket: &Path) -> (bool, String) {
    let output = StdCommand::new("timeout")
        .args(["--kill-after=5", "60"])
        .arg(zygote_bin())
        .arg("upgrade")
        .arg("--socket")
        .arg(socket)
        .output()
        .expect("run zygote upgrade");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// [`upgrade`] from async code, off the runtime's thread.
async fn upgrade_async(daemon: &Daemon) -> (bool, String) {
    let socket = daemon.socket().to_owned();
    tokio::task::spawn_blocking(move || upgrade_at(&socket))
        .await
        .expect("join")
}

/// A `NOTIFY_SOCKET` for a test daemon: the sd_notify lines it was sent.
struct Notifications {
    socket: std::os::unix::net::UnixDatagram,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Notifications {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind notify");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        Self {
            socket,
            path,
            _dir: dir,
        }
    }

    /// Every line received until one equals `until`, or 10 s have passed.
    fn until(&self, until: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = String::new();
        let mut buffer = [0u8; 4096];
        while Instant::now() < deadline && !seen.lines().any(|line| line == until) {
            if let Ok(n) = self.socket.recv(&mut buffer) {
                seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
                seen.push('\n');
            }
        }
        seen
    }
}

fn version(tag: &str) -> String {
    format!("{}+{tag}", env!("CARGO_PKG_VERSION"))
}

/// When the daemon started, by the clock of this process.
async fn origin(client: &Client) -> Instant {
    let status = client.status().await.expect("status");
    Instant::now() - status.uptime
}

fn close_to(a: Instant, b: Instant, within: Duration) -> bool {
    (if a > b { a - b } else { b - a }) <= within
}

fn expect_exit(status: &ExitStatus, code: i32, what: &str, log: &dyn Fn() -> String) {
    assert_eq!(
        status.code(),
        Some(code),
        "{what}: {status:?}; log:\n{}",
        log()
    );
}

#[test]
fn upgrade_under_load_loses_no_child_and_no_connection() {
    let installed = Installed::new("a");
    let daemon = start("upgrade-load", &installed, &[]);
    let log = || daemon.log();
    let rt = runtime();
    rt.block_on(async {
        let clients: Vec<Client> =
            futures_join((0..5).map(|_| Client::connect(daemon.socket())).collect())
                .await
                .into_iter()
                .map(|client| client.expect("connect"))
                .collect();
        let before = origin(&clients[0]).await;
        let pid = clients[0].status().await.expect("status").pid;
        for round in 0..3u32 {
            let tag = if round % 2 == 0 { "b" } else { "a" };
            // 100 children running, each exiting with its own code.
            let mut running = Vec::new();
            for i in 0..100u32 {
                let client = &clients[(i % 5) as usize];
                let code = (i % 100) as i32;
                let child = client
                    .command("sh")
                    .arg("-c")
                    .arg(format!("sleep 1.2; exit {code}"))
                    .spawn()
                    .await
                    .expect("spawn");
                running.push((code, child));
            }
            installed.install(tag);
            // The upgrade, and 50 spawns spread over the ~50 ms around it:
            // some are in flight when the daemon pauses.
            let socket = daemon.socket().to_owned();
            let upgrading = tokio::task::spawn_blocking(move || upgrade_at(&socket));
            let mut in_flight = Vec::new();
            for i in 0..50u32 {
                let mut command = clients[(i % 5) as usize].command("sh");
                let code = 100 + i as i32;
                command.arg("-c").arg(format!("exit {code}"));
                in_flight.push((
                    code,
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(u64::from(i))).await;
                        command.status().await
                    }),
                ));
            }
            let (ok, text) = upgrading.await.expect("join");
            assert!(
                ok,
                "round {round}: zygote upgrade failed: {text}; log:\n{}",
                log()
            );
            assert!(text.contains(&version(tag)), "{text}");
            for (code, task) in in_flight {
                let status = within(Duration::from_secs(60), "a spawn in flight", task)
                    .await
                    .expect("join")
                    .expect("a spawn in flight finishes");
                expect_exit(&status, code, "spawn in flight", &log);
            }
            for (code, mut child) in running {
                let status = within(
                    Duration::from_secs(60),
                    "exit notice after the upgrade",
                    child.wait(),
                )
                .await
                .expect("exit notice after the upgrade");
                expect_exit(&status, code, "running child", &log);
                let usage = child.usage().expect("rusage comes with the exit notice");
                assert!(usage.max_rss_kib > 0, "{usage:?}");
            }
            for client in &clients {
                assert!(
                    client.is_connected(),
                    "a connection dropped; log:\n{}",
                    log()
                );
                let status = client.command("true").status().await.expect("spawn after");
                assert!(status.success());
            }
            let status = clients[0].status().await.expect("status");
            assert_eq!(status.server_version, version(tag), "log:\n{}", log());
            assert_eq!(status.pid, pid, "the pid changed");
            let after = Instant::now() - status.uptime;
            assert!(
                close_to(before, after, Duration::from_millis(500)),
                "the uptime origin moved by {:?}",
                if after > before {
                    after - before
                } else {
                    before - after
                }
            );
        }
    });
    assert!(
        daemon.zombies().is_empty(),
        "zombies: {:?}",
        daemon.zombies()
    );
}

/// Awaits every future, in order.
async fn futures_join<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut out = Vec::with_capacity(futures.len());
    for future in futures {
        out.push(future.await);
    }
    out
}

#[test]
fn twenty_upgrades_in_a_row_under_load_leak_nothing() {
    let installed = Installed::new("a");
    let daemon = start("upgrade-twenty", &installed, &[]);
    let log = || daemon.log();
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        // Warm up: lazily opened fds exist, and an image started by an
        // upgrade (which opens fewer than a first start) is counted.
        for _ in 0..3 {
            client.command("true").status().await.expect("warm up");
        }
        installed.install("a");
        let (ok, text) = upgrade(&daemon);
        assert!(ok, "{text}");
        client.command("true").status().await.expect("warm up");
        let fds_before = daemon.settled_fd_count();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Load: spawns on two connections all along, each checked.
        let mut load = Vec::new();
        for worker in 0..2 {
            let socket = daemon.socket().to_owned();
            let stop = std::sync::Arc::clone(&stop);
            load.push(tokio::spawn(async move {
                let client = Client::connect(&socket).await.expect("connect");
                let mut done = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let code = (done % 50) as i32 + worker;
                    let mut command = client.command("sh");
                    command
                        .arg("-c")
                        .arg(format!("sleep 0.0{}; exit {code}", done % 5));
                    let status = within(
                        Duration::from_secs(60),
                        "a spawn under load",
                        command.status(),
                    )
                    .await
                    .expect("a spawn under load");
                    assert_eq!(status.code(), Some(code));
                    done += 1;
                }
                done
            }));
        }
        for round in 0..20 {
            let tag = if round % 2 == 0 { "b" } else { "a" };
            installed.install(tag);
            let (ok, text) = upgrade_async(&daemon).await;
            assert!(ok, "upgrade {round} failed: {text}; log:\n{}", log());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut total = 0;
        for task in load {
            total += task.await.expect("no lost child: every exit came back");
        }
        assert!(total > 20, "the load barely ran: {total} spawns");
        let status = client.status().await.expect("status");
        assert_eq!(status.server_version, version("a"));
        assert_eq!(status.children_running, 0, "log:\n{}", log());
        // The load clients have left; count with one client as before.
        client.command("true").status().await.expect("spawn");
        let fds_after = daemon.settled_fd_count();
        assert_eq!(
            fds_before,
            fds_after,
            "fds leaked over 20 upgrades: {:?}; log:\n{}",
            crate::util::open_fds(daemon.pid()),
            log()
        );
    });
    assert!(
        daemon.zombies().is_empty(),
        "zombies: {:?}",
        daemon.zombies()
    );
}

#[test]
fn sighup_upgrades_in_place() {
    let installed = Installed::new("a");
    let mut daemon = start("upgrade-sighup", &installed, &[]);
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let mut child = client
            .command("sh")
            .args(["-c", "sleep 1; exit 3"])
            .spawn()
            .await
            .expect("spawn");
        installed.install("b");
        daemon.signal_stop(rustix::process::Signal::HUP);
        let mut upgraded = false;
        for _ in 0..200 {
            if client.status().await.expect("status").server_version == version("b") {
                upgraded = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(upgraded, "SIGHUP did not upgrade; log:\n{}", daemon.log());
        // The new image keeps the daemon's environment.
        let environ = std::fs::read(format!("/proc/{}/environ", daemon.pid())).expect("environ");
        assert!(
            environ
                .split(|byte| *byte == 0)
                .any(|var| var.starts_with(b"PATH=")),
            "the new image lost the environment: {}",
            String::from_utf8_lossy(&environ)
        );
        // The new image blocks SIGCHLD in every thread again and reads it
        // from its signalfd: stops are still reported.
        let sigchld = signal_bit(libc::SIGCHLD);
        let blocked = thread_masks(daemon.pid(), "SigBlk");
        assert!(
            blocked.iter().all(|(_, mask)| mask & sigchld != 0),
            "after the upgrade, SigBlk: {blocked:?}"
        );
        // Still under SCHED_BATCH (exec keeps it), its children not.
        let policies = crate::sched::thread_policies(daemon.pid());
        assert!(
            policies
                .iter()
                .all(|(_, policy)| *policy == crate::sched::SCHED_BATCH),
            "after the upgrade, policies: {policies:?}"
        );
        let output = client
            .command("cut")
            .args(["-d", " ", "-f", "41", "/proc/self/stat"])
            .stdout(zygote_client::Stdio::piped())
            .output()
            .await
            .expect("run cut");
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "0");
        crate::daemon::stops_reported_among_exits(&client).await;
        let status = within(Duration::from_secs(60), "exit notice", child.wait())
            .await
            .expect("exit notice");
        assert_eq!(status.code(), Some(3));
    });
}

#[test]
fn kill_on_close_of_a_child_or_its_group_and_timeouts_still_fire_after_an_upgrade() {
    let installed = Installed::new("a");
    let daemon = start("upgrade-deadlines", &installed, &[]);
    let log = || daemon.log();
    let rt = runtime();
    rt.block_on(async {
        let leaving = Client::connect(daemon.socket()).await.expect("connect");
        let staying = Client::connect(daemon.socket()).await.expect("connect");
        let doomed = leaving
            .command("sleep")
            .arg("60")
            .kill_on_close(libc::SIGKILL)
            .spawn()
            .await
            .expect("spawn");
        let doomed_pid = doomed.id();
        // A group leader whose whole group goes when the client leaves.
        let group = leaving
            .command("/bin/sh")
            .args(["-c", "sleep 60 & sleep 60"])
            .process_group(0)
            .kill_process_group_on_close(libc::SIGKILL)
            .spawn()
            .await
            .expect("spawn");
        let group_pid = group.id();
        assert!(eventually(Duration::from_secs(10), || group_members(
            group_pid
        )
        .len()
            == 3));
        let started = Instant::now();
        let mut timed = staying
            .command("sleep")
            .arg("60")
            .timeout(Duration::from_millis(1500))
            .spawn()
            .await
            .expect("spawn");
        installed.install("b");
        let (ok, text) = upgrade_async(&daemon).await;
        assert!(ok, "{text}; log:\n{}", log());
        // The timeout keeps its absolute deadline across the upgrade.
        let status = within(Duration::from_secs(60), "exit notice", timed.wait())
            .await
            .expect("exit notice");
        let took = started.elapsed();
        assert!(status.timed_out(), "{status:?}; log:\n{}", log());
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert!(
            took >= Duration::from_millis(1400) && took < Duration::from_secs(10),
            "the timeout fired after {took:?}"
        );
        // The client leaves: its kill-on-close child is killed by the new
        // image.
        drop((doomed, group));
        drop(leaving);
        assert!(
            eventually(Duration::from_secs(10), || process_state(doomed_pid)
                .is_none_or(|state| state == 'Z')
                && !crate::util::children_of(daemon.pid()).contains(&doomed_pid)),
            "the kill-on-close child survived its client; log:\n{}",
            log()
        );
        assert!(
            eventually(Duration::from_secs(10), || group_members(group_pid)
                .is_empty()),
            "the group killed on close kept {:?} after an upgrade; log:\n{}",
            group_members(group_pid),
            log()
        );
    });
}

#[test]
fn a_state_the_new_binary_refuses_leaves_the_old_image_serving() {
    let installed = Installed::new("a");
    let notifications = Notifications::new();
    let notify_socket = notifications.path.display().to_string();
    let daemon = start(
        "upgrade-refused",
        &installed,
        &[
            ("ZYGOTE_TEST_CORRUPT_STATE", "truncate"),
            ("NOTIFY_SOCKET", &notify_socket),
        ],
    );
    assert!(notifications.until("READY=1").contains("READY=1"));
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let mut child = client
            .command("sh")
            .args(["-c", "sleep 1; exit 5"])
            .spawn()
            .await
            .expect("spawn");
        installed.install("b");
        let (ok, text) = upgrade(&daemon);
        assert!(!ok, "a truncated state was accepted: {text}");
        assert!(
            text.contains("upgrade abandoned") && text.contains("truncated"),
            "the error does not say what failed: {text}"
        );
        // The service manager, told it was reloading, hears it is ready
        // again.
        let seen = notifications.until("READY=1");
        assert!(
            seen.contains("RELOADING=1") && seen.lines().any(|line| line == "READY=1"),
            "no READY=1 after the abandoned upgrade's RELOADING=1: {seen:?}"
        );
        // Same image, same connection, child still reported.
        let status = client.status().await.expect("still serving");
        assert_eq!(status.server_version, version("a"));
        assert_eq!(
            within(Duration::from_secs(60), "exit notice", child.wait())
                .await
                .expect("exit notice")
                .code(),
            Some(5)
        );
        assert!(
            client
                .command("true")
                .status()
                .await
                .expect("spawn")
                .success()
        );
    });
    let mut daemon = daemon;
    assert!(
        daemon.wait_exit(Duration::ZERO).is_none(),
        "the daemon died"
    );
    assert!(
        daemon.logged("upgrade abandoned", Duration::from_secs(10)),
        "{}",
        daemon.log()
    );
}

#[test]
fn a_state_the_new_image_cannot_read_keeps_the_socket_and_reaps_the_children() {
    let installed = Installed::new("a");
    let daemon = start(
        "upgrade-unreadable",
        &installed,
        &[("ZYGOTE_TEST_CORRUPT_STATE", "truncate-unchecked")],
    );
    let rt = runtime();
    let pid = daemon.pid();
    rt.block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let child = client
            .command("sh")
            .args(["-c", "sleep 1; exit 5"])
            .spawn()
            .await
            .expect("spawn");
        let child_pid = child.id();
        installed.install("b");
        let (ok, text) = upgrade(&daemon);
        assert!(!ok, "an unreadable state went unnoticed: {text}");
        // The defined survival: same pid, same socket, a new image serving
        // afresh; old connections dropped; old children reaped.
        let fresh = Client::connect(daemon.socket())
            .await
            .expect("connect after");
        let status = fresh.status().await.expect("status");
        assert_eq!(status.pid as u32, pid);
        assert_eq!(status.server_version, version("b"));
        assert!(
            fresh
                .command("true")
                .status()
                .await
                .expect("spawn")
                .success()
        );
        assert!(
            eventually(Duration::from_secs(10), || process_state(child_pid)
                .is_none()),
            "the old child was not reaped (state {:?})",
            process_state(child_pid)
        );
        drop(child);
    });
    assert!(
        daemon.logged("cannot be read", Duration::from_secs(10)),
        "no clear error in the log:\n{}",
        daemon.log()
    );
    let log = daemon.log();
    assert!(
        log.contains("truncated"),
        "no clear error in the log:\n{log}"
    );
}

/// A connection that negotiated version 2 is still answered in version
/// 2's layouts by the new image: the handover carries its version.
#[test]
fn a_version_2_connection_keeps_its_layout_across_an_upgrade() {
    use std::os::fd::AsFd;
    use zygote_proto::{
        ClientMessage, Hello, RECV_BUFFER_BYTES, StatusRequest, decode, encode, recv_frame,
        send_frame, v2,
    };
    let installed = Installed::new("a");
    let daemon = start("upgrade-version-2", &installed, &[]);
    let fd = crate::util::connect_with_deadline(daemon.socket(), Duration::from_secs(20));
    let send = |bytes: Vec<u8>| send_frame(fd.as_fd(), &bytes, &[]).expect("send");
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    // Replies decode strictly in the version-2 layout: a version-3 one
    // has bytes left over.
    let mut receive = || -> v2::ServerMessage {
        let frame = recv_frame(fd.as_fd(), &mut scratch)
            .expect("recv")
            .expect("open");
        decode(&frame.bytes).expect("a reply in the version-2 layout")
    };
    let hello = ClientMessage::Hello(Hello {
        protocol_version: 2,
        client: "version 2 test".into(),
    });
    send(encode(&hello).expect("encode"));
    match receive() {
        v2::ServerMessage::HelloAck(ack) => assert_eq!(ack.protocol_version, 2),
        other => panic!("expected HelloAck, got {other:?}"),
    }
    installed.install("b");
    let (ok, text) = upgrade(&daemon);
    assert!(ok, "{text}; log:\n{}", daemon.log());
    let status = v2::ClientMessage::Status(StatusRequest { id: 1 });
    send(encode(&status).expect("encode"));
    match receive() {
        v2::ServerMessage::Status(status) => assert_eq!(status.server_version, version("b")),
        other => panic!("expected Status, got {other:?}"),
    }
    let request = v2::SpawnRequest::try_from(zygote_proto::SpawnRequest::new(2, "/bin/true"))
        .expect("no sandbox");
    send(encode(&v2::ClientMessage::Spawn(request)).expect("encode"));
    match receive() {
        v2::ServerMessage::Spawned(spawned) => assert_eq!(spawned.id, 2),
        other => panic!("expected Spawned, got {other:?}; log:\n{}", daemon.log()),
    }
    assert!(matches!(receive(), v2::ServerMessage::Exited(_)));
}

#[test]
fn the_state_fixture_of_format_1_still_reads() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade-state-v1.bin");
    let output = StdCommand::new(zygote_bin())
        .arg("check-state")
        .arg(&fixture)
        .output()
        .expect("zygote check-state");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}{}",
        text,
        String::from_utf8_lossy(&output.stderr)
    );
    // Its connections spoke versions 1 or 2, the same layouts after the
    // handshake: they carry on in version 2.
    assert!(
        text.contains("state format 1 ")
            && text.contains("3 connections, 2 children, protocol versions [2]"),
        "{text}"
    );
    // Cut short: refused by name.
    let bytes = std::fs::read(&fixture).expect("read fixture");
    let dir = tempfile::tempdir().expect("tempdir");
    let cut = dir.path().join("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() - 7]).expect("write");
    let output = StdCommand::new(zygote_bin())
        .arg("check-state")
        .arg(&cut)
        .output()
        .expect("zygote check-state");
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("state truncated"), "{error}");
}

#[test]
fn the_state_fixture_of_format_2_still_reads() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade-state-v2.bin");
    let output = StdCommand::new(zygote_bin())
        .arg("check-state")
        .arg(&fixture)
        .output()
        .expect("zygote check-state");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}{}",
        text,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("state format 2 ")
            && text.contains("4 connections, 2 children, protocol versions [2, 3]"),
        "{text}"
    );
}

#[test]
fn the_state_fixture_of_format_3_still_reads() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade-state-v3.bin");
    let output = StdCommand::new(zygote_bin())
        .arg("check-state")
        .arg(&fixture)
        .output()
        .expect("zygote check-state");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}{}",
        text,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("state format 3 ")
            && text.contains("4 connections, 2 children, protocol versions [2, 3]"),
        "{text}"
    );
}

/// Writes the fixture from a live daemon's state (run by hand when the
/// format changes: keep the old fixtures, add the new one).
#[test]
#[ignore = "writes tests/fixtures/upgrade-state-v3.bin"]
fn write_state_fixture() {
    let installed = Installed::new("a");
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = dir.path().join("state.bin");
    let daemon = start(
        "upgrade-fixture",
        &installed,
        &[("ZYGOTE_TEST_DUMP_STATE", dump.to_str().expect("utf-8"))],
    );
    let rt = runtime();
    rt.block_on(async {
        let one = Client::connect(daemon.socket()).await.expect("connect");
        let two = Client::connect(daemon.socket()).await.expect("connect");
        let _a = one
            .command("sleep")
            .arg("5")
            .kill_on_close(libc::SIGTERM)
            .spawn()
            .await
            .expect("spawn");
        let _b = two
            .command("sleep")
            .arg("5")
            .timeout(Duration::from_secs(3))
            .spawn()
            .await
            .expect("spawn");
        // A client of version 2 beside the version-3 ones.
        let older = zygote_proto::socket::connect_to(daemon.socket(), false).expect("connect");
        let hello = zygote_proto::ClientMessage::Hello(zygote_proto::Hello {
            protocol_version: 2,
            client: "fixture".into(),
        });
        let bytes = zygote_proto::encode(&hello).expect("encode");
        zygote_proto::send_frame(std::os::fd::AsFd::as_fd(&older), &bytes, &[]).expect("send");
        let mut scratch = vec![0u8; zygote_proto::RECV_BUFFER_BYTES];
        zygote_proto::recv_frame(std::os::fd::AsFd::as_fd(&older), &mut scratch)
            .expect("recv")
            .expect("HelloAck");
        let (ok, text) = upgrade(&daemon);
        assert!(ok, "{text}");
        drop(older);
    });
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade-state-v3.bin");
    std::fs::create_dir_all(target.parent().expect("dir")).expect("mkdir");
    std::fs::copy(&dump, &target).expect("copy the state");
}

/// A writable cgroup2 directory for one test, removed on drop (what is
/// left in it is killed first); `None`, said on stderr, where there is none.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn new(test: &str) -> Option<Self> {
        let mount = Path::new("/sys/fs/cgroup/unified");
        let mount = if mount.join("cgroup.procs").exists() {
            mount
        } else {
            Path::new("/sys/fs/cgroup")
        };
        let path = mount.join(format!("zygote-test-{test}-{}", std::process::id()));
        if rustix::process::geteuid().as_raw() != 0 || std::fs::create_dir(&path).is_err() {
            crate::util::skip(&format!(
                "the cgroup part of {test}: no writable cgroup2 here"
            ));
            return None;
        }
        Some(Self(path))
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        for _ in 0..100 {
            let mut dirs = Vec::new();
            collect_dirs(&self.0, &mut dirs);
            dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
            for dir in &dirs {
                let _ = std::fs::remove_dir(dir);
            }
            if !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_owned());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten().filter(|entry| entry.path().is_dir()) {
            collect_dirs(&entry.path(), out);
        }
    }
}

#[test]
fn sigkill_leaves_children_running_as_orphans_and_a_new_daemon_serves() {
    let installed = Installed::new("a");
    let cgroup = TestCgroup::new("upgrade-sigkill");
    let cgroup_flag = cgroup.as_ref().map(|cgroup| cgroup.0.display().to_string());
    let mut flags = Vec::new();
    if let Some(path) = &cgroup_flag {
        flags.extend(["--cgroup", path.as_str()]);
    }
    let mut daemon = start_daemon_custom(
        "upgrade-sigkill",
        None,
        None,
        &flags,
        &installed.path(),
        &[],
    );
    let socket = daemon.socket().to_owned();
    let rt = runtime();
    let child_pid = rt.block_on(async {
        let client = Client::connect(&socket).await.expect("connect");
        let child = client
            .command("sleep")
            .arg("30")
            .kill_on_close(libc::SIGKILL)
            .spawn()
            .await
            .expect("spawn");
        child.id()
    });
    let daemon_pid = daemon.pid();
    // The client has left, and its kill-on-close child was killed then;
    // start another one whose client stays, then kill the daemon.
    let orphan = rt.block_on(async {
        let client = Client::connect(&socket).await.expect("connect");
        let child = client
            .command("sleep")
            .arg("30")
            .kill_on_close(libc::SIGKILL)
            .spawn()
            .await
            .expect("spawn");
        let pid = child.id();
        assert_eq!(parent_of(pid), Some(daemon_pid));
        daemon.kill();
        // Re-parented to the nearest subreaper or init, still running:
        // kill-on-close went with the daemon's end of the connection, so
        // it never fires.
        assert!(
            eventually(Duration::from_secs(5), || parent_of(pid)
                .is_some_and(|parent| parent != daemon_pid)),
            "the child was not re-parented"
        );
        assert_eq!(
            process_state(pid).map(|state| state != 'Z'),
            Some(true),
            "the orphan should still run"
        );
        assert!(!client.is_connected() || client.status().await.is_err());
        pid
    });
    // Its cgroup, made by the dead daemon, stays while it runs.
    let orphan_cgroup = std::fs::read_to_string(format!("/proc/{orphan}/cgroup"))
        .unwrap_or_default()
        .trim()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(
        eventually(Duration::from_secs(5), || process_state(child_pid)
            .is_none()),
        "the first child outlived its client (kill-on-close)"
    );
    // A new daemon on the same socket path serves at once; the orphan's
    // cgroup stays (it holds a live process) and is not reused.
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("daemon.log");
    let mut command = StdCommand::new(installed.path());
    command.arg("serve").arg("--socket").arg(&socket);
    if let Some(path) = &cgroup_flag {
        command.args(["--cgroup", path]);
    }
    let mut again = command
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(std::fs::File::create(dir.path().join("stderr")).expect("log"))
        .spawn()
        .expect("restart the daemon");
    let served = rt.block_on(async {
        for _ in 0..500 {
            if let Ok(client) = Client::connect(&socket).await {
                return client
                    .command("true")
                    .status()
                    .await
                    .map(|status| status.success());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "the restarted daemon does not listen on {}",
            socket.display()
        );
    });
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    let pid = rustix::process::Pid::from_raw(orphan as i32).expect("pid");
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    let _ = again.kill();
    let _ = again.wait();
    assert_eq!(served.ok(), Some(true), "the restarted daemon: {stderr}");
    if cgroup.is_some() {
        assert!(
            orphan_cgroup.contains("/peers/0/"),
            "the orphan is in {orphan_cgroup:?}"
        );
        assert!(
            stderr.contains("still hold processes"),
            "the restarted daemon does not mention the orphans' cgroups: {stderr}"
        );
    }
}

#[test]
fn only_root_or_the_daemons_uid_may_upgrade() {
    use std::os::unix::process::CommandExt;
    if !crate::util::root_or_skip("an upgrade asked by another uid") {
        return;
    }
    let installed = Installed::new("a");
    let daemon = start_daemon_custom(
        "upgrade-eperm",
        None,
        None,
        &["--socket-mode", "0666"],
        &installed.path(),
        &[],
    );
    installed.install("b");
    let output = StdCommand::new(zygote_bin())
        .args(["upgrade", "--socket"])
        .arg(daemon.socket())
        .uid(65534)
        .gid(65534)
        .output()
        .expect("zygote upgrade as nobody");
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        error.contains("only root or uid 0"),
        "the refusal does not say who may: {error}"
    );
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let status = client.status().await.expect("status");
        assert_eq!(status.server_version, version("a"), "it upgraded anyway");
    });
}

/// A daemon run as a user may be upgraded by that user, and by root.
#[test]
fn a_daemon_run_as_a_user_is_upgraded_by_that_user_or_root() {
    use std::os::unix::process::CommandExt;
    if !crate::util::root_or_skip("a daemon of another uid") {
        return;
    }
    let daemon = crate::util::start_daemon_as("upgrade-user-daemon", Some(65534), None, &[]);
    for uid in [65534, 0] {
        let output = StdCommand::new(zygote_bin())
            .args(["upgrade", "--socket"])
            .arg(daemon.socket())
            .uid(uid)
            .gid(uid)
            .output()
            .expect("zygote upgrade");
        let error = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "uid {uid} could not upgrade a daemon of uid 65534: {error}\n{}",
            daemon.log()
        );
    }
}

#[test]
fn an_exit_waiting_for_its_tree_is_carried_over() {
    let Some(cgroup) = TestCgroup::new("upgrade-tree") else {
        return;
    };
    let installed = Installed::new("a");
    let path = cgroup.0.display().to_string();
    let daemon = start_daemon_custom(
        "upgrade-tree",
        None,
        None,
        &["--cgroup", &path],
        &installed.path(),
        &[],
    );
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let started = Instant::now();
        // The child exits at once; its grandchild keeps the tree for 1.5 s.
        let mut child = client
            .command("sh")
            .args(["-c", "sleep 1.5 & exit 4"])
            .wait_tree(true)
            .spawn()
            .await
            .expect("spawn");
        tokio::time::sleep(Duration::from_millis(300)).await;
        installed.install("b");
        let (ok, text) = upgrade_async(&daemon).await;
        assert!(ok, "{text}; log:\n{}", daemon.log());
        let status = within(
            Duration::from_secs(60),
            "the exit notice, after the tree",
            child.wait(),
        )
        .await
        .expect("the exit notice, after the tree");
        assert_eq!(status.code(), Some(4), "log:\n{}", daemon.log());
        assert!(
            started.elapsed() >= Duration::from_millis(1400),
            "the notice did not wait for the tree: {:?}",
            started.elapsed()
        );
        assert!(status.tree_usage().is_some(), "{status:?}");
    });
}

#[test]
fn a_socket_activated_service_reloads_in_place() {
    if !crate::tools::have_tool("systemd-socket-activate", "systemd") {
        return;
    }
    let installed = Installed::new("a");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("zygote.sock");
    let notifications = Notifications::new();
    let mut activator = StdCommand::new("systemd-socket-activate")
        .arg("--seqpacket")
        .arg("--listen")
        .arg(&socket)
        .arg("--fdname=spawn")
        .arg(format!(
            "--setenv=NOTIFY_SOCKET={}",
            notifications.path.display()
        ))
        .arg("--setenv=WATCHDOG_USEC=400000")
        .arg(installed.path())
        .arg("serve")
        .env("ZYGOTE_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("systemd-socket-activate");
    assert!(eventually(Duration::from_secs(10), || socket.exists()));
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(&socket).await.expect("connect");
        assert!(notifications.until("READY=1").contains("READY=1"));
        let mut child = client
            .command("sh")
            .args(["-c", "sleep 1; exit 6"])
            .spawn()
            .await
            .expect("spawn");
        installed.install("b");
        let pid = client.status().await.expect("status").pid;
        let pid = rustix::process::Pid::from_raw(pid).expect("pid");
        let monotonic_us = || {
            let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
            now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
        };
        let before = monotonic_us();
        rustix::process::kill_process(pid, rustix::process::Signal::HUP).expect("SIGHUP");
        let seen = notifications.until("READY=1");
        assert!(
            seen.contains("RELOADING=1") && seen.contains("MONOTONIC_USEC="),
            "no RELOADING=1 before READY=1: {seen:?}"
        );
        // systemd orders the reload by it: CLOCK_MONOTONIC in µs, now.
        let reloading_at: u64 = seen
            .lines()
            .find_map(|line| line.strip_prefix("MONOTONIC_USEC="))
            .and_then(|value| value.parse().ok())
            .expect("a number");
        assert!(
            (before..=monotonic_us()).contains(&reloading_at),
            "MONOTONIC_USEC={reloading_at}, sent between {before} and now"
        );
        // The new image keeps the watchdog and the socket-activated
        // listener.
        assert!(notifications.until("WATCHDOG=1").contains("WATCHDOG=1"));
        let status = client.status().await.expect("status");
        assert_eq!(status.server_version, version("b"));
        assert_eq!(
            within(Duration::from_secs(60), "exit notice", child.wait())
                .await
                .expect("exit notice")
                .code(),
            Some(6)
        );
        let fresh = Client::connect(&socket).await.expect("a new client");
        assert!(
            fresh
                .command("true")
                .status()
                .await
                .expect("spawn")
                .success()
        );
    });
    let _ = activator.kill();
    let _ = activator.wait();
}

/// A client that reads none of its replies does not hold the upgrade up:
/// its connection stops being read once 64 replies are unread (the
/// outbox's bound), and those fit in the socket's send buffer (1 MiB, and
/// 64 replies of at most ~1 KiB of text and 4 fds each take well under
/// 200 KiB), so no reply is left waiting to be sent and every task
/// reaches its safe point. The requests it sent meanwhile wait in its
/// socket, unread, and the new image answers them: nothing is lost.
#[test]
fn a_client_that_does_not_read_does_not_hold_up_the_upgrade_and_loses_nothing() {
    use std::os::fd::AsFd;
    use zygote_proto::{
        ClientMessage, Hello, PROTOCOL_VERSION, RECV_BUFFER_BYTES, ServerMessage, SpawnRequest,
        decode, encode, recv_frame, send_frame,
    };
    // Failing spawns whose replies carry ~1 KiB of text each: 2,000 of
    // them would fill the daemon's send buffer (1 MiB), were they all
    // answered unread.
    const SPAWNS: u64 = 2000;
    let installed = Installed::new("a");
    let daemon = start("upgrade-unread", &installed, &[]);
    let fd = crate::util::connect_with_deadline(daemon.socket(), Duration::from_secs(20));
    let send = |fd: &std::os::fd::OwnedFd, message: &ClientMessage| {
        send_frame(fd.as_fd(), &encode(message).expect("encode"), &[]).expect("send");
    };
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let mut receive = || -> ServerMessage {
        let frame = recv_frame(fd.as_fd(), &mut scratch)
            .expect("recv")
            .expect("open");
        decode(&frame.bytes).expect("decode")
    };
    send(
        &fd,
        &ClientMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: "upgrade test".into(),
        }),
    );
    assert!(matches!(receive(), ServerMessage::HelloAck(_)));
    let program = format!("/nonexistent/{}", "x".repeat(1000));
    let sender_fd = fd.try_clone().expect("dup");
    let sender = std::thread::spawn(move || {
        for id in 1..=SPAWNS {
            let request = SpawnRequest::new(id, program.as_bytes().to_vec());
            send(&sender_fd, &ClientMessage::Spawn(request));
        }
    });
    // The connection is held back at its bound of unread replies.
    std::thread::sleep(Duration::from_millis(2500));
    installed.install("b");
    let (ok, text) = upgrade(&daemon);
    assert!(ok, "{text}; log:\n{}", daemon.log());
    assert!(text.contains(&version("b")), "{text}");
    // Nothing was lost: every spawn is answered.
    let mut failed = 0;
    while failed < SPAWNS {
        match receive() {
            ServerMessage::SpawnFailed(_) => failed += 1,
            other => panic!("unexpected {other:?}; log:\n{}", daemon.log()),
        }
    }
    sender.join().expect("sender");
}

/// `Name`, `State` and real uid of `pid`, from `/proc/PID/status`.
fn name_state_uid(pid: u32) -> Option<(String, char, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .map(str::trim)
    };
    Some((
        field("Name:")?.to_owned(),
        field("State:")?.chars().next()?,
        field("Uid:")?.split_whitespace().next()?.parse().ok()?,
    ))
}

/// The uid the stuck spawns run as: a child that switches ids is started
/// on the fork path, whose wait for the exec holds its own spawn only (a
/// child that keeps the daemon's ids is vforked, and stopping it would
/// hold the cloning thread: only the daemon's own uid can do that).
const STUCK_UID: u32 = 65534;

/// Stops one child of the daemon `daemon_pid` running as [`STUCK_UID`]
/// between its switch to that uid and its exec of `true` (a 6,000-entry
/// PATH makes that window milliseconds wide); its pid, `None` past the
/// deadline.
fn stop_one_before_exec(daemon_pid: u32) -> Option<u32> {
    use rustix::process::{Pid, Signal, kill_process};
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        for pid in crate::util::children_of(daemon_pid) {
            if name_state_uid(pid).is_none_or(|(name, _, uid)| name == "true" || uid != STUCK_UID) {
                continue;
            }
            let target = Pid::from_raw(pid as i32)?;
            if kill_process(target, Signal::STOP).is_err() {
                continue;
            }
            // Once stopped, its name is settled: the one before exec, or
            // `true` when the stop landed after the exec.
            let mut settled = None;
            for _ in 0..50 {
                match name_state_uid(pid) {
                    Some((name, 'T', _)) => {
                        settled = Some(name);
                        break;
                    }
                    Some(_) => std::thread::sleep(Duration::from_millis(1)),
                    None => break,
                }
            }
            match settled {
                Some(name) if name != "true" => return Some(pid),
                _ => {
                    let _ = kill_process(target, Signal::CONT);
                }
            }
        }
    }
    None
}

/// What does make an upgrade give up: a spawn that cannot reach its safe
/// point (here a child stopped between clone and exec, whose spawn waits
/// for its exec). The upgrade is abandoned after the drain bound, the old
/// image carries on, and nothing is lost: once the child continues, its
/// spawn is answered, and the next upgrade goes through.

#[test]
fn a_spawn_stuck_before_exec_makes_the_upgrade_give_up_and_loses_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let installed = Installed::new("a");
    let daemon = start("upgrade-stuck", &installed, &[]);
    let rt = runtime();
    let client = Arc::new(
        rt.block_on(Client::connect(daemon.socket()))
            .expect("connect"),
    );
    let path = (0..6000)
        .map(|i| format!("/nonexistent/{i}"))
        .chain(["/usr/bin".into(), "/bin".into()])
        .collect::<Vec<_>>()
        .join(":");
    let spawning = Arc::new(AtomicBool::new(true));
    let loops: Vec<_> = (0..3)
        .map(|_| {
            let (client, path, spawning) =
                (Arc::clone(&client), path.clone(), Arc::clone(&spawning));
            rt.spawn(async move {
                let mut spawned = 0u32;
                while spawning.load(Ordering::SeqCst) {
                    let status = client
                        .command("true")
                        .env_clear()
                        .env("PATH", &path)
                        .uid(STUCK_UID)
                        .gid(STUCK_UID)
                        .current_dir("/")
                        .status()
                        .await
                        .expect("every spawn is answered");
                    assert!(status.success(), "{status:?}");
                    spawned += 1;
                }
                spawned
            })
        })
        .collect();
    let stopped = stop_one_before_exec(daemon.pid());
    spawning.store(false, Ordering::SeqCst);
    let Some(stopped) = stopped else {
        panic!("no child could be stopped before exec within 30 s");
    };
    installed.install("b");
    let started = Instant::now();
    let (ok, text) = upgrade(&daemon);
    assert!(
        !ok,
        "the upgrade went through a spawn stuck before exec: {text}"
    );
    assert!(
        text.contains("upgrade abandoned") && text.contains("safe point"),
        "{text}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "gave up too early"
    );
    // The old image carries on, and the stuck spawn completes.
    let target = rustix::process::Pid::from_raw(stopped as i32).expect("pid");
    rustix::process::kill_process(target, rustix::process::Signal::CONT).expect("SIGCONT");
    let spawned: u32 = rt.block_on(async {
        let mut total = 0;
        for each in loops {
            total += within(Duration::from_secs(60), "the spawn loops", each)
                .await
                .expect("a spawn loop");
        }
        total
    });
    assert!(spawned >= 1, "the stuck spawn was answered");
    let status = rt.block_on(client.status()).expect("status");
    assert_eq!(status.server_version, version("a"), "the old image serves");
    assert_eq!(status.spawns_failed, 0, "nothing was lost");
    let (ok, text) = upgrade(&daemon);
    assert!(ok, "{text}; log:\n{}", daemon.log());
    assert!(text.contains(&version("b")), "{text}");
}

#[test]
fn a_connection_that_has_not_said_hello_is_served_by_the_new_image() {
    use std::os::fd::AsFd;
    use zygote_proto::{
        ClientMessage, Hello, PROTOCOL_VERSION, RECV_BUFFER_BYTES, ServerMessage, decode, encode,
        recv_frame, send_frame,
    };
    let installed = Installed::new("a");
    let daemon = start("upgrade-prehello", &installed, &[]);
    let fd = crate::util::connect_with_deadline(daemon.socket(), Duration::from_secs(10));
    installed.install("b");
    let (ok, text) = upgrade(&daemon);
    assert!(ok, "{text}; log:\n{}", daemon.log());
    let hello = ClientMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "upgrade test".into(),
    });
    send_frame(fd.as_fd(), &encode(&hello).expect("encode"), &[]).expect("send");
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let frame = recv_frame(fd.as_fd(), &mut scratch)
        .expect("recv")
        .expect("the connection survived the upgrade");
    match decode(&frame.bytes).expect("decode") {
        ServerMessage::HelloAck(ack) => assert_eq!(ack.server_version, version("b")),
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

/// A `defer_spawned` child whose `Spawned` is still pending when the
/// daemon pauses gets it before the pause (the saved state has no room
/// for it), then its `Exited` from the new image.
#[test]
fn a_deferred_spawned_pending_at_an_upgrade_is_sent_before_the_pause() {
    use crate::deferred::{connect, deferred, pidfd_alive, receive, send};
    use zygote_proto::{ClientMessage, ExitStatus, ServerMessage, UpgradeRequest};

    let installed = Installed::new("a");
    let daemon = start("upgrade-deferred", &installed, &[]);
    let fd = connect(daemon.socket());
    // Whether the pause catches the deferred `Spawned` pending is a race
    // the test cannot steer; under load a round can miss it, so up to 20.
    let mut early = 0;
    for attempt in 0..20u64 {
        if early > 0 && attempt >= 5 {
            break;
        }
        let tag = format!("d{attempt}");
        installed.install(&tag);
        let id = attempt * 2 + 1;
        let sent = Instant::now();
        send(&fd, &deferred(id, "/bin/sleep", &["0.3"]));
        send(&fd, &ClientMessage::Upgrade(UpgradeRequest { id: id + 1 }));
        let mut spawned = None;
        let mut upgraded = false;
        let exited = loop {
            match receive(&fd) {
                (ServerMessage::Spawned(reply), mut fds) => {
                    assert_eq!(reply.id, id);
                    assert!(spawned.is_none(), "a second Spawned");
                    assert_eq!(fds.len(), 1, "the pidfd");
                    let pidfd = fds.remove(0);
                    assert!(pidfd_alive(&pidfd), "the pidfd of the running child");
                    spawned = Some((reply.pid, sent.elapsed(), upgraded));
                }
                (ServerMessage::Status(status), _) => {
                    assert_eq!(status.id, id + 1);
                    assert_eq!(status.server_version, version(&tag), "{}", daemon.log());
                    upgraded = true;
                }
                (ServerMessage::Exited(notice), _) => break notice,
                (other, _) => panic!("unexpected reply: {other:?}; log:\n{}", daemon.log()),
            }
        };
        let (pid, after, after_upgrade) =
            spawned.expect("a child running 300 ms across an upgrade gets its Spawned");
        assert!(
            upgraded,
            "the upgrade's Status came before the child's Exited"
        );
        assert_eq!((exited.id, exited.pid), (id, pid));
        assert_eq!(exited.status, ExitStatus::Exited(0));
        // Sent by the old image as it paused, before its deadline.
        if !after_upgrade && after < Duration::from_millis(10) {
            early += 1;
        }
    }
    assert!(
        early > 0,
        "the upgrade never caught a deferred Spawned pending; log:\n{}",
        daemon.log()
    );
}

/// The upgrade's reply goes to the connection that asked for it, with
/// older and newer connections open beside it, and to no other.
#[test]
fn the_upgrades_reply_reaches_the_connection_that_asked_and_no_other() {
    use crate::deferred::{connect, receive, send};
    use zygote_proto::{ClientMessage, ServerMessage, StatusRequest, UpgradeRequest};

    let installed = Installed::new("a");
    let daemon = start("upgrade-asker", &installed, &[]);
    let older = connect(daemon.socket());
    let asker = connect(daemon.socket());
    let newer = connect(daemon.socket());
    installed.install("b");
    send(&asker, &ClientMessage::Upgrade(UpgradeRequest { id: 7 }));
    match receive(&asker) {
        (ServerMessage::Status(status), _) => {
            assert_eq!(status.id, 7);
            assert_eq!(status.server_version, version("b"), "{}", daemon.log());
        }
        (other, _) => panic!("unexpected reply: {other:?}; log:\n{}", daemon.log()),
    }
    // Each other connection's first reply is the answer to its own
    // request: nothing of the upgrade's came before it.
    for (id, fd) in [(11, &older), (12, &newer)] {
        send(fd, &ClientMessage::Status(StatusRequest { id }));
        match receive(fd) {
            (ServerMessage::Status(status), _) => assert_eq!(status.id, id),
            (other, _) => panic!("unexpected reply: {other:?}; log:\n{}", daemon.log()),
        }
    }
}

/// The spawn id of a child still running is still taken after an
/// upgrade: a request that reuses it is refused, not answered under it,
/// and the child's exit comes under its id.
#[test]
fn a_running_childs_id_stays_taken_across_an_upgrade() {
    use crate::deferred::{connect, receive, send};
    use zygote_proto::{ClientMessage, ServerMessage, SpawnRequest, StatusRequest};

    let installed = Installed::new("a");
    let daemon = start("upgrade-ids", &installed, &[]);
    let fd = connect(daemon.socket());
    let mut sleeper = SpawnRequest::new(5, b"/bin/sleep".to_vec());
    sleeper.args = vec![b"3".to_vec()];
    send(&fd, &ClientMessage::Spawn(sleeper));
    match receive(&fd) {
        (ServerMessage::Spawned(spawned), _) => assert_eq!(spawned.id, 5),
        (other, _) => panic!("unexpected reply: {other:?}; log:\n{}", daemon.log()),
    }
    installed.install("b");
    let (ok, text) = upgrade(&daemon);
    assert!(
        ok && text.contains(&version("b")),
        "{text}; log:\n{}",
        daemon.log()
    );
    send(&fd, &ClientMessage::Status(StatusRequest { id: 5 }));
    match receive(&fd) {
        (ServerMessage::RequestFailed(failed), _) => {
            assert_eq!((failed.id, failed.errno), (5, libc::EEXIST), "{failed:?}");
        }
        (other, _) => panic!("the running child's id was free after the upgrade: {other:?}"),
    }
    match receive(&fd) {
        (ServerMessage::Exited(notice), _) => {
            assert_eq!(notice.id, 5);
            assert_eq!(notice.status, zygote_proto::ExitStatus::Exited(0));
        }
        (other, _) => panic!("unexpected reply: {other:?}; log:\n{}", daemon.log()),
    }
}

/// A connection that has not said hello yet is carried across an
/// upgrade once, also after an upgrade that was abandoned (its place on
/// the list of parked sockets is given back).
#[test]
fn a_connection_before_its_hello_is_carried_once_after_an_abandoned_upgrade() {
    use crate::deferred::{receive, send};
    use zygote_proto::{ClientMessage, Hello, PROTOCOL_VERSION, ServerMessage, SpawnRequest};

    let installed = Installed::new("a");
    let daemon = start("upgrade-parked", &installed, &[]);
    // One: with several, a drop that removed the others' places instead
    // of its own would leave the list empty, and right, by chance.
    let connections = [crate::util::connect_with_deadline(
        daemon.socket(),
        Duration::from_secs(10),
    )];
    // A binary that refuses the state: the upgrade is abandoned.
    let next = installed.dir.path().join("zygote.next");
    std::fs::copy("/bin/false", &next).expect("copy /bin/false");
    std::fs::rename(&next, installed.path()).expect("install /bin/false");
    let (ok, text) = upgrade(&daemon);
    assert!(!ok, "an upgrade to /bin/false: {text}");
    installed.install("b");
    let (ok, text) = upgrade(&daemon);
    assert!(ok && text.contains(&version("b")), "{text}");
    for (id, fd) in (1..).zip(&connections) {
        send(
            fd,
            &ClientMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                client: "parked test".into(),
            }),
        );
        match receive(fd) {
            (ServerMessage::HelloAck(_), _) => {}
            (other, _) => panic!("expected HelloAck, got {other:?}; log:\n{}", daemon.log()),
        }
        send(
            fd,
            &ClientMessage::Spawn(SpawnRequest::new(id, b"/bin/true".to_vec())),
        );
        match receive(fd) {
            (ServerMessage::Spawned(spawned), _) => assert_eq!(spawned.id, id),
            (other, _) => panic!("spawn {id}: {other:?}; log:\n{}", daemon.log()),
        }
    }
}

/// A SIGTERM that comes the moment the new image has been exec'd, before
/// it has a runtime or handlers, is held across the exec and stops the
/// new image gracefully: exit status 0, the socket removed.
#[test]
fn sigterm_right_after_the_upgrades_exec_stops_the_new_image_gracefully() {
    let mut held = 0;
    for round in 0..5 {
        let installed = Installed::new("a");
        let mut daemon = start("upgrade-sigterm", &installed, &[]);
        installed.install("b");
        let exe = format!("/proc/{}/exe", daemon.pid());
        let path = installed.path();
        daemon.signal_stop(rustix::process::Signal::HUP);
        // The old image's binary was replaced (its link reads "(deleted)"):
        // the link names the installed path again once the new image runs.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_link(&exe).ok().as_deref() != Some(path.as_path()) {
            assert!(
                Instant::now() < deadline,
                "round {round}: no exec; log:\n{}",
                daemon.log()
            );
        }
        daemon.signal_stop(rustix::process::Signal::TERM);
        if crate::util::stop_signals(daemon.pid()) == crate::util::StopSignals::Held {
            held += 1;
        }
        let status = daemon.wait_exit(Duration::from_secs(20));
        let log = daemon.log();
        assert!(
            status.is_some_and(|status| status.success()),
            "round {round}: {status:?}; log:\n{log}"
        );
        assert!(log.contains("upgraded in place"), "round {round}:\n{log}");
        assert!(log.contains("stopped"), "round {round}:\n{log}");
        assert!(
            std::fs::symlink_metadata(daemon.socket()).is_err(),
            "round {round}: the socket file was left behind"
        );
    }
    assert!(held > 0, "the new image was never seen holding SIGTERM");
}
