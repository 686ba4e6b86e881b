//! Warm templates through the Rust client and the CLI, against a real
//! daemon: the refusals made before anything is sent, and the children.

use std::process::{Command, Output};

use zygote_client::{Client, Feature};

use crate::util::{runtime, start_daemon_custom, zygote_bin};

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
