//! The shared test vectors in `vectors/frames.json` are the bytes
//! `zygote_proto::encode` produces for the values built here, decode back to
//! those values, and carry their `serde_json` form, which the Go and Python
//! clients compare with their own decoders.
//!
//! `PROTOCOL.md` shows some of them as `#### vector: NAME` headings followed
//! by a fenced `hex` block; each such block must equal the file's hex for
//! that name.
//!
//! To regenerate the file after a deliberate protocol change:
//! `cargo test -p zygote-proto --test vectors -- --ignored`.

use std::collections::BTreeMap;

use zygote_proto::{
    AppliedSandbox, CgroupSpec, ClientMessage, ContinueNotice, CpuMax, EnvVar, ExitNotice,
    ExitStatus, FdMapping, FilesystemSpec, Hello, HelloAck, InVersion, KillOnClose, LandlockSpec,
    Limits, MountKind, MountSpec, NetworkMode, PeerUse, ProtocolError, ProtocolErrorKind, PtySpec,
    RequestFailed, ResourceLimit, ResourceUsage, SandboxSpec, SeccompSpec, ServerMessage,
    SignalRequest, SignalSent, SpawnFailed, SpawnRequest, SpawnStage, Spawned, SpawnerInfo,
    StatusReply, StatusRequest, StdioSpec, StopNotice, TemplateInfo, TemplateList,
    TemplateListRequest, TemplateReady, TemplateRequest, TemplateSpawnRequest, Timeout, TreeUsage,
    UpgradeRequest, UserSpec, WindowSize, decode, decode_client, decode_server, encode, v2,
};

/// A whole frame: what a client or the daemon sends.
// One short-lived value per vector; boxing would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
enum Frame {
    Client(ClientMessage),
    Server(ServerMessage),
}

impl Frame {
    fn encode(&self) -> Vec<u8> {
        match self {
            Self::Client(message) => encode(message),
            Self::Server(message) => encode(message),
        }
        .expect("messages always encode")
    }

    /// Decodes `bytes` as the same direction as `self`.
    fn decode_like(&self, bytes: &[u8]) -> Frame {
        match self {
            Self::Client(_) => Self::Client(decode(bytes).expect("vector decodes")),
            Self::Server(_) => Self::Server(decode(bytes).expect("vector decodes")),
        }
    }
}

/// Every vector `frames.json` must contain, in file order.
const NAMES: &[&str] = &[
    "hello",
    "hello_ack",
    "hello_v1",
    "hello_ack_v1",
    "spawn_full",
    "spawn_minimal",
    "signal",
    "spawned",
    "spawn_failed",
    "exited_code",
    "exited_signal",
    "signal_sent",
    "request_failed",
    "protocol_error",
    "status_request",
    "status_reply",
    "spawn_empty_arg_fd",
    "signal_max",
    "spawned_max",
    "spawn_failed_validate",
    "exited_core_dumped",
    "exited_max",
    "protocol_error_busy",
    "status_reply_max",
    "spawn_pty",
    "stopped",
    "continued",
    "spawn_cgroup",
    "exited_tree",
    "upgrade_request",
    "spawn_deferred",
    "spawn_env_odd_keys",
    "spawn_sandbox",
    "spawn_sandbox_filter",
    "spawned_sandbox",
    "spawn_failed_sandbox",
    "template_request",
    "template_ready",
    "spawn_from_template",
    "list_templates",
    "templates",
    "spawn_failed_template",
];

/// The vectors `PROTOCOL.md` shows with a hex block.
const DOCUMENTED: &[&str] = &[
    "hello",
    "hello_ack",
    "hello_v1",
    "hello_ack_v1",
    "spawn_full",
    "spawn_minimal",
    "signal",
    "spawned",
    "spawn_failed",
    "exited_code",
    "exited_signal",
    "signal_sent",
    "request_failed",
    "protocol_error",
    "status_request",
    "status_reply",
    "spawn_pty",
    "stopped",
    "continued",
    "upgrade_request",
    "spawn_deferred",
    "spawn_sandbox",
    "spawned_sandbox",
    "spawn_failed_sandbox",
    "template_request",
    "template_ready",
    "spawn_from_template",
    "list_templates",
    "templates",
    "spawn_failed_template",
];

