//! Parked inits ([`spawn::Spawner::park_sibling`]): the namespaces and root of a
//! sandbox with a pid namespace of its own, made before the spawn that
//! enters them.
//!
//! Making them is most of such a spawn's cost (a fork of the daemon, the
//! namespaces, the root's mounts, `/proc`, `pivot_root`). So after each
//! spawn of such a sandbox the daemon parks one init for the same plan
//! and peer, off the request's path; the next spawn of that plan enters
//! its namespaces (`setns` by pidfd, in a spawner process) and runs as
//! the program there. Each init serves one spawn, and a plan's first
//! spawn makes its own namespaces, as without the pool.
//!
//! Bounds: [`DEPTH`] parked inits per plan and peer (two, so that a spawn
//! that follows another at once finds one while the other is being
//! made); at most [`MAX_PARKED`] in all and [`MAX_PARKED_PER_UID`] per
//! uid; each ends after [`IDLE`] unused. A rootless daemon's children (in
//! a user namespace of their own) are not parked.
//!
//! Mount templates: where a plan's mounts allow it ([`Recipe::template`]),
//! its binds and `/dev` are built once, read-only, in a mount namespace
//! held by a parked process of their own (a template), and each init
//! copies that namespace (`setns`, `unshare`) and mounts only its own
//! tmpfs, proc and devpts instances: about half an init's work. So does
//! each spawn of a sandbox with a filesystem but no pid namespace of its
//! own ([`Recipe::of_filesystem`]), which is never parked. A
//! template is used for [`TEMPLATE_AGE`], then ends; an init made from
//! it ends [`IDLE`] after the template resolved its binds, as one that
//! resolved them itself. At most [`MAX_TEMPLATES_PER_UID`] per uid and
//! [`MAX_TEMPLATES`] in all: beyond, inits build their whole root.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::spawn::{self, Credentials, Mount, MountKind, SandboxPlan, SpawnPlan};

/// Parked inits at most (and being made) per plan and peer.
pub const DEPTH: usize = 2;

/// Parked inits at most (and being made), all peers together.
pub const MAX_PARKED: usize = 32;

/// Parked inits at most (and being made) for the children of one uid.
pub const MAX_PARKED_PER_UID: usize = 8;

/// How long a parked init waits for its spawn before it ends, counted
/// from the resolution of its binds.
pub const IDLE: Duration = Duration::from_secs(60);

/// How many inits of a key are made at the usual priority after a spawn
/// found none ready (see [`Pool::behind`]): in the background, the pool
/// did not keep up (a busy machine), and would not for the next spawns.
pub const BEHIND_REFILLS: u32 = 64;

/// How long a mount template makes inits before it ends.
pub const TEMPLATE_AGE: Duration = Duration::from_secs(30);

/// Mount templates at most (and being built) for one uid's plans.
pub const MAX_TEMPLATES_PER_UID: usize = 4;

/// Mount templates at most (and being built), all peers together.
pub const MAX_TEMPLATES: usize = 16;

/// What a parked init is made for: everything of a plan that shapes its
/// namespaces and root. A spawn enters only an init made for its very
/// key. Landlock, seccomp and the capabilities are the program's own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    credentials: Option<Credentials>,
    clone_flags: i32,
    network_none: bool,
    dev_template: bool,
    hostname: Option<Vec<u8>>,
    mounts: Option<Vec<Mount>>,
    fresh_proc: bool,
}

impl Key {
    /// The uid whose paths the init resolves, and whose children it
    /// serves (root's when the plan keeps the daemon's ids).
    fn uid(&self) -> u32 {
        self.credentials
            .as_ref()
            .map_or(0, |credentials| credentials.uid)
    }
}

/// How to make a parked init: its key, and the daemon's fds it needs.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// What it is made for.
    pub key: Key,
    netns: Option<Arc<OwnedFd>>,
    dev_template: Option<Arc<OwnedFd>>,
}

