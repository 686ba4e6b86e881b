//! zygote as a systemd service, checked with systemd's own tools: the unit
//! files, socket activation, sd_notify, graceful stop, logs and status.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use zygote_client::blocking::Client;
use zygote_client::{Error, SpawnStage};

use crate::tools::{Process, free_port, have_tool, http_get, serve, temp_dir};
use crate::util::{eventually, exit_within, zygote_bin};

/// `deploy/systemd` in the source tree.
fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd")
}

/// Copies the unit files of `from` into a temp dir, pointing `ExecStart=`
/// at the binary under test (verify checks that the program exists).
fn staged_units(from: &Path, into: &Path) -> Vec<PathBuf> {
    let mut units = Vec::new();
    for entry in std::fs::read_dir(from).expect("read units dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.ends_with(".service") || name.ends_with(".socket")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).expect("read unit");
        let text = text.replace("/usr/bin/zygote", &zygote_bin().display().to_string());
        let staged = into.join(&name);
        std::fs::write(&staged, text).expect("write unit");
        units.push(staged);
    }
    units.sort();
    units
}

fn verify(user: bool, units: &[PathBuf], runtime_dir: &Path) {
    let mut command = Command::new("systemd-analyze");
    if user {
        command.arg("--user").env("XDG_RUNTIME_DIR", runtime_dir);
    }
    let output = command
        .arg("verify")
        .args(units)
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Unknown keys and bad values are warnings with exit code 0: any
    // output at all is a failure.
    assert!(
        output.status.success() && stderr.trim().is_empty() && output.stdout.is_empty(),
        "systemd-analyze verify {units:?}: {}\n{stderr}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn unit_files_pass_systemd_analyze_verify() {
    if !have_tool("systemd-analyze", "systemd") {
        return;
    }
    let dir = temp_dir("verify");
    let system = dir.path().join("system");
    let user = dir.path().join("user");
    let runtime = dir.path().join("run");
    for path in [&system, &user, &runtime] {
        std::fs::create_dir(path).unwrap();
    }
    let system_units = staged_units(&units_dir(), &system);
    assert_eq!(system_units.len(), 3, "{system_units:?}");
    verify(false, &system_units, &runtime);
    let user_units = staged_units(&units_dir().join("user"), &user);
    assert_eq!(user_units.len(), 2, "{user_units:?}");
    verify(true, &user_units, &runtime);
}

/// Variables the service manager sets for the daemon alone.
const SERVICE_VARS: [&str; 7] = [
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "INVOCATION_ID",
];

/// `systemd-socket-activate --seqpacket` owning the socket at `socket`,
/// ready to exec `zygote serve` on the first connection.
fn socket_activate(socket: &Path, fdname: &str, env: &[(&str, &str)]) -> Process {
    let mut command = Command::new("systemd-socket-activate");
    command
        .arg("--seqpacket")
        .arg("--listen")
        .arg(socket)
        .arg(format!("--fdname={fdname}"));
    for (key, value) in env {
        command.arg(format!("--setenv={key}={value}"));
    }
    command
        .arg(zygote_bin())
        .arg("serve")
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    let process = Process::start(&mut command, "systemd-socket-activate");
    // Not only bound but listening: a connection refused in between would
    // never start the daemon.
    assert!(
        eventually(Duration::from_secs(10), || is_listening(socket)),
        "systemd-socket-activate did not listen on {}",
        socket.display()
    );
    process
}

/// Whether a Unix socket bound at `path` listens, from `/proc/net/unix`
/// (its `Flags` column has `__SO_ACCEPTCON`, 0x10000): unlike a test
/// connection, looking does not wake the activator.
fn is_listening(path: &Path) -> bool {
    const ACCEPTING: u32 = 0x1_0000;
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return false;
    };
    let path = path.to_string_lossy();
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() >= 8
            && fields[7] == path
            && u32::from_str_radix(fields[3], 16).is_ok_and(|flags| flags & ACCEPTING != 0)
    })
}

fn exe_of(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// The `flags:` of `/proc/PID/fdinfo/FD`, octal.
fn fd_flags(pid: u32, fd: i32) -> u32 {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).expect("fdinfo");
    let flags = info
        .lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .expect("flags line");
    u32::from_str_radix(flags.trim(), 8).expect("octal flags")
}