fn env(key: &str, value: &str) -> EnvVar {
    EnvVar {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

/// The value each vector encodes; `None` for a name this test does not know.
fn value(name: &str) -> Option<Frame> {
    Some(match name {
        "hello" => Frame::Client(ClientMessage::Hello(Hello {
            protocol_version: 4,
            client: "py/0.1".to_owned(),
        })),
        "hello_ack" => Frame::Server(ServerMessage::HelloAck(HelloAck {
            protocol_version: 4,
            server_version: "0.1.0".to_owned(),
            limits: Limits {
                max_frame_bytes: 262_144,
                max_fds_per_frame: 64,
            },
            features: vec![
                "pty".to_owned(),
                "large_args".to_owned(),
                "templates".to_owned(),
            ],
        })),
        "hello_v1" => Frame::Client(ClientMessage::Hello(Hello {
            protocol_version: 1,
            client: "py/0.1".to_owned(),
        })),
        "hello_ack_v1" => Frame::Server(ServerMessage::HelloAck(HelloAck {
            protocol_version: 1,
            server_version: "0.1.0".to_owned(),
            limits: Limits {
                max_frame_bytes: 262_144,
                max_fds_per_frame: 64,
            },
            features: Vec::new(),
        })),
        "spawn_full" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            id: 7,
            program: b"sh".to_vec(),
            argv0: Some(b"-sh".to_vec()),
            args: vec![b"-c".to_vec(), b"echo hi there".to_vec(), b"\xff".to_vec()],
            env: vec![env("PATH", "/usr/bin:/bin"), env("LANG", "C.UTF-8")].into(),
            cwd: Some(b"/tmp".to_vec()),
            stdin: StdioSpec::Pipe,
            stdout: StdioSpec::Null,
            stderr: StdioSpec::Fd(0),
            fd_mappings: vec![FdMapping {
                attached_index: 1,
                child_fd: 3,
            }],
            new_session: false,
            process_group: Some(0),
            umask: Some(0o022),
            rlimits: vec![ResourceLimit {
                resource: 7,
                soft: 1024,
                hard: u64::MAX,
            }],
            user: Some(UserSpec {
                uid: 1000,
                gid: 100,
                groups: vec![100, 27],
            }),
            kill_on_close: Some(KillOnClose {
                signal: 9,
                process_group: true,
            }),
            timeout: Some(Timeout {
                millis: 5000,
                grace_millis: 200,
            }),
            pty: None,
            report_stops: false,
            cgroup: None,
            ignored_signals: 1 << 0,
            nice: Some(7),
            cpu_affinity: vec![0, 2],
            oom_score_adj: Some(300),
            large_args: None,
            defer_spawned: false,
            sandbox: None,
        })),
        "spawn_minimal" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            id: 300,
            program: b"/bin/true".to_vec(),
            argv0: None,
            args: vec![],
            env: Default::default(),
            cwd: None,
            stdin: StdioSpec::Null,
            stdout: StdioSpec::Null,
            stderr: StdioSpec::Null,
            fd_mappings: vec![],
            new_session: true,
            process_group: None,
            umask: None,
            rlimits: vec![],
            user: None,
            kill_on_close: None,
            timeout: None,
            pty: None,
            report_stops: false,
            cgroup: None,
            ignored_signals: 0,
            nice: None,
            cpu_affinity: vec![],
            oom_score_adj: None,
            large_args: None,
            defer_spawned: false,
            sandbox: None,
        })),
        "signal" => Frame::Client(ClientMessage::Signal(SignalRequest {
            id: 8,
            spawn_id: 7,
            signal: 15,
        })),
        "spawned" => Frame::Server(ServerMessage::Spawned(Spawned {
            id: 7,
            pid: 4242,
            sandbox: None,
        })),
        "spawn_failed" => Frame::Server(ServerMessage::SpawnFailed(SpawnFailed {
            id: 9,
            stage: SpawnStage::Exec,
            errno: 2,
            message: "nope: not found".to_owned(),
        })),
        "exited_code" => Frame::Server(ServerMessage::Exited(ExitNotice {
            id: 7,
            status: ExitStatus::Exited(0),
            usage: ResourceUsage {
                user_micros: 1500,
                system_micros: 250,
                max_rss_kib: 3072,
            },
            timed_out: false,
            tree: None,
            pid: 4242,
        })),
        "exited_signal" => Frame::Server(ServerMessage::Exited(ExitNotice {
            id: 7,
            status: ExitStatus::Signaled {
                signal: 9,
                core_dumped: false,
            },
            usage: ResourceUsage::default(),
            timed_out: true,
            tree: None,
            pid: 4242,
        })),
        "status_request" => Frame::Client(ClientMessage::Status(StatusRequest { id: 11 })),
        "upgrade_request" => Frame::Client(ClientMessage::Upgrade(UpgradeRequest { id: 12 })),
        "status_reply" => Frame::Server(ServerMessage::Status(StatusReply {
            id: 11,
            server_version: "0.1.0".to_owned(),
            pid: 812,
            uptime_millis: 90_000,
            connections_open: 2,
            connections_accepted: 17,
            children_running: 3,
            spawns_succeeded: 1000,
            spawns_failed: 4,
            peers: vec![
                PeerUse {
                    uid: 0,
                    connections: 1,
                    children: 0,
                    children_limit: 4096,
                    connections_limit: 1024,
                    sandbox_profile: None,
                },
                PeerUse {
                    uid: 1000,
                    connections: 1,
                    children: 3,
                    children_limit: 1024,
                    connections_limit: 256,
                    sandbox_profile: Some("build".to_owned()),
                },
            ],
            spawners: vec![SpawnerInfo {
                uid: 1000,
                pid: 813,
                spawns: 1000,
                restarts: 1,
            }],
        })),
        "signal_sent" => Frame::Server(ServerMessage::SignalSent(SignalSent { id: 8 })),
        "request_failed" => Frame::Server(ServerMessage::RequestFailed(RequestFailed {
            id: 10,
            errno: 3,
            message: "no such child".to_owned(),
        })),
        "protocol_error" => Frame::Server(ServerMessage::ProtocolError(ProtocolError {
            kind: ProtocolErrorKind::UnsupportedVersion,
            message: "client 0, zygote 1 to 2".to_owned(),
        })),
        "spawn_empty_arg_fd" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            args: vec![Vec::new(), b"x".to_vec(), b"\xc3\x28".to_vec()],
            env: vec![
                env("EMPTY", ""),
                EnvVar {
                    key: b"K\xfe".to_vec(),
                    value: b"\x80".to_vec(),
                },
            ]
            .into(),
            stdin: StdioSpec::Fd(1),
            stdout: StdioSpec::Fd(0),
            stderr: StdioSpec::Fd(0),
            fd_mappings: vec![
                FdMapping {
                    attached_index: 2,
                    child_fd: 3,
                },
                FdMapping {
                    attached_index: 2,
                    child_fd: 1_048_576,
                },
            ],
            process_group: Some(-1),
            umask: Some(0o777),
            rlimits: vec![ResourceLimit {
                resource: u32::MAX,
                soft: 0,
                hard: u64::MAX,
            }],
            user: Some(UserSpec {
                uid: 0,
                gid: u32::MAX - 1,
                groups: vec![],
            }),
            kill_on_close: Some(KillOnClose {
                signal: 15,
                process_group: false,
            }),
            timeout: Some(Timeout {
                millis: u64::MAX,
                grace_millis: 0,
            }),
            ..SpawnRequest::new(u64::MAX, "")
        })),
        "signal_max" => Frame::Client(ClientMessage::Signal(SignalRequest {
            id: u64::MAX,
            spawn_id: u64::MAX - 1,
            signal: i32::MIN,
        })),
        "spawned_max" => Frame::Server(ServerMessage::Spawned(Spawned {
            id: u64::MAX,
            pid: i32::MAX,
            sandbox: None,
        })),
        "spawn_failed_validate" => Frame::Server(ServerMessage::SpawnFailed(SpawnFailed {
            id: 128,
            stage: SpawnStage::Setuid,
            errno: -1,
            message: "caf\u{e9} \u{2603}".to_owned(),
        })),
        "exited_core_dumped" => Frame::Server(ServerMessage::Exited(ExitNotice {
            id: 1,
            status: ExitStatus::Signaled {
                signal: 11,
                core_dumped: true,
            },
            usage: ResourceUsage {
                user_micros: 0,
                system_micros: 1,
                max_rss_kib: 127,
            },
            timed_out: false,
            tree: None,
            pid: 4242,
        })),
        "exited_max" => Frame::Server(ServerMessage::Exited(ExitNotice {
            id: u64::MAX,
            status: ExitStatus::Exited(255),
            usage: ResourceUsage {
                user_micros: u64::MAX,
                system_micros: u64::MAX,
                max_rss_kib: u64::MAX,
            },
            timed_out: true,
            tree: None,
            pid: i32::MAX,
        })),
        "protocol_error_busy" => Frame::Server(ServerMessage::ProtocolError(ProtocolError {
            kind: ProtocolErrorKind::Busy,
            message: String::new(),
        })),
        "status_reply_max" => Frame::Server(ServerMessage::Status(StatusReply {
            id: 0,
            server_version: String::new(),
            pid: i32::MIN,
            uptime_millis: u64::MAX,
            connections_open: 0,
            connections_accepted: u64::MAX,
            children_running: 1 << 35,
            spawns_succeeded: 127,
            spawns_failed: 128,
            peers: Vec::new(),
            spawners: Vec::new(),
        })),
        "spawn_pty" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            pty: Some(PtySpec {
                window: WindowSize { rows: 24, cols: 80 },
            }),
            report_stops: true,
            ..SpawnRequest::new(12, "/bin/sh")
        })),
        "stopped" => Frame::Server(ServerMessage::Stopped(StopNotice { id: 12, signal: 20 })),
        "continued" => Frame::Server(ServerMessage::Continued(ContinueNotice { id: 12 })),
        "spawn_cgroup" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            cgroup: Some(CgroupSpec {
                kill_tree: true,
                wait_tree: false,
                memory_max: Some(512 << 20),
                memory_swap_max: Some(0),
                pids_max: Some(64),
                cpu_max: Some(CpuMax {
                    quota_micros: 50_000,
                    period_micros: 100_000,
                }),
                cpu_weight: Some(100),
                io_weight: None,
            }),
            ..SpawnRequest::new(9, "true")
        })),
        "exited_tree" => Frame::Server(ServerMessage::Exited(ExitNotice {
            id: 9,
            status: ExitStatus::Signaled {
                signal: 9,
                core_dumped: false,
            },
            usage: ResourceUsage {
                user_micros: 1,
                system_micros: 2,
                max_rss_kib: 3,
            },
            timed_out: false,
            tree: Some(TreeUsage {
                user_micros: 1_000_000,
                system_micros: 20,
                memory_peak_bytes: Some(536_870_912),
                oom_kills: 1,
                memory_max: Some(536_870_912),
            }),
            pid: 4242,
        })),
        "spawn_deferred" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            defer_spawned: true,
            ..SpawnRequest::new(13, "/bin/true")
        })),
        // Inherited `=A=B` as Rust and Go split it (key `=A`) and as
        // Python does (key ""): both are sent as they are (§4.7).
        "spawn_env_odd_keys" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            env: vec![env("=A", "B"), env("", "C=D"), env("K", "v")].into(),
            ..SpawnRequest::new(14, "/usr/bin/env")
        })),
        _ => return sandbox_value(name),
    })
}