impl Recipe {
    /// For `plan`, if its child can enter a parked init: a sandbox with a
    /// pid namespace of its own, and no user namespace.
    pub fn of(plan: &SpawnPlan) -> Option<Self> {
        let sandbox = plan.sandbox.as_ref()?;
        if sandbox.clone_flags & libc::CLONE_NEWPID == 0
            || sandbox.map_ids.is_some()
            || sandbox.enter.is_some()
        {
            return None;
        }
        Some(Self::for_key(plan, sandbox))
    }

    /// For `plan`, if its child can copy a mount template instead of
    /// building its root, but is never parked: a sandbox with a
    /// filesystem, no pid namespace of its own (a spawner vforks it), and
    /// no user namespace.
    pub fn of_filesystem(plan: &SpawnPlan) -> Option<Self> {
        let sandbox = plan.sandbox.as_ref()?;
        if sandbox.clone_flags & libc::CLONE_NEWPID != 0
            || sandbox.filesystem.is_none()
            || sandbox.map_ids.is_some()
            || sandbox.enter.is_some()
            || sandbox.mount_template.is_some()
        {
            return None;
        }
        Some(Self::for_key(plan, sandbox))
    }

    fn for_key(plan: &SpawnPlan, sandbox: &SandboxPlan) -> Self {
        Self {
            key: Key {
                credentials: plan.credentials.clone(),
                clone_flags: sandbox.clone_flags,
                network_none: sandbox.netns.is_some(),
                dev_template: sandbox.dev_template.is_some(),
                hostname: sandbox.hostname.clone(),
                mounts: sandbox.filesystem.clone(),
                fresh_proc: sandbox.fresh_proc,
            },
            netns: sandbox.netns.clone(),
            dev_template: sandbox.dev_template.clone(),
        }
    }

    /// Whether its mounts can be made in two parts, a template's binds
    /// and `/dev` first, then each copy's tmpfs and proc mounts, with the
    /// same result as in their own order: no bind follows a mount of the
    /// other part on the same path, or above or below it.
    pub fn template(&self) -> bool {
        let Some(mounts) = &self.key.mounts else {
            return false;
        };
        let shared =
            |mount: &Mount| matches!(mount.kind, MountKind::ReadOnlyBind | MountKind::Bind);
        mounts.iter().enumerate().all(|(index, later)| {
            !shared(later)
                || mounts[..index].iter().all(|earlier| {
                    shared(earlier) || !nested(&earlier.destination, &later.destination)
                })
        })
    }

    /// The plan of this recipe's mount template: as [`Recipe::park_plan`]'s,
    /// building only the template's part of the root; its process is
    /// parked as an init is, in a pid namespace of its own.
    ///
    /// # Errors
    ///
    /// When `/dev/null` cannot be opened.
    pub fn template_plan(&self) -> io::Result<SpawnPlan> {
        let mut plan = self.park_plan(None)?;
        if let Some(sandbox) = plan.sandbox.as_mut() {
            sandbox.build_template = true;
            sandbox.clone_flags |= libc::CLONE_NEWNS | libc::CLONE_NEWPID;
        }
        Ok(plan)
    }

