use std::io::{Read, Write};

use zygote_client::blocking::{Client, Command};
use zygote_client::{Error, SpawnStage, Stdio};

use crate::util::start_daemon;

#[test]
fn blocking_client_spawns_pipes_and_waits() {
    let daemon = start_daemon("blocking");
    let client = Client::connect(daemon.socket()).expect("connect");

    let output = Command::new(&client, "sh")
        .args(["-c", "echo out; echo err >&2; exit 4"])
        .output()
        .expect("sh");
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.status.code(), Some(4));

    let mut child = Command::new(&client, "tr")
        .args(["a-z", "A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("tr");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"hello").expect("write");
    drop(stdin);
    let mut upper = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut upper)
        .expect("read");
    assert_eq!(upper, "HELLO");
    assert!(child.wait().expect("wait").success());

    match Command::new(&client, "zygote-no-such-program").status() {
        Err(Error::Spawn { stage, errno, .. }) => {
            assert_eq!((stage, errno), (SpawnStage::Exec, libc::ENOENT));
        }
        other => panic!("expected ENOENT, got {other:?}"),
    }
}

#[test]
fn blocking_client_is_shared_by_threads() {
    let daemon = start_daemon("blocking-threads");
    let client = Client::connect(daemon.socket()).expect("connect");
    std::thread::scope(|scope| {
        for n in 0..8 {
            let client = &client;
            scope.spawn(move || {
                for _ in 0..10 {
                    let output = Command::new(client, "echo")
                        .arg(n.to_string())
                        .output()
                        .expect("echo");
                    assert_eq!(output.stdout, format!("{n}\n").as_bytes());
                }
            });
        }
    });
}

#[test]
fn blocking_wait_after_the_zygote_died_reads_the_pidfd() {
    let mut daemon = start_daemon("blocking-lost");
    let client = Client::connect(daemon.socket()).expect("connect");
    let mut child = Command::new(&client, "sleep")
        .arg("30")
        .spawn()
        .expect("sleep");
    daemon.kill();
    child.kill().expect("kill through the pidfd");
    // Linux 6.15 keeps the status for the pidfd (tests/lost.rs has more).
    match child.wait() {
        Ok(status) => assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}"),
        Err(error) => assert!(matches!(error, Error::ZygoteLost { .. }), "{error}"),
    }
}

/// Callers read their own replies while they block; between calls the
/// client's background thread must still read what arrives, so that an
/// exit shows in `try_wait`, which never blocks, with no call in between.
#[test]
fn blocking_try_wait_sees_the_exit_without_a_blocking_call() {
    let daemon = start_daemon("blocking-idle");
    let client = Client::connect(daemon.socket()).expect("connect");
    let mut child = Command::new(&client, "true").spawn().expect("true");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit seen in 10 s without a blocking call"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert!(status.success());
    // Threads taking turns at driving the runtime, each also waiting.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let client = &client;
            scope.spawn(move || {
                for _ in 0..25 {
                    let status = Command::new(client, "true").status().expect("true");
                    assert!(status.success());
                }
            });
        }
    });
}

#[test]
fn closed_stdin_of_the_caller_reaches_the_child_as_dev_null() {
    // The client assumes its fds 0 to 2 open and checks them only once a
    // send fails with EBADF; a process of its own, since it closes fd 0.
    let daemon = start_daemon("blocking-closed-stdin");
    let output = crate::helper::helper("closed-stdin", daemon.socket())
        .output()
        .expect("run helper");
    assert!(
        output.status.success(),
        "helper failed: {}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(crate::helper::findings(&output.stdout), ["stdin /dev/null"]);
}

/// Fifty threads on one blocking client, as the bench's concurrency 50,
/// in bursts separated by idle gaps longer than the client's idle delay
/// (10 ms), so that the runtime's driver moves between callers within a
/// burst and to the background thread and back between bursts. Each
/// thread's children exit with its own code, so a reply handed to the
/// wrong caller fails the test; a lost wake-up hangs a caller, which the
/// watchdog turns into a failure instead of a stuck test.
#[test]
fn fifty_threads_in_bursts_each_get_their_own_replies() {
    const THREADS: i32 = 50;
    const PER_THREAD: usize = 4;
    const BURSTS: usize = 3;
    let daemon = start_daemon("blocking-fifty");
    let client = Client::connect(daemon.socket()).expect("connect");
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        for _ in 0..BURSTS {
            std::thread::scope(|scope| {
                for code in 0..THREADS {
                    let client = &client;
                    scope.spawn(move || {
                        for _ in 0..PER_THREAD {
                            let status = Command::new(client, "sh")
                                .args(["-c", &format!("exit {code}")])
                                .status()
                                .expect("sh");
                            assert_eq!(status.code(), Some(code), "{status}");
                        }
                    });
                }
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        done.send(()).expect("the test waits");
    });
    // Generous: 600 spawns of sh on a loaded 2-core machine take seconds.
    match finished.recv_timeout(std::time::Duration::from_secs(120)) {
        Ok(()) => worker.join().expect("the callers"),
        // A caller's assertion failed: its panic is the failure to show.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            worker.join().expect("a caller failed");
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("a blocking caller hung for 120 s: a lost wake-up")
        }
    }
}
