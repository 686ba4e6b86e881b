//! Warm templates: an interpreter the zygote starts for this peer, which
//! imports a list of modules once and then forks children that run
//! without an exec (protocol version 4, feature `templates`).
//!
//! [`Client::python_template`] gives a [`TemplateBuilder`]; its
//! [`start`](TemplateBuilder::start) asks the zygote for the template and
//! returns a [`Template`], whose [`command`](Template::command) is a
//! [`Command`] like any other: stdio, environment, working directory,
//! timeouts and the rest mean what they mean for a cold spawn.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use zygote_proto::{Env, PYTHON_TEMPLATE, SpawnStage, TemplateInfo, TemplateRequest};

use crate::client::Session;
use crate::{Client, Command, Error, Feature, Result};

/// Most modules a template may preload.
pub const MAX_PRELOAD: usize = 256;
/// Longest module name a template may preload, in bytes.
pub const MAX_PRELOAD_NAME_BYTES: usize = 256;
/// The interpreter a Python template runs unless
/// [`python`](TemplateBuilder::python) names another: looked up in the
/// template's `PATH`.
pub const DEFAULT_PYTHON: &str = "python3";

/// A template to ask the zygote for, built like a [`Command`]: made by
/// [`Client::python_template`], started with
/// [`start`](TemplateBuilder::start).
///
/// By default the template is what this process would have started
/// itself: `python3` from `PATH`, this process's environment (with the
/// changes made here) and working directory.
#[derive(Debug, Clone)]
pub struct TemplateBuilder {
    client: Client,
    interpreter: OsString,
    preload: Vec<String>,
    env_clear: bool,
    env: BTreeMap<OsString, Option<OsString>>,
    cwd: Option<PathBuf>,
}

impl TemplateBuilder {
    pub(crate) fn new(client: &Client, preload: Vec<String>) -> Self {
        Self {
            client: client.clone(),
            interpreter: OsString::from(DEFAULT_PYTHON),
            preload,
            env_clear: false,
            env: BTreeMap::new(),
            cwd: None,
        }
    }

    /// The interpreter to run: a path, or a name looked up in the
    /// template's `PATH`. `python3` unless set.
    pub fn python(&mut self, interpreter: impl AsRef<OsStr>) -> &mut Self {
        self.interpreter = interpreter.as_ref().to_owned();
        self
    }

