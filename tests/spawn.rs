use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zygote_client::{Client, Command, Error, SpawnStage, Stdio};

use crate::helper::{findings, helper, with_raw_environment};
use crate::util::{eventually, open_fds, parent_of, runtime, start_daemon, within};

#[test]
fn args_keep_spaces_quotes_and_non_utf8_bytes() {
    let daemon = start_daemon("args");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let args: Vec<&OsStr> = vec![
            OsStr::new("two words"),
            OsStr::new("\"double\" 'single'"),
            OsStr::from_bytes(b"bytes \xff\xfe end"),
            OsStr::new(""),
        ];
        let output = Command::new(&client, "printf")
            .arg("%s|")
            .args(&args)
            .output()
            .await
            .expect("printf runs");
        assert!(output.status.success(), "{:?}", output.status);
        assert_eq!(
            output.stdout,
            b"two words|\"double\" 'single'|bytes \xff\xfe end||".to_vec()
        );
    });
}

#[test]
fn children_get_default_signal_dispositions_every_time() {
    // The daemon ignores SIGPIPE (the Rust runtime) and catches SIGTERM and
    // SIGINT. It reads that once, at its first spawn; the first child and
    // later ones alike must start with nothing blocked, and with what this
    // process ignores ignored, as a child of std's Command would.
    let daemon = start_daemon("signals");
    let direct = std::process::Command::new("grep")
        .args(["-E", "^Sig(Blk|Ign)", "/proc/self/status"])
        .output()
        .expect("grep runs");
    // glibc's own signal 33 (SIGSETXID), which its posix_spawn leaves
    // ignored, aside: no program can use it.
    let without_setxid = |text: &[u8]| -> String {
        String::from_utf8_lossy(text)
            .lines()
            .map(|line| match line.strip_prefix("SigIgn:\t") {
                Some(hex) => {
                    let mask = u64::from_str_radix(hex, 16).expect("hex mask") & !(1 << 32);
                    format!("SigIgn:\t{mask:016x}\n")
                }
                None => format!("{line}\n"),
            })
            .collect()
    };
    let expected = without_setxid(&direct.stdout);
    assert!(
        expected.starts_with("SigBlk:\t0000000000000000\n"),
        "{expected}"
    );
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        for _ in 0..3 {
            let output = Command::new(&client, "grep")
                .args(["-E", "^Sig(Blk|Ign)", "/proc/self/status"])
                .output()
                .await
                .expect("grep runs");
            assert_eq!(without_setxid(&output.stdout), expected);
        }
    });
}

#[test]
fn argv0_is_set_apart_from_the_program() {
    let daemon = start_daemon("argv0");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let output = Command::new(&client, "sh")
            .arg0("custom-name")
            .args(["-c", "echo $0"])
            .output()
            .await
            .expect("sh runs");
        assert_eq!(output.stdout, b"custom-name\n");
    });
}