/// The vectors of the version-3 sandbox fields.
fn sandbox_value(name: &str) -> Option<Frame> {
    let mount = |kind, source: &str, destination: &str| MountSpec {
        kind,
        source: source.as_bytes().to_vec(),
        destination: destination.as_bytes().to_vec(),
    };
    Some(match name {
        "spawn_sandbox" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            sandbox: Some(SandboxSpec {
                profile: Some("build".to_owned()),
                filesystem: Some(FilesystemSpec {
                    mounts: vec![
                        mount(MountKind::ReadOnlyBind, "/usr", "/usr"),
                        mount(MountKind::Bind, "/srv/work", "/work"),
                        mount(MountKind::Tmpfs, "", "/tmp"),
                    ],
                }),
                network: NetworkMode::None,
                isolate: true,
                hostname: Some("box".to_owned()),
                seccomp: Some(SeccompSpec::Profile("default".to_owned())),
                landlock: Some(LandlockSpec {
                    read_only: vec![b"/usr".to_vec()],
                    read_execute: vec![b"/usr/bin".to_vec()],
                    read_write: vec![b"/work".to_vec()],
                    tcp_bind: vec![8080],
                    tcp_connect: vec![443],
                    require: true,
                }),
            }),
            ..SpawnRequest::new(15, "/usr/bin/make")
        })),
        "spawn_sandbox_filter" => Frame::Client(ClientMessage::Spawn(SpawnRequest {
            sandbox: Some(SandboxSpec {
                seccomp: Some(SeccompSpec::Filter("deny ptrace\n".to_owned())),
                landlock: Some(LandlockSpec {
                    read_write: vec![b"/tmp/\xff".to_vec()],
                    tcp_connect: vec![0, u16::MAX],
                    ..LandlockSpec::default()
                }),
                ..SandboxSpec::default()
            }),
            ..SpawnRequest::new(16, "true")
        })),
        "spawned_sandbox" => Frame::Server(ServerMessage::Spawned(Spawned {
            id: 15,
            pid: 4243,
            sandbox: Some(AppliedSandbox {
                profile: Some("build".to_owned()),
                namespaces: vec!["mount".to_owned(), "pid".to_owned(), "net".to_owned()],
                seccomp: Some("default".to_owned()),
                landlock_abi: Some(7),
                landlock_complete: true,
            }),
        })),
        "spawn_failed_sandbox" => Frame::Server(ServerMessage::SpawnFailed(SpawnFailed {
            id: 15,
            stage: SpawnStage::Sandbox,
            errno: 2,
            message: "bind /srv/work: ENOENT".to_owned(),
        })),
        _ => return template_value(name),
    })
}