    /// The plan a parked init starts with: the sandbox's namespaces and
    /// root (a copy of `template`'s when given), its paths resolved as
    /// the key's credentials, stdio on `/dev/null`, and nothing to exec.
    ///
    /// # Errors
    ///
    /// When `/dev/null` cannot be opened.
    pub fn park_plan(&self, template: Option<Arc<OwnedFd>>) -> io::Result<SpawnPlan> {
        let null = OwnedFd::from(
            std::fs::File::options()
                .read(true)
                .write(true)
                .open("/dev/null")?,
        );
        let fds = vec![(null.try_clone()?, 0), (null.try_clone()?, 1), (null, 2)];
        let key = &self.key;
        Ok(SpawnPlan {
            exec_candidates: vec![CString::from(c"/")],
            argv: vec![CString::from(c"zygote-init")],
            envp: zygote_proto::Env::new(),
            cwd: None,
            fds,
            new_session: false,
            controlling_terminal: false,
            process_group: None,
            umask: None,
            rlimits: Vec::new(),
            credentials: key.credentials.clone(),
            cgroup: None,
            ignored_signals: 0,
            nice: None,
            cpu_affinity: Vec::new(),
            oom_score_adj: None,
            sandbox: Some(SandboxPlan {
                clone_flags: key.clone_flags,
                netns: self.netns.clone(),
                dev_template: self.dev_template.clone(),
                hostname: key.hostname.clone(),
                filesystem: key.mounts.clone(),
                fresh_proc: key.fresh_proc,
                mount_template: template,
                ..SandboxPlan::default()
            }),
        })
    }
}

/// Whether one of two relative paths is the other or lies below it.
fn nested(a: &CString, b: &CString) -> bool {
    let below = |outer: &[u8], inner: &[u8]| {
        inner.starts_with(outer) && matches!(inner.get(outer.len()), None | Some(b'/'))
    };
    let (a, b) = (a.as_bytes(), b.as_bytes());
    below(a, b) || below(b, a)
}

/// A parked init taken for one spawn. Dropping it releases the init,
/// which then lives as long as the program that entered it, or ends.
#[derive(Debug)]
pub struct Taken {
    /// The init's pidfd, for [`SandboxPlan::enter`].
    pub pidfd: Arc<OwnedFd>,
    _release: OwnedFd,
}

#[derive(Debug)]
struct Parked {
    pidfd: Arc<OwnedFd>,
    release: OwnedFd,
    generation: u64,
}

/// A mount template ([`Recipe::template`]): the process holding it, and
/// the write end of its release pipe (closing it ends the process).
#[derive(Debug)]
struct Template {
    pidfd: Arc<OwnedFd>,
    _release: OwnedFd,
    resolved: Instant,
    generation: u64,
}

#[derive(Debug)]
enum TemplateState {
    Building,
    Ready(Template),
}

/// How to make an init's root ([`Pool::template_for`]).
#[derive(Debug)]
pub enum RootFrom {
    /// Copy this template (the pidfd of its process), whose binds were
    /// resolved at this instant.
    Template(Arc<OwnedFd>, Instant),
    /// Build the template first (then [`Pool::put_template`] or
    /// [`Pool::abandon_template`]).
    NewTemplate,
    /// Build the whole root.
    Whole,
}

#[derive(Debug, Default)]
struct Inner {
    /// Oldest first.
    parked: HashMap<Key, VecDeque<Parked>>,
    making: HashMap<Key, usize>,
    templates: HashMap<Key, TemplateState>,
    /// How many more inits of the key are made at the usual priority
    /// (see [`Pool::behind`]).
    behind: HashMap<Key, u32>,
    generation: u64,
}

impl Inner {
    fn all(&self) -> usize {
        self.parked.values().map(VecDeque::len).sum::<usize>() + self.making.values().sum::<usize>()
    }

    fn of_key(&self, key: &Key) -> usize {
        self.parked.get(key).map_or(0, VecDeque::len) + self.making.get(key).copied().unwrap_or(0)
    }

    fn of_uid(&self, uid: u32) -> usize {
        let parked = self.parked.iter().filter(|(key, _)| key.uid() == uid);
        let making = self.making.iter().filter(|(key, _)| key.uid() == uid);
        parked.map(|(_, inits)| inits.len()).sum::<usize>() + making.map(|(_, n)| n).sum::<usize>()
    }

    fn made(&mut self, key: &Key) {
        if let Some(making) = self.making.get_mut(key) {
            *making -= 1;
            if *making == 0 {
                self.making.remove(key);
            }
        }
    }
}