#[test]
fn socket_activation_starts_the_daemon_on_first_connection() {
    if !have_tool("systemd-socket-activate", "systemd") {
        return;
    }
    let dir = temp_dir("activate");
    let socket = dir.path().join("zygote.sock");
    let notify = dir.path().join("notify");
    let notify_socket = UnixDatagram::bind(&notify).unwrap();
    let notify_path = notify.display().to_string();
    let env = [
        ("NOTIFY_SOCKET", notify_path.as_str()),
        ("INVOCATION_ID", "0123456789abcdef0123456789abcdef"),
        ("WATCHDOG_USEC", "60000000"),
    ];
    let mut activator = socket_activate(&socket, "spawn", &env);
    let pid = activator.pid();
    // Nothing runs zygote before a client arrives.
    assert_ne!(exe_of(pid), Some(zygote_bin().canonicalize().unwrap()));

    let client = Client::connect(&socket).expect("connect through the activated socket");
    assert_eq!(exe_of(pid), Some(zygote_bin().canonicalize().unwrap()));
    let status = client.status().expect("status");
    assert_eq!(
        status.pid as u32, pid,
        "the daemon is the activated process"
    );

    // The inherited listener (fd 3) is close-on-exec in the daemon.
    assert_ne!(fd_flags(pid, 3) & libc::O_CLOEXEC as u32, 0);

    // A child sees the client's environment, never the daemon's: the
    // service manager's variables reach the daemon (above), not the child.
    let output = client
        .command("env")
        .env_clear()
        .env("FROM_CLIENT", "yes")
        .output()
        .expect("spawn env through the activated daemon");
    assert!(output.status.success());
    let env_text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(env_text.trim(), "FROM_CLIENT=yes");
    // ... unless the client itself passes one on, as std would.
    let output = client
        .command("printenv")
        .arg("INVOCATION_ID")
        .env("INVOCATION_ID", "client's own")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "client's own"
    );
    for var in SERVICE_VARS {
        if std::env::var_os(var).is_none() {
            let output = client.command("printenv").arg(var).output().unwrap();
            assert!(!output.status.success(), "{var} reached a child");
        }
    }

    // READY=1 reached the notify socket the activator passed on.
    notify_socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buffer = [0u8; 1024];
    let received = notify_socket.recv(&mut buffer).expect("a notify datagram");
    let text = String::from_utf8_lossy(&buffer[..received]);
    assert!(text.contains("READY=1\n"), "{text:?}");

    drop(client);
    activator.signal(libc::SIGTERM);
    let exit = activator.expect_exit(Duration::from_secs(10));
    assert!(exit.success(), "{exit}: {}", activator.stderr());
}

#[test]
fn socket_activation_tells_sockets_apart_by_name() {
    if !have_tool("systemd-socket-activate", "systemd") {
        return;
    }
    // A SEQPACKET socket named "metrics" is a configuration mistake: the
    // daemon must say what to change, not serve it as metrics.
    let dir = temp_dir("fdname");
    let socket = dir.path().join("zygote.sock");
    let mut activator = socket_activate(&socket, "metrics", &[]);
    let _ = zygote_proto::socket::connect_to(&socket, false);
    let exit = activator.expect_exit(Duration::from_secs(10));
    let stderr = activator.stderr();
    assert!(!exit.success());
    assert!(
        stderr.contains("\"metrics\"") && stderr.contains("ListenStream="),
        "{stderr}"
    );
}

/// Receives notify datagrams until one contains `line`, for up to `timeout`.
fn wait_for_notify(socket: &UnixDatagram, line: &str, timeout: Duration) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + timeout;
    let mut buffer = [0u8; 4096];
    while std::time::Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buffer) {
            let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
            let done = text.lines().any(|l| l == line);
            seen.push(text);
            if done {
                return seen;
            }
        }
    }
    panic!("no {line:?} within {timeout:?}; saw {seen:?}");
}