/// The vectors of the version-4 template messages.
fn template_value(name: &str) -> Option<Frame> {
    let preload = || vec!["json".to_owned(), "xml.etree.ElementTree".to_owned()];
    Some(match name {
        "template_request" => Frame::Client(ClientMessage::Template(TemplateRequest {
            id: 20,
            kind: "python".to_owned(),
            interpreter: b"python3".to_vec(),
            preload: preload(),
            env: vec![env("PATH", "/usr/bin:/bin")].into(),
            cwd: Some(b"/srv".to_vec()),
        })),
        "template_ready" => Frame::Server(ServerMessage::TemplateReady(TemplateReady {
            id: 20,
            template: 3,
            pid: 4300,
            reused: false,
        })),
        "spawn_from_template" => {
            Frame::Client(ClientMessage::SpawnFromTemplate(TemplateSpawnRequest {
                template: 3,
                spawn: SpawnRequest {
                    args: vec![b"-c".to_vec(), b"print(1)".to_vec()],
                    stdout: StdioSpec::Pipe,
                    ..SpawnRequest::new(21, "")
                },
            }))
        }
        "list_templates" => {
            Frame::Client(ClientMessage::ListTemplates(TemplateListRequest { id: 22 }))
        }
        "templates" => Frame::Server(ServerMessage::Templates(TemplateList {
            id: 22,
            templates: vec![TemplateInfo {
                template: 3,
                uid: 1000,
                pid: 4300,
                kind: "python".to_owned(),
                interpreter: b"python3".to_vec(),
                preload: preload(),
                forks: 300,
                restarts: 1,
                age_millis: 61_000,
                rss_bytes: 25_165_824,
            }],
        })),
        "spawn_failed_template" => Frame::Server(ServerMessage::SpawnFailed(SpawnFailed {
            id: 21,
            stage: SpawnStage::Template,
            errno: 71,
            message: "template 3 exited before it forked".to_owned(),
        })),
        _ => return None,
    })
}

