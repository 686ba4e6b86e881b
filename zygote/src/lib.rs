//! The zygote daemon: a small template process that starts children for
//! clients over a SEQPACKET Unix socket.
//!
//! # Layout
//!
//! - [`daemon`]: the daemon itself: the accept loop, connections, peer
//!   policy, admission, child lifetimes and reaping; private zygotes and
//!   the forked [`template`].
//! - [`spawn`]: creating the child; the only module with unsafe process
//!   code.
//! - [`service`]: glue to the system around the daemon: systemd
//!   activation and notification, Prometheus metrics and their exporter,
//!   logging.
//! - [`cli`]: the `zygote` binary's commands: `serve`, `run`, `status`.

pub mod cli;
pub mod daemon;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod service;
pub mod spawn;

pub use daemon::template;
pub use error::Error;

/// The C library's message for `errno`, without std's " (os error N)":
/// the number travels and is printed apart.
pub(crate) fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(end) => text[..end].to_owned(),
        None => text,
    }
}

/// The README's Rust examples, compiled by `cargo test --doc` so that they
/// cannot rot. They are complete as shown: no hidden `# ` lines, which
/// rustdoc would hide but a README viewer shows.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod readme_tests {
    /// Rustdoc hides lines starting with `# ` in Rust blocks; the rendered
    /// README would show them.
    #[test]
    fn readme_rust_blocks_have_no_hidden_lines() {
        let readme = include_str!("../../README.md");
        let mut in_rust = false;
        let mut rust_blocks = 0;
        for (number, line) in readme.lines().enumerate() {
            if let Some(info) = line.strip_prefix("```") {
                in_rust = !in_rust && info.split([' ', ',']).next() == Some("rust");
                rust_blocks += usize::from(in_rust);
                continue;
            }
            assert!(
                !(in_rust && (line == "#" || line.starts_with("# "))),
                "README.md line {}: a hidden doctest line shows in the README: {line}",
                number + 1
            );
        }
        assert!(
            rust_blocks >= 5,
            "found {rust_blocks} Rust blocks in README.md"
        );
    }
}