#[test]
fn notify_socket_gets_ready_status_watchdog_and_stopping() {
    let dir = temp_dir("notify");
    let notify = dir.path().join("notify");
    let notify_socket = UnixDatagram::bind(&notify).unwrap();
    let notify_path = notify.display().to_string();
    let env = [
        ("NOTIFY_SOCKET", notify_path.as_str()),
        ("WATCHDOG_USEC", "200000"),
    ];
    let (mut daemon, socket) = serve(dir.path(), &[], &env);
    let seen = wait_for_notify(&notify_socket, "READY=1", Duration::from_secs(5));
    assert!(
        seen.iter().any(|text| text.contains("STATUS=serving")),
        "{seen:?}"
    );
    // Pinged at half of WATCHDOG_USEC, from the accept loop.
    wait_for_notify(&notify_socket, "WATCHDOG=1", Duration::from_secs(2));
    wait_for_notify(&notify_socket, "WATCHDOG=1", Duration::from_secs(2));

    daemon.signal(libc::SIGTERM);
    let seen = wait_for_notify(&notify_socket, "STOPPING=1", Duration::from_secs(5));
    assert!(seen.last().unwrap().contains("STATUS=stopping"), "{seen:?}");
    let exit = daemon.expect_exit(Duration::from_secs(10));
    assert!(exit.success(), "{exit}: {}", daemon.stderr());
    assert!(!socket.exists(), "the daemon removes the socket it bound");
}

#[test]
fn sigterm_finishes_spawns_keeps_reaping_then_exits() {
    let dir = temp_dir("graceful");
    let (mut daemon, socket) = serve(dir.path(), &[], &[]);
    let client = Client::connect(&socket).unwrap();
    // `cat` runs until its stdin closes: the child outlives every check
    // below however slow the machine, and ends when the test says so.
    let mut child = client
        .command("cat")
        .stdin(zygote_client::Stdio::piped())
        .stdout(zygote_client::Stdio::null())
        .spawn()
        .expect("spawn cat");
    daemon.signal(libc::SIGTERM);
    // Accepting stops at once, and the socket file goes with it.
    assert!(eventually(Duration::from_secs(5), || !socket.exists()));
    assert!(zygote_proto::socket::connect_to(&socket, false).is_err());
    // The connected client is still served: new spawns are refused ...
    match client.command("true").status() {
        Err(Error::Spawn { stage, errno, .. }) => {
            assert_eq!(stage, SpawnStage::Admission);
            assert_eq!(errno, libc::ESHUTDOWN);
        }
        other => panic!("expected a refusal while stopping, got {other:?}"),
    }
    // ... status is answered, and the running child's exit is delivered.
    assert_eq!(client.status().unwrap().children_running, 1);
    assert!(daemon.wait_timeout(Duration::from_millis(200)).is_none());
    drop(child.stdin.take());
    let status = exit_within(
        Duration::from_secs(30),
        "exit notice while stopping",
        || child.try_wait(),
    );
    assert!(status.success());
    // With nothing left running, the daemon exits by itself.
    let exit = daemon.expect_exit(Duration::from_secs(10));
    assert!(exit.success(), "{exit}: {}", daemon.stderr());
}

#[test]
fn sigterm_does_not_wait_for_children_whose_client_left() {
    let dir = temp_dir("abandon");
    let (mut daemon, socket) = serve(dir.path(), &[], &[]);
    let client = Client::connect(&socket).unwrap();
    let child = client.command("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    drop(child);
    drop(client);
    daemon.signal(libc::SIGTERM);
    let exit = daemon.expect_exit(Duration::from_secs(10));
    assert!(exit.success(), "{exit}: {}", daemon.stderr());
    // The child outlives the daemon (KillMode=process semantics); end it.
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    );
}