/// Extracts `name -> bytes` from every `#### vector: NAME` heading and the
/// ```` ```hex ```` block that follows it.
fn parse_vectors(document: &str) -> BTreeMap<String, Vec<u8>> {
    let mut vectors = BTreeMap::new();
    let mut lines = document.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.trim().strip_prefix("#### vector:") else {
            continue;
        };
        let name = name.trim().to_owned();
        assert!(!name.is_empty(), "vector heading without a name");
        let opening = lines
            .by_ref()
            .map(str::trim)
            .find(|line| !line.is_empty())
            .unwrap_or_else(|| panic!("vector {name}: no block after the heading"));
        assert_eq!(opening, "```hex", "vector {name}: expected a ```hex block");
        let mut bytes = Vec::new();
        let mut closed = false;
        for line in lines.by_ref() {
            let line = line.trim();
            if line == "```" {
                closed = true;
                break;
            }
            for pair in line.split_whitespace() {
                assert_eq!(pair.len(), 2, "vector {name}: {pair:?} is not one byte");
                let byte = u8::from_str_radix(pair, 16)
                    .unwrap_or_else(|_| panic!("vector {name}: {pair:?} is not hex"));
                bytes.push(byte);
            }
        }
        assert!(closed, "vector {name}: block is not closed");
        assert!(
            vectors.insert(name.clone(), bytes).is_none(),
            "vector {name} appears twice"
        );
    }
    vectors
}

fn document() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/PROTOCOL.md");
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {path}: {error}"))
}

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors/frames.json");

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn unhex(text: &str) -> Vec<u8> {
    assert!(text.len() % 2 == 0, "odd-length hex {text:?}");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digits"))
        .collect()
}

impl Frame {
    fn direction(&self) -> &'static str {
        match self {
            Self::Client(_) => "client",
            Self::Server(_) => "server",
        }
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Client(message) => serde_json::to_value(message),
            Self::Server(message) => serde_json::to_value(message),
        }
        .expect("messages serialize to JSON")
    }

    fn to_json_text(&self) -> String {
        match self {
            Self::Client(message) => serde_json::to_string(message),
            Self::Server(message) => serde_json::to_string(message),
        }
        .expect("messages serialize to JSON")
    }

    /// Builds the value from its JSON form, in the same direction as `self`.
    fn parse_json_like(&self, json: &serde_json::Value) -> Frame {
        match self {
            Self::Client(_) => Self::Client(serde_json::from_value(json.clone()).expect("JSON")),
            Self::Server(_) => Self::Server(serde_json::from_value(json.clone()).expect("JSON")),
        }
    }
}

/// The text of `frames.json` for the values in this file.
fn generate() -> String {
    let mut out = format!(
        "{{\n  \"protocol_version\": {},\n  \"vectors\": [\n",
        zygote_proto::PROTOCOL_VERSION
    );
    for (i, name) in NAMES.iter().enumerate() {
        let frame = value(name).expect("listed names are known");
        let separator = if i + 1 == NAMES.len() { "" } else { "," };
        out.push_str(&format!(
            "    {{\n      \"name\": \"{name}\",\n      \"direction\": \"{}\",\n      \"hex\": \"{}\",\n      \"message\": {}\n    }}{separator}\n",
            frame.direction(),
            hex(&frame.encode()).replace(' ', ""),
            frame.to_json_text(),
        ));
    }
    out.push_str("  ]\n}\n");
    out
}