/// The parked inits, by key.
#[derive(Debug, Default)]
pub struct Pool {
    inner: Mutex<Inner>,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The oldest init parked for `key` that is still alive, if any.
    pub fn take(&self, key: &Key) -> Option<Taken> {
        loop {
            let parked = {
                let mut inner = self.lock();
                let inits = inner.parked.get_mut(key)?;
                let parked = inits.pop_front();
                if inits.is_empty() {
                    inner.parked.remove(key);
                }
                parked?
            };
            if !spawn::has_exited(parked.pidfd.as_fd()) {
                return Some(Taken {
                    pidfd: parked.pidfd,
                    _release: parked.release,
                });
            }
        }
    }

    /// Whether to make an init for `key` now: fewer than [`DEPTH`] are
    /// parked or being made for it, and the bounds allow one more. Then
    /// it counts as being made until [`Pool::put`] or [`Pool::abandon`].
    pub fn start_making(&self, key: &Key) -> bool {
        let mut inner = self.lock();
        let room = inner.of_key(key) < DEPTH
            && inner.all() < MAX_PARKED
            && inner.of_uid(key.uid()) < MAX_PARKED_PER_UID;
        if room {
            *inner.making.entry(key.clone()).or_insert(0) += 1;
        }
        room
    }

    /// Parks a ready init made for `key`; its generation, for
    /// [`Pool::expire`].
    pub fn put(&self, key: Key, pidfd: Arc<OwnedFd>, release: OwnedFd) -> u64 {
        let mut inner = self.lock();
        inner.made(&key);
        inner.generation += 1;
        let generation = inner.generation;
        inner.parked.entry(key).or_default().push_back(Parked {
            pidfd,
            release,
            generation,
        });
        generation
    }

    /// An init being made for `key` failed.
    pub fn abandon(&self, key: &Key) {
        self.lock().made(key);
    }

    /// Ends the init of `generation` if it is still parked for `key`;
    /// whether it was.
    pub fn expire(&self, key: &Key, generation: u64) -> bool {
        let mut inner = self.lock();
        let Some(inits) = inner.parked.get_mut(key) else {
            return false;
        };
        let before = inits.len();
        inits.retain(|parked| parked.generation != generation);
        let expired = inits.len() < before;
        if inits.is_empty() {
            inner.parked.remove(key);
        }
        expired
    }

    /// Whether the next init for `key` is made at the usual priority, not
    /// in the background (see `UidSpawners::park`): a spawn that found
    /// none (`missed`, a plan's first among them) makes that so for the
    /// next [`BEHIND_REFILLS`]; another miss starts the count over.
    pub fn behind(&self, key: &Key, missed: bool) -> bool {
        let mut inner = self.lock();
        if missed {
            inner.behind.insert(key.clone(), BEHIND_REFILLS);
        }
        let Some(left) = inner.behind.get_mut(key) else {
            return false;
        };
        *left -= 1;
        if *left == 0 {
            inner.behind.remove(key);
        }
        true
    }

    /// How many inits are parked now.
    pub fn parked(&self) -> usize {
        self.lock().parked.values().map(VecDeque::len).sum()
    }

    /// How an init (or a spawn without a pid namespace) for `recipe` gets
    /// its root: from its template while that lives and is younger than
    /// [`TEMPLATE_AGE`]; else from a new one, when the bounds allow it and
    /// none is being built.
    pub fn template_for(&self, recipe: &Recipe) -> RootFrom {
        if !recipe.template() {
            return RootFrom::Whole;
        }
        let key = &recipe.key;
        let mut inner = self.lock();
        match inner.templates.get(key) {
            Some(TemplateState::Building) => return RootFrom::Whole,
            Some(TemplateState::Ready(template))
                if template.resolved.elapsed() < TEMPLATE_AGE
                    && !spawn::has_exited(template.pidfd.as_fd()) =>
            {
                return RootFrom::Template(Arc::clone(&template.pidfd), template.resolved);
            }
            // Old or gone: dropped, which ends its process.
            Some(TemplateState::Ready(_)) => drop(inner.templates.remove(key)),
            None => {}
        }
        let of_uid = inner
            .templates
            .keys()
            .filter(|other| other.uid() == key.uid());
        if of_uid.count() >= MAX_TEMPLATES_PER_UID || inner.templates.len() >= MAX_TEMPLATES {
            return RootFrom::Whole;
        }
        inner.templates.insert(key.clone(), TemplateState::Building);
        RootFrom::NewTemplate
    }