#[test]
fn json_logs_carry_one_debug_line_per_spawn() {
    let dir = temp_dir("json");
    let (mut daemon, socket) = serve(
        dir.path(),
        &["--log-format", "json"],
        &[("ZYGOTE_LOG", "debug")],
    );
    let client = Client::connect(&socket).unwrap();
    assert!(client.command("true").status().unwrap().success());
    assert!(client.command("zygote-no-such-program").status().is_err());
    drop(client);
    daemon.signal(libc::SIGTERM);
    daemon.expect_exit(Duration::from_secs(10));
    let logs = daemon.stderr();
    let lines: Vec<&str> = logs.lines().collect();
    assert!(lines.iter().all(|line| line.starts_with('{')), "{logs}");
    let spawned: Vec<&&str> = lines
        .iter()
        .filter(|line| line.contains("\"message\":\"spawned\""))
        .collect();
    assert_eq!(spawned.len(), 1, "{logs}");
    for field in [
        "\"level\":\"DEBUG\"",
        "\"peer_pid\":",
        "\"peer_uid\":",
        "\"program\":\"true\"",
        "\"pid\":",
        "\"latency_us\":",
    ] {
        assert!(spawned[0].contains(field), "{field} in {}", spawned[0]);
    }
    let failed = lines
        .iter()
        .find(|line| line.contains("\"message\":\"spawn failed\""))
        .expect("a spawn failed line");
    // The client got the error in its reply: for the daemon it is one
    // more per-spawn line, with a symbolic errno.
    assert!(failed.contains("\"level\":\"DEBUG\""), "{failed}");
    assert!(failed.contains("\"errno\":\"ENOENT\""), "{failed}");
    // One peer field set on every line about a peer, and nothing per
    // connection or per spawn at INFO.
    for line in lines.iter().filter(|line| line.contains("\"peer_")) {
        for field in ["\"peer_pid\":", "\"peer_uid\":", "\"peer_gid\":"] {
            assert!(line.contains(field), "{field} in {line}");
        }
        assert!(!line.contains("\"peer\":"), "a second peer field: {line}");
    }
    let info: Vec<&&str> = lines
        .iter()
        .filter(|line| line.contains("\"level\":\"INFO\""))
        .collect();
    assert!(
        info.iter().all(|line| !line.contains("\"peer_")),
        "per-connection lines at INFO: {info:#?}"
    );
}

