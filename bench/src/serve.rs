//! A second `zygote serve` for a comparison (cgroups, sandboxes): started
//! with its own arguments on its own socket, and connected to.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use zygote_client::Client;

/// Starts `zygote serve --socket SOCKET ARGS...` and connects to it within
/// 10 s. `Err(reason)` when it cannot start or does not answer; the
/// process is then killed, never left behind.
pub fn serve(
    runtime: &tokio::runtime::Runtime,
    socket: &Path,
    args: &[&OsStr],
) -> Result<(Child, Client), String> {
    let binary = zygote_client::private::find_binary().map_err(|error| error.to_string())?;
    let mut process = Command::new(&binary)
        .arg("serve")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|error| format!("starting {}: {error}", binary.display()))?;
    let client = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Client::connect(socket).await {
                Ok(client) => break Ok(client),
                Err(error) if Instant::now() > deadline => break Err(error.to_string()),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });
    match client {
        Ok(client) => Ok((process, client)),
        Err(error) => {
            let _ = process.kill();
            let _ = process.wait();
            Err(error)
        }
    }
}