    /// Sets an environment variable for the template, which its preloads
    /// see. Each child still gets its own command's environment.
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.env
            .insert(key.as_ref().to_owned(), Some(value.as_ref().to_owned()));
        self
    }

    /// Sets several environment variables.
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (key, value) in vars {
            self.env(key, value);
        }
        self
    }

    /// Removes a variable from the template's environment.
    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Self {
        if self.env_clear {
            self.env.remove(key.as_ref());
        } else {
            self.env.insert(key.as_ref().to_owned(), None);
        }
        self
    }

    /// Starts the template's environment empty instead of from this
    /// process's, dropping earlier changes.
    pub fn env_clear(&mut self) -> &mut Self {
        self.env_clear = true;
        self.env.clear();
        self
    }

    /// The template's working directory while it imports (a relative
    /// path is taken from this process's). This process's own unless set.
    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.cwd = Some(dir.as_ref().to_owned());
        self
    }

    /// The request this builder describes, checked as the zygote would
    /// check it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an empty interpreter, a NUL byte, a
    /// preload that is not a dotted Python identifier, or too many or too
    /// long preloads; [`Error::Io`] when this process's working directory
    /// is needed and unknown.
    pub(crate) fn request(&self) -> Result<TemplateRequest> {
        check_interpreter(&self.interpreter)?;
        check_preload(&self.preload)?;
        let mut vars: Vec<(OsString, OsString)> = if self.env_clear {
            Vec::new()
        } else {
            std::env::vars_os().collect()
        };
        for (key, change) in &self.env {
            let existing = vars.iter().position(|(name, _)| name == key);
            match (change, existing) {
                (Some(value), Some(index)) => vars[index].1 = value.clone(),
                (Some(value), None) => vars.push((key.clone(), value.clone())),
                (None, Some(index)) => {
                    vars.remove(index);
                }
                (None, None) => {}
            }
        }
        let mut env = Env::default();
        for (key, value) in &vars {
            if key.as_bytes().contains(&0) || value.as_bytes().contains(&0) {
                return Err(Error::invalid(format!(
                    "template environment variable {key:?} contains a NUL byte"
                )));
            }
            env.push(key.as_bytes(), value.as_bytes());
        }
        let cwd = match &self.cwd {
            Some(dir) if dir.is_absolute() => dir.clone(),
            other => {
                let own = std::env::current_dir().map_err(|error| {
                    Error::io(
                        "reading the current directory (the template starts in the caller's)",
                        error,
                    )
                })?;
                match other {
                    Some(relative) => own.join(relative),
                    None => own,
                }
            }
        };
        if cwd.as_os_str().as_bytes().contains(&0) {
            return Err(Error::invalid(format!(
                "template working directory {cwd:?} contains a NUL byte"
            )));
        }
        Ok(TemplateRequest {
            id: 0,
            kind: PYTHON_TEMPLATE.to_owned(),
            interpreter: self.interpreter.as_bytes().to_vec(),
            preload: self.preload.clone(),
            env,
            cwd: Some(cwd.into_os_string().into_vec()),
        })
    }

    /// Asks the zygote for the template: a running one of the same
    /// interpreter, preloads, environment and working directory, or a new
    /// one, which is ready once every preload is imported. Returns when it
    /// is ready, or failed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (see above) and `EOPNOTSUPP` when the
    /// zygote does not offer the feature `templates`, both before anything
    /// is sent; [`Error::Request`] (op `template`) with the zygote's errno
    /// and message: the exec's errno for an interpreter that cannot run,
    /// `EPROTO` for a preload that raised (the message holds the
    /// traceback) or started a thread, `ETIMEDOUT`, `EAGAIN`;
    /// [`Error::ZygoteLost`].
    pub async fn start(&self) -> Result<Template> {
        let request = self.request()?;
        let shared = Arc::new(Shared {
            interpreter: self.interpreter.clone(),
            request,
            ready: Mutex::new(Ready::default()),
        });
        let template = Template {
            client: self.client.clone(),
            shared,
        };
        template.create().await?;
        Ok(template)
    }
}

/// A warm template, ready to fork children: see
/// [`Client::python_template`].
///
/// Cheap to clone; clones share the handle. The template lives in the
/// zygote while this peer's uid keeps a connection open and it is used
/// (the zygote stops one idle for 10 minutes); a handle the zygote no
/// longer knows is replaced by asking for the same template again, once,
/// at the next spawn.
#[derive(Debug, Clone)]
pub struct Template {
    client: Client,
    shared: Arc<Shared>,
}

/// What every clone of a [`Template`] shares: the request that makes it,
/// and the zygote's latest answer.
#[derive(Debug)]
pub(crate) struct Shared {
    interpreter: OsString,
    request: TemplateRequest,
    ready: Mutex<Ready>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Ready {
    handle: u64,
    pid: i32,
    reused: bool,
}

impl Shared {
    pub(crate) fn handle(&self) -> u64 {
        self.ready().handle
    }

    pub(crate) fn interpreter(&self) -> &OsStr {
        &self.interpreter
    }

    fn ready(&self) -> Ready {
        *self
            .ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends the template request again (the same spec) and keeps the
    /// handle of the answer.
    pub(crate) async fn create(&self, client: &Client) -> Result<()> {
        let session = client.session().await?;
        check_offered(&session, "template")?;
        let ready = session.template(self.request.clone()).await?;
        *self
            .ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Ready {
            handle: ready.template,
            pid: ready.pid,
            reused: ready.reused,
        };
        Ok(())
    }
}

impl Template {
    async fn create(&self) -> Result<()> {
        self.shared.create(&self.client).await
    }