/// `(name, direction, bytes, message)` for every vector in `frames.json`.
fn load_file() -> Vec<(String, String, Vec<u8>, serde_json::Value)> {
    let text =
        std::fs::read_to_string(FILE).unwrap_or_else(|error| panic!("reading {FILE}: {error}"));
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|error| panic!("parsing {FILE}: {error}"));
    assert_eq!(
        json["protocol_version"],
        serde_json::json!(zygote_proto::PROTOCOL_VERSION),
        "{FILE}: protocol_version"
    );
    json["vectors"]
        .as_array()
        .unwrap_or_else(|| panic!("{FILE}: no \"vectors\" array"))
        .iter()
        .map(|vector| {
            let field = |key: &str| {
                vector[key]
                    .as_str()
                    .unwrap_or_else(|| panic!("{FILE}: a vector lacks string field {key:?}"))
                    .to_owned()
            };
            let hex_text = field("hex");
            assert_eq!(
                hex_text,
                hex_text.to_lowercase(),
                "{FILE}: hex must be lowercase"
            );
            (
                field("name"),
                field("direction"),
                unhex(&hex_text),
                vector["message"].clone(),
            )
        })
        .collect()
}

#[test]
fn vectors_file_matches_the_codec() {
    let vectors = load_file();
    let names: Vec<&str> = vectors.iter().map(|(name, ..)| name.as_str()).collect();
    assert_eq!(names, NAMES, "{FILE}: names or their order differ");
    for (name, direction, bytes, message) in &vectors {
        let expected = value(name).unwrap_or_else(|| panic!("unknown vector {name}"));
        assert_eq!(direction, expected.direction(), "vector {name}: direction");
        assert_eq!(
            hex(&expected.encode()),
            hex(bytes),
            "vector {name}: encode(value) differs from the file"
        );
        assert_eq!(
            expected.decode_like(bytes),
            expected,
            "vector {name}: decode(hex) differs from the value"
        );
        assert_eq!(
            &expected.to_json(),
            message,
            "vector {name}: serde_json form differs from the file's message"
        );
        assert_eq!(
            expected.parse_json_like(message),
            expected,
            "vector {name}: the file's message does not deserialize to the value"
        );
    }
}

#[test]
fn protocol_md_blocks_match_the_file() {
    let documented = parse_vectors(&document());
    let file: BTreeMap<String, Vec<u8>> = load_file()
        .into_iter()
        .map(|(name, _, bytes, _)| (name, bytes))
        .collect();
    for name in DOCUMENTED {
        assert!(
            documented.contains_key(*name),
            "PROTOCOL.md lacks vector {name}"
        );
    }
    for (name, bytes) in &documented {
        let expected = file
            .get(name)
            .unwrap_or_else(|| panic!("PROTOCOL.md shows vector {name}, which {FILE} lacks"));
        assert_eq!(
            hex(bytes),
            hex(expected),
            "vector {name}: PROTOCOL.md differs from {FILE}"
        );
    }
}

#[test]
fn parser_sees_headings_and_blocks() {
    let document = "text\n#### vector: a\n\n```hex\n00 01\nff\n```\n#### other\n";
    let vectors = parse_vectors(document);
    assert_eq!(vectors.len(), 1);
    assert_eq!(vectors["a"], vec![0x00, 0x01, 0xff]);
}

/// The examples in the "Encoding rules" table of `PROTOCOL.md`.
#[test]
fn primitive_examples_match_postcard() {
    fn check<T: serde::Serialize>(value: T, expected: &str) {
        assert_eq!(hex(&encode(&value).expect("encodes")), expected);
    }
    check(0_u32, "00");
    check(127_u32, "7f");
    check(128_u32, "80 01");
    check(300_u32, "ac 02");
    check(262_144_u32, "80 80 10");
    check(u32::MAX, "ff ff ff ff 0f");
    check(u64::MAX, "ff ff ff ff ff ff ff ff ff 01");
    check(0_i32, "00");
    check(-1_i32, "01");
    check(1_i32, "02");
    check(-2_i32, "03");
    check(4242_i32, "a4 42");
    check(i32::MIN, "ff ff ff ff 0f");
    check(true, "01");
    check(None::<u32>, "00");
    check(Some(18_u32), "01 12");
    check(b"sh".to_vec(), "02 73 68");
    check("py", "02 70 79");
    check(vec![1_u32, 300], "02 01 ac 02");
}

/// The variant indices in the enum tables of `PROTOCOL.md`, and that the
/// first index past each table does not decode.
#[test]
fn variant_indices_match_the_tables() {
    fn check<T>(variants: &[T])
    where
        T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        for (index, variant) in variants.iter().enumerate() {
            let bytes = encode(variant).expect("encodes");
            assert_eq!(bytes, [index as u8], "{variant:?} should be index {index}");
        }
        assert!(
            decode::<T>(&[variants.len() as u8]).is_err(),
            "index {} should not exist",
            variants.len()
        );
    }
    check(&[
        StdioSpec::Null,
        StdioSpec::Pipe,
        // Fd(0) is index 2 followed by the u32 0; checked separately.
    ]);
    assert_eq!(encode(&StdioSpec::Fd(0)).expect("encodes"), [2, 0]);
    assert!(decode::<StdioSpec>(&[3]).is_err());
    check(&SpawnStage::ALL);
    check(&ProtocolErrorKind::ALL);
    assert_eq!(encode(&ExitStatus::Exited(0)).expect("encodes"), [0, 0]);
    assert_eq!(
        encode(&ExitStatus::Signaled {
            signal: 0,
            core_dumped: true
        })
        .expect("encodes"),
        [1, 0, 1]
    );
    assert!(decode::<ExitStatus>(&[2, 0]).is_err());
}

