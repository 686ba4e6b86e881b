//! seccomp filters: the named profiles, compiled once, and custom filters
//! in the filter file format, compiled per request. `seccompiler` turns
//! rules into BPF; this module only says which syscalls.
//!
//! # The filter file format
//!
//! Line-based; `#` starts a comment; blank lines are skipped.
//!
//! ```text
//! # every syscall not listed below
//! default allow
//! # what a listed syscall gets
//! action errno EPERM
//! ptrace
//! mount
//! ```
//!
//! - `default ACTION`: what every syscall not listed gets (default
//!   `allow`).
//! - `action ACTION`: what the listed syscalls get (default
//!   `errno EPERM`). It must differ from `default`.
//! - any other line: one syscall name, as in `syscalls(2)`.
//!
//! `ACTION` is `allow`, `errno NAME` or `errno NUMBER` (`EPERM`,
//! `ENOSYS`, `EACCES`, ...), `kill` (the whole process), `trap` or `log`.
//! At most [`MAX_FILTER_BYTES`] of text and [`MAX_FILTER_SYSCALLS`]
//! names.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use seccompiler::TargetArch;
use serde_json::{Value, json};

use crate::spawn::SeccompProgram;

/// The longest custom filter text accepted.
pub const MAX_FILTER_BYTES: usize = 64 * 1024;
/// The most syscall names a custom filter may list.
pub const MAX_FILTER_SYSCALLS: usize = 512;

/// What `default` denies, with `EPERM`: the kernel's administration
/// surface, in the spirit of Docker's default profile and systemd's
/// `@system-service` (which leaves out `@mount`, `@module`, `@reboot`,
/// `@swap`, `@raw-io`, `@debug`, `@obsolete`, `@clock`, `@cpu-emulation`).
const DEFAULT_DENIED: &[&str] = &[
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "query_module",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "syslog",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
];

/// What `strict` denies on top of `default`: io_uring (which bypasses
/// seccomp for the operations it carries), device nodes, `chroot`,
/// `personality`, fanotify, the kernel's memory-sharing paths, and new
/// namespaces through `clone` (see [`namespace_clone_rules`]).
const STRICT_DENIED: &[&str] = &[
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "mknod",
    "mknodat",
    "chroot",
    "personality",
    "fanotify_init",
    "memfd_secret",
    "mbind",
    "migrate_pages",
    "move_pages",
    "set_mempolicy",
];

/// The named profiles this daemon knows.
pub const PROFILES: [&str; 2] = ["default", "strict"];

static COMPILED: LazyLock<HashMap<&'static str, Result<Arc<SeccompProgram>, String>>> =
    LazyLock::new(|| {
        PROFILES
            .iter()
            .map(|name| (*name, compile_profile(name).map(Arc::new)))
            .collect()
    });

/// The compiled program of a named profile, compiled once.
///
/// # Errors
///
/// An unknown name, or (never expected) a profile that does not compile.
pub fn profile(name: &str) -> Result<Arc<SeccompProgram>, String> {
    match COMPILED.get(name) {
        Some(compiled) => compiled.clone(),
        None => Err(format!(
            "unknown seccomp profile {name:?}: this zygote knows {}",
            PROFILES.join(", ")
        )),
    }
}

fn compile_profile(name: &str) -> Result<SeccompProgram, String> {
    let mut rules: Vec<Value> = DEFAULT_DENIED.iter().map(|s| rule(s)).collect();
    if name == "strict" {
        rules.extend(STRICT_DENIED.iter().map(|s| rule(s)));
        rules.extend(namespace_clone_rules());
    }
    let filter = json!({
        "mismatch_action": "allow",
        "match_action": {"errno": libc::EPERM},
        "filter": rules,
    });
    compile(name, &filter)
}

fn rule(name: &str) -> Value {
    json!({ "syscall": name })
}

/// `clone` with any `CLONE_NEW*` flag (its first argument on x86_64 and
/// aarch64). `clone3` passes its flags in memory, which seccomp cannot
/// read: `strict` leaves it allowed, and new user namespaces are then
/// still possible through it (they give no access beyond the peer's).
fn namespace_clone_rules() -> Vec<Value> {
    [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWCGROUP,
    ]
    .into_iter()
    .map(|flag| {
        json!({
            "syscall": "clone",
            "args": [{"index": 0, "type": "qword", "op": {"masked_eq": flag}, "val": flag}],
        })
    })
    .collect()
}

/// Compiles a custom filter's text (see the module's format).
///
/// # Errors
///
/// A message naming the line that does not parse, the unknown syscall,
/// or the limit exceeded.
pub fn custom(text: &str) -> Result<Arc<SeccompProgram>, String> {
    if text.len() > MAX_FILTER_BYTES {
        return Err(format!(
            "seccomp filter: {} bytes, more than the {MAX_FILTER_BYTES} allowed",
            text.len()
        ));
    }
    let mut default = json!("allow");
    let mut action = json!({"errno": libc::EPERM});
    let mut names = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let at = |message: String| format!("seccomp filter line {}: {message}", number + 1);
        let mut words = line.split_whitespace();
        match words.next() {
            None => {}
            Some("default") => default = parse_action(words.collect()).map_err(at)?,
            Some("action") => action = parse_action(words.collect()).map_err(at)?,
            Some(name) => {
                let valid = name
                    .bytes()
                    .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
                if !valid || words.next().is_some() {
                    return Err(at(format!(
                        "{line:?} is neither `default ACTION`, `action ACTION` nor a syscall name"
                    )));
                }
                names.push(rule(name));
            }
        }
    }
    if names.len() > MAX_FILTER_SYSCALLS {
        return Err(format!(
            "seccomp filter: {} syscalls, more than the {MAX_FILTER_SYSCALLS} allowed",
            names.len()
        ));
    }
    if default == action {
        return Err("seccomp filter: `default` and `action` must differ".into());
    }
    let filter = json!({"mismatch_action": default, "match_action": action, "filter": names});
    compile("custom", &filter).map(Arc::new)
}

