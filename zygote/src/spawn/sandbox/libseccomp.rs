//! libseccomp, loaded at run time when the machine has it, for the one
//! thing seccompiler cannot do: a filter shaped as a binary tree over
//! syscall numbers (`SCMP_FLTATR_CTL_OPTIMIZE` = 2).
//!
//! When a filter is attached, the kernel runs it once for every syscall
//! number to fill its action cache, so a linear chain of N rules costs
//! ~N steps per number and a tree ~log2(N): on the `default` profile,
//! ~0.3 to 0.5 ms less per child that installs a filter. Without
//! libseccomp (a static build, a machine without `libseccomp.so.2`, a
//! version before 2.5) the daemon keeps seccompiler's chain, which
//! refuses the same syscalls.
//!
//! Only the daemon calls this, to compile a program once; children only
//! install the instructions it exported.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::io::{Read, Seek};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{LazyLock, Mutex};

/// One rule: a syscall by name, and optionally a masked-equal test on
/// its first argument (`arg0 & mask == mask`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeRule {
    /// The syscall's name, as in `syscalls(2)`.
    pub syscall: String,
    /// Match only when every bit of the mask is set in the first argument.
    pub arg0_has_bits: Option<u64>,
}

/// `struct scmp_arg_cmp`.
#[repr(C)]
struct ArgCompare {
    arg: c_uint,
    op: c_int,
    datum_a: u64,
    datum_b: u64,
}

const SCMP_FLTATR_ACT_BADARCH: c_int = 2;
const SCMP_FLTATR_CTL_OPTIMIZE: c_int = 8;
const SCMP_CMP_MASKED_EQ: c_int = 7;
/// `__NR_SCMP_ERROR`: a name this libseccomp does not know.
const UNKNOWN_SYSCALL: c_int = -1;
/// `SECCOMP_RET_KILL_PROCESS`, what seccompiler's chain does for another
/// architecture.
const KILL_PROCESS: u32 = 0x8000_0000;

type InitFn = unsafe extern "C" fn(u32) -> *mut c_void;
type ReleaseFn = unsafe extern "C" fn(*mut c_void);
type AttrSetFn = unsafe extern "C" fn(*mut c_void, c_int, u32) -> c_int;
type ResolveNameFn = unsafe extern "C" fn(*const c_char) -> c_int;
type RuleAddArrayFn =
    unsafe extern "C" fn(*mut c_void, u32, c_int, c_uint, *const ArgCompare) -> c_int;
type ExportBpfFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;

/// The entry points used, resolved once with `dlsym`.
struct Library {
    init: InitFn,
    release: ReleaseFn,
    attr_set: AttrSetFn,
    resolve_name: ResolveNameFn,
    rule_add_array: RuleAddArrayFn,
    export_bpf: ExportBpfFn,
}

/// The library, or why it is not used.
static LIBRARY: LazyLock<Result<Library, String>> = LazyLock::new(load);

/// libseccomp keeps no state between contexts that matters here, but its
/// thread safety is not documented: one compile at a time.
static COMPILING: Mutex<()> = Mutex::new(());

/// Whether filters are compiled as trees, or why not.
///
/// # Errors
///
/// Why libseccomp is not used.
pub fn available() -> Result<(), String> {
    LIBRARY.as_ref().map(drop).map_err(Clone::clone)
}

fn load() -> Result<Library, String> {
    let name = c"libseccomp.so.2";
    // SAFETY: dlopen with a NUL-terminated name; the handle is never
    // closed, so the symbols below stay valid for the process's life.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err("libseccomp.so.2 cannot be loaded".into());
    }
    let symbol = |name: &CStr| {
        // SAFETY: dlsym on a live handle with a NUL-terminated name.
        let address = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if address.is_null() {
            Err(format!("libseccomp has no {}", name.to_string_lossy()))
        } else {
            Ok(address)
        }
    };
    // SAFETY: each symbol is transmuted to the signature libseccomp's
    // seccomp.h declares for it (stable since libseccomp 2.0; the
    // optimizer attribute is checked at compile time, below).
    unsafe {
        Ok(Library {
            init: std::mem::transmute::<*mut c_void, InitFn>(symbol(c"seccomp_init")?),
            release: std::mem::transmute::<*mut c_void, ReleaseFn>(symbol(c"seccomp_release")?),
            attr_set: std::mem::transmute::<*mut c_void, AttrSetFn>(symbol(c"seccomp_attr_set")?),
            resolve_name: std::mem::transmute::<*mut c_void, ResolveNameFn>(symbol(
                c"seccomp_syscall_resolve_name",
            )?),
            rule_add_array: std::mem::transmute::<*mut c_void, RuleAddArrayFn>(symbol(
                c"seccomp_rule_add_array",
            )?),
            export_bpf: std::mem::transmute::<*mut c_void, ExportBpfFn>(symbol(
                c"seccomp_export_bpf",
            )?),
        })
    }
}