    /// The template being built for `key` is ready: its process, the
    /// write end of its release pipe, and when its build started. Its
    /// generation, for [`Pool::expire_template`].
    pub fn put_template(
        &self,
        key: Key,
        pidfd: Arc<OwnedFd>,
        release: OwnedFd,
        resolved: Instant,
    ) -> u64 {
        let mut inner = self.lock();
        inner.generation += 1;
        let generation = inner.generation;
        let template = Template {
            pidfd,
            _release: release,
            resolved,
            generation,
        };
        inner.templates.insert(key, TemplateState::Ready(template));
        generation
    }

    /// The template being built for `key` failed.
    pub fn abandon_template(&self, key: &Key) {
        let mut inner = self.lock();
        if matches!(inner.templates.get(key), Some(TemplateState::Building)) {
            inner.templates.remove(key);
        }
    }

    /// Ends the template of `generation` if it is still `key`'s; whether
    /// it was.
    pub fn expire_template(&self, key: &Key, generation: u64) -> bool {
        let mut inner = self.lock();
        let current = matches!(
            inner.templates.get(key),
            Some(TemplateState::Ready(template)) if template.generation == generation
        );
        if current {
            inner.templates.remove(key);
        }
        current
    }

    /// Ends every init parked for `key`, and its template: one of them
    /// bound a file its source no longer names. Those being made finish
    /// and are parked (they resolved their binds anew, unless copied
    /// from the template just ended).
    pub fn forget(&self, key: &Key) {
        let mut inner = self.lock();
        inner.parked.remove(key);
        if matches!(inner.templates.get(key), Some(TemplateState::Ready(_))) {
            inner.templates.remove(key);
        }
    }

