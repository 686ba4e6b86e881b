//! A program for the fork tests: uses a client, forks, and uses it in both
//! processes at once. `fork_helper blocking|async SOCKET`.
//!
//! The parent spawns `sleep 30` with kill-on-drop, forks, then spawns
//! `true` 20 times while the forked child:
//!
//! - (blocking) gets [`Error::Forked`] from the parent's client, spawns on
//!   a client of its own, drops its copies of both, and exits;
//! - (async) spawns through the parent's client on a runtime of its own
//!   (the client connects again), drops its copies and the parent's
//!   runtime, and exits.
//!
//! The parent then checks the forked child's exit code, that the sleeper
//! still runs, and that its client still spawns; it prints `ok` last.
//! Everything has a deadline: the child exits by `alarm(2)` after 20 s,
//! and the parent gives up on it after 30 s.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use zygote_client::Error;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(socket)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: fork_helper blocking|async SOCKET");
        return ExitCode::from(2);
    };
    let result = match mode.as_str() {
        "blocking" => blocking(socket),
        "async" => asynchronous(socket),
        other => Err(format!("unknown mode {other:?}")),
    };
    match result {
        Ok(()) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(error) => {
            println!("failed: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `fork(2)`: `None` in the child, the child's pid in the parent.
fn fork() -> Result<Option<libc::pid_t>, String> {
    // SAFETY: the child only uses the client (whose fork handling is what
    // is tested), allocates (glibc's fork makes malloc safe in the child)
    // and leaves with `_exit`.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            // SAFETY: a plain syscall; the deadline of the child.
            unsafe { libc::alarm(20) };
            Ok(None)
        }
        pid => Ok(Some(pid)),
    }
}

/// Ends the forked child with `code`, running no exit handler of the
/// parent's (as a forked worker should).
fn exit_child(code: i32) -> ! {
    // SAFETY: `_exit` ends this process at once.
    unsafe { libc::_exit(code) }
}

/// Waits for the forked child, within 30 s; its exit code.
fn reap(pid: libc::pid_t) -> Result<i32, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        match unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) } {
            0 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            0 => return Err("the forked child still runs after 30 s".into()),
            -1 => return Err(format!("waitpid: {}", std::io::Error::last_os_error())),
            _ if libc::WIFEXITED(status) => return Ok(libc::WEXITSTATUS(status)),
            _ => return Err(format!("the forked child died: wait status {status:#x}")),
        }
    }
}

fn blocking(socket: &str) -> Result<(), String> {
    use zygote_client::blocking::{Client, Command};
    let client = Client::connect(socket).map_err(|e| e.to_string())?;
    let mut sleeper = Command::new(&client, "sleep")
        .arg("30")
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let Some(child) = fork()? else {
        let code = match Command::new(&client, "true").status() {
            Err(Error::Forked { .. }) => {
                let own = Client::connect(socket);
                let ran = own.as_ref().map(|own| Command::new(own, "true").status());
                match ran {
                    Ok(Ok(status)) if status.success() => 0,
                    other => {
                        eprintln!("forked child: its own client: {other:?}");
                        4
                    }
                }
            }
            other => {
                eprintln!("forked child: the parent's client gave {other:?}");
                3
            }
        };
        drop(sleeper);
        drop(client);
        exit_child(code);
    };
    for _ in 0..20 {
        let status = Command::new(&client, "true").status();
        if !status.as_ref().is_ok_and(|status| status.success()) {
            return Err(format!("the parent's spawn during the fork: {status:?}"));
        }
    }
    check_after_fork(reap(child)?, sleeper.try_wait().map_err(|e| e.to_string())?)?;
    let status = Command::new(&client, "true").status();
    if !status.as_ref().is_ok_and(|status| status.success()) {
        return Err(format!("the parent's spawn after the fork: {status:?}"));
    }
    sleeper.kill().map_err(|e| e.to_string())
}

fn asynchronous(socket: &str) -> Result<(), String> {
    use zygote_client::Client;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let (client, mut sleeper) = runtime.block_on(async {
        let client = Client::connect(socket).await.map_err(|e| e.to_string())?;
        let sleeper = client
            .command("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((client, sleeper))
    })?;
    let Some(child) = fork()? else {
        // The parent's runtime is not used here: a new one, as a forked
        // worker of a tokio program must build.
        let code = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(own) => match own.block_on(client.command("true").status()) {
                Ok(status) if status.success() => 0,
                other => {
                    eprintln!("forked child: the reconnected client gave {other:?}");
                    3
                }
            },
            Err(error) => {
                eprintln!("forked child: runtime: {error}");
                5
            }
        };
        drop(sleeper);
        drop(client);
        // The parent's runtime goes too, with its tasks (the reader holds
        // the connection). Without waiting: its blocking pool's threads
        // are not in this process, and a plain drop would wait for them.
        runtime.shutdown_background();
        exit_child(code);
    };
    runtime.block_on(async {
        for _ in 0..20 {
            let status = client.command("true").status().await;
            if !status.as_ref().is_ok_and(|status| status.success()) {
                return Err(format!("the parent's spawn during the fork: {status:?}"));
            }
        }
        Ok(())
    })?;
    check_after_fork(reap(child)?, sleeper.try_wait().map_err(|e| e.to_string())?)?;
    runtime.block_on(async {
        let status = client.command("true").status().await;
        if !status.as_ref().is_ok_and(|status| status.success()) {
            return Err(format!("the parent's spawn after the fork: {status:?}"));
        }
        sleeper.kill().await.map_err(|e| e.to_string())
    })
}

fn check_after_fork(
    child_code: i32,
    sleeper: Option<zygote_client::ExitStatus>,
) -> Result<(), String> {
    if child_code != 0 {
        return Err(format!("the forked child exited with {child_code}"));
    }
    if let Some(status) = sleeper {
        return Err(format!(
            "the forked child's drop ended the parent's kill-on-drop child: {status:?}"
        ));
    }
    Ok(())
}
