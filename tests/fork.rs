//! A process that forks after using a client: the forked copy never sends
//! on the parent's connection, never hangs, and never ends the parent's
//! children; the parent keeps spawning through it meanwhile. Run in a
//! helper process, since this test binary has threads of its own.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::{eventually, start_daemon};

const HELPER: &str = env!("CARGO_BIN_EXE_zygote-fork-helper");

fn fork_while_spawning(mode: &str) {
    let daemon = start_daemon(&format!("fork-{mode}"));
    let mut helper = Command::new(HELPER)
        .arg(mode)
        .arg(daemon.socket())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the fork helper");
    let finished = eventually(Duration::from_secs(60), || {
        helper.try_wait().expect("try_wait").is_some()
    });
    if !finished {
        let _ = helper.kill();
    }
    let output = helper.wait_with_output().expect("wait for the helper");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        finished,
        "{mode}: the helper hung; stdout: {stdout} stderr: {stderr}"
    );
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "{mode}: {}\nstdout: {stdout}\nstderr: {stderr}\ndaemon log:\n{}",
        output.status,
        daemon.log()
    );
}

/// The blocking client in a forked copy fails at once with
/// `Error::Forked`; a new client there works.
#[test]
fn a_forked_copy_of_a_blocking_client_fails_fast_and_the_parent_keeps_spawning() {
    fork_while_spawning("blocking");
}

/// The async client in a forked copy connects again, on a connection of
/// its own.
#[test]
fn a_forked_copy_of_an_async_client_reconnects_and_the_parent_keeps_spawning() {
    fork_while_spawning("async");
}