    /// How many mount templates exist or are being built.
    #[cfg(test)]
    fn templates(&self) -> usize {
        self.lock().templates.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(uid: u32, hostname: &str) -> Key {
        Key {
            credentials: Some(Credentials {
                uid,
                gid: uid,
                groups: Vec::new(),
            }),
            clone_flags: libc::CLONE_NEWPID | libc::CLONE_NEWNS,
            network_none: true,
            dev_template: false,
            hostname: Some(hostname.as_bytes().to_vec()),
            mounts: None,
            fresh_proc: false,
        }
    }

    /// A pidfd of a process that is alive: this one.
    fn live_pidfd() -> Arc<OwnedFd> {
        let pid = rustix::process::getpid();
        Arc::new(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap())
    }

    fn release() -> OwnedFd {
        rustix::pipe::pipe().unwrap().1
    }

    fn mount(kind: MountKind, destination: &str) -> Mount {
        Mount {
            kind,
            source: CString::new(format!("/{destination}")).unwrap(),
            destination: CString::new(destination).unwrap(),
        }
    }

    fn recipe(uid: u32, mounts: Option<Vec<Mount>>) -> Recipe {
        Recipe {
            key: Key {
                mounts,
                ..key(uid, "a")
            },
            netns: None,
            dev_template: None,
        }
    }

    #[test]
    fn only_mounts_that_keep_their_order_split_get_a_template() {
        use MountKind::{Bind, ReadOnlyBind, Tmpfs};
        let splits = |mounts: Vec<Mount>| recipe(0, Some(mounts)).template();
        assert!(!recipe(0, None).template(), "no root of its own");
        assert!(splits(vec![
            mount(ReadOnlyBind, "usr"),
            mount(Tmpfs, "tmp"),
            mount(Bind, "work"),
        ]));
        assert!(splits(vec![mount(Bind, "a"), mount(Tmpfs, "a/b")]));
        assert!(splits(vec![mount(Tmpfs, "ab"), mount(Bind, "a")]));
        assert!(
            !splits(vec![mount(Tmpfs, "a"), mount(Bind, "a/b")]),
            "a bind into an earlier tmpfs"
        );
        assert!(
            !splits(vec![mount(Tmpfs, "a/b"), mount(Bind, "a")]),
            "a bind over an earlier tmpfs"
        );
        assert!(
            !splits(vec![mount(Tmpfs, "a"), mount(ReadOnlyBind, "a")]),
            "a bind on an earlier tmpfs"
        );
    }

    #[test]
    fn a_template_is_built_once_used_while_young_and_bounded() {
        use MountKind::ReadOnlyBind;
        let pool = Pool::default();
        let mine = recipe(1000, Some(vec![mount(ReadOnlyBind, "usr")]));
        assert!(matches!(pool.template_for(&mine), RootFrom::NewTemplate));
        assert!(
            matches!(pool.template_for(&mine), RootFrom::Whole),
            "one being built: not another"
        );
        pool.abandon_template(&mine.key);
        assert_eq!(pool.templates(), 0);
        assert!(matches!(pool.template_for(&mine), RootFrom::NewTemplate));
        let now = Instant::now();
        let generation = pool.put_template(mine.key.clone(), live_pidfd(), release(), now);
        assert!(matches!(
            pool.template_for(&mine),
            RootFrom::Template(_, resolved) if resolved == now
        ));
        assert!(!pool.expire_template(&mine.key, generation + 1));
        assert!(pool.expire_template(&mine.key, generation));
        assert_eq!(pool.templates(), 0);
        // One too old is replaced.
        assert!(matches!(pool.template_for(&mine), RootFrom::NewTemplate));
        let old = now.checked_sub(TEMPLATE_AGE).unwrap();
        pool.put_template(mine.key.clone(), live_pidfd(), release(), old);
        assert!(matches!(pool.template_for(&mine), RootFrom::NewTemplate));
        assert_eq!(pool.templates(), 1);
        // Bounded per uid: beyond, inits build their whole root.
        for n in 1..MAX_TEMPLATES_PER_UID {
            let other = recipe(1000, Some(vec![mount(ReadOnlyBind, &format!("usr{n}"))]));
            assert!(matches!(pool.template_for(&other), RootFrom::NewTemplate));
        }
        let one_more = recipe(1000, Some(vec![mount(ReadOnlyBind, "one-more")]));
        assert!(matches!(pool.template_for(&one_more), RootFrom::Whole));
        let another_uid = recipe(1001, Some(vec![mount(ReadOnlyBind, "usr")]));
        assert!(matches!(
            pool.template_for(&another_uid),
            RootFrom::NewTemplate
        ));
        // A template whose process ended is not used.
        let child = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
        let ended = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
        let mut child = child;
        child.wait().unwrap();
        pool.put_template(another_uid.key.clone(), Arc::new(ended), release(), now);
        assert!(matches!(
            pool.template_for(&another_uid),
            RootFrom::NewTemplate
        ));
    }

    /// A spawn that found no init ready has the next [`BEHIND_REFILLS`]
    /// of its key made at the usual priority; another miss starts over,
    /// and other keys are not behind.
    #[test]
    fn a_miss_puts_the_next_inits_of_its_key_at_the_usual_priority() {
        let pool = Pool::default();
        let (key, other) = (key(1000, "a"), key(1000, "b"));
        assert!(!pool.behind(&key, false), "not before any miss");
        assert!(pool.behind(&key, true));
        for _ in 1..BEHIND_REFILLS - 2 {
            assert!(pool.behind(&key, false));
        }
        assert!(pool.behind(&key, true), "a second miss starts over");
        for _ in 1..BEHIND_REFILLS {
            assert!(pool.behind(&key, false));
        }
        assert!(!pool.behind(&key, false), "in the background again");
        assert!(!pool.behind(&other, false));
    }

    #[test]
    fn an_init_is_taken_once_and_only_for_its_own_key() {
        let pool = Pool::default();
        let mine = key(1000, "a");
        assert!(pool.take(&mine).is_none(), "none parked yet");
        for _ in 0..DEPTH {
            assert!(pool.start_making(&mine));
        }
        assert!(!pool.start_making(&mine), "as many as the depth being made");
        pool.put(mine.clone(), live_pidfd(), release());
        assert!(!pool.start_making(&mine), "one parked, one being made");
        pool.abandon(&mine);
        assert!(pool.start_making(&mine), "a failed one frees its place");
        pool.put(mine.clone(), live_pidfd(), release());
        assert!(pool.take(&key(1001, "a")).is_none(), "another uid's");
        assert!(pool.take(&key(1000, "b")).is_none(), "another plan's");
        assert!(pool.take(&mine).is_some());
        assert!(pool.take(&mine).is_some());
        assert!(pool.take(&mine).is_none(), "each init serves one spawn");
        assert_eq!(pool.parked(), 0);
    }

    #[test]
    fn parked_inits_are_bounded_per_uid_and_in_all() {
        let pool = Pool::default();
        for n in 0..MAX_PARKED_PER_UID {
            assert!(pool.start_making(&key(1000, &n.to_string())), "{n}");
        }
        assert!(!pool.start_making(&key(1000, "one more")));
        pool.abandon(&key(1000, "0"));
        assert!(
            pool.start_making(&key(1000, "one more")),
            "a failed one frees its place"
        );
        let mut uid = 2000;
        while pool.lock().all() < MAX_PARKED {
            assert!(pool.start_making(&key(uid, "x")));
            uid += 1;
        }
        assert!(
            !pool.start_making(&key(uid, "x")),
            "the bound on all of them"
        );
    }

    #[test]
    fn only_the_generation_parked_expires() {
        let pool = Pool::default();
        let mine = key(1000, "a");
        let first = pool.put(mine.clone(), live_pidfd(), release());
        let second = pool.put(mine.clone(), live_pidfd(), release());
        assert!(pool.take(&mine).is_some(), "the first");
        assert!(!pool.expire(&mine, first), "taken: its timer finds nothing");
        assert_eq!(pool.parked(), 1);
        assert!(pool.expire(&mine, second));
        assert_eq!(pool.parked(), 0);
    }

    #[test]
    fn an_init_that_ended_is_not_taken() {
        let pool = Pool::default();
        let mine = key(1000, "a");
        let child = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
        let mut child = child;
        child.wait().unwrap();
        pool.put(mine.clone(), Arc::new(pidfd), release());
        assert!(pool.take(&mine).is_none());
    }

    #[test]
    fn only_a_sandbox_with_a_pid_namespace_and_no_user_namespace_is_parked() {
        let plan = |clone_flags, map_ids| SpawnPlan {
            sandbox: Some(SandboxPlan {
                clone_flags,
                map_ids,
                ..SandboxPlan::default()
            }),
            ..Recipe {
                key: key(0, "x"),
                netns: None,
                dev_template: None,
            }
            .park_plan(None)
            .unwrap()
        };
        assert!(Recipe::of(&plan(libc::CLONE_NEWPID | libc::CLONE_NEWNS, None)).is_some());
        assert!(Recipe::of(&plan(libc::CLONE_NEWNS, None)).is_none());
        assert!(Recipe::of(&plan(libc::CLONE_NEWPID, Some((1000, 1000)))).is_none());
    }
}
