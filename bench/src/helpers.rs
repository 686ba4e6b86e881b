//! Programs the bench builds with `cc` at start: the floor (a tiny
//! posix_spawn loop) and a static child that exits at once.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// The floor: reads `PROGRAM N C` lines; runs N posix_spawn + waitpid of
/// PROGRAM with C in flight; answers with one line of latencies in ns and
/// a line `wall NS`.
const FLOOR_C: &str = r#"
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(void) {
    char path[4096];
    int n, c;
    while (scanf("%4095s %d %d", path, &n, &c) == 3) {
        if (c < 1) c = 1;
        pid_t pids[c];
        long long starts[c];
        char *argv[] = {path, NULL};
        int started = 0, done = 0, inflight = 0;
        for (int i = 0; i < c; i++) pids[i] = 0;
        long long t0 = now_ns();
        while (done < n) {
            while (inflight < c && started < n) {
                int i = 0;
                while (pids[i] != 0) i++;
                starts[i] = now_ns();
                if (posix_spawn(&pids[i], path, NULL, NULL, argv, environ) != 0) {
                    printf("error posix_spawn\n");
                    fflush(stdout);
                    return 1;
                }
                inflight++;
                started++;
            }
            int status;
            pid_t pid = waitpid(-1, &status, 0);
            long long t = now_ns();
            for (int i = 0; i < c; i++) {
                if (pids[i] == pid) {
                    printf("%lld ", t - starts[i]);
                    pids[i] = 0;
                    inflight--;
                    done++;
                    break;
                }
            }
        }
        printf("\nwall %lld\n", now_ns() - t0);
        fflush(stdout);
    }
    return 0;
}
"#;

const STATIC_C: &str = "int main(void) { return 0; }\n";

/// Without a static libc: a bare `_start` that calls exit(0) (x86-64).
const STATIC_NOLIBC_C: &str =
    "void _start(void) { __asm__ volatile(\"mov $60, %eax\\n xor %edi, %edi\\n syscall\"); }\n";

/// Compiles the floor helper into `dir`.
///
/// # Errors
///
/// [`Error::Compile`].
pub fn build_floor(dir: &Path) -> Result<PathBuf> {
    compile("the floor helper", dir, "floor", FLOOR_C, &["-O2"])
}

/// Compiles a static child that exits at once; returns it and what kind
/// it is.
///
/// # Errors
///
/// [`Error::Compile`] when neither a libc nor a bare static binary builds.
pub fn build_static_child(dir: &Path) -> Result<(PathBuf, &'static str)> {
    match compile(
        "a static child",
        dir,
        "static-true",
        STATIC_C,
        &["-O2", "-static"],
    ) {
        Ok(path) => Ok((path, "C, cc -static with glibc")),
        Err(error) => {
            eprintln!("zygote-bench: {error}; trying a child without libc");
            compile(
                "a static child without libc",
                dir,
                "static-true",
                STATIC_NOLIBC_C,
                &["-O2", "-static", "-nostdlib"],
            )
            .map(|path| (path, "bare _start, no libc (static libc missing)"))
        }
    }
}

fn compile(
    what: &'static str,
    dir: &Path,
    name: &str,
    source: &str,
    flags: &[&str],
) -> Result<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    let out = dir.join(name);
    std::fs::write(&src, source).map_err(Error::io(format!("writing {}", src.display())))?;
    let output = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .map_err(|error| Error::Compile {
            what,
            reason: error.to_string(),
        })?;
    if !output.status.success() {
        return Err(Error::Compile {
            what,
            reason: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(out)
}