#[test]
fn zygote_status_prints_version_uptime_and_counters() {
    let dir = temp_dir("status");
    let (_daemon, socket) = serve(dir.path(), &[], &[]);
    let client = Client::connect(&socket).unwrap();
    assert!(client.command("true").status().unwrap().success());
    assert!(client.command("zygote-no-such-program").status().is_err());
    let output = Command::new(zygote_bin())
        .arg("status")
        .arg("--socket")
        .arg(&socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains(&format!("version:           {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(text.contains("uptime:"), "{text}");
    // This connection and the status command's own are open; the
    // harness's readiness probe was accepted too.
    assert!(
        text.contains("connections:       2 open, 3 accepted"),
        "{text}"
    );
    assert!(text.contains("children running:  0"), "{text}");
    assert!(
        text.contains("spawns:            1 succeeded, 1 failed"),
        "{text}"
    );

    let missing = Command::new(zygote_bin())
        .arg("status")
        .arg("--socket")
        .arg(dir.path().join("nothing.sock"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no zygote is listening"));
}

/// `zygote status --json` of the daemon at `socket`, run as `uid`.
fn status_json_as(socket: &Path, uid: u32) -> serde_json::Value {
    use std::os::unix::process::CommandExt;
    let output = Command::new(zygote_bin())
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .current_dir("/")
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text}"))
}

/// The use per peer uid: root sees every uid's connections and children
/// with their caps (the plain form as a table); a peer of another uid
/// sees only its own line.
#[test]
fn zygote_status_shows_each_peers_use_to_root_and_only_its_own_to_others() {
    use std::os::unix::process::CommandExt;
    const RUNNER: u32 = 65534;
    const LOOKER: u32 = 65533;
    if !crate::util::root_or_skip("status of other uids (a root daemon and two other uids)") {
        return;
    }
    let daemon = crate::util::start_daemon_with("status-peers", None, &["--socket-mode", "0666"]);
    let socket = daemon.socket();
    // Killed on drop: the zygote then kills its child (kill-on-close).
    let runner = Process::start(
        Command::new(zygote_bin())
            .args(["run", "--socket"])
            .arg(socket)
            .args(["--", "sleep", "60"])
            .current_dir("/")
            .uid(RUNNER)
            .gid(RUNNER)
            .stdin(Stdio::null()),
        "zygote run as another uid",
    );
    let peer_of = |json: &serde_json::Value, uid: u32| {
        json["peers"]
            .as_array()
            .expect("a peers array")
            .iter()
            .find(|peer| peer["uid"] == uid)
            .cloned()
    };
    // Root: its own status connection and the runner's use. A peer's
    // child counts from its spawn's admission, before its uid's spawner
    // has started, so wait for the child to be running too.
    let mut root = serde_json::Value::Null;
    let seen = eventually(Duration::from_secs(20), || {
        root = status_json_as(socket, 0);
        peer_of(&root, RUNNER).is_some_and(|peer| peer["children"] == 1)
            && root["children_running"] == 1
    });
    assert!(seen, "the runner's child never showed: {root}");
    let runner_use = peer_of(&root, RUNNER).expect("runner");
    assert_eq!(runner_use["connections"], 1, "{runner_use}");
    assert!(runner_use["children_limit"].as_u64().expect("a cap") >= 1);
    assert!(runner_use["connections_limit"].as_u64().expect("a cap") >= 1);
    assert_eq!(runner_use["sandbox_profile"], serde_json::Value::Null);
    let own = peer_of(&root, 0).expect("root's own line");
    assert_eq!(own["connections"], 1, "{own}");
    // The runner's child came from its uid's spawner, which root sees.
    let spawners = root["spawners"].as_array().expect("a spawners array");
    assert_eq!(spawners.len(), 1, "{root}");
    assert_eq!(spawners[0]["uid"], RUNNER);
    // Another uid: its own line alone.
    let looker = status_json_as(socket, LOOKER);
    let peers = looker["peers"].as_array().expect("a peers array");
    assert_eq!(peers.len(), 1, "{looker}");
    assert_eq!(peers[0]["uid"], LOOKER);
    assert_eq!(peers[0]["connections"], 1);
    assert_eq!(peers[0]["children"], 0);
    assert_eq!(
        looker["spawners"],
        serde_json::json!([]),
        "another uid's spawner"
    );
    // The plain form: a table with a line per uid.
    let output = Command::new(zygote_bin())
        .args(["status", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("\npeers:\n") && text.contains("CONNECTIONS"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|line| line.trim_start().starts_with(&RUNNER.to_string()))
        .unwrap_or_else(|| panic!("no line for uid {RUNNER}: {text}"));
    assert!(
        line.contains("1/") && line.trim_end().ends_with('-'),
        "{line}"
    );
    // The runner's child goes with its client, before the daemon stops
    // (which would leave it running, an orphan).
    drop(runner);
    let mut after = serde_json::Value::Null;
    assert!(
        eventually(Duration::from_secs(10), || {
            after = status_json_as(socket, 0);
            after["children_running"] == 0
        }),
        "the runner's child outlived it: {after}"
    );
}

#[test]
fn socket_activated_metrics_socket_serves_metrics() {
    if !have_tool("systemd-socket-activate", "systemd") {
        return;
    }
    let dir = temp_dir("activate-metrics");
    let socket = dir.path().join("zygote.sock");
    let address = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, free_port()));
    let mut command = Command::new("systemd-socket-activate");
    command
        .arg(format!("--listen={address}"))
        .arg("--fdname=metrics")
        .arg(zygote_bin())
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    let mut activator = Process::start(&mut command, "systemd-socket-activate");
    // The first scrape starts the daemon, which answers it.
    let mut scraped = None;
    let ready = eventually(Duration::from_secs(10), || {
        scraped = http_get(address, "/metrics").ok();
        scraped.is_some()
    });
    assert!(ready, "no answer on {address}: {}", {
        activator.signal(libc::SIGKILL);
        activator.stderr()
    });
    let (code, text) = scraped.unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("# HELP zygote_spawns_total "), "{text}");
    assert_eq!(
        exe_of(activator.pid()),
        Some(zygote_bin().canonicalize().unwrap())
    );
    // The spawn socket is the daemon's own, bound from --socket.
    let client = Client::connect(&socket).unwrap();
    assert!(client.command("true").status().unwrap().success());
    let (_, text) = http_get(address, "/metrics").unwrap();
    assert!(
        text.contains("zygote_spawns_total{result=\"ok\"} 1"),
        "{text}"
    );
}

/// Runs a daemon with stderr on a pipe and `JOURNAL_STREAM` set by
/// `journal_stream` from the pipe's device and inode; returns its stderr.
fn stderr_with_journal_stream(
    test_name: &str,
    journal_stream: impl Fn(u64, u64) -> String,
) -> String {
    let dir = temp_dir(test_name);
    let socket = dir.path().join("zygote.sock");
    let (read, write) = rustix::pipe::pipe().unwrap();
    let stat = rustix::fs::fstat(&write).unwrap();
    let mut command = Command::new(zygote_bin());
    command
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .env("ZYGOTE_LOG", "info")
        .env("JOURNAL_STREAM", journal_stream(stat.st_dev, stat.st_ino))
        .stdin(Stdio::null())
        .stderr(Stdio::from(write));
    let mut daemon = Process::start(&mut command, "zygote serve");
    drop(command);
    // Serving: it has logged its start (a SIGTERM any earlier would stop
    // it gracefully too, see `sigterm_the_moment_the_socket_appears_...`).
    assert!(eventually(Duration::from_secs(10), || {
        Client::connect(&socket)
            .and_then(|client| client.status())
            .is_ok()
    }));
    daemon.signal(libc::SIGTERM);
    daemon.expect_exit(Duration::from_secs(10));
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut text).unwrap();
    text
}

#[test]
fn logs_go_to_the_journal_only_when_stderr_is_the_journal() {
    // Not the journal: text on stderr.
    let text = stderr_with_journal_stream("not-journal", |dev, ino| format!("{dev}:{}", ino + 1));
    assert!(text.contains("listening"), "{text}");
    // The journal: nothing on stderr, or (without journald on this
    // machine) a note that the journal cannot be reached.
    let text = stderr_with_journal_stream("journal", |dev, ino| format!("{dev}:{ino}"));
    let journald = std::os::unix::net::UnixDatagram::unbound()
        .and_then(|socket| socket.connect("/run/systemd/journal/socket"))
        .is_ok();
    if journald {
        assert!(!text.contains("listening"), "{text}");
    } else {
        assert!(text.contains("cannot log to the journal"), "{text}");
    }
}

/// The socket path appears only once it listens, with its final mode: it
/// is bound under a temporary name and linked into place. A stale socket
/// file is replaced; a live daemon's is not.
#[test]
fn the_socket_path_appears_listening_and_a_live_one_is_kept() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    let dir = temp_dir("socket-path");
    let socket = dir.path().join("zygote.sock");
    // A stale socket: bound, never listening, its owner gone.
    drop(std::os::unix::net::UnixDatagram::bind(&socket).expect("a stale socket file"));
    let (mut daemon, socket) = serve(dir.path(), &["--socket-mode", "0640"], &[]);
    let meta = std::fs::symlink_metadata(&socket).expect("the socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list the socket's directory")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["zygote.sock"], "a temporary name was left behind");

    // A second daemon on the same path leaves the first one serving.
    let second = Command::new(zygote_bin())
        .args(["serve", "--socket"])
        .arg(&socket)
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run a second zygote serve");
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("already listening"), "{stderr}");
    let client = Client::connect(&socket).expect("the first daemon still serves");
    assert_eq!(client.status().expect("status").pid as u32, daemon.pid());
    daemon.signal(libc::SIGTERM);
    daemon.expect_exit(Duration::from_secs(10));
}

