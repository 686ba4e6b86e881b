//! seccomp filters: the named profiles, compiled once, and custom filters
//! in the filter file format, compiled per request (and cached by their
//! text). `seccompiler` turns rules into BPF and checks every name;
//! where libseccomp is there, its binary tree of the same rules replaces
//! seccompiler's linear chain, which a child attaches several times
//! faster (`spawn::libseccomp`). This module only says which syscalls.
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
use std::sync::{Arc, LazyLock, Mutex};

use seccompiler::TargetArch;
use serde_json::{Value, json};

use crate::spawn::SeccompProgram;
use crate::spawn::libseccomp::{self, TreeRule};

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

/// Compiles the named profiles now, at the daemon's start, and says
/// (INFO) when filters cannot be trees.
pub fn prepare() {
    LazyLock::force(&COMPILED);
    if let Err(reason) = libseccomp::available() {
        tracing::info!(
            "seccomp filters are linear chains ({reason}): a child that installs one takes \
             ~0.3 ms longer to start than with libseccomp's trees"
        );
    }
}

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

/// What a filter does with a syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Allow,
    Errno(u32),
    KillProcess,
    Trap,
    Log,
}

impl Action {
    /// seccompiler's JSON for it.
    fn json(self) -> Value {
        match self {
            Action::Allow => json!("allow"),
            Action::Errno(errno) => json!({ "errno": errno }),
            Action::KillProcess => json!("kill_process"),
            Action::Trap => json!("trap"),
            Action::Log => json!("log"),
        }
    }

    /// The `SECCOMP_RET_*` value a filter returns for it.
    fn ret(self) -> u32 {
        match self {
            Action::Allow => 0x7fff_0000,
            Action::Errno(errno) => 0x0005_0000 | (errno & 0xffff),
            Action::KillProcess => 0x8000_0000,
            Action::Trap => 0x0003_0000,
            Action::Log => 0x7ffc_0000,
        }
    }
}

/// A filter before compiling: `matched` for the rules, `default` for
/// every other syscall.
struct FilterSpec {
    default: Action,
    matched: Action,
    rules: Vec<TreeRule>,
}

const EPERM: Action = Action::Errno(libc::EPERM as u32);

fn compile_profile(name: &str) -> Result<SeccompProgram, String> {
    compile(name, &profile_spec(name))
}

/// A named profile's rules: a deny-list, `strict` longer than `default`.
fn profile_spec(name: &str) -> FilterSpec {
    let mut rules: Vec<TreeRule> = DEFAULT_DENIED.iter().map(|s| rule(s)).collect();
    if name == "strict" {
        rules.extend(STRICT_DENIED.iter().map(|s| rule(s)));
        rules.extend(namespace_clone_rules());
    }
    FilterSpec {
        default: Action::Allow,
        matched: EPERM,
        rules,
    }
}

fn rule(name: &str) -> TreeRule {
    TreeRule {
        syscall: name.to_owned(),
        arg0_has_bits: None,
    }
}

/// `clone` with any `CLONE_NEW*` flag (its first argument on x86_64 and
/// aarch64). `clone3` passes its flags in memory, which seccomp cannot
/// read: `strict` leaves it allowed, and new user namespaces are then
/// still possible through it (they give no access beyond the peer's).
fn namespace_clone_rules() -> Vec<TreeRule> {
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
    .map(|flag| TreeRule {
        syscall: "clone".into(),
        arg0_has_bits: Some(u64::from(flag.unsigned_abs())),
    })
    .collect()
}

/// Compiled custom filters by their text, so that a peer repeating one
/// compiles it once; emptied when full.
static CUSTOM: LazyLock<Mutex<HashMap<String, Arc<SeccompProgram>>>> =
    LazyLock::new(Mutex::default);
const CUSTOM_CACHED: usize = 32;

/// Compiles a custom filter's text (see the module's format), or takes
/// it from the cache.
///
/// # Errors
///
/// A message naming the line that does not parse, the unknown syscall,
/// or the limit exceeded.
pub fn custom(text: &str) -> Result<Arc<SeccompProgram>, String> {
    let cache = || {
        CUSTOM
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    };
    if let Some(program) = cache().get(text) {
        return Ok(Arc::clone(program));
    }
    let program = Arc::new(compile("custom", &parse_custom(text)?)?);
    let mut cache = cache();
    if cache.len() >= CUSTOM_CACHED {
        cache.clear();
    }
    cache.insert(text.to_owned(), Arc::clone(&program));
    Ok(program)
}

