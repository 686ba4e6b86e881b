//! The exit codes of `zygote run`, with and without `-t`, and the message
//! and code for a spawn that failed. They follow the shell and `env`: the
//! child's code; death by the child's signal when one killed it; 124 when
//! `--timeout` expired; 127 when the program is not found, 126 when it
//! cannot be executed; 125 when zygote itself fails or the command line is
//! wrong.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use zygote_client::Error;
use zygote_proto::SpawnStage;

use crate::strerror;

/// Exit code when the child's `--timeout` expired, as timeout(1) uses.
pub(crate) const EXIT_TIMED_OUT: u8 = 124;
/// Exit code when zygote itself fails (no daemon, protocol error, usage).
pub const EXIT_ZYGOTE_FAILED: u8 = 125;
/// Exit code when the program exists but cannot be executed.
const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit code when the program is not found.
const EXIT_NOT_FOUND: u8 = 127;

/// Says on stderr why the spawn of `program` (run in `chdir`, if given)
/// failed, and returns the wrapper's exit code for it.
pub(crate) fn report_error(error: &Error, program: &Path, chdir: Option<&Path>) -> u8 {
    match error {
        Error::Spawn {
            stage: SpawnStage::Exec,
            errno,
            ..
        } => {
            let in_dir = chdir.map_or_else(|| program.to_owned(), |dir| dir.join(program));
            let is_dir = program.as_os_str().as_bytes().contains(&b'/') && in_dir.is_dir();
            let reason = if is_dir {
                // execve says EACCES; shells say what is wrong.
                "Is a directory".to_owned()
            } else {
                strerror(*errno)
            };
            eprintln!("zygote: {}: {reason}", program.display());
            if *errno == libc::ENOENT {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            }
        }
        Error::Spawn { errno, .. } | Error::Request { errno, .. } if *errno == libc::E2BIG => {
            eprintln!("zygote: {}: {}", program.display(), strerror(*errno));
            EXIT_CANNOT_EXECUTE
        }
        Error::RequestTooLarge { .. } => {
            eprintln!("zygote: {}: {}", program.display(), strerror(libc::E2BIG));
            EXIT_CANNOT_EXECUTE
        }
        Error::Spawn {
            stage: SpawnStage::Chdir,
            message,
            ..
        } => {
            // The zygote names the directory ("chdir /x: No such file ...").
            eprintln!("zygote: {message}");
            EXIT_ZYGOTE_FAILED
        }
        other => {
            eprintln!("zygote: {other}");
            EXIT_ZYGOTE_FAILED
        }
    }
}