/// Starts `zygote serve --socket DIR/zygote.sock` with its log (info) in
/// `DIR/log`, without waiting for anything.
fn serve_logged(dir: &Path) -> (Process, PathBuf, PathBuf) {
    let socket = dir.join("zygote.sock");
    let log = dir.join("log");
    let log_file = std::fs::File::create(&log).expect("create the daemon log");
    let mut command = Command::new(zygote_bin());
    command
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .env("ZYGOTE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    (Process::start(&mut command, "zygote serve"), socket, log)
}

/// Sends SIGTERM to the daemon and checks that it stopped gracefully: exit
/// status 0 (not killed by the signal), its socket removed, its last log
/// line written.
fn expect_graceful_stop(daemon: &mut Process, socket: &Path, log: &Path, what: &str) {
    daemon.signal(libc::SIGTERM);
    let exit = daemon.expect_exit(Duration::from_secs(10));
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(exit.success(), "{what}: {exit}; log:\n{text}");
    assert!(
        std::fs::symlink_metadata(socket).is_err(),
        "{what}: the socket file was left behind; log:\n{text}"
    );
    assert!(
        text.contains("stopped"),
        "{what}: no 'stopped' line:\n{text}"
    );
}

/// A supervisor that waits for the socket path and stops the daemon the
/// moment it appears gets a graceful stop, not a daemon killed by the
/// signal's default action with its socket file left behind. Repeated:
/// the daemon used to bind its socket a few milliseconds before its
/// handlers existed.
#[test]
fn sigterm_the_moment_the_socket_appears_stops_gracefully() {
    for round in 0..20 {
        let dir = temp_dir("sigterm-at-socket");
        let (mut daemon, socket, log) = serve_logged(dir.path());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::symlink_metadata(&socket).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: no socket within 10 s"
            );
            std::thread::yield_now();
        }
        expect_graceful_stop(&mut daemon, &socket, &log, &format!("round {round}"));
    }
}

