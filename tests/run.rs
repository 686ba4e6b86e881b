use std::process::{Command, Output};

use crate::util::{start_daemon, zygote_bin};

fn zygote_run(socket: &std::path::Path, shell: &str) -> Output {
    // Run through sh so that the test can set up fds as a user would.
    Command::new("sh")
        .arg("-c")
        .arg(shell)
        .env("ZYGOTE", zygote_bin())
        .env("ZYGOTE_SOCKET", socket)
        .output()
        .expect("run sh")
}

#[test]
fn run_exits_with_the_childs_code_or_128_plus_signal() {
    let daemon = start_daemon("run-codes");
    let out = zygote_run(
        daemon.socket(),
        r#""$ZYGOTE" run -- sh -c 'echo hi; exit 42'"#,
    );
    assert_eq!(out.status.code(), Some(42));
    assert_eq!(out.stdout, b"hi\n");
    let out = zygote_run(daemon.socket(), r#""$ZYGOTE" run -- sh -c 'kill -KILL $$'"#);
    assert_eq!(out.status.code(), Some(128 + 9));
}

#[test]
fn run_reports_missing_and_non_executable_programs_like_a_shell() {
    let daemon = start_daemon("run-errors");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::write(&data, "not a program").expect("write");
    let out = zygote_run(
        daemon.socket(),
        r#""$ZYGOTE" run -- zygote-no-such-program"#,
    );
    assert_eq!(out.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("zygote-no-such-program: No such file or directory"),
        "{stderr}"
    );
    let out = zygote_run(
        daemon.socket(),
        &format!(r#""$ZYGOTE" run -- '{}'"#, data.display()),
    );
    assert_eq!(out.status.code(), Some(126));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
}

#[test]
fn run_without_a_zygote_names_the_socket_and_exits_125() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("nobody.sock");
    let out = zygote_run(&socket, r#""$ZYGOTE" run -- true"#);
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&socket.display().to_string()), "{stderr}");
    assert!(stderr.contains("zygote serve"), "{stderr}");
}

#[test]
fn run_passes_inheritable_fds_unless_close_fds() {
    let daemon = start_daemon("run-fds");
    // fd 7 is open without close-on-exec in the shell, like <(...) or a
    // make jobserver pipe.
    let out = zygote_run(
        daemon.socket(),
        r#"exec 7</dev/null; "$ZYGOTE" run -- sh -c 'ls /proc/$$/fd'"#,
    );
    assert!(out.status.success(), "{out:?}");
    let fds: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(fds.contains(&"7".to_owned()), "{fds:?}");

    let out = zygote_run(
        daemon.socket(),
        r#"exec 7</dev/null; "$ZYGOTE" run --close-fds -- sh -c 'ls /proc/$$/fd'"#,
    );
    let fds = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        fds.lines().collect::<Vec<_>>(),
        vec!["0", "1", "2"],
        "{fds}"
    );
}

#[test]
fn run_uses_the_callers_environment_cwd_and_stdin() {
    let daemon = start_daemon("run-env");
    let dir = tempfile::tempdir().expect("tempdir");
    let shell = format!(
        r#"cd '{}' && echo piped | FOO=bar "$ZYGOTE" run -- sh -c 'echo $FOO; pwd; cat'"#,
        dir.path().display()
    );
    let out = zygote_run(daemon.socket(), &shell);
    assert!(out.status.success(), "{out:?}");
    let expected = format!(
        "bar\n{}\npiped\n",
        dir.path().canonicalize().unwrap().display()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
}

/// The sandbox options while the zygote does not offer sandboxes (it
/// withholds them here): the command is not run (no request is even
/// sent), the tool exits 125 and names the feature; a bad option value is
/// refused by name first.
#[test]
fn run_refuses_sandbox_options_the_zygote_does_not_offer() {
    let daemon = crate::util::start_daemon_custom(
        "run-sandbox-refused",
        None,
        None,
        &[],
        &crate::util::zygote_bin(),
        &[("ZYGOTE_MASK_FEATURES", "sandbox")],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("ran");
    let out = zygote_run(
        daemon.socket(),
        &format!(
            r#""$ZYGOTE" run --isolate --ro-bind /usr --tmpfs /tmp --network none -- touch '{}'"#,
            marker.display()
        ),
    );
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("feature sandbox"), "{stderr}");
    assert!(!marker.exists(), "the command ran unconfined");
    let out = zygote_run(
        daemon.socket(),
        r#""$ZYGOTE" run --seccomp /nonexistent/filter -- true"#,
    );
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--seccomp /nonexistent/filter: No such file"),
        "{stderr}"
    );
    let out = zygote_run(daemon.socket(), r#""$ZYGOTE" run --tmpfs tmp -- true"#);
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--tmpfs tmp: "), "{stderr}");
    // Without sandbox options the same command runs.
    let out = zygote_run(
        daemon.socket(),
        &format!(r#""$ZYGOTE" run -- touch '{}'"#, marker.display()),
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(marker.exists());
}

/// Each `-p` property limits its own cgroup file: where the controller is
/// delegated the child reads its value back, elsewhere (as here) the
/// zygote's refusal names that file.
#[test]
fn each_property_limits_its_own_cgroup_file() {
    let Some(cgroup) = crate::cgroup::TestCgroup::new("run-properties") else {
        return;
    };
    let daemon =
        crate::util::start_daemon_with("run-properties", None, &["--cgroup", &cgroup.arg()]);
    let cases = [
        ("MemoryMax=512M", "memory.max", "536870912"),
        ("MemorySwapMax=1G", "memory.swap.max", "1073741824"),
        ("TasksMax=64", "pids.max", "64"),
        ("CPUWeight=50", "cpu.weight", "50"),
        ("IOWeight=200", "io.weight", "default 200"),
        ("CPUQuota=50%", "cpu.max", "50000 100000"),
    ];
    let arg = cgroup.arg();
    let mount = std::path::Path::new(&arg)
        .parent()
        .expect("the test's cgroup is under the mount");
    for (property, file, value) in cases {
        let out = zygote_run(
            daemon.socket(),
            &format!(
                r#""$ZYGOTE" run -p {property} -- sh -c 'cat "{}$(cut -d: -f3 /proc/self/cgroup)/{file}"'"#,
                mount.display()
            ),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                value,
                "{property}"
            );
        } else {
            assert_eq!(out.status.code(), Some(125), "{property}: {stderr}");
            assert!(
                stderr.contains(&format!("{file} requested")),
                "{property}: {stderr}"
            );
        }
    }
}

/// `-u NAME` and `-E NAME[=VALUE]` refuse what is no variable name, before
/// anything runs.
#[test]
fn run_refuses_variable_names_that_cannot_be() {
    let daemon = start_daemon("run-bad-names");
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("ran");
    for (options, message) in [
        ("-u ''", "cannot unset \"\""),
        ("-u A=B", "cannot unset \"A=B\""),
        ("-E =x", "the name is empty"),
        ("-E ''", "cannot set an empty name"),
    ] {
        let out = zygote_run(
            daemon.socket(),
            &format!(r#""$ZYGOTE" run {options} -- touch '{}'"#, marker.display()),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{options}: {stderr}");
        assert!(stderr.contains(message), "{options}: {stderr}");
        assert!(!marker.exists(), "{options}: the command ran");
    }
}