fn parse_action(words: Vec<&str>) -> Result<Value, String> {
    Ok(match words.as_slice() {
        ["allow"] => json!("allow"),
        ["kill"] => json!("kill_process"),
        ["trap"] => json!("trap"),
        ["log"] => json!("log"),
        ["errno", errno] => json!({"errno": parse_errno(errno)?}),
        _ => {
            return Err(format!(
                "{:?} is not an action: allow, errno NAME, kill, trap or log",
                words.join(" ")
            ));
        }
    })
}

fn parse_errno(text: &str) -> Result<u32, String> {
    if let Ok(number) = text.parse::<u32>() {
        if (1..4096).contains(&number) {
            return Ok(number);
        }
    }
    let known = [
        ("EPERM", libc::EPERM),
        ("ENOENT", libc::ENOENT),
        ("EACCES", libc::EACCES),
        ("EINVAL", libc::EINVAL),
        ("ENOSYS", libc::ENOSYS),
        ("EOPNOTSUPP", libc::EOPNOTSUPP),
        ("ENOTSUP", libc::ENOTSUP),
        ("EAFNOSUPPORT", libc::EAFNOSUPPORT),
    ];
    known
        .iter()
        .find(|(name, _)| *name == text)
        .and_then(|(_, errno)| u32::try_from(*errno).ok())
        .ok_or_else(|| {
            format!("unknown errno {text:?}: give a number from 1 to 4095, or EPERM, ENOSYS, ...")
        })
}

/// Compiles one filter given in seccompiler's JSON, for this machine's
/// architecture, and adds the x32 guard.
fn compile(name: &str, filter: &Value) -> Result<SeccompProgram, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|error| format!("seccomp: {error}"))?;
    let text = json!({ "filter": filter }).to_string();
    let mut compiled = seccompiler::compile_from_json(text.as_bytes(), arch).map_err(|error| {
        // seccompiler's message names the unknown syscall.
        format!("seccomp filter {name}: {error}")
    })?;
    let program = compiled
        .remove("filter")
        .ok_or_else(|| format!("seccomp filter {name}: nothing compiled"))?;
    let mut filter: Vec<libc::sock_filter> = program
        .into_iter()
        .map(|insn| libc::sock_filter {
            code: insn.code,
            jt: insn.jt,
            jf: insn.jf,
            k: insn.k,
        })
        .collect();
    x32_guard(&mut filter);
    Ok(SeccompProgram {
        name: name.to_owned(),
        filter,
    })
}

/// On x86_64, x32 syscalls carry the x86_64 architecture with bit 30 set
/// in their number, so a deny-list keyed on x86_64 numbers would miss
/// them: refuse every one with `ENOSYS`, right after seccompiler's
/// architecture check (3 instructions, whose jumps stay within them).
fn x32_guard(filter: &mut Vec<libc::sock_filter>) {
    if std::env::consts::ARCH != "x86_64" || filter.len() < 3 {
        return;
    }
    const LD_W_ABS: u16 = 0x20;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let insn = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let guard = [
        insn(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        insn(JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32),
    ];
    filter.splice(3..3, guard);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_compile_and_unknown_ones_are_named() {
        for name in PROFILES {
            let program = profile(name).unwrap();
            assert_eq!(program.name, name);
            assert!(
                program.filter.len() > 40,
                "{name}: {}",
                program.filter.len()
            );
        }
        let strict = profile("strict").unwrap().filter.len();
        assert!(strict > profile("default").unwrap().filter.len());
        let error = profile("lenient").unwrap_err();
        assert!(error.contains("\"lenient\""), "{error}");
    }

    #[test]
    fn custom_filters_parse_and_bad_ones_name_the_line() {
        let program =
            custom("# deny two\ndefault allow\naction errno ENOSYS\nptrace\nmount\n").unwrap();
        assert_eq!(program.name, "custom");
        let error = custom("default allow\nptrace now\n").unwrap_err();
        assert!(error.contains("line 2"), "{error}");
        let error = custom("no_such_syscall\n").unwrap_err();
        assert!(error.contains("no_such_syscall"), "{error}");
        let error = custom("default errno EWHAT\n").unwrap_err();
        assert!(error.contains("EWHAT"), "{error}");
        let error = custom("default errno EPERM\n").unwrap_err();
        assert!(error.contains("must differ"), "{error}");
        let long = "ptrace\n".repeat(MAX_FILTER_SYSCALLS + 1);
        assert!(custom(&long).unwrap_err().contains("more than"));
    }
}