/// A caller whose environment holds entries that are no `NAME=VALUE` with
/// a plain name (`=A=B`, left by some shells and Windows-ported tools, and
/// `NOEQ`) still spawns: the child gets the entries `std::env::vars_os`
/// reads (`=A=B` byte for byte), as `std::process::Command` would pass
/// them, and the one without `=`, which names no variable, is left out.
#[test]
fn an_inherited_environment_with_odd_entries_reaches_the_child() {
    let daemon = start_daemon("env-odd-entries");
    let mut socket_var = b"ZYGOTE_TEST_SOCKET=".to_vec();
    socket_var.extend_from_slice(daemon.socket().as_os_str().as_bytes());
    let entries: [&[u8]; 7] = [
        b"=A=B",
        b"NOEQ",
        b"K=v",
        b"==x",
        b"ZYGOTE_TEST_HELPER=inherited-env",
        &socket_var,
        b"PATH=/usr/bin:/bin",
    ];
    let mut command = helper("inherited-env", daemon.socket());
    with_raw_environment(&mut command, &entries);
    let output = command.output().expect("run helper");
    assert!(
        output.status.success(),
        "helper failed: {}\n{}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
    let escaped = |entry: &[u8]| entry.escape_ascii().to_string();
    let inherited: Vec<String> = entries
        .iter()
        .filter(|entry| **entry != b"NOEQ")
        .map(|entry| escaped(entry))
        .collect();
    let changed: Vec<String> = inherited
        .iter()
        .filter(|entry| *entry != "=A=B")
        .cloned()
        .chain(["ADDED=1".to_owned()])
        .collect();
    let expected: Vec<String> = inherited
        .iter()
        .map(|entry| format!("inherited {entry}"))
        .chain(changed.iter().map(|entry| format!("changed {entry}")))
        .collect();
    assert_eq!(findings(&output.stdout), expected);
}

#[test]
fn environment_is_the_clients_with_changes() {
    let daemon = start_daemon("env");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let path = std::env::var_os("PATH").expect("test has PATH");

        // Inherited by default, plus a variable set with non-UTF-8 bytes.
        let output = Command::new(&client, "env")
            .env("ZYGOTE_TEST_SET", OsStr::from_bytes(b"v\xff"))
            .output()
            .await
            .expect("env runs");
        let mut expected_path = b"PATH=".to_vec();
        expected_path.extend_from_slice(path.as_bytes());
        let lines: Vec<&[u8]> = output.stdout.split(|&b| b == b'\n').collect();
        assert!(
            lines.contains(&expected_path.as_slice()),
            "PATH not inherited"
        );
        assert!(lines.contains(&b"ZYGOTE_TEST_SET=v\xff".as_slice()));

        // Removed.
        let output = Command::new(&client, "env")
            .env_remove("PATH")
            .output()
            .await
            .expect("env runs");
        assert!(
            !output
                .stdout
                .split(|&b| b == b'\n')
                .any(|line| line.starts_with(b"PATH="))
        );

        // Cleared: exactly what was set afterwards. `env` is found through
        // the client's PATH lookup rules in the daemon's default PATH.
        let output = Command::new(&client, "/usr/bin/env")
            .env_clear()
            .env("ONLY", "this")
            .output()
            .await
            .expect("env runs");
        assert_eq!(output.stdout, b"ONLY=this\n");
    });
}

#[test]
fn working_directory_is_the_clients_or_the_one_set() {
    let daemon = start_daemon("cwd");
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let output = Command::new(&client, "pwd")
            .current_dir(dir.path())
            .output()
            .await
            .expect("pwd runs");
        let expected = format!("{}\n", dir.path().canonicalize().unwrap().display());
        assert_eq!(String::from_utf8_lossy(&output.stdout), expected);

        let output = Command::new(&client, "pwd")
            .output()
            .await
            .expect("pwd runs");
        let own = format!("{}\n", std::env::current_dir().unwrap().display());
        assert_eq!(String::from_utf8_lossy(&output.stdout), own);

        let missing = dir.path().join("does-not-exist");
        match Command::new(&client, "pwd")
            .current_dir(&missing)
            .spawn()
            .await
        {
            Err(Error::Spawn {
                stage,
                errno,
                message,
                ..
            }) => {
                assert_eq!(stage, SpawnStage::Chdir);
                assert_eq!(errno, libc::ENOENT);
                // The directory is named, not the program.
                let named = format!("chdir {}", missing.display());
                assert!(message.starts_with(&named), "{message}");
            }
            other => panic!("expected a chdir failure, got {other:?}"),
        }
    });
}

