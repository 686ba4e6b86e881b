//! The three zygotes under test, started while the bench is small, and
//! their size with many children running.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use zygote_client::Client;

use crate::Bench;
use crate::error::{Error, Result};
use crate::methods::Method;
use crate::nonroot::NonRoot;
use crate::report::Resident;

/// The zygote clients, one per mode and API, and the shared daemon's
/// process.
pub struct Zygotes {
    pub shared: Client,
    pub private: Client,
    pub template: Client,
    pub shared_blocking: zygote_client::blocking::Client,
    pub private_blocking: zygote_client::blocking::Client,
    pub template_blocking: zygote_client::blocking::Client,
    /// The client process running as another uid; None when the bench is
    /// not root.
    pub nonroot: Option<NonRoot>,
    pub daemon: Child,
    pub private_pid: Option<u32>,
    pub private_blocking_pid: Option<u32>,
    pub template_pid: u32,
    pub template_blocking_pid: u32,
}

impl Zygotes {
    /// The pid of the zygote process behind `method`.
    pub fn pid(&self, method: Method) -> Option<u32> {
        match method {
            Method::ZygoteShared | Method::ZygoteSharedBlocking | Method::ZygoteSharedNonRoot => {
                Some(self.daemon.id())
            }
            Method::ZygotePrivate => self.private_pid,
            Method::ZygotePrivateBlocking => self.private_blocking_pid,
            Method::ZygoteTemplate => Some(self.template_pid),
            Method::ZygoteTemplateBlocking => Some(self.template_blocking_pid),
            // The sandbox daemons are the bench's own (see `sandboxes`).
            Method::Floor
            | Method::StdSpawn
            | Method::StdFork
            | Method::ZygoteSandboxFilters
            | Method::ZygoteSandboxFull
            | Method::ZygoteSandboxMounts
            | Method::ZygoteBwrap => None,
        }
    }
}

impl Drop for Zygotes {
    fn drop(&mut self) {
        drop(self.nonroot.take());
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

/// Starts the shared daemon on a socket in `dir`, launches the private
/// zygotes, connects to all of them (async and blocking), and starts the
/// non-root client when we are root.
///
/// # Errors
///
/// When the binary is missing or a zygote does not answer.
pub fn start_zygotes(
    runtime: &tokio::runtime::Runtime,
    templates: [zygote::template::Template; 2],
    dir: &Path,
) -> Result<Zygotes> {
    let binary = zygote_client::private::find_binary()?;
    let socket = dir.join("zygote.sock");
    let [template, template_blocking] = templates;
    let daemon = Command::new(&binary)
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        // The non-root client connects too.
        .arg("--socket-mode")
        .arg("0666")
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(Error::io(format!("starting {}", binary.display())))?;
    let daemon_pid = daemon.id();
    let template_pid = template.pid().unsigned_abs();
    let template_blocking_pid = template_blocking.pid().unsigned_abs();
    let (shared, private, template) = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        let shared = loop {
            match Client::connect(&socket).await {
                Ok(client) => break client,
                Err(error) if Instant::now() > deadline => return Err(Error::from(error)),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let private = Client::launch_private().await?;
        let template = template.client().await?;
        Ok::<_, Error>((shared, private, template))
    })?;
    let private_pid = private_zygote_pid(&[daemon_pid]);
    let shared_blocking = zygote_client::blocking::Client::connect(&socket)?;
    let private_blocking = zygote_client::blocking::Client::launch_private()?;
    let private_blocking_pid = private_zygote_pid(&[daemon_pid, private_pid.unwrap_or(0)]);
    let template_blocking = template_blocking.blocking_client()?;
    let nonroot = if rustix::process::geteuid().is_root() {
        // Uid 65534 must be able to run this binary where it lies (not
        // under a 0700 home, say): without it, the rest still runs.
        match NonRoot::start(&socket) {
            Ok(helper) => Some(helper),
            Err(error) => {
                eprintln!("zygote-bench: no non-root client cells: {error}");
                None
            }
        }
    } else {
        eprintln!(
            "zygote-bench: not root, so no non-root client cells (they need a root daemon \
             and a client as uid {})",
            crate::nonroot::UID
        );
        None
    };
    Ok(Zygotes {
        shared,
        private,
        template,
        shared_blocking,
        private_blocking,
        template_blocking,
        nonroot,
        daemon,
        private_pid,
        private_blocking_pid,
        template_pid,
        template_blocking_pid,
    })
}

/// A launched private zygote: our child named as the zygote binary the
/// client launches (`$ZYGOTE_BIN`, else `zygote`) that is none of `known`.
fn private_zygote_pid(known: &[u32]) -> Option<u32> {
    let me = std::process::id();
    let binary = std::env::var_os("ZYGOTE_BIN")
        .and_then(|path| {
            std::path::Path::new(&path)
                .file_name()
                .map(|name| name.as_encoded_bytes().to_vec())
        })
        .unwrap_or_else(|| b"zygote".to_vec());
    // The kernel keeps the first 15 bytes of the name (TASK_COMM_LEN - 1).
    let expected = &binary[..binary.len().min(15)];
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let comm = &stat[stat.find('(')? + 1..stat.rfind(')')?];
            let ppid: u32 = stat[stat.rfind(')')? + 2..]
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == me && comm.as_bytes() == expected && !known.contains(&pid)).then_some(pid)
        })
}

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Each zygote's RSS while `count` children (`cat`, waiting on a pipe
/// from us) run.
pub fn measure_resident(bench: &Bench, count: usize) -> Result<Vec<Resident>> {
    let zygotes = &bench.zygotes;
    let list = [
        (
            Method::ZygoteShared,
            &zygotes.shared,
            Some(zygotes.daemon.id()),
        ),
        (Method::ZygotePrivate, &zygotes.private, zygotes.private_pid),
        (
            Method::ZygoteTemplate,
            &zygotes.template,
            Some(zygotes.template_pid),
        ),
    ];
    let mut resident = Vec::new();
    for (method, client, pid) in list {
        let Some(pid) = pid else {
            eprintln!("zygote-bench: cannot find the pid of {}", method.name());
            continue;
        };
        let rss_kib = bench.runtime.block_on(async {
            let mut children = Vec::with_capacity(count);
            for _ in 0..count {
                let child = client
                    .command("cat")
                    .stdin(zygote_client::Stdio::piped())
                    .stdout(zygote_client::Stdio::null())
                    .spawn()
                    .await?;
                children.push(child);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let rss = vm_rss_kib(pid).unwrap_or(0);
            for child in &mut children {
                drop(child.stdin.take());
            }
            for child in &mut children {
                child.wait().await?;
            }
            Ok::<_, Error>(rss)
        })?;
        resident.push(Resident {
            method,
            children: count,
            rss_kib,
        });
    }
    Ok(resident)
}