    /// A [`Command`] that runs `args` in a child of this template, as
    /// `python ARGS` would: `["-c", CODE, ...]`, `["-m", MODULE, ...]` or
    /// `[SCRIPT, ...]`. Add arguments, set stdio, environment, working
    /// directory, limits, timeouts as for any command; a child cannot
    /// take another user ([`Command::uid`]), `argv[0]`
    /// ([`Command::arg0`]) or a sandbox: those are refused at spawn.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::from_template(&self.client, Arc::clone(&self.shared));
        command.args(args);
        command
    }

    /// The template's handle in the zygote.
    pub fn handle(&self) -> u64 {
        self.shared.ready().handle
    }

    /// The template process's pid, when the zygote last answered.
    pub fn pid(&self) -> i32 {
        self.shared.ready().pid
    }

    /// Whether the zygote's last answer found a running template rather
    /// than starting one.
    pub fn reused(&self) -> bool {
        self.shared.ready().reused
    }

    /// The interpreter, as given.
    pub fn interpreter(&self) -> &OsStr {
        &self.shared.interpreter
    }

    /// The modules it preloads, in order.
    pub fn preload(&self) -> &[String] {
        &self.shared.request.preload
    }
}

impl Client {
    /// A [`TemplateBuilder`] for a Python template that imports `preload`
    /// (module names, in order) before it forks children.
    ///
    /// ```no_run
    /// # async fn example() -> zygote_client::Result<()> {
    /// let client = zygote_client::Client::from_env().await?;
    /// let template = client.python_template(["json", "decimal"]).start().await?;
    /// let output = template.command(["-c", "import json; print(json.dumps(1))"]).output().await?;
    /// assert_eq!(output.stdout, b"1\n");
    /// # Ok(())
    /// # }
    /// ```
    pub fn python_template<I, S>(&self, preload: I) -> TemplateBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        TemplateBuilder::new(self, preload.into_iter().map(Into::into).collect())
    }