fn parse_custom(text: &str) -> Result<FilterSpec, String> {
    if text.len() > MAX_FILTER_BYTES {
        return Err(format!(
            "seccomp filter: {} bytes, more than the {MAX_FILTER_BYTES} allowed",
            text.len()
        ));
    }
    let mut default = Action::Allow;
    let mut matched = EPERM;
    let mut rules = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let at = |message: String| format!("seccomp filter line {}: {message}", number + 1);
        let mut words = line.split_whitespace();
        match words.next() {
            None => {}
            Some("default") => default = parse_action(words.collect()).map_err(at)?,
            Some("action") => matched = parse_action(words.collect()).map_err(at)?,
            Some(name) => {
                let valid = name
                    .bytes()
                    .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
                if !valid || words.next().is_some() {
                    return Err(at(format!(
                        "{line:?} is neither `default ACTION`, `action ACTION` nor a syscall name"
                    )));
                }
                rules.push(rule(name));
            }
        }
    }
    if rules.len() > MAX_FILTER_SYSCALLS {
        return Err(format!(
            "seccomp filter: {} syscalls, more than the {MAX_FILTER_SYSCALLS} allowed",
            rules.len()
        ));
    }
    if default == matched {
        return Err("seccomp filter: `default` and `action` must differ".into());
    }
    Ok(FilterSpec {
        default,
        matched,
        rules,
    })
}

