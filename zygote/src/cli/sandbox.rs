//! The sandbox options of `zygote run`: `--sandbox`, the mounts
//! (`--ro-bind`, `--bind`, `--tmpfs`, applied in command-line order),
//! `--network`, `--isolate`, `--hostname`, `--seccomp` and the Landlock
//! rules; and their translation into a [`Sandbox`].
//!
//! The clap definition is written by hand (not derived) only to keep the
//! mounts in the order given across the three flags.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches};
use zygote_client::Sandbox;

/// One mount, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// `--ro-bind SRC[:DST]`.
    ReadOnly(OsString),
    /// `--bind SRC[:DST]`.
    ReadWrite(OsString),
    /// `--tmpfs DIR`.
    Tmpfs(OsString),
}

/// The sandbox options of `zygote run`, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxArgs {
    /// `--sandbox PROFILE`.
    pub profile: Option<String>,
    /// The mounts, in command-line order.
    pub mounts: Vec<Mount>,
    /// `--network none`.
    pub network_none: bool,
    /// `--isolate`.
    pub isolate: bool,
    /// `--hostname NAME`.
    pub hostname: Option<String>,
    /// `--seccomp PROFILE|FILE`.
    pub seccomp: Option<OsString>,
    /// `--landlock-ro PATH`.
    pub landlock_ro: Vec<OsString>,
    /// `--landlock-rx PATH`.
    pub landlock_rx: Vec<OsString>,
    /// `--landlock-rw PATH`.
    pub landlock_rw: Vec<OsString>,
    /// `--landlock-require`.
    pub landlock_require: bool,
}

const MOUNTS: [(&str, &str, &str); 3] = [
    (
        "ro-bind",
        "SRC[:DST]",
        "Bind host path SRC read-only at DST (default: SRC) in a filesystem of the \
         child's own: an empty root with these mounts, in command-line order, and a \
         minimal /dev. A relative SRC is taken from the current directory",
    ),
    (
        "bind",
        "SRC[:DST]",
        "Bind host path SRC read-write at DST (default: SRC); see --ro-bind",
    ),
    (
        "tmpfs",
        "DIR",
        "Mount a fresh tmpfs at DIR in the child's own filesystem; see --ro-bind",
    ),
];

const LANDLOCK: [(&str, &str); 3] = [
    (
        "landlock-ro",
        "Landlock: the child may read PATH (and beneath it); relative to the current directory",
    ),
    (
        "landlock-rx",
        "Landlock: the child may read and execute PATH",
    ),
    ("landlock-rw", "Landlock: the child may read and write PATH"),
];

fn os_string() -> clap::builder::ValueParser {
    clap::builder::ValueParser::os_string()
}

