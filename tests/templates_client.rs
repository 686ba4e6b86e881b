//! Warm templates through the Rust client and the CLI, against a real
//! daemon: the refusals made before anything is sent, and the children.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use zygote_client::{Client, Feature, Stdio};

use crate::util::{eventually, runtime, skip, start_daemon, start_daemon_custom, zygote_bin};

/// The CPython these tests run: `$ZYGOTE_TEST_PYTHON` (as for the
/// daemon's template tests), else `python3` on `PATH`; `None`, after a
/// visible skip, without either.
fn python_or_skip() -> Option<PathBuf> {
    let found = std::env::var_os("ZYGOTE_TEST_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH")?
                .to_string_lossy()
                .split(':')
                .map(|dir| Path::new(dir).join("python3"))
                .find(|path| path.exists())
        });
    if found.is_none() {
        skip("no CPython: neither ZYGOTE_TEST_PYTHON nor python3 on PATH");
    }
    found
}

/// `zygote run ARGS` with `ZYGOTE_SOCKET` set to `socket`.
fn zygote_run(socket: &std::path::Path, args: &[&str]) -> Output {
    Command::new(zygote_bin())
        .arg("run")
        .args(args)
        .env("ZYGOTE_SOCKET", socket)
        .output()
        .expect("run zygote")
}

/// Options a forked child cannot honour are refused with the option
/// named, exit 125, before the zygote is even asked (there is none here).
#[test]
fn run_refuses_options_a_warm_child_cannot_take() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("nobody.sock");
    for (option, named) in [
        (&["--uid", "0"][..], "--uid"),
        (&["--gid", "0"], "--gid"),
        (&["--isolate"], "a sandbox option"),
        (&["--ro-bind", "/usr", "/usr"], "a sandbox option"),
    ] {
        let mut args = vec!["--python-template", "json"];
        args.extend_from_slice(option);
        args.extend(["--", "-c", "pass"]);
        let out = zygote_run(&socket, &args);
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("cannot be combined with {named}")),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("nobody.sock"), "not connected: {stderr}");
    }
    let out = zygote_run(&socket, &["--python", "python3", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--python-template"),
        "--python alone: {stderr}"
    );
}

/// A daemon that withholds templates: the Rust client sends nothing for
/// a template and says which feature is missing; `zygote run
/// --python-template` fails with 125 and the same reason; cold spawns go
/// on.
#[test]
fn templates_are_refused_by_the_clients_when_not_offered() {
    let daemon = start_daemon_custom(
        "templates-not-offered",
        None,
        None,
        &[],
        &zygote_bin(),
        &[("ZYGOTE_MASK_FEATURES", "templates")],
    );
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        assert!(!client.offers(Feature::Templates));
        let error = client
            .python_template(["json"])
            .start()
            .await
            .expect_err("not offered");
        assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP), "{error}");
        assert!(error.to_string().contains("feature templates"), "{error}");
        let status = client.status().await.expect("status");
        assert_eq!(status.spawns_failed, 0, "nothing reached the daemon");
        assert!(
            client
                .command("true")
                .status()
                .await
                .expect("spawn")
                .success()
        );
    });
    let out = zygote_run(
        daemon.socket(),
        &["--python-template", "json", "--", "-c", "pass"],
    );
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("feature templates"), "{stderr}");
}