/// A filter context, released when dropped.
struct Context<'a> {
    library: &'a Library,
    raw: *mut c_void,
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from seccomp_init and is released once.
        unsafe { (self.library.release)(self.raw) }
    }
}

/// Compiles a deny- or allow-list as a binary tree for this machine's
/// architecture: `default` for every syscall not matched, `matched` for
/// the rules (both `SECCOMP_RET_*` values). Another architecture's
/// syscalls kill the process, as in seccompiler's chain.
///
/// # Errors
///
/// libseccomp is missing or too old, does not know a syscall name, or
/// refuses a rule: the caller keeps its chain.
pub fn compile_tree(
    default: u32,
    matched: u32,
    rules: &[TreeRule],
) -> Result<Vec<libc::sock_filter>, String> {
    let library = LIBRARY.as_ref().map_err(Clone::clone)?;
    let _one_at_a_time = COMPILING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // SAFETY: seccomp_init takes an action value and returns a context
    // or NULL.
    let raw = unsafe { (library.init)(default) };
    if raw.is_null() {
        return Err(format!(
            "libseccomp refused the default action {default:#x}"
        ));
    }
    let context = Context { library, raw };
    let attributes = [
        (SCMP_FLTATR_CTL_OPTIMIZE, 2),
        (SCMP_FLTATR_ACT_BADARCH, KILL_PROCESS),
    ];
    for (attribute, value) in attributes {
        // SAFETY: sets an attribute of a live context.
        let ret = unsafe { (library.attr_set)(context.raw, attribute, value) };
        if ret != 0 {
            return Err(format!(
                "libseccomp refused attribute {attribute}: {ret} (before 2.5?)"
            ));
        }
    }
    for rule in rules {
        add_rule(&context, matched, rule)?;
    }
    export(&context)
}

fn add_rule(context: &Context<'_>, action: u32, rule: &TreeRule) -> Result<(), String> {
    let name = CString::new(rule.syscall.as_str()).map_err(|_| "a NUL in a syscall name")?;
    // SAFETY: resolves a NUL-terminated name.
    let number = unsafe { (context.library.resolve_name)(name.as_ptr()) };
    if number == UNKNOWN_SYSCALL {
        return Err(format!("libseccomp does not know {:?}", rule.syscall));
    }
    let compare = rule.arg0_has_bits.map(|mask| ArgCompare {
        arg: 0,
        op: SCMP_CMP_MASKED_EQ,
        datum_a: mask,
        datum_b: mask,
    });
    let (count, compares) = match &compare {
        Some(compare) => (1, std::ptr::from_ref(compare)),
        None => (0, std::ptr::null()),
    };
    // SAFETY: `compares` points at `count` valid comparisons (or is NULL
    // with a count of 0) for the duration of the call.
    let ret =
        unsafe { (context.library.rule_add_array)(context.raw, action, number, count, compares) };
    if ret != 0 {
        return Err(format!(
            "libseccomp refused the rule for {:?}: {ret}",
            rule.syscall
        ));
    }
    Ok(())
}

/// Exports the program into a memfd and reads it back.
fn export(context: &Context<'_>) -> Result<Vec<libc::sock_filter>, String> {
    // SAFETY: memfd_create with a NUL-terminated name; the fd is owned
    // below.
    let fd = unsafe { libc::memfd_create(c"seccomp-bpf".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    // SAFETY: writes the program to a live fd of ours.
    let ret = unsafe { (context.library.export_bpf)(context.raw, file.as_raw_fd()) };
    if ret != 0 {
        return Err(format!("libseccomp could not export the filter: {ret}"));
    }
    let mut bytes = Vec::new();
    file.rewind()
        .and_then(|()| file.read_to_end(&mut bytes))
        .map_err(|error| format!("reading the exported filter: {error}"))?;
    if bytes.is_empty() || bytes.len() % 8 != 0 {
        return Err(format!("libseccomp exported {} bytes", bytes.len()));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|insn| libc::sock_filter {
            code: u16::from_ne_bytes([insn[0], insn[1]]),
            jt: insn[2],
            jf: insn[3],
            k: u32::from_ne_bytes([insn[4], insn[5], insn[6], insn[7]]),
        })
        .collect())
}