/// A SIGTERM that comes as the daemon starts, before its socket, runtime
/// or handlers exist, is held until the handlers are in place, then stops
/// it gracefully. (One that comes before `main` runs, while the binary is
/// being loaded, still kills it.) The test sends it as soon as
/// `/proc/PID/status` shows the stop signals held or SIGTERM caught.
#[test]
fn sigterm_as_the_daemon_starts_is_held_then_stops_it_gracefully() {
    let mut held = 0;
    for round in 0..20 {
        let dir = temp_dir("sigterm-at-start");
        let (mut daemon, socket, log) = serve_logged(dir.path());
        if crate::util::wait_stop_signals_handled(daemon.pid()) {
            held += 1;
        }
        expect_graceful_stop(&mut daemon, &socket, &log, &format!("round {round}"));
    }
    // Each round's startup holds SIGTERM for milliseconds, and /proc is
    // read every few microseconds: the held state is seen.
    assert!(held > 0, "SIGTERM was never seen held during startup");
}

/// A socket-activated daemon stopped as it starts (a client's connection
/// started it) stops gracefully too. The SIGTERM is sent as soon as the
/// daemon has a second thread (its log writer, started early in `main`,
/// well before the runtime and the signal handlers).
#[test]
fn sigterm_right_after_socket_activation_stops_gracefully() {
    if !have_tool("systemd-socket-activate", "systemd") {
        return;
    }
    let zygote = zygote_bin().canonicalize().unwrap();
    for round in 0..10 {
        let dir = temp_dir("sigterm-activated");
        let socket = dir.path().join("zygote.sock");
        let mut activator = socket_activate(&socket, "spawn", &[]);
        let pid = activator.pid();
        // Only connecting: the daemon answers nothing before it is asked.
        let _connection =
            zygote_proto::socket::connect_to(&socket, false).expect("connect to wake the daemon");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while exe_of(pid).as_ref() != Some(&zygote) || threads_of(pid) < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the activator did not exec zygote"
            );
        }
        activator.signal(libc::SIGTERM);
        let exit = activator.expect_exit(Duration::from_secs(10));
        assert!(
            exit.success(),
            "round {round}: {exit}: {}",
            activator.stderr()
        );
    }
}

/// The `Threads:` of `/proc/PID/status`; 0 when it cannot be read.
fn threads_of(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Threads:"))
                .and_then(|count| count.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Not root, and no `--socket`, `$ZYGOTE_SOCKET` or `$XDG_RUNTIME_DIR`:
/// the default socket is root's, which this user cannot create. The error
/// says so and how to choose another, instead of a bare "Permission
/// denied".
#[test]
fn a_user_without_xdg_runtime_dir_is_told_to_pass_socket() {
    use std::os::unix::process::CommandExt;
    if !crate::util::root_or_skip("running zygote serve as another user") {
        return;
    }
    // With the directory in place the bind itself fails, under the
    // temporary name it binds first; the error must still name the path.
    std::fs::create_dir_all("/run/zygote").expect("create /run/zygote");
    let mut daemon = Command::new(zygote_bin())
        .arg("serve")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("ZYGOTE_SOCKET")
        .env("ZYGOTE_LOG", "error")
        .uid(1901)
        .gid(1901)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start zygote serve as uid 1901");
    let exited = eventually(Duration::from_secs(10), || {
        daemon.try_wait().expect("try_wait").is_some()
    });
    if !exited {
        let _ = daemon.kill();
    }
    let output = daemon.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(exited, "zygote serve as uid 1901 kept running: {stderr}");
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("/run/zygote/zygote.sock"), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(stderr.contains("XDG_RUNTIME_DIR is not set"), "{stderr}");
    assert!(stderr.contains("--socket PATH"), "{stderr}");
}