#[test]
fn ten_mib_through_cat_without_deadlock_and_stderr_apart() {
    let daemon = start_daemon("cat");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let mut child = Command::new(&client, "sh")
            .args(["-c", "cat; echo done >&2"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .await
            .expect("cat starts");
        let input: Vec<u8> = (0..10 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let mut stdin = child.stdin.take().expect("stdin pipe");
        let mut stdout = child.stdout.take().expect("stdout pipe");
        let mut stderr = child.stderr.take().expect("stderr pipe");
        let writer = {
            let input = input.clone();
            tokio::spawn(async move {
                stdin.write_all(&input).await.expect("write stdin");
                // Dropping stdin closes it, so cat sees EOF.
            })
        };
        let mut out = Vec::new();
        let mut err = Vec::new();
        let (read_out, read_err) =
            tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        read_out.expect("read stdout");
        read_err.expect("read stderr");
        writer.await.expect("writer");
        let status = within(Duration::from_secs(60), "wait", child.wait())
            .await
            .expect("wait");
        assert!(status.success());
        assert_eq!(out.len(), input.len());
        assert!(out == input, "stdout differs from stdin");
        assert_eq!(err, b"done\n");
    });
}

#[test]
fn exit_codes_and_signals_are_reported() {
    let daemon = start_daemon("status");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let status = Command::new(&client, "sh")
            .args(["-c", "exit 3"])
            .status()
            .await
            .expect("sh");
        assert_eq!((status.code(), status.signal()), (Some(3), None));
        assert!(!status.success());

        let status = Command::new(&client, "sh")
            .args(["-c", "kill -TERM $$"])
            .status()
            .await
            .expect("sh");
        assert_eq!(
            (status.code(), status.signal()),
            (None, Some(libc::SIGTERM))
        );

        let mut child = Command::new(&client, "sleep")
            .arg("30")
            .spawn()
            .await
            .expect("sleep");
        assert_eq!(child.try_wait().expect("try_wait"), None);
        child.kill().await.expect("kill");
        let status = within(Duration::from_secs(60), "wait", child.wait())
            .await
            .expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL));

        // The protocol's own signal request.
        let mut child = Command::new(&client, "sleep")
            .arg("30")
            .spawn()
            .await
            .expect("sleep");
        child.signal(libc::SIGUSR1).await.expect("signal");
        assert_eq!(
            within(Duration::from_secs(60), "wait", child.wait())
                .await
                .expect("wait")
                .signal(),
            Some(libc::SIGUSR1)
        );

        // Resource usage travels with the exit status.
        let mut child = Command::new(&client, "sh")
            .args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])
            .spawn()
            .await
            .expect("busy loop");
        within(Duration::from_secs(60), "wait", child.wait())
            .await
            .expect("wait");
        let usage = child.usage().expect("usage after exit");
        assert!(usage.max_rss_kib > 0, "{usage:?}");
        // A loop that runs for milliseconds, not for a microsecond or two.
        assert!(
            usage.user_time + usage.system_time >= Duration::from_millis(1),
            "{usage:?}"
        );
    });
}

#[test]
fn missing_and_non_executable_programs_fail_with_errno() {
    let daemon = start_daemon("exec-errors");
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let error = Command::new(&client, "zygote-no-such-program")
            .spawn()
            .await
            .expect_err("missing program");
        match &error {
            Error::Spawn { stage, errno, .. } => {
                assert_eq!((*stage, *errno), (SpawnStage::Exec, libc::ENOENT));
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(
            error.to_string().contains("No such file or directory"),
            "{error}"
        );
        assert_eq!(
            std::io::Error::from(error).kind(),
            std::io::ErrorKind::NotFound
        );

        let error = Command::new(&client, &script)
            .spawn()
            .await
            .expect_err("non-executable file");
        match error {
            Error::Spawn { stage, errno, .. } => {
                assert_eq!((stage, errno), (SpawnStage::Exec, libc::EACCES));
            }
            other => panic!("unexpected error {other:?}"),
        }
    });
}

/// A non-close-on-exec fd in the test process, as a careless library
/// would leave one.
fn leaky_fd() -> OwnedFd {
    let file = std::fs::File::open("/dev/null").expect("open");
    let fd = OwnedFd::from(file);
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).expect("clear CLOEXEC");
    fd
}

