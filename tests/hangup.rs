//! SIGHUP: ignored by a private zygote, whose owner decides. (For the
//! shared daemon it is a live upgrade: see `upgrade.rs`.)

use std::os::fd::OwnedFd;
use std::process::{Child, Command as StdCommand, Stdio as StdStdio};
use std::time::Duration;

use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
use rustix::process::{Pid, Signal, kill_process};
use zygote_client::blocking::{Client, Command};

use crate::util::{eventually, wait_within, zygote_bin};

/// `zygote serve --private-fd 0` on a new socketpair: our end, and the
/// zygote.
fn start_private_zygote() -> (OwnedFd, Child) {
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .expect("socketpair");
    let zygote = StdCommand::new(zygote_bin())
        .args(["serve", "--private-fd", "0"])
        .env("ZYGOTE_LOG", "off")
        .stdin(StdStdio::from(theirs))
        .spawn()
        .expect("start a private zygote");
    (ours, zygote)
}

#[test]
fn private_zygote_ignores_sighup() {
    let (ours, mut zygote) = start_private_zygote();
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

/// A SIGINT or SIGHUP that comes as a private zygote starts, before its
/// handlers exist, is held until they do, then ignored: a terminal's ^C at
/// that moment does not kill it. Repeated, each sent as soon as
/// `/proc/PID/status` shows the signals held or caught.
#[test]
fn private_zygote_ignores_sigint_and_sighup_as_it_starts() {
    let mut held = 0;
    for round in 0..5 {
        let (ours, mut zygote) = start_private_zygote();
        if crate::util::wait_stop_signals_handled(zygote.id()) {
            held += 1;
        }
        let pid = Pid::from_raw(zygote.id() as i32).expect("pid");
        kill_process(pid, Signal::INT).expect("SIGINT");
        kill_process(pid, Signal::HUP).expect("SIGHUP");
        let client = Client::from_fd(ours).expect("handshake");
        let status = Command::new(&client, "true")
            .status()
            .unwrap_or_else(|error| panic!("round {round}: not serving: {error}"));
        assert!(status.success());
        drop(client);
        let exit = wait_within(&mut zygote, Duration::from_secs(30), "the private zygote");
        assert!(exit.success(), "round {round}: {exit}");
    }
    assert!(held > 0, "the signals were never seen held during startup");
}