fn parse_action(words: Vec<&str>) -> Result<Action, String> {
    Ok(match words.as_slice() {
        ["allow"] => Action::Allow,
        ["kill"] => Action::KillProcess,
        ["trap"] => Action::Trap,
        ["log"] => Action::Log,
        ["errno", errno] => Action::Errno(parse_errno(errno)?),
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

/// Compiles one filter for this machine's architecture: seccompiler's
/// chain, which also checks every name, then libseccomp's tree for the
/// same rules where libseccomp is there; either way behind the x32 guard.
fn compile(name: &str, spec: &FilterSpec) -> Result<SeccompProgram, String> {
    let chain = compile_chain(name, spec)?;
    let mut filter =
        match libseccomp::compile_tree(spec.default.ret(), spec.matched.ret(), &spec.rules) {
            Ok(tree) => tree,
            Err(reason) => {
                tracing::debug!(
                    filter = name,
                    "seccomp filter compiled as a chain: {reason}"
                );
                chain
            }
        };
    x32_guard(&mut filter);
    Ok(SeccompProgram {
        name: name.to_owned(),
        filter,
    })
}

/// seccompiler's program for a filter: a linear chain, two steps per
/// syscall.
fn compile_chain(name: &str, spec: &FilterSpec) -> Result<Vec<libc::sock_filter>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|error| format!("seccomp: {error}"))?;
    let rules: Vec<Value> = spec
        .rules
        .iter()
        .map(|rule| match rule.arg0_has_bits {
            None => json!({ "syscall": rule.syscall }),
            Some(bits) => json!({
                "syscall": rule.syscall,
                "args": [{"index": 0, "type": "qword", "op": {"masked_eq": bits}, "val": bits}],
            }),
        })
        .collect();
    let filter = json!({
        "mismatch_action": spec.default.json(),
        "match_action": spec.matched.json(),
        "filter": rules,
    });
    let text = json!({ "filter": filter }).to_string();
    let mut compiled = seccompiler::compile_from_json(text.as_bytes(), arch).map_err(|error| {
        // seccompiler's message names the unknown syscall.
        format!("seccomp filter {name}: {error}")
    })?;
    let program = compiled
        .remove("filter")
        .ok_or_else(|| format!("seccomp filter {name}: nothing compiled"))?;
    Ok(program
        .into_iter()
        .map(|insn| libc::sock_filter {
            code: insn.code,
            jt: insn.jt,
            jf: insn.jf,
            k: insn.k,
        })
        .collect())
}

/// On x86_64, x32 syscalls carry the x86_64 architecture with bit 30 set
/// in their number, so a deny-list keyed on x86_64 numbers would miss
/// them: refuse every one with `ENOSYS`, before anything else (BPF jumps
/// only forward, so the program after it is unchanged).
fn x32_guard(filter: &mut Vec<libc::sock_filter>) {
    if std::env::consts::ARCH != "x86_64" {
        return;
    }
    const LD_W_ABS: u16 = 0x20;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let insn = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let guard = [
        insn(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        insn(JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(RET_K, 0, 0, Action::Errno(libc::ENOSYS as u32).ret()),
    ];
    filter.splice(0..0, guard);
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

    #[test]
    fn a_repeated_custom_filter_is_compiled_once() {
        let text = "# compiled once\nkeyctl\n";
        let first = custom(text).unwrap();
        assert!(Arc::ptr_eq(&first, &custom(text).unwrap()));
        let other = custom("# another\nkeyctl\n").unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
    }

    /// Runs a classic BPF program on one syscall, as the kernel would:
    /// the opcodes seccompiler and libseccomp emit.
    fn run(filter: &[libc::sock_filter], nr: u32, arch: u32, arg0: u64) -> u32 {
        let word = |offset: u32| match offset {
            0 => nr,
            4 => arch,
            16 => arg0 as u32,
            20 => (arg0 >> 32) as u32,
            _ => 0,
        };
        let (mut a, mut x, mut memory, mut pc) = (0u32, 0u32, [0u32; 16], 0usize);
        loop {
            let insn = filter[pc];
            pc += 1;
            let k = insn.k;
            let jump = |taken: bool| usize::from(if taken { insn.jt } else { insn.jf });
            match insn.code {
                0x20 => a = word(k),            // ld [k]
                0x00 => a = k,                  // ld #k
                0x01 => x = k,                  // ldx #k
                0x60 => a = memory[k as usize], // ld M[k]
                0x61 => x = memory[k as usize], // ldx M[k]
                0x02 => memory[k as usize] = a, // st M[k]
                0x03 => memory[k as usize] = x, // stx M[k]
                0x07 => x = a,                  // tax
                0x87 => a = x,                  // txa
                0x54 => a &= k,                 // and #k
                0x05 => pc += k as usize,       // ja
                0x15 => pc += jump(a == k),     // jeq #k
                0x25 => pc += jump(a > k),      // jgt #k
                0x35 => pc += jump(a >= k),     // jge #k
                0x45 => pc += jump(a & k != 0), // jset #k
                0x1d => pc += jump(a == x),     // jeq x
                0x2d => pc += jump(a > x),      // jgt x
                0x3d => pc += jump(a >= x),     // jge x
                0x06 => return k,               // ret #k
                0x16 => return a,               // ret a
                code => panic!("opcode {code:#x} at {}", pc - 1),
            }
        }
    }

    /// libseccomp's tree gives every syscall the answer seccompiler's
    /// chain gives: native and x32 numbers, another architecture, and
    /// `clone`'s flags for `strict`.
    /// Where the dynamic linker knows libseccomp, filters are its trees:
    /// a failed load would only show as slower sandboxed spawns.
    #[test]
    fn libseccomp_is_used_where_it_is_installed() {
        let known = ["ldconfig", "/sbin/ldconfig"].iter().find_map(|ldconfig| {
            let output = std::process::Command::new(ldconfig)
                .arg("-p")
                .output()
                .ok()?;
            Some(String::from_utf8_lossy(&output.stdout).contains("libseccomp.so.2"))
        });
        if known != Some(true) {
            return crate::spawn::tests::skip(
                "daemon::sandbox::seccomp::tests::libseccomp_is_used_where_it_is_installed",
                "ldconfig knows no libseccomp.so.2",
            );
        }
        assert_eq!(libseccomp::available(), Ok(()));
    }

    #[test]
    fn trees_and_chains_answer_every_syscall_alike() {
        const X86_64: u32 = 0xc000_003e;
        const I386: u32 = 0x4000_0003;
        if std::env::consts::ARCH != "x86_64" {
            return crate::spawn::tests::skip(
                "daemon::sandbox::seccomp::tests::trees_and_chains_answer_every_syscall_alike",
                "the evaluator's numbers are x86_64's",
            );
        }
        if let Err(reason) = libseccomp::available() {
            return crate::spawn::tests::skip(
                "daemon::sandbox::seccomp::tests::trees_and_chains_answer_every_syscall_alike",
                &reason,
            );
        }
        let mut specs: Vec<(&str, FilterSpec)> = PROFILES
            .iter()
            .map(|name| (*name, profile_spec(name)))
            .collect();
        let allow_list = "default kill\naction allow\nread\nwrite\nexit_group\nexecve\n";
        specs.push(("allow-list", parse_custom(allow_list).unwrap()));
        let clone_args = [
            0,
            u64::MAX,
            libc::SIGCHLD as u64,
            0x1000_0000 | 0x11,
            0x2000_0000,
        ];
        for (name, spec) in &specs {
            let mut chain = compile_chain(name, spec).unwrap();
            x32_guard(&mut chain);
            let (default, matched) = (spec.default.ret(), spec.matched.ret());
            let mut tree = libseccomp::compile_tree(default, matched, &spec.rules).unwrap();
            x32_guard(&mut tree);
            let mut matches = 0;
            for arch in [X86_64, I386] {
                for nr in (0..600).chain(0x4000_0000..0x4000_0000 + 600) {
                    for arg0 in clone_args {
                        let answer = run(&chain, nr, arch, arg0);
                        assert_eq!(
                            run(&tree, nr, arch, arg0),
                            answer,
                            "{name}: nr {nr:#x}, arch {arch:#x}, arg0 {arg0:#x}"
                        );
                        matches += u32::from(answer == matched);
                    }
                }
            }
            // The evaluator saw the rules match (it is not comparing two
            // programs that allow everything).
            assert!(matches >= 4 * 5, "{name}: {matches}");
            assert!(
                tree.len() < chain.len(),
                "{name}: {} >= {}",
                tree.len(),
                chain.len()
            );
        }
    }
}