#[test]
fn child_fd_table_is_exactly_what_was_asked_for() {
    let daemon = start_daemon("fd-table");
    let leaked = leaky_fd();
    let leaked_number = std::os::fd::AsRawFd::as_raw_fd(&leaked);
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let (_read, write) = rustix::pipe::pipe().expect("pipe");
        let mut child = Command::new(&client, "sleep")
            .arg("30")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .fd(7, write)
            .spawn()
            .await
            .expect("sleep");
        let pid = child.id();
        // The dynamic loader may hold an fd for a moment while sleep starts.
        let settled = eventually(Duration::from_secs(5), || open_fds(pid) == vec![0, 1, 2, 7]);
        assert!(settled, "child fds: {:?}", open_fds(pid));
        assert_eq!(
            parent_of(pid),
            Some(daemon.pid()),
            "the zygote is the parent"
        );
        child.kill().await.expect("kill");

        // Opting in passes the leaky fd at its own number.
        let mut child = Command::new(&client, "sleep")
            .arg("30")
            .inherit_fds()
            .spawn()
            .await
            .expect("sleep");
        let pid = child.id();
        let seen = eventually(Duration::from_secs(5), || {
            open_fds(pid).contains(&leaked_number)
        });
        assert!(seen, "inherit_fds: {:?}", open_fds(pid));
        child.kill().await.expect("kill");
    });
    drop(leaked);
}

#[test]
fn passed_fds_land_at_their_numbers() {
    let daemon = start_daemon("fd-map");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let (read5, write5) = rustix::pipe::pipe().expect("pipe");
        let (read9, write9) = rustix::pipe::pipe().expect("pipe");
        let status = Command::new(&client, "sh")
            .args(["-c", "echo five >&5; echo nine >&9"])
            .fd(5, write5)
            .fd(9, write9)
            .status()
            .await
            .expect("sh");
        assert!(status.success());
        let mut five = String::new();
        std::fs::File::from(read5)
            .read_to_string(&mut five)
            .unwrap();
        let mut nine = String::new();
        std::fs::File::from(read9)
            .read_to_string(&mut nine)
            .unwrap();
        assert_eq!((five.as_str(), nine.as_str()), ("five\n", "nine\n"));

        // A file as stdout.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out");
        let file = std::fs::File::create(&path).expect("create");
        let status = Command::new(&client, "echo")
            .arg("to a file")
            .stdout(file)
            .status()
            .await
            .expect("echo");
        assert!(status.success());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "to a file\n");
    });
}

#[test]
fn fifty_concurrent_spawns_from_one_client_do_not_queue() {
    let daemon = start_daemon("concurrent");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        // Each child lives 3 s. If spawns queued behind one another's exit,
        // never would all 50 be alive at once.
        let spawns = (0..50).map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                Command::new(&client, "sleep")
                    .arg("3")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .await
            })
        });
        let mut children = Vec::new();
        for spawn in spawns {
            children.push(spawn.await.expect("task").expect("spawn"));
        }
        let alive = children
            .iter()
            .filter(|child| crate::util::process_state(child.id()).is_some_and(|s| s != 'Z'))
            .count();
        assert_eq!(alive, 50, "all 50 children run at the same time");
        let waits = children.into_iter().map(|mut child| {
            tokio::spawn(async move { within(Duration::from_secs(60), "wait", child.wait()).await })
        });
        for wait in waits {
            assert!(wait.await.expect("task").expect("wait").success());
        }
    });
}

#[test]
fn a_zygote_that_dies_is_not_a_hang() {
    let mut daemon = start_daemon("lost");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let mut child = Command::new(&client, "sleep")
            .arg("30")
            .spawn()
            .await
            .expect("sleep");
        let pid = child.id();
        daemon.kill();
        // The pidfd still reaches the orphaned child.
        child.start_kill().expect("kill through the pidfd");
        assert!(eventually(Duration::from_secs(5), || {
            crate::util::process_state(pid).is_none_or(|s| s == 'Z')
        }));
        // Its status comes from the pidfd on Linux 6.15+ (tests/lost.rs),
        // else the loss is the error; either way, promptly.
        let waited = tokio::time::timeout(Duration::from_secs(40), child.wait())
            .await
            .expect("wait returns instead of hanging");
        match waited {
            Ok(status) => {
                assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
                assert!(status.zygote_lost());
            }
            Err(error) => assert!(matches!(error, Error::ZygoteLost { .. }), "{error}"),
        }
    });
}
