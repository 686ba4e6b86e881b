//! Clients that must be processes of their own (to be SIGKILLed, to run
//! as another uid, to load the daemon from several processes): the test
//! binary re-executes itself to run [`client_process`] instead of its
//! tests (see `util::reexec`), which does what `ZYGOTE_TEST_HELPER` says
//! and prints its findings as lines that start with `HELPER `.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use zygote_client::{Client, Error, SpawnStage, Stdio};
use zygote_proto::{
    ClientMessage, Hello, PROTOCOL_VERSION, RECV_BUFFER_BYTES, ResourceLimit, ServerMessage,
    SpawnRequest, StdioSpec, decode, encode, recv_frame, send_frame, socket,
};

/// Selects [`client_process`] as the entry point, and its mode.
pub const MODE_ENV: &str = "ZYGOTE_TEST_HELPER";
const SOCKET_ENV: &str = "ZYGOTE_TEST_SOCKET";

/// A command that re-executes this test binary as a helper in `mode`,
/// talking to the zygote at `socket`.
pub fn helper(mode: &str, socket: &Path) -> Command {
    let mut command = crate::util::reexec(MODE_ENV, mode);
    command
        .env(SOCKET_ENV, socket)
        // Children inherit the cwd; `/` is searchable by any uid.
        .current_dir("/");
    command
}

/// Makes `command` exec with exactly `entries` as its environment, even
/// ones `Command::env` cannot make (an entry without `=`): the forked child
/// calls `execve(2)` itself from `pre_exec`. At most 31 arguments and 31
/// entries, so that the child needs no allocation.
pub fn with_raw_environment(command: &mut Command, entries: &[&[u8]]) {
    const SLOTS: usize = 32;
    let cstring = |bytes: &[u8]| CString::new(bytes).expect("no NUL");
    let program = cstring(command.get_program().as_bytes());
    let args: Vec<CString> = std::iter::once(program.clone())
        .chain(command.get_args().map(|arg| cstring(arg.as_bytes())))
        .collect();
    let env: Vec<CString> = entries.iter().map(|entry| cstring(entry)).collect();
    assert!(args.len() < SLOTS && env.len() < SLOTS, "too many strings");
    let exec = move || {
        // Pointer arrays on the stack: no allocation after fork.
        let mut argv = [std::ptr::null::<libc::c_char>(); SLOTS];
        let mut envp = [std::ptr::null::<libc::c_char>(); SLOTS];
        for (slot, arg) in argv.iter_mut().zip(&args) {
            *slot = arg.as_ptr();
        }
        for (slot, entry) in envp.iter_mut().zip(&env) {
            *slot = entry.as_ptr();
        }
        // SAFETY: `program` and every string that `argv` and `envp` point
        // to live in this closure; both arrays end with a null pointer
        // (fewer strings than slots, checked above).
        unsafe { libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        Err(std::io::Error::last_os_error())
    };
    // SAFETY: the closure runs in the forked child and only calls
    // execve(2), which is async-signal-safe; it allocates nothing.
    unsafe { command.pre_exec(exec) };
}

/// The `HELPER ` lines of a helper's stdout, without the prefix.
pub fn findings(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("HELPER "))
        .map(str::to_owned)
        .collect()
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "HELPER {line}").expect("stdout");
    out.flush().expect("flush");
}

/// The entry point of helper processes, run instead of the tests when
/// `ZYGOTE_TEST_HELPER` is set.
pub fn client_process() {
    let mode = std::env::var(MODE_ENV).expect("the helper's mode");
    let socket = std::env::var(SOCKET_ENV).expect("socket path");
    let socket = Path::new(&socket);
    match mode.split(':').collect::<Vec<_>>().as_slice() {
        ["load", count, parallel] => load(
            socket,
            count.parse().expect("count"),
            parallel.parse().expect("parallel"),
        ),
        ["fault"] => fault(socket),
        ["other-uid"] => other_uid(socket),
        ["templates", handle] => {
            crate::templates::other_uid_client(socket, handle.parse().expect("handle"));
        }
        ["closed-stdin"] => closed_stdin(socket),
        ["inherited-env"] => inherited_env(socket),
        _ => panic!("unknown helper mode {mode}"),
    }
}

