//! Logs: what a daemon writes to the journal, read from a stand-in for
//! journald's socket.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::tools::have_tool;
use crate::util::zygote_bin;

/// One journal entry: field name to value.
type Entry = HashMap<String, String>;

/// Parses journald's native protocol: `NAME=value\n`, or `NAME\n`, a
/// little-endian u64 length, the value and `\n`.
fn parse_entry(mut data: &[u8]) -> Entry {
    let mut entry = Entry::new();
    while !data.is_empty() {
        let end = data.iter().position(|b| *b == b'\n').expect("field ends");
        let line = &data[..end];
        if let Some(eq) = line.iter().position(|b| *b == b'=') {
            let (name, value) = (&line[..eq], &line[eq + 1..]);
            entry.insert(lossy(name), lossy(value));
            data = &data[end + 1..];
        } else {
            let rest = &data[end + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().expect("length")) as usize;
            entry.insert(lossy(line), lossy(&rest[8..8 + len]));
            data = &rest[8 + len + 1..];
        }
    }
    entry
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The daemon logs to the journal with syslog's priorities (INFO is 6),
/// one peer field set, and errno names; per-spawn lines are DEBUG (7).
#[test]
fn journal_entries_have_syslog_priorities_and_consistent_fields() {
    if !crate::util::root_or_skip("a private mount namespace for the journal socket") {
        return;
    }
    if !have_tool("unshare", "util-linux") {
        return;
    }
    let can_unshare = Command::new("unshare")
        .args(["--mount", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !can_unshare {
        crate::util::skip("`unshare --mount` is refused here (a container without CAP_SYS_ADMIN?)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let journal_dir = dir.path().join("journal");
    std::fs::create_dir(&journal_dir).expect("mkdir journal");
    let journal = UnixDatagram::bind(journal_dir.join("socket")).expect("bind journal socket");
    journal
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    // Read as the daemon writes, as journald does: a datagram socket's
    // queue holds only ~10 entries, and a full one blocks the daemon.
    let collected = Arc::new(Mutex::new(Vec::<Entry>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (collected, stop) = (Arc::clone(&collected), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut buffer = vec![0u8; 1 << 16];
            while !stop.load(Ordering::Relaxed) {
                if let Ok(len @ 1..) = journal.recv(&mut buffer) {
                    let entry = parse_entry(&buffer[..len]);
                    collected.lock().expect("entries").push(entry);
                }
            }
        })
    };
    let socket = dir.path().join("zygote.sock");
    // The daemon, alone in a mount namespace where our socket is
    // /run/systemd/journal/socket; the host's /run is untouched.
    let script = r#"base=/run/systemd; [ -d "$base" ] || base=/run
        mount -t tmpfs tmpfs "$base" && mkdir -p /run/systemd/journal &&
        mount --bind "$1" /run/systemd/journal &&
        exec "$2" serve --log-format journald --socket "$3""#;
    let mut daemon = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(&journal_dir)
        .arg(zygote_bin())
        .arg(&socket)
        .env("ZYGOTE_LOG", "debug")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start zygote under unshare");
    if !crate::util::eventually(Duration::from_secs(10), || socket.exists()) {
        let _ = daemon.kill();
        let output = daemon.wait_with_output().expect("reap the daemon");
        panic!(
            "the daemon did not bind {}: {}\n{}",
            socket.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let run = |program: &str| {
        Command::new(zygote_bin())
            .args(["run", "--socket"])
            .arg(&socket)
            .args(["--", program])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("zygote run")
    };
    assert_eq!(run("true").code(), Some(0));
    assert_eq!(run("/nonexistent/program").code(), Some(127));

    let has = |message: &str| {
        collected
            .lock()
            .expect("entries")
            .iter()
            .any(|entry| entry.get("MESSAGE").is_some_and(|m| m == message))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !(has("spawned") && has("spawn failed")) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = daemon.kill();
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("journal reader");
    let entries = std::mem::take(&mut *collected.lock().expect("entries"));
    let output = daemon.wait_with_output().expect("reap the daemon");
    let find = |message: &str| {
        entries
            .iter()
            .find(|entry| entry.get("MESSAGE").is_some_and(|m| m == message))
            .unwrap_or_else(|| {
                panic!(
                    "no {message:?} entry in the journal: {entries:#?}\ndaemon stderr: {}",
                    String::from_utf8_lossy(&output.stderr)
                )
            })
    };
    let field = |entry: &Entry, name: &str| entry.get(name).cloned().unwrap_or_default();

    let serving = find("serving");
    assert_eq!(
        field(serving, "PRIORITY"),
        "6",
        "INFO is syslog's 6: {serving:?}"
    );
    assert_eq!(field(serving, "SYSLOG_IDENTIFIER"), "zygote");

    let my = std::process::id().to_string();
    let spawned = find("spawned");
    assert_eq!(
        field(spawned, "PRIORITY"),
        "7",
        "per-spawn lines are DEBUG: {spawned:?}"
    );
    let failed = find("spawn failed");
    assert_eq!(field(failed, "PRIORITY"), "7", "{failed:?}");
    assert_eq!(
        field(failed, "ZYGOTE_ERRNO"),
        "ENOENT",
        "symbolic errno: {failed:?}"
    );
    assert_eq!(field(failed, "ZYGOTE_STAGE"), "exec", "{failed:?}");
    // One peer field set, on every per-peer line.
    for message in ["client connected", "spawned", "spawn failed", "client left"] {
        let entry = find(message);
        for name in ["ZYGOTE_PEER_PID", "ZYGOTE_PEER_UID", "ZYGOTE_PEER_GID"] {
            assert!(
                entry.contains_key(name),
                "{message:?} lacks {name}: {entry:?}"
            );
        }
        assert_eq!(field(entry, "ZYGOTE_PEER_UID"), "0", "{entry:?}");
        assert!(
            !entry.contains_key("ZYGOTE_PEER"),
            "a second peer field set: {entry:?}"
        );
        // zygote run is our child: its pid is not ours, but it is a pid.
        assert_ne!(field(entry, "ZYGOTE_PEER_PID"), my);
    }
}

/// A log nobody reads (stderr a pipe whose reader sleeps) does not stall
/// the daemon: lines are queued, then dropped and counted, and spawns go
/// on. Writing in place blocked the daemon once the pipe's 64 KiB filled,
/// a few hundred DEBUG lines in.
#[test]
fn an_unread_log_does_not_stall_the_daemon() {
    use zygote_client::blocking::{Client, Command as ZygoteCommand};

    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("zygote.sock");
    let (mut reader, writer) = std::io::pipe().expect("pipe");
    let mut daemon = Command::new(zygote_bin())
        .args(["serve", "--log-format", "text", "--socket"])
        .arg(&socket)
        .env("ZYGOTE_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(writer)
        .spawn()
        .expect("start zygote serve");
    assert!(
        crate::util::eventually(Duration::from_secs(10), || socket.exists()),
        "the daemon did not bind its socket"
    );
    let client = Client::connect(&socket).expect("connect");
    // Each spawn logs 2 DEBUG lines of ~150 bytes: 4,000 lines are more
    // than the pipe and the daemon's queue (1,024 entries) hold.
    let (done, finished) = std::sync::mpsc::channel();
    let spawner = std::thread::spawn(move || {
        for _ in 0..2_000 {
            let status = ZygoteCommand::new(&client, "true").status();
            assert!(status.expect("spawn true").success());
        }
        let _ = done.send(());
    });
    let outcome = finished.recv_timeout(Duration::from_secs(120));
    // Read the log now: once it catches up, the daemon says how many lines
    // it dropped.
    let drain = std::thread::spawn(move || {
        let mut log = Vec::new();
        let _ = std::io::Read::read_to_end(&mut reader, &mut log);
        log
    });
    std::thread::sleep(Duration::from_millis(500));
    let _ = daemon.kill();
    let _ = daemon.wait();
    let log = drain.join().expect("log reader");
    assert!(
        outcome.is_ok(),
        "2,000 spawns did not finish in 120 s with the log unread"
    );
    spawner.join().expect("spawner");
    let log = String::from_utf8_lossy(&log);
    assert!(
        log.contains("log entries dropped"),
        "no drop notice in {} lines of log, ending: {}",
        log.lines().count(),
        &log[log.len().saturating_sub(500)..]
    );
}