/// Where the frames of each released protocol version are kept: the
/// layouts of versions 1 and 2 are frozen in `zygote_proto::v2`.
const RELEASED_V1: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors/v1/frames.json");
const RELEASED_V2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors/v2/frames.json");

/// Checks every frame recorded in `path` in the layout of `version`: it
/// decodes with the frozen types to the value its JSON names, decodes by
/// version into the current types, and encodes back by version to the
/// same bytes. So that layout has not moved, and a daemon reads it and
/// answers in it.
fn check_released(path: &str, version: u32) {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {path}: {error}"));
    let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(json["protocol_version"], version);
    let vectors = json["vectors"].as_array().expect("a vectors array");
    assert!(vectors.len() >= 30, "{path} lost vectors");
    for vector in vectors {
        let name = vector["name"].as_str().expect("name");
        let bytes = unhex(vector["hex"].as_str().expect("hex"));
        let frozen_json = |result: Result<serde_json::Value, _>| {
            result.unwrap_or_else(|error: zygote_proto::ProtoError| {
                panic!("version-{version} frame {name}: {error}")
            })
        };
        let (json, encoded) = match vector["direction"].as_str() {
            Some("client") => {
                let frozen = frozen_json(
                    decode::<v2::ClientMessage>(&bytes)
                        .map(|message| serde_json::to_value(&message).expect("JSON")),
                );
                let message = decode_client(&bytes, version).expect("decodes by version");
                (frozen, encode(&InVersion::new(&message, version)))
            }
            Some("server") => {
                let frozen = frozen_json(
                    decode::<v2::ServerMessage>(&bytes)
                        .map(|message| serde_json::to_value(&message).expect("JSON")),
                );
                let message = decode_server(&bytes, version).expect("decodes by version");
                (frozen, encode(&InVersion::new(&message, version)))
            }
            other => panic!("version-{version} frame {name}: direction {other:?}"),
        };
        assert_eq!(json, vector["message"], "version-{version} frame {name}");
        assert_eq!(
            hex(&encoded.expect("encodes")),
            hex(&bytes),
            "version-{version} frame {name} encodes differently now"
        );
    }
}

#[test]
fn released_version_1_frames_still_decode() {
    check_released(RELEASED_V1, 1);
}

#[test]
fn released_version_2_frames_still_decode() {
    check_released(RELEASED_V2, 2);
}

/// Where the frames of protocol version 3 are kept. Version 4 only
/// appended variants, so they are checked with the current types.
const RELEASED_V3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors/v3/frames.json");

/// Every frame recorded for version 3 is a version-4 frame: it decodes
/// with the current types to the value its JSON names, by version 3 to
/// the same value, and encodes back to the same bytes both in the layout
/// of version 3 and as it is. A vector of the same name in `frames.json`
/// has the same bytes, except the handshake, whose version number (and
/// feature list) differ.
#[test]
fn released_version_3_frames_are_version_4_frames() {
    let text = std::fs::read_to_string(RELEASED_V3)
        .unwrap_or_else(|error| panic!("reading {RELEASED_V3}: {error}"));
    let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(json["protocol_version"], 3);
    let vectors = json["vectors"].as_array().expect("a vectors array");
    assert!(vectors.len() >= 36, "{RELEASED_V3} lost vectors");
    let current: BTreeMap<String, Vec<u8>> = load_file()
        .into_iter()
        .map(|(name, _, bytes, _)| (name, bytes))
        .collect();
    for vector in vectors {
        let name = vector["name"].as_str().expect("name");
        let bytes = unhex(vector["hex"].as_str().expect("hex"));
        let (as_json, in_v3, as_is) = match vector["direction"].as_str() {
            Some("client") => {
                let message: ClientMessage = decode(&bytes).expect("a version-4 frame");
                assert_eq!(decode_client(&bytes, 3).expect("decodes"), message);
                (
                    serde_json::to_value(&message).expect("JSON"),
                    encode(&InVersion::new(&message, 3)),
                    encode(&message),
                )
            }
            Some("server") => {
                let message: ServerMessage = decode(&bytes).expect("a version-4 frame");
                assert_eq!(decode_server(&bytes, 3).expect("decodes"), message);
                (
                    serde_json::to_value(&message).expect("JSON"),
                    encode(&InVersion::new(&message, 3)),
                    encode(&message),
                )
            }
            other => panic!("version-3 frame {name}: direction {other:?}"),
        };
        assert_eq!(as_json, vector["message"], "version-3 frame {name}");
        assert_eq!(hex(&in_v3.expect("encodes")), hex(&bytes), "{name} in v3");
        assert_eq!(hex(&as_is.expect("encodes")), hex(&bytes), "{name} in v4");
        let now = current
            .get(name)
            .unwrap_or_else(|| panic!("frames.json lost the version-3 vector {name}"));
        if name != "hello" && name != "hello_ack" {
            assert_eq!(hex(now), hex(&bytes), "vector {name} moved in version 4");
        }
    }
}

