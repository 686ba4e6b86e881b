//! `zygote upgrade`: ask a running zygote to upgrade in place; and the
//! hidden `zygote check-state`, which the daemon runs on the new binary
//! before it execs it.

use std::os::fd::AsFd;

use zygote_proto::{
    ClientMessage, Hello, PROTOCOL_VERSION, RECV_BUFFER_BYTES, ServerMessage, UpgradeRequest,
    decode, encode, recv_frame, send_frame, socket,
};

use crate::cli::{CheckStateArgs, UpgradeArgs};
use crate::daemon::upgrade;

/// Exit code when the upgrade failed or the zygote cannot be asked.
const EXIT_FAILED: u8 = 1;

/// Asks the zygote at `args.socket` to upgrade; prints the new version.
/// Returns 0, or 1 when it could not be asked or the upgrade failed (the
/// daemon then carries on in its old image).
pub fn upgrade(args: &UpgradeArgs) -> u8 {
    let path = crate::cli::run::socket_path(args.socket.clone());
    match ask(&path) {
        Ok(message) => {
            println!("{message}");
            0
        }
        Err(message) => {
            eprintln!("zygote: {message}");
            EXIT_FAILED
        }
    }
}

/// Connects to the zygote at `path` and asks it to upgrade in place;
/// returns a line naming the old and new versions, or why it failed.
///
/// # Errors
///
/// The reason, as a sentence.
pub fn ask(path: &std::path::Path) -> Result<String, String> {
    let shown = path.display();
    let fd = socket::connect_to(path, false).map_err(|error| format!("{shown}: {error}"))?;
    let send = |message: &ClientMessage| {
        let bytes = encode(message).map_err(|error| error.to_string())?;
        send_frame(fd.as_fd(), &bytes, &[]).map_err(|error| format!("{shown}: {error}"))
    };
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let mut recv = || -> Result<ServerMessage, String> {
        let frame = recv_frame(fd.as_fd(), &mut scratch)
            .map_err(|error| format!("{shown}: {error}"))?
            .ok_or_else(|| format!("{shown}: the zygote closed the connection"))?;
        decode(&frame.bytes).map_err(|error| format!("{shown}: {error}"))
    };
    send(&ClientMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: format!("zygote upgrade {}", crate::version()),
    }))?;
    let old = match recv()? {
        ServerMessage::HelloAck(ack) => ack.server_version,
        ServerMessage::ProtocolError(error) => return Err(error.message),
        other => return Err(format!("unexpected answer to Hello: {other:?}")),
    };
    send(&ClientMessage::Upgrade(UpgradeRequest { id: 1 }))?;
    match recv()? {
        ServerMessage::Status(status) => Ok(format!(
            "upgraded in place: zygote {old} -> {} (pid {}, up {} s)",
            status.server_version,
            status.pid,
            status.uptime_millis / 1000
        )),
        ServerMessage::RequestFailed(failed) => Err(failed.message),
        ServerMessage::ProtocolError(error) => Err(error.message),
        other => Err(format!("unexpected answer to Upgrade: {other:?}")),
    }
}

/// Reads a state file (or stdin) and says whether this binary can restore
/// it: 0 when it can, 1 otherwise.
pub fn check_state(args: &CheckStateArgs) -> u8 {
    let file = match &args.file {
        Some(path) => {
            std::fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))
        }
        None => std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map(std::fs::File::from)
            .map_err(|error| format!("stdin: {error}")),
    };
    match file.and_then(|file| upgrade::check_state(&file).map_err(|error| error.to_string())) {
        Ok(summary) => {
            println!("{summary}");
            0
        }
        Err(message) => {
            eprintln!("zygote: {message}");
            EXIT_FAILED
        }
    }
}
