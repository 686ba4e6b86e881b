//! The Rust builder against a real daemon: whatever values its methods
//! take, the request it sends decodes (the daemon never closes the
//! connection as `Malformed`), a value the daemon cannot use is that one
//! spawn's error, and the shared connection serves the next spawn.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use zygote_client::blocking::{Client, Command};
use zygote_client::{Error, Stdio};

use crate::util::start_daemon;

/// One call of the builder, with every value it takes chosen at random.
#[derive(Debug, Clone)]
struct Call {
    program: Vec<u8>,
    args: Vec<Vec<u8>>,
    /// One argument of this many bytes, past the frame size when large:
    /// the client sends such lists in a sealed memfd.
    big_arg: Option<usize>,
    env: Vec<(Vec<u8>, Vec<u8>)>,
    cwd: Option<Vec<u8>>,
    uid: Option<u32>,
    gid: Option<u32>,
    groups: Option<Vec<u32>>,
    umask: Option<u32>,
    process_group: Option<i32>,
    setsid: bool,
    kill_on_close: Option<(i32, bool)>,
    timeout: Option<(u64, u64)>,
    pty: Option<(u16, u16)>,
    /// Child fd numbers to map `/dev/null` at; sometimes more than a
    /// frame may carry.
    fds: Vec<i32>,
    cgroup: Option<(u64, u64, u32, u32, u64, u64)>,
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..max)
}

/// Mostly ordinary values, sometimes the edges of each type.
fn edgy_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        6 => 0..70_000u32,
        1 => Just(0),
        1 => Just(u32::MAX),
        1 => Just(u32::MAX - 1),
        1 => any::<u32>(),
    ]
}

fn edgy_i32() -> impl Strategy<Value = i32> {
    prop_oneof![
        6 => 1..100i32,
        1 => Just(0),
        1 => Just(-1),
        1 => Just(i32::MIN),
        1 => Just(i32::MAX),
        1 => any::<i32>(),
    ]
}

fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0..10_000u64,
        1 => Just(0),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

/// Child fds to map: usually none or a few, sometimes any number,
/// sometimes more than a frame may carry (64).
fn child_fds() -> impl Strategy<Value = Vec<i32>> {
    prop_oneof![
        6 => vec(3..200i32, 0..3),
        1 => vec(edgy_i32(), 0..3),
        1 => Just((3..75).collect()),
    ]
}

/// An option that is set one time in five.
fn sometimes<T: std::fmt::Debug>(
    value: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    proptest::option::weighted(0.2, value)
}

fn call() -> impl Strategy<Value = Call> {
    let program = prop_oneof![
        Just(b"true".to_vec()),
        Just(b"/bin/true".to_vec()),
        Just(b"zygote-no-such-program".to_vec()),
        bytes(16),
    ];
    let first = (
        program,
        vec(bytes(24), 0..4),
        proptest::option::weighted(0.05, 1usize..400_000),
        vec((bytes(12), bytes(24)), 0..3),
        sometimes(prop_oneof![Just(b"/".to_vec()), bytes(12)]),
        sometimes(edgy_u32()),
        sometimes(edgy_u32()),
        sometimes(vec(edgy_u32(), 0..6)),
    );
    let second = (
        sometimes(prop_oneof![0..0o7777u32, any::<u32>()]),
        sometimes(edgy_i32()),
        any::<bool>(),
        sometimes((edgy_i32(), any::<bool>())),
        sometimes((edgy_u64(), edgy_u64())),
        sometimes((any::<u16>(), any::<u16>())),
        child_fds(),
        sometimes((
            edgy_u64(),
            edgy_u64(),
            edgy_u32(),
            edgy_u32(),
            edgy_u64(),
            edgy_u64(),
        )),
    );
    (first, second).prop_map(
        |(
            (program, args, big_arg, env, cwd, uid, gid, groups),
            (umask, process_group, setsid, kill_on_close, timeout, pty, fds, cgroup),
        )| Call {
            program,
            args,
            big_arg,
            env,
            cwd,
            uid,
            gid,
            groups,
            umask,
            process_group,
            setsid,
            kill_on_close,
            timeout,
            pty,
            fds,
            cgroup,
        },
    )
}

/// The command `call` describes, on `client`.
fn build(client: &Client, call: &Call) -> Command {
    let mut command = Command::new(client, OsStr::from_bytes(&call.program));
    for arg in &call.args {
        command.arg(OsStr::from_bytes(arg));
    }
    if let Some(len) = call.big_arg {
        command.arg("x".repeat(len));
    }
    for (key, value) in &call.env {
        command.env(OsStr::from_bytes(key), OsStr::from_bytes(value));
    }
    if let Some(cwd) = &call.cwd {
        command.current_dir(OsStr::from_bytes(cwd));
    }
    if let Some(uid) = call.uid {
        command.uid(uid);
    }
    if let Some(gid) = call.gid {
        command.gid(gid);
    }
    if let Some(groups) = &call.groups {
        command.groups(groups);
    }
    if let Some(umask) = call.umask {
        command.umask(umask);
    }
    if let Some(group) = call.process_group {
        command.process_group(group);
    }
    command.setsid(call.setsid);
    match call.kill_on_close {
        Some((signal, false)) => {
            command.kill_on_close(signal);
        }
        Some((signal, true)) => {
            command.kill_process_group_on_close(signal);
        }
        None => {}
    }
    if let Some((limit, grace)) = call.timeout {
        command
            .timeout(Duration::from_millis(limit))
            .timeout_grace(Duration::from_millis(grace));
    }
    match call.pty {
        Some((rows, cols)) => {
            command.pty(rows, cols);
        }
        None => {
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
        }
    }
    for &child_fd in &call.fds {
        let null = std::fs::File::open("/dev/null").expect("open /dev/null");
        command.fd(child_fd, null);
    }
    if let Some((memory, swap, cpu, io, quota, period)) = call.cgroup {
        command
            .memory_max(memory)
            .memory_swap_max(swap)
            .cpu_weight(cpu)
            .io_weight(io)
            .pids_max(memory)
            .cpu_max(Duration::from_micros(quota), Duration::from_micros(period));
    }
    command
}

/// Errors that end or condemn the connection: never the answer to one
/// spawn's values.
fn is_connection_error(error: &Error) -> bool {
    matches!(
        error,
        Error::Protocol { .. } | Error::ZygoteLost { .. } | Error::Handshake { .. }
    )
}

#[test]
fn no_builder_value_makes_a_frame_the_daemon_cannot_decode() {
    let daemon = start_daemon("builder-values");
    let client = Client::connect(daemon.socket()).expect("connect");
    let config = ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(call in call())| {
        let result = build(&client, &call).status();
        if let Err(error) = &result {
            prop_assert!(
                !is_connection_error(error),
                "{call:?} cost the connection: {error}"
            );
        }
        prop_assert!(client.is_connected(), "{call:?}: {result:?}");
        let next = Command::new(&client, "true").status();
        prop_assert!(
            next.as_ref().is_ok_and(|status| status.success()),
            "after {call:?} ({result:?}), the next spawn: {next:?}"
        );
    });
    let log = daemon.log();
    assert!(
        !log.contains("closing connection"),
        "the daemon closed a connection:\n{log}"
    );
}