    /// The templates this peer may see: its uid's, or every uid's for root
    /// and the zygote's own uid.
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP` ([`Error::Request`]) when the zygote does not offer
    /// the feature `templates` (an older protocol version, or withheld;
    /// nothing is sent);
    /// [`Error::Request`] when it refuses; [`Error::ZygoteLost`].
    pub async fn templates(&self) -> Result<Vec<TemplateInfo>> {
        let session = self.session().await?;
        check_offered(&session, "list templates")?;
        session.list_templates().await
    }
}

/// `EOPNOTSUPP` ([`Error::Request`] for `op`) unless the zygote offered
/// the feature `templates` on this connection (a version-4 zygote may
/// withhold it; one of an older version never offers it).
fn check_offered(session: &Session, op: &'static str) -> Result<()> {
    let offered = session
        .features()
        .iter()
        .any(|name| name == Feature::Templates.name());
    if offered && session.protocol_version() >= zygote_proto::TEMPLATES_SINCE {
        return Ok(());
    }
    Err(Error::Request {
        op,
        errno: libc::EOPNOTSUPP,
        message: format!(
            "this zygote does not offer the feature templates (it offers: {}; protocol version \
             {}): the request was not sent",
            crate::command::offered(session.features()),
            session.protocol_version()
        ),
    })
}

/// Checks an interpreter before it is sent.
fn check_interpreter(interpreter: &OsStr) -> Result<()> {
    if interpreter.is_empty() {
        return Err(Error::invalid("the template's interpreter is empty"));
    }
    if interpreter.as_bytes().contains(&0) {
        return Err(Error::invalid(format!(
            "the template's interpreter {interpreter:?} contains a NUL byte"
        )));
    }
    Ok(())
}

/// Checks preload names as the zygote does: at most [`MAX_PRELOAD`], each
/// a dotted Python identifier of at most [`MAX_PRELOAD_NAME_BYTES`].
pub(crate) fn check_preload(preload: &[String]) -> Result<()> {
    if preload.len() > MAX_PRELOAD {
        return Err(Error::invalid(format!(
            "a template preloads at most {MAX_PRELOAD} modules, not {}",
            preload.len()
        )));
    }
    for name in preload {
        if name.len() > MAX_PRELOAD_NAME_BYTES {
            return Err(Error::invalid(format!(
                "preload module name {:?}... is {} bytes, over {MAX_PRELOAD_NAME_BYTES}",
                name.chars().take(32).collect::<String>(),
                name.len()
            )));
        }
        if !is_module_name(name) {
            return Err(Error::invalid(format!(
                "preload {name:?} is not a module name (dotted Python identifiers: letters, \
                 digits and _, not starting with a digit)"
            )));
        }
    }
    Ok(())
}

/// `[A-Za-z_][A-Za-z0-9_]*` parts joined by `.`.
fn is_module_name(name: &str) -> bool {
    name.split('.').all(|part| {
        let mut bytes = part.bytes();
        matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
            && bytes.all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
    })
}

/// Checks a template child's arguments before they are sent: they begin
/// with `-c CODE`, `-m MODULE`, or a script path not starting with `-`.
pub(crate) fn check_args(args: &[OsString]) -> Result<()> {
    let first = args.first().map(|arg| arg.as_bytes());
    match first {
        Some(b"-c" | b"-m") if args.len() >= 2 => Ok(()),
        Some(flag @ (b"-c" | b"-m")) => Err(Error::invalid(format!(
            "{} needs an argument after it",
            String::from_utf8_lossy(flag)
        ))),
        Some(script) if !script.is_empty() && !script.starts_with(b"-") => Ok(()),
        _ => Err(Error::invalid(format!(
            "a template child's arguments begin with -c CODE, -m MODULE or a script path, \
             not {:?}",
            args.first().map_or(OsStr::new(""), |arg| arg.as_os_str())
        ))),
    }
}

/// Whether a template spawn failed because the zygote no longer knows the
/// handle (it stopped the template): the cue to ask for it again.
pub(crate) fn is_unknown_template(error: &Error) -> bool {
    matches!(
        error,
        Error::Spawn {
            stage: SpawnStage::Validate,
            errno: libc::ENOENT,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_are_dotted_identifiers() {
        for good in ["json", "xml.etree.ElementTree", "_x", "a1._b2"] {
            assert!(is_module_name(good), "{good}");
        }
        for bad in ["", "1x", "a..b", "a.", ".a", "a-b", "a b", "é", "a.1"] {
            assert!(!is_module_name(bad), "{bad}");
        }
    }

    #[test]
    fn preload_limits_are_checked() {
        assert!(check_preload(&vec!["m".to_owned(); MAX_PRELOAD]).is_ok());
        let error = check_preload(&vec!["m".to_owned(); MAX_PRELOAD + 1]).unwrap_err();
        assert!(error.to_string().contains("at most 256"), "{error}");
        assert!(check_preload(&["a".repeat(MAX_PRELOAD_NAME_BYTES)]).is_ok());
        let error = check_preload(&["a".repeat(MAX_PRELOAD_NAME_BYTES + 1)]).unwrap_err();
        assert!(error.to_string().contains("257 bytes"), "{error}");
        let error = check_preload(&["os.path".to_owned(), "no-dash".to_owned()]).unwrap_err();
        assert!(error.to_string().contains("\"no-dash\""), "{error}");
    }

    #[test]
    fn child_args_begin_with_code_module_or_script() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(check_args(&args(&["-c", "pass"])).is_ok());
        assert!(check_args(&args(&["-m", "http.server", "0"])).is_ok());
        assert!(check_args(&args(&["script.py", "-x"])).is_ok());
        for bad in [&[][..], &["-c"], &["-m"], &["-u", "-c", "x"], &[""], &["-"]] {
            assert!(check_args(&args(bad)).is_err(), "{bad:?}");
        }
    }
}
