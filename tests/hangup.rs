//! SIGHUP: a graceful stop for the shared daemon (there is nothing to
//! reload, and no live upgrade yet); ignored by a private zygote, whose
//! owner decides.

use std::process::{Command as StdCommand, Stdio as StdStdio};
use std::time::Duration;

use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
use rustix::process::{Pid, Signal, kill_process};
use zygote_client::blocking::{Client, Command};

use crate::util::{eventually, start_daemon, zygote_bin};

#[test]
fn sighup_stops_the_daemon_gracefully() {
    let mut daemon = start_daemon("sighup");
    let client = Client::connect(daemon.socket()).expect("connect");
    let mut child = Command::new(&client, "sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    daemon.signal_stop(Signal::HUP);
    // Stops accepting at once: the socket file it bound goes away.
    let socket = daemon.socket().to_owned();
    assert!(
        eventually(Duration::from_secs(10), || !socket.exists()),
        "the daemon still listens after SIGHUP; log:\n{}",
        daemon.log()
    );
    // Drains: it waits for the connected client's child instead of dying
    // of the signal (exit 129) as it used to.
    assert_eq!(
        daemon.wait_exit(Duration::from_millis(300)),
        None,
        "the daemon exited with a client's child running; log:\n{}",
        daemon.log()
    );
    child.kill().expect("kill sleep");
    let status = child.wait().expect("the exit notice still comes");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    drop(child);
    drop(client);
    let exit = daemon
        .wait_exit(Duration::from_secs(10))
        .expect("the daemon exits once its last client leaves");
    assert!(exit.success(), "{exit}; log:\n{}", daemon.log());
    let log = daemon.log();
    assert!(
        log.contains("stopping gracefully") && log.contains("SIGHUP"),
        "no INFO line says why it stopped:\n{log}"
    );
}

#[test]
fn private_zygote_ignores_sighup() {
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .expect("socketpair");
    let mut zygote = StdCommand::new(zygote_bin())
        .args(["serve", "--private-fd", "0"])
        .env("ZYGOTE_LOG", "off")
        .stdin(StdStdio::from(theirs))
        .spawn()
        .expect("start a private zygote");
    // Let it set up its signal handling before the signal comes.
    let client = Client::from_fd(ours).expect("handshake");
    let pid = Pid::from_raw(zygote.id() as i32).expect("pid");
    kill_process(pid, Signal::HUP).expect("SIGHUP");
    let status = Command::new(&client, "true")
        .status()
        .expect("still serving");
    assert!(status.success());
    assert!(
        zygote.try_wait().expect("try_wait").is_none(),
        "the private zygote died of SIGHUP"
    );
    drop(client);
    assert!(
        eventually(Duration::from_secs(10), || zygote
            .try_wait()
            .expect("try_wait")
            .is_some()),
        "the private zygote outlived its owner's socket"
    );
    assert!(zygote.wait().expect("wait").success());
}