/// Spawns `/bin/true` `count` times, `parallel` at a time, on one
/// connection; prints `ok N` with the number of exit statuses seen.
fn load(socket: &Path, count: usize, parallel: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let delivered = runtime.block_on(async {
        let client = Client::connect(socket).await.expect("connect");
        let permits = Arc::new(tokio::sync::Semaphore::new(parallel));
        let mut tasks = Vec::with_capacity(count);
        for _ in 0..count {
            let permit = Arc::clone(&permits).acquire_owned().await.expect("permit");
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let status = zygote_client::Command::new(&client, "/bin/true")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .await;
                drop(permit);
                status
            }));
        }
        let mut delivered = 0;
        for task in tasks {
            let status = task.await.expect("task").expect("spawn and wait");
            assert!(status.success(), "{status}");
            delivered += 1;
        }
        delivered
    });
    say(&format!("ok {delivered}"));
}

/// Starts a kill-on-close child and a plain one, says their pids, and
/// waits to be SIGKILLed.
fn fault(socket: &Path) {
    let client = zygote_client::blocking::Client::connect(socket).expect("connect");
    let doomed = zygote_client::blocking::Command::new(&client, "sleep")
        .arg("30")
        .kill_on_close(libc::SIGKILL)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn kill-on-close child");
    let survivor = zygote_client::blocking::Command::new(&client, "sleep")
        .arg("3")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn plain child");
    say(&format!("pids {} {}", doomed.id(), survivor.id()));
    std::thread::sleep(Duration::from_secs(60));
}

/// Run as another uid under a policy that lets it run as uid 4321 only:
/// reports its children's ids and the refusals it gets.
fn other_uid(socket: &Path) {
    // A hard limit below the daemon's, which it must not hand our children.
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(100),
            maximum: Some(200),
        },
    )
    .expect("lower our own NOFILE limit");
    let client = zygote_client::blocking::Client::connect(socket).expect("connect");
    let ids = |command: &mut zygote_client::blocking::Command| match command
        .args(["-c", "echo $(id -u) $(id -g) $(id -G)"])
        .output()
    {
        Ok(output) => String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        Err(Error::Spawn { stage, errno, .. }) => format!("refused {} {errno}", stage.name()),
        Err(error) => format!("error {error}"),
    };
    let mut own = zygote_client::blocking::Command::new(&client, "/bin/sh");
    say(&format!("own {}", ids(&mut own)));
    let mut root = zygote_client::blocking::Command::new(&client, "/bin/sh");
    root.uid(0).gid(0);
    say(&format!("root {}", ids(&mut root)));
    let mut allowed = zygote_client::blocking::Command::new(&client, "/bin/sh");
    allowed.uid(4321);
    say(&format!("allowed {}", ids(&mut allowed)));

    // Resource limits above our own hard limit, on the raw protocol (the
    // client library always sends the caller's own).
    let fd = socket::connect_to(socket, false).expect("connect");
    let hello = ClientMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "other-uid".into(),
    });
    send_frame(fd.as_fd(), &encode(&hello).unwrap(), &[]).expect("hello");
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let receive = |scratch: &mut [u8]| -> ServerMessage {
        let frame = recv_frame(fd.as_fd(), scratch)
            .expect("recv")
            .expect("a reply");
        decode(&frame.bytes).expect("decode")
    };
    receive(&mut scratch);
    let own_hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .expect("finite hard limit");
    let request = ClientMessage::Spawn(SpawnRequest {
        rlimits: vec![ResourceLimit {
            resource: libc::RLIMIT_NOFILE,
            soft: 64,
            hard: own_hard + 1,
        }],
        ..SpawnRequest::new(1, "/bin/true")
    });
    send_frame(fd.as_fd(), &encode(&request).unwrap(), &[]).expect("spawn");
    match receive(&mut scratch) {
        ServerMessage::SpawnFailed(failed) if failed.stage == SpawnStage::Admission => {
            say(&format!(
                "rlimit refused {} {}",
                failed.errno, failed.message
            ));
        }
        other => say(&format!("rlimit {other:?}")),
    }

    // A request that sets no limits: the child must not get the daemon's.
    let mut bare = match request {
        ClientMessage::Spawn(request) => request,
        _ => unreachable!(),
    };
    bare.id = 2;
    bare.program = b"/bin/sh".to_vec();
    bare.args = vec![b"-c".to_vec(), b"ulimit -Hn".to_vec()];
    bare.stdout = StdioSpec::Pipe;
    bare.rlimits = vec![];
    let frame = encode(&ClientMessage::Spawn(bare)).unwrap();
    send_frame(fd.as_fd(), &frame, &[]).expect("spawn");
    let reply = recv_frame(fd.as_fd(), &mut scratch)
        .expect("recv")
        .expect("reply");
    let mut out = String::new();
    if let Some(stdout) = reply.fds.get(1) {
        let mut stdout = std::fs::File::from(stdout.try_clone().expect("dup"));
        std::io::Read::read_to_string(&mut stdout, &mut out).expect("read child's stdout");
    }
    say(&format!("unset-rlimit {}", out.trim()));
}

