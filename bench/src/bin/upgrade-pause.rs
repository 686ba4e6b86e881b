//! The pause of a live upgrade (`zygote upgrade`), with 0 and 1,000
//! children running: from the `Upgrade` request to the new image's answer,
//! which bounds the time the daemon serves nobody (it stops reading at the
//! request, and answers once it serves again). 20 upgrades per row.
//!
//! `cargo build --release --bins && target/release/upgrade-pause`

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use zygote_client::Client;

const UPGRADES: usize = 20;

fn main() {
    let binary = zygote_binary();
    raise_fd_limit();
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("zygote.sock");
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "[limits]\nmax_children = 2000\nmax_children_per_peer = 2000\n",
    )
    .expect("write policy");
    let mut daemon = Command::new(&binary)
        .args(["serve", "--socket"])
        .arg(&socket)
        .arg("--policy")
        .arg(&policy)
        .env(
            "ZYGOTE_LOG",
            std::env::var("ZYGOTE_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .spawn()
        .expect("start zygote serve");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = runtime.block_on(async {
        for _ in 0..500 {
            if let Ok(client) = Client::connect(&socket).await {
                return client;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("zygote serve does not answer on {}", socket.display());
    });
    println!("| children running | upgrades | p50 | max |");
    println!("|---:|---:|---:|---:|");
    let mut children = Vec::new();
    for running in [0usize, 1000] {
        runtime.block_on(async {
            while children.len() < running {
                let child = client
                    .command("sleep")
                    .arg("3600")
                    .kill_on_close(libc::SIGKILL)
                    .spawn()
                    .await
                    .expect("spawn sleep");
                children.push(child);
            }
        });
        let mut pauses: Vec<Duration> = (0..UPGRADES)
            .map(|_| {
                let start = Instant::now();
                if let Err(error) = zygote::cli::upgrade::ask(&socket) {
                    panic!("upgrade failed: {error}");
                }
                start.elapsed()
            })
            .collect();
        pauses.sort();
        let status = runtime.block_on(client.status()).expect("status");
        assert_eq!(status.children_running as usize, running);
        println!(
            "| {running} | {UPGRADES} | {:.1} ms | {:.1} ms |",
            millis(pauses[UPGRADES / 2]),
            millis(pauses[UPGRADES - 1])
        );
    }
    // Kill-on-close ends the children once the client is gone; the daemon
    // must see that before it stops, or they would outlive it.
    drop(children);
    drop(client);
    runtime.block_on(async {
        for _ in 0..1000 {
            let Ok(client) = Client::connect(&socket).await else {
                break;
            };
            if client
                .status()
                .await
                .is_ok_and(|status| status.children_running == 0)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let _ = daemon.wait();
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// `zygote` next to this binary (`target/<profile>/`).
fn zygote_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let path = exe.parent().map(|dir| dir.join("zygote"));
    match path {
        Some(path) if path.exists() => path,
        _ => PathBuf::from("zygote"),
    }
}

/// 1,000 children's pidfds stay open here.
fn raise_fd_limit() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
}