/// A Rust `Template`'s children are `Command`s: arguments as `python`
/// takes them, the command's environment and working directory, output,
/// exit codes, kill and timeout; the same spec finds the same template,
/// and the list shows it with its forks. The blocking client too.
#[test]
fn the_rust_client_runs_warm_children_as_commands() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let daemon = start_daemon("tpl-client-commands");
    let dir = tempfile::tempdir().expect("tempdir");
    let cwd = dir.path().canonicalize().expect("canonical tempdir");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        assert!(client.offers(Feature::Templates), "{:?}", client.features());
        let template = client
            .python_template(["json"])
            .python(&python)
            .start()
            .await
            .unwrap_or_else(|error| panic!("{error}\n{}", daemon.log()));
        let code = "import sys, os, json; \
                    print(json.dumps([sys.argv, os.environ.get('WARM'), os.getcwd(), \
                    'json' in sys.modules]))";
        let output = template
            .command(["-c", code])
            .arg("x")
            .env("WARM", "yes")
            .current_dir(&cwd)
            .output()
            .await
            .expect("output");
        assert!(output.status.success(), "{output:?}");
        let expected = format!("[[\"-c\", \"x\"], \"yes\", {:?}, true]\n", cwd.display());
        assert_eq!(String::from_utf8_lossy(&output.stdout), expected);
        let status = template
            .command(["-c", "raise SystemExit(7)"])
            .status()
            .await
            .expect("status");
        assert_eq!(status.code(), Some(7));
        let mut child = template
            .command(["-c", "import time; time.sleep(60)"])
            .stdout(Stdio::null())
            .spawn()
            .await
            .expect("spawn");
        child.kill().await.expect("kill");
        assert_eq!(
            child.wait().await.expect("wait").signal(),
            Some(libc::SIGKILL)
        );
        let timed = template
            .command(["-c", "import time; time.sleep(60)"])
            .timeout(Duration::from_millis(300))
            .timeout_grace(Duration::from_millis(300))
            .status()
            .await
            .expect("status");
        assert!(timed.timed_out(), "{timed:?}");
        let again = client
            .python_template(["json"])
            .python(&python)
            .start()
            .await
            .expect("the same template");
        assert!(again.reused());
        assert_eq!(again.handle(), template.handle());
        let listed = client.templates().await.expect("list");
        let info = listed
            .iter()
            .find(|info| info.template == template.handle())
            .unwrap_or_else(|| panic!("not listed: {listed:?}"));
        assert_eq!(
            (info.pid, info.preload.as_slice()),
            (template.pid(), &["json".to_owned()][..])
        );
        assert!(info.forks >= 4, "{info:?}");
    });
    let client = zygote_client::blocking::Client::connect(daemon.socket()).expect("connect");
    let template = client
        .python_template(["json"])
        .python(&python)
        .start()
        .expect("template");
    let output = template
        .command(["-c", "print(6 * 7)"])
        .output()
        .expect("output");
    assert_eq!(output.stdout, b"42\n");
}

/// After an upgrade the daemon no longer knows the template (its handle
/// answers `ENOENT`): the client's next spawn asks for it again, once,
/// and runs; the new handle is kept.
#[test]
fn the_rust_client_asks_again_for_a_template_an_upgrade_ended() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let daemon = start_daemon("tpl-client-upgrade");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let template = client
            .python_template(["json"])
            .python(&python)
            .start()
            .await
            .unwrap_or_else(|error| panic!("{error}\n{}", daemon.log()));
        let (old_handle, old_pid) = (template.handle(), template.pid());
        let upgraded = Command::new(zygote_bin())
            .args(["upgrade", "--socket"])
            .arg(daemon.socket())
            .output()
            .expect("zygote upgrade");
        assert!(upgraded.status.success(), "{upgraded:?}\n{}", daemon.log());
        assert!(
            eventually(Duration::from_secs(10), || {
                crate::util::process_state(old_pid.unsigned_abs()).is_none()
            }),
            "the old template ended\n{}",
            daemon.log()
        );
        let output = template
            .command(["-c", "print(5)"])
            .output()
            .await
            .unwrap_or_else(|error| panic!("{error}\n{}", daemon.log()));
        assert_eq!(output.stdout, b"5\n");
        assert_ne!(template.handle(), old_handle, "a new handle");
        let listed = client.templates().await.expect("list");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].template, template.handle());
    });
}

