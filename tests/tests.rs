//! Integration tests of the zygote workspace, each against a real
//! `zygote serve` process on its own socket.

// The harness: start_daemon(test_name), /proc helpers.
mod util;

// Client processes of their own (killed, another uid, load), re-executed
// from this binary.
mod helper;

// The Rust API, async flavour: args, env, cwd, stdio, exit statuses, fds.
mod spawn;

// The blocking flavour.
mod blocking;

// Every value the Rust builder takes makes a frame the daemon decodes; a
// value it cannot use fails that spawn alone.
mod builder;

// The daemon under churn and misbehaving clients: fd and zombie leaks,
// concurrency, clients that leave mid-spawn, raw protocol errors.
mod daemon;

// A cgroup per child: tree kill, tree accounting, cleanup, refusals.
mod cgroup;

// The `zygote run` tool: exit codes, inherited fds, messages.
mod run;

// Sandboxes: escape attempts under a profile the policy imposes.
mod sandbox;

// Generated docs: `zygote run --help`, man pages, shell completions.
mod docs;

// `zygote run -- CMD` against `CMD` run directly: signals, attributes,
// argument lists, messages, flags.
mod run_transparent;

// The README's quick start, as written.
mod quickstart;

// The harness for tests driving outside tools: tool checks, HTTP, ports.
mod tools;

// As a systemd service: unit files, socket activation, sd_notify, stop.
mod service;

// Prometheus: the /metrics exposition, promtool, a real scraping server.
mod metrics;

// Logs in the journal: priorities and fields.
mod logs;

// SIGHUP: ignored by private zygotes.
mod hangup;

// Signals with no meaning to a zygote (a child's `kill(getppid(),
// SIGUSR1)`): logged and ignored by the daemon, private zygotes and
// templates; children still see them at their default.
mod signals;

// Live upgrade in place, and children of a killed daemon.
mod upgrade;

// `defer_spawned`: no `Spawned` for a child that ends at once.
mod deferred;

// Scheduling: daemon threads under SCHED_BATCH, children under SCHED_OTHER.
mod sched;

// Private zygotes (launched binary, forked template) serving a 2 GiB
// program, and dying with it.
mod private;

// Hostile and broken input on the raw protocol; the daemon keeps serving.
mod hostile;

// Protocol versions: a recorded version-1 client replayed against this
// daemon, version negotiation, and a client against fewer features.
mod compat;

// The security invariant, policy and admission limits.
mod security;

// `zygote run -t` under tmux: bash job control, vi, python, Ctrl-C/Ctrl-Z,
// resizes, the terminal restored; each compared with running directly.
mod terminal;

// Kill-on-close, timeouts, killed clients and a killed daemon.
mod lifetimes;

// A client that loses its zygote: exit statuses from the pidfd, reconnect.
mod lost;

// A process that forks after using a client: neither copy disturbs the
// other's connection or children.
mod fork;

// 10,000 spawns from several processes; nothing leaks.
mod load;

// Denial of service by an unprivileged peer of a shared root daemon: the
// daemon keeps serving everyone else, within bounded memory and fds.
mod dos;

// The per-uid spawner processes of a root daemon: where a non-root peer's
// children come from, what a spawner holds, its death and replacement.
mod spawners;

// Warm templates: a CPython that forks children in place of a cold exec.
mod templates;