/// Closes this process's fd 0, then runs a child with inherited stdin:
/// the client assumes fds 0 to 2 open until a send fails, and must then
/// retry with the closed one left out. Says what the child's stdin is.
fn closed_stdin(socket: &Path) {
    let client = zygote_client::blocking::Client::connect(socket).expect("connect");
    // The child writes what its stdin is to a file: output() would make
    // pipes, which would take the freed fd 0. Nothing else opens an fd
    // between the close and the spawn's send.
    let report = std::env::temp_dir().join(format!("zygote-closed-stdin-{}", std::process::id()));
    // SAFETY: fd 0 is this helper process's stdin, which nothing in it
    // reads or holds as an owned fd; closing it is the point of the test.
    unsafe { rustix::io::close(0) };
    let status = zygote_client::blocking::Command::new(&client, "sh")
        .args([
            "-c",
            "readlink /proc/self/fd/0 > \"$1\" || echo closed > \"$1\"",
            "sh",
        ])
        .arg(&report)
        .status()
        .expect("spawn with fd 0 closed");
    assert!(status.success(), "{status}");
    let seen = std::fs::read_to_string(&report).expect("the child's report");
    let _ = std::fs::remove_file(&report);
    say(&format!("stdin {}", seen.trim()));
}

/// Runs `cat /proc/self/environ` with this process's environment as is,
/// then with changes, and says each child's entries, escaped, in order.
fn inherited_env(socket: &Path) {
    let client = zygote_client::blocking::Client::connect(socket).expect("connect");
    let environ = |command: &mut zygote_client::blocking::Command, label: &str| {
        let output = command
            .arg("/proc/self/environ")
            .output()
            .unwrap_or_else(|error| panic!("{label} spawn failed: {error}"));
        assert!(output.status.success(), "{}", output.status);
        let entries = output.stdout.strip_suffix(b"\0").unwrap_or(&output.stdout);
        for entry in entries.split(|byte| *byte == 0) {
            say(&format!("{label} {}", entry.escape_ascii()));
        }
    };
    environ(
        &mut zygote_client::blocking::Command::new(&client, "/bin/cat"),
        "inherited",
    );
    environ(
        zygote_client::blocking::Command::new(&client, "/bin/cat")
            .env("ADDED", "1")
            .env_remove("=A"),
        "changed",
    );
}