/// `zygote run --python-template`: Python's arguments, exit codes and
/// tracebacks as `python` gives them; 127 for a missing interpreter, 125
/// with the traceback for a preload that fails; `python3` from PATH by
/// default. `zygote status` lists the template a connection keeps, in its
/// table and in `--json`.
#[test]
fn zygote_run_python_template_runs_python_and_status_lists_it() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let python = python.to_str().expect("UTF-8 path");
    let daemon = start_daemon("tpl-client-cli");
    let socket = daemon.socket();
    let warm = |args: &[&str]| {
        let mut all = vec!["--python-template", "json", "--python", python, "--"];
        all.extend_from_slice(args);
        zygote_run(socket, &all)
    };
    let out = warm(&[
        "-c",
        "import sys; print(sys.argv[1:]); sys.exit(3)",
        "a",
        "b",
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{}", daemon.log());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "['a', 'b']\n");
    let out = warm(&["-c", "raise ValueError('warm')"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ValueError: warm"),
        "{out:?}"
    );
    let out = zygote_run(
        socket,
        &[
            "--python-template",
            "json",
            "--python",
            "/nonexistent/python3",
            "--",
            "-c",
            "pass",
        ],
    );
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("/nonexistent/python3: No such file or directory"),
        "{out:?}"
    );
    let out = zygote_run(
        socket,
        &[
            "--python-template",
            "json,zygote_no_such_module",
            "--python",
            python,
            "--",
            "-c",
            "pass",
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("zygote_no_such_module"),
        "{out:?}"
    );
    let out = zygote_run(socket, &["--python-template", "", "--", "-c", "print(1)"]);
    assert_eq!(out.status.code(), Some(0), "python3 from PATH: {out:?}");
    assert_eq!(out.stdout, b"1\n");

    // A connection of this uid keeps templates alive between runs.
    let _keeper = runtime()
        .block_on(Client::connect(socket))
        .expect("connect");
    let out = warm(&["-c", "pass"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status = Command::new(zygote_bin())
        .args(["status", "--socket"])
        .arg(socket)
        .output()
        .expect("zygote status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("\ntemplates:\n"), "{text}");
    assert!(text.contains(&format!("{python}  json")), "{text}");
    let json = Command::new(zygote_bin())
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .expect("zygote status --json");
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let templates = json["templates"].as_array().expect("templates");
    assert!(
        templates.iter().any(
            |template| template["preload"] == serde_json::json!(["json"])
                && template["interpreter"] == python
        ),
        "{json}"
    );
}

/// A zygote of the current protocol that offers templates, on `path`,
/// for one connection: it answers a status request, and refuses every
/// list of templates with `EPERM`.
fn status_daemon_refusing_the_list(path: &Path) -> std::thread::JoinHandle<()> {
    use zygote_proto::{
        ClientMessage, HelloAck, LIMITS, PROTOCOL_VERSION, RequestFailed, ServerMessage,
        StatusReply,
    };
    let listener = zygote_proto::socket::listen_at(path, false).expect("listen");
    std::thread::spawn(move || {
        use std::os::fd::AsFd;
        let (connection, _) =
            zygote_proto::socket::accept_peer(listener.as_fd(), false).expect("accept");
        let mut scratch = vec![0; zygote_proto::RECV_BUFFER_BYTES];
        let reply = |message: ServerMessage| {
            let bytes = zygote_proto::encode(&message).expect("encode");
            zygote_proto::send_frame(connection.as_fd(), &bytes, &[]).expect("send");
        };
        while let Ok(Some(frame)) = zygote_proto::recv_frame(connection.as_fd(), &mut scratch) {
            match zygote_proto::decode::<ClientMessage>(&frame.bytes).expect("decode") {
                ClientMessage::Hello(_) => reply(ServerMessage::HelloAck(HelloAck {
                    protocol_version: PROTOCOL_VERSION,
                    server_version: "fake-status".into(),
                    limits: LIMITS,
                    features: vec!["templates".into()],
                })),
                ClientMessage::Status(request) => reply(ServerMessage::Status(StatusReply {
                    id: request.id,
                    server_version: "fake-status".into(),
                    pid: 4242,
                    uptime_millis: 65_000,
                    connections_open: 1,
                    connections_accepted: 9,
                    children_running: 2,
                    spawns_succeeded: 17,
                    spawns_failed: 3,
                    peers: Vec::new(),
                    spawners: Vec::new(),
                })),
                ClientMessage::ListTemplates(request) => {
                    reply(ServerMessage::RequestFailed(RequestFailed {
                        id: request.id,
                        errno: libc::EPERM,
                        message: "listing refused here".into(),
                    }));
                }
                other => panic!("unexpected request: {other:?}"),
            }
        }
    })
}

/// `zygote status` against a zygote that refuses the list of templates
/// prints everything else, and one line saying the templates could not
/// be listed (in `--json`, `templates` is null and `templates_error` says
/// why); it still exits 0.
#[test]
fn status_prints_the_rest_when_templates_cannot_be_listed() {
    for json in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("zygote.sock");
        let daemon = status_daemon_refusing_the_list(&socket);
        let mut command = Command::new(zygote_bin());
        command.arg("status").arg("--socket").arg(&socket);
        if json {
            command.arg("--json");
        }
        let output = crate::util::output_within(
            command
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run zygote status"),
            Duration::from_secs(20),
            "zygote status",
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stdout}{stderr}");
        daemon.join().expect("the fake zygote");
        if json {
            let status: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
            assert_eq!(status["spawns_succeeded"], 17, "{stdout}");
            assert_eq!(status["templates"], serde_json::Value::Null, "{stdout}");
            let error = status["templates_error"].as_str().unwrap_or_default();
            assert!(error.contains("listing refused here"), "{stdout}");
        } else {
            assert!(
                stdout.contains("spawns:            17 succeeded, 3 failed\n"),
                "{stdout}"
            );
            let note: Vec<&str> = stdout
                .lines()
                .filter(|line| line.contains("could not be listed"))
                .collect();
            assert_eq!(note.len(), 1, "{stdout}");
            assert!(note[0].starts_with("templates:"), "{stdout}");
            assert!(note[0].contains("listing refused here"), "{stdout}");
        }
    }
}
