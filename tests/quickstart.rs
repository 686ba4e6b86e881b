//! The README's quick start, run as written: `cargo run --release -- serve`
//! from the top of the workspace must start a zygote.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::eventually;

/// The first `cargo run` line of the README's "Quick start" block, without
/// its comment.
fn quick_start_command(readme: &str) -> String {
    let section = readme
        .split("## Quick start")
        .nth(1)
        .expect("README has a Quick start section");
    section
        .lines()
        .find(|line| line.starts_with("cargo run"))
        .expect("the Quick start has a cargo run line")
        .split('#')
        .next()
        .expect("split yields one part")
        .trim()
        .to_owned()
}

#[test]
fn the_readmes_serve_command_starts_a_zygote() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let command = quick_start_command(&readme);
    assert_eq!(command, "cargo run --release -- serve");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("quickstart.sock");
    let log = dir.path().join("cargo.log");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let words: Vec<&str> = command.split_whitespace().collect();
    let mut child = Command::new(cargo)
        .args(&words[1..])
        .current_dir(root)
        // Where to listen, as `run` and `status` take it; the default
        // would be the machine's own zygote socket.
        .env("ZYGOTE_SOCKET", &socket)
        // The same command; a cheaper release profile, so that the test
        // does not spend minutes on link-time optimisation.
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("create log"))
        .spawn()
        .expect("start cargo");
    let listening = eventually(Duration::from_secs(1200), || {
        zygote_proto::socket::connect_to(&socket, false).is_ok()
            || child.try_wait().ok().flatten().is_some()
    }) && zygote_proto::socket::connect_to(&socket, false).is_ok();
    // cargo run execs the program, so this stops the zygote itself.
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        listening,
        "`{command}` did not start a zygote on {}; its output:\n{}",
        socket.display(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