impl Args for SandboxArgs {
    fn augment_args(command: clap::Command) -> clap::Command {
        let mut command = command.next_help_heading("Sandbox").arg(
            Arg::new("sandbox")
                .long("sandbox")
                .value_name("PROFILE")
                .help(
                    "Confine the child in PROFILE, a profile of the zygote's policy file; the \
                     other sandbox options can only tighten it. Every sandbox option is \
                     refused, and nothing runs, when the zygote does not offer sandboxes",
                ),
        );
        for (name, value, help) in MOUNTS {
            command = command.arg(
                Arg::new(name)
                    .long(name)
                    .value_name(value)
                    .value_parser(os_string())
                    .action(ArgAction::Append)
                    .help(help),
            );
        }
        command = command
            .arg(
                Arg::new("network")
                    .long("network")
                    .value_name("MODE")
                    .value_parser(["none", "host"])
                    .help("none: an empty network namespace (loopback down); host: the host's"),
            )
            .arg(
                Arg::new("isolate")
                    .long("isolate")
                    .action(ArgAction::SetTrue)
                    .help("New pid, ipc and uts namespaces"),
            )
            .arg(
                Arg::new("hostname")
                    .long("hostname")
                    .value_name("NAME")
                    .requires("isolate")
                    .help("The hostname inside; needs --isolate"),
            )
            .arg(
                Arg::new("seccomp")
                    .long("seccomp")
                    .value_name("PROFILE|FILE")
                    .value_parser(os_string())
                    .help(
                        "A seccomp filter, installed last before exec: a value with a / or \
                         naming an existing file is read here and sent as a custom filter; \
                         any other is a profile name (default, strict, or the policy's)",
                    ),
            );
        for (name, help) in LANDLOCK {
            command = command.arg(
                Arg::new(name)
                    .long(name)
                    .value_name("PATH")
                    .value_parser(os_string())
                    .action(ArgAction::Append)
                    .help(help),
            );
        }
        command
            .arg(
                Arg::new("landlock-require")
                    .long("landlock-require")
                    .action(ArgAction::SetTrue)
                    .help(
                        "Refuse the spawn when the kernel cannot enforce every Landlock rule \
                         (by default they are enforced as far as it can)",
                    ),
            )
            // The arguments declared after these are not sandbox options.
            .next_help_heading(None::<&str>)
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

/// The values of `name` with their positions on the command line.
fn indexed(matches: &ArgMatches, name: &str) -> Vec<(usize, OsString)> {
    match (matches.indices_of(name), matches.get_many::<OsString>(name)) {
        (Some(indices), Some(values)) => indices.zip(values.cloned()).collect(),
        _ => Vec::new(),
    }
}

fn all(matches: &ArgMatches, name: &str) -> Vec<OsString> {
    matches
        .get_many::<OsString>(name)
        .map(|values| values.cloned().collect())
        .unwrap_or_default()
}

impl FromArgMatches for SandboxArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut mounts: Vec<(usize, Mount)> = Vec::new();
        for (name, kind) in [
            ("ro-bind", Mount::ReadOnly as fn(OsString) -> Mount),
            ("bind", Mount::ReadWrite),
            ("tmpfs", Mount::Tmpfs),
        ] {
            mounts.extend(
                indexed(matches, name)
                    .into_iter()
                    .map(|(at, value)| (at, kind(value))),
            );
        }
        mounts.sort_by_key(|(at, _)| *at);
        Ok(Self {
            profile: matches.get_one::<String>("sandbox").cloned(),
            mounts: mounts.into_iter().map(|(_, mount)| mount).collect(),
            network_none: matches.get_one::<String>("network").map(String::as_str) == Some("none"),
            isolate: matches.get_flag("isolate"),
            hostname: matches.get_one::<String>("hostname").cloned(),
            seccomp: matches.get_one::<OsString>("seccomp").cloned(),
            landlock_ro: all(matches, "landlock-ro"),
            landlock_rx: all(matches, "landlock-rx"),
            landlock_rw: all(matches, "landlock-rw"),
            landlock_require: matches.get_flag("landlock-require"),
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

/// A host path: relative ones from the current directory.
fn host_path(path: &OsString) -> Result<PathBuf, String> {
    let path = Path::new(path);
    if path.as_os_str().is_empty() {
        return Err("an empty path".to_owned());
    }
    if path.is_absolute() {
        return Ok(path.to_owned());
    }
    std::env::current_dir()
        .map(|dir| dir.join(path))
        .map_err(|error| format!("{}: the current directory: {error}", path.display()))
}

/// A path inside the sandbox, which must be absolute.
fn inside_path(path: &[u8]) -> Result<PathBuf, String> {
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    if path.is_absolute() {
        Ok(path.to_owned())
    } else {
        Err(format!(
            "{}: a path inside the sandbox must be absolute",
            path.display()
        ))
    }
}

/// `SRC[:DST]` (split at the first `:`) as host and inside paths.
fn source_and_destination(value: &OsString) -> Result<(PathBuf, PathBuf), String> {
    let bytes = value.as_bytes();
    let (source, destination) = match bytes.iter().position(|byte| *byte == b':') {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, bytes),
    };
    let source = host_path(&std::ffi::OsStr::from_bytes(source).to_owned())?;
    // Without a DST the host path, made absolute, is the inside path too.
    let destination = if destination == bytes && !bytes.contains(&b':') {
        source.clone()
    } else {
        inside_path(destination)?
    };
    Ok((source, destination))
}

impl SandboxArgs {
    /// Whether any sandbox option was given.
    pub fn any(&self) -> bool {
        *self != Self::default()
    }

    /// The sandbox these options ask for; `Ok(None)` when none was given.
    /// A `--seccomp` file is read here.
    ///
    /// # Errors
    ///
    /// A sentence naming the option and the value that cannot be used.
    pub fn sandbox(&self) -> Result<Option<Sandbox>, String> {
        if !self.any() {
            return Ok(None);
        }
        let mut sandbox = Sandbox::new();
        if let Some(profile) = &self.profile {
            sandbox = sandbox.profile(profile);
        }
        for mount in &self.mounts {
            sandbox = match mount {
                Mount::ReadOnly(value) => {
                    let (source, destination) = source_and_destination(value).map_err(|error| {
                        format!("--ro-bind {}: {error}", Path::new(value).display())
                    })?;
                    sandbox.ro_bind(source, destination)
                }
                Mount::ReadWrite(value) => {
                    let (source, destination) = source_and_destination(value).map_err(|error| {
                        format!("--bind {}: {error}", Path::new(value).display())
                    })?;
                    sandbox.bind(source, destination)
                }
                Mount::Tmpfs(value) => {
                    sandbox.tmpfs(inside_path(value.as_bytes()).map_err(|error| {
                        format!("--tmpfs {}: {error}", Path::new(value).display())
                    })?)
                }
            };
        }
        if self.network_none {
            sandbox = sandbox.network_none();
        }
        if self.isolate {
            sandbox = sandbox.isolate();
        }
        if let Some(name) = &self.hostname {
            sandbox = sandbox.hostname(name);
        }
        if let Some(value) = &self.seccomp {
            sandbox = seccomp(sandbox, value)?;
        }
        sandbox = self.landlock(sandbox)?;
        Ok(Some(sandbox))
    }

    fn landlock(&self, mut sandbox: Sandbox) -> Result<Sandbox, String> {
        type Add = fn(Sandbox, PathBuf) -> Sandbox;
        let lists: [(&str, &Vec<OsString>, Add); 3] = [
            ("--landlock-ro", &self.landlock_ro, Sandbox::landlock_ro),
            ("--landlock-rx", &self.landlock_rx, Sandbox::landlock_rx),
            ("--landlock-rw", &self.landlock_rw, Sandbox::landlock_rw),
        ];
        for (flag, paths, add) in lists {
            for path in paths {
                let path = host_path(path)
                    .map_err(|error| format!("{flag} {}: {error}", Path::new(path).display()))?;
                sandbox = add(sandbox, path);
            }
        }
        if self.landlock_require {
            sandbox = sandbox.landlock_require(true);
        }
        Ok(sandbox)
    }
}

/// `--seccomp`: a file's text (a value with a `/`, or naming an existing
/// file) as a custom filter, else a profile name.
fn seccomp(sandbox: Sandbox, value: &OsString) -> Result<Sandbox, String> {
    let path = Path::new(value);
    if !value.as_bytes().contains(&b'/') && !path.is_file() {
        let name = value.to_str().ok_or_else(|| {
            format!(
                "--seccomp {}: not a profile name",
                Path::new(value).display()
            )
        })?;
        return Ok(sandbox.seccomp_profile(name));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("--seccomp {}: {error}", path.display()))?;
    Ok(sandbox.seccomp_filter(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        sandbox: SandboxArgs,
    }

    fn parse(args: &[&str]) -> SandboxArgs {
        let argv = std::iter::once("zygote-run").chain(args.iter().copied());
        Cli::try_parse_from(argv).expect("parses").sandbox
    }

    #[test]
    fn mounts_keep_their_command_line_order() {
        let args = parse(&[
            "--tmpfs",
            "/tmp",
            "--ro-bind",
            "/usr",
            "--bind",
            "/srv/work:/work",
            "--ro-bind",
            "/etc/ssl:/etc/ssl",
        ]);
        assert_eq!(
            args.mounts,
            [
                Mount::Tmpfs("/tmp".into()),
                Mount::ReadOnly("/usr".into()),
                Mount::ReadWrite("/srv/work:/work".into()),
                Mount::ReadOnly("/etc/ssl:/etc/ssl".into()),
            ]
        );
        assert!(args.any());
        assert!(!parse(&[]).any(), "no option, no sandbox");
        assert_eq!(parse(&[]).sandbox(), Ok(None));
    }

    #[test]
    fn options_become_the_sandbox() {
        let args = parse(&[
            "--sandbox",
            "build",
            "--ro-bind",
            "/usr",
            "--bind",
            "/srv/work:/work",
            "--network",
            "none",
            "--isolate",
            "--hostname",
            "box",
            "--seccomp",
            "strict",
            "--landlock-ro",
            "/usr",
            "--landlock-rx",
            "/usr/bin",
            "--landlock-rw",
            "/work",
            "--landlock-require",
        ]);
        let expected = Sandbox::new()
            .profile("build")
            .ro_bind("/usr", "/usr")
            .bind("/srv/work", "/work")
            .network_none()
            .isolate()
            .hostname("box")
            .seccomp_profile("strict")
            .landlock_ro("/usr")
            .landlock_rx("/usr/bin")
            .landlock_rw("/work")
            .landlock_require(true);
        assert_eq!(args.sandbox(), Ok(Some(expected)));
        assert!(!parse(&["--network", "host"]).network_none);
        assert!(
            Cli::try_parse_from(["zygote-run", "--network", "bridge"]).is_err(),
            "an unknown network mode"
        );
        assert!(
            Cli::try_parse_from(["zygote-run", "--hostname", "box"]).is_err(),
            "--hostname needs --isolate"
        );
    }

    #[test]
    fn seccomp_takes_a_file_or_a_profile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("filter");
        std::fs::write(&file, "deny ptrace\n").expect("write");
        let from_file = parse(&["--seccomp", file.to_str().expect("utf-8")]);
        assert_eq!(
            from_file.sandbox(),
            Ok(Some(Sandbox::new().seccomp_filter("deny ptrace\n")))
        );
        let missing = parse(&["--seccomp", "/nonexistent/filter"]).sandbox();
        assert!(
            missing
                .as_ref()
                .is_err_and(|error| error.starts_with("--seccomp /nonexistent/filter:")),
            "{missing:?}"
        );
        assert_eq!(
            parse(&["--seccomp", "default"]).sandbox(),
            Ok(Some(Sandbox::new().seccomp_profile("default")))
        );
    }

    #[test]
    fn paths_are_made_absolute_or_refused() {
        let here = std::env::current_dir().expect("cwd");
        assert_eq!(
            parse(&["--ro-bind", "data", "--landlock-rw", "out"]).sandbox(),
            Ok(Some(
                Sandbox::new()
                    .ro_bind(here.join("data"), here.join("data"))
                    .landlock_rw(here.join("out"))
            ))
        );
        let relative_inside = parse(&["--bind", "/srv:work"]).sandbox();
        assert!(
            relative_inside.as_ref().is_err_and(
                |error| error.contains("--bind /srv:work") && error.contains("absolute")
            ),
            "{relative_inside:?}"
        );
        let tmpfs = parse(&["--tmpfs", "tmp"]).sandbox();
        assert!(
            tmpfs
                .as_ref()
                .is_err_and(|error| error.starts_with("--tmpfs tmp:")),
            "{tmpfs:?}"
        );
    }
}