/// Template messages have no place in a version-3 connection: a client
/// cannot encode them for it, and the daemon's answers to them reach it as
/// `RequestFailed`, and `SpawnStage::Template` as `Exec`, both variants a
/// version-3 peer decodes.
#[test]
fn version_4_content_converts_for_older_connections() {
    for name in ["template_request", "spawn_from_template", "list_templates"] {
        let Some(Frame::Client(message)) = value(name) else {
            panic!("{name} is a client frame");
        };
        for version in 1..4 {
            let error = encode(&InVersion::new(&message, version)).expect_err("no room");
            assert!(
                matches!(error, zygote_proto::ProtoError::Encode(_)),
                "{name}: {error}"
            );
        }
    }
    for (name, id) in [("template_ready", 20), ("templates", 22)] {
        let Some(Frame::Server(message)) = value(name) else {
            panic!("{name} is a server frame");
        };
        for version in 1..4 {
            let bytes = encode(&InVersion::new(&message, version)).expect("encodes");
            match decode_server(&bytes, version).expect("decodes") {
                ServerMessage::RequestFailed(failed) => {
                    assert_eq!((failed.id, failed.errno), (id, 71), "{name}");
                }
                other => panic!("{name} in version {version}: {other:?}"),
            }
        }
    }
    let Some(Frame::Server(failed)) = value("spawn_failed_template") else {
        panic!("spawn_failed_template is a server frame");
    };
    for version in 1..4 {
        let bytes = encode(&InVersion::new(&failed, version)).expect("encodes");
        match decode_server(&bytes, version).expect("decodes") {
            ServerMessage::SpawnFailed(old) => assert_eq!(old.stage, SpawnStage::Exec),
            other => panic!("{other:?}"),
        }
    }
}

/// Replies with version-3 content reach an older connection without it:
/// the new fields are dropped, `Sandbox` is sent as `Exec`, and a sandbox
/// request cannot be encoded in the older layout at all.
#[test]
fn version_3_content_converts_for_older_connections() {
    let Some(Frame::Server(spawned)) = value("spawned_sandbox") else {
        panic!("spawned_sandbox is a server frame");
    };
    let Some(Frame::Server(plain)) = value("spawned") else {
        panic!("spawned is a server frame");
    };
    let old = |message: &ServerMessage| encode(&InVersion::new(message, 2)).expect("encodes");
    let v2_spawned = decode::<v2::ServerMessage>(&old(&spawned)).expect("a version-2 frame");
    assert_eq!(
        v2_spawned,
        v2::ServerMessage::Spawned(v2::Spawned { id: 15, pid: 4243 })
    );
    assert_eq!(
        old(&plain).len() + 1,
        encode(&plain).expect("encodes").len()
    );
    let Some(Frame::Server(failed)) = value("spawn_failed_sandbox") else {
        panic!("spawn_failed_sandbox is a server frame");
    };
    match decode::<v2::ServerMessage>(&old(&failed)).expect("a version-2 frame") {
        v2::ServerMessage::SpawnFailed(failed) => {
            assert_eq!(failed.stage, v2::SpawnStage::Exec);
            assert_eq!(failed.message, "bind /srv/work: ENOENT");
        }
        other => panic!("{other:?}"),
    }
    let Some(Frame::Server(status)) = value("status_reply") else {
        panic!("status_reply is a server frame");
    };
    let back = decode_server(&old(&status), 2).expect("decodes");
    let ServerMessage::Status(back) = back else {
        panic!("{back:?}");
    };
    assert!(back.peers.is_empty() && back.spawners.is_empty());
    assert_eq!(back.spawns_failed, 4);
    let Some(Frame::Client(sandboxed)) = value("spawn_sandbox") else {
        panic!("spawn_sandbox is a client frame");
    };
    assert!(
        encode(&InVersion::new(&sandboxed, 2)).is_err(),
        "no room for a sandbox"
    );
}

/// Writes `frames.json` from the values above.
#[test]
#[ignore = "generator: run by hand after a deliberate protocol change"]
fn write_vectors_file() {
    std::fs::write(FILE, generate()).unwrap_or_else(|error| panic!("writing {FILE}: {error}"));
}

/// The file is exactly what the generator writes, so hand edits show up.
#[test]
fn vectors_file_is_generated() {
    let text =
        std::fs::read_to_string(FILE).unwrap_or_else(|error| panic!("reading {FILE}: {error}"));
    assert!(
        text == generate(),
        "{FILE} differs from the generator's output; run the ignored test write_vectors_file"
    );
}
