//! Writes the seed corpus: a few valid frames of each kind, encoded as the
//! daemon receives them. Run from `fuzz/`: `cargo run --example seeds`.

use std::path::Path;

use zygote_proto::{
    CgroupSpec, ClientMessage, CpuMax, EnvVar, FdMapping, Hello, KillOnClose, PROTOCOL_VERSION, PYTHON_TEMPLATE,
    PtySpec, ResourceLimit, SignalRequest, SpawnRequest, StatusRequest, StdioSpec, TemplateListRequest,
    TemplateRequest, TemplateSpawnRequest, Timeout, UpgradeRequest, UserSpec, WindowSize, encode,
};

fn spawn(id: u64) -> SpawnRequest {
    SpawnRequest {
        stdout: StdioSpec::Pipe,
        ..SpawnRequest::new(id, "true")
    }
}

fn main() {
    let full = SpawnRequest {
        argv0: Some(b"sh".to_vec()),
        program: b"/bin/sh".to_vec(),
        args: vec![b"-c".to_vec(), b"echo hi >&3".to_vec()],
        env: vec![EnvVar {
            key: b"PATH".to_vec(),
            value: b"/usr/bin:/bin".to_vec(),
        }]
        .into(),
        cwd: Some(b"/tmp".to_vec()),
        stdin: StdioSpec::Fd(0),
        fd_mappings: vec![FdMapping {
            attached_index: 1,
            child_fd: 3,
        }],
        process_group: Some(0),
        umask: Some(0o022),
        rlimits: vec![ResourceLimit {
            resource: 7,
            soft: 1024,
            hard: 4096,
        }],
        user: Some(UserSpec {
            uid: 1000,
            gid: 1000,
            groups: vec![27],
        }),
        kill_on_close: Some(KillOnClose {
            signal: 9,
            process_group: true,
        }),
        timeout: Some(Timeout {
            millis: 1000,
            grace_millis: 500,
        }),
        ignored_signals: 1 << 0,
        nice: Some(5),
        cpu_affinity: vec![0],
        oom_score_adj: Some(100),
        cgroup: Some(CgroupSpec {
            kill_tree: true,
            wait_tree: true,
            memory_max: Some(512 << 20),
            memory_swap_max: Some(0),
            pids_max: Some(64),
            cpu_max: Some(CpuMax {
                quota_micros: 50_000,
                period_micros: 100_000,
            }),
            cpu_weight: Some(100),
            io_weight: Some(100),
        }),
        ..spawn(2)
    };
    let messages = [
        (
            "hello",
            ClientMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                client: "seed".into(),
            }),
        ),
        ("spawn_minimal", ClientMessage::Spawn(spawn(1))),
        ("spawn_full", ClientMessage::Spawn(full)),
        (
            "spawn_pty",
            ClientMessage::Spawn(SpawnRequest {
                pty: Some(PtySpec {
                    window: WindowSize { rows: 24, cols: 80 },
                }),
                report_stops: true,
                ..SpawnRequest::new(12, "/bin/sh")
            }),
        ),
        (
            "signal",
            ClientMessage::Signal(SignalRequest {
                id: 3,
                spawn_id: 1,
                signal: 15,
            }),
        ),
        (
            "spawn_deferred",
            ClientMessage::Spawn(SpawnRequest {
                defer_spawned: true,
                ..spawn(13)
            }),
        ),
        ("status", ClientMessage::Status(StatusRequest { id: 4 })),
        ("upgrade", ClientMessage::Upgrade(UpgradeRequest { id: 6 })),
        (
            "template",
            ClientMessage::Template(TemplateRequest {
                id: 7,
                kind: PYTHON_TEMPLATE.into(),
                interpreter: b"/usr/bin/python3".to_vec(),
                preload: vec!["json".into(), "email.mime.text".into()],
                env: vec![EnvVar {
                    key: b"PYTHONPATH".to_vec(),
                    value: b"/srv/lib".to_vec(),
                }]
                .into(),
                cwd: Some(b"/srv".to_vec()),
            }),
        ),
        (
            "template_spawn",
            ClientMessage::SpawnFromTemplate(TemplateSpawnRequest {
                template: 1_700_000_000_000_000,
                spawn: SpawnRequest {
                    args: vec![b"-c".to_vec(), b"import json; print(json.dumps(1))".to_vec()],
                    stdout: StdioSpec::Pipe,
                    timeout: Some(Timeout {
                        millis: 1000,
                        grace_millis: 500,
                    }),
                    ..SpawnRequest::new(8, Vec::new())
                },
            }),
        ),
        (
            "template_spawn_module",
            ClientMessage::SpawnFromTemplate(TemplateSpawnRequest {
                template: 1,
                spawn: SpawnRequest {
                    args: vec![b"-m".to_vec(), b"http.server".to_vec(), b"8000".to_vec()],
                    cwd: Some(b"/tmp".to_vec()),
                    fd_mappings: vec![FdMapping {
                        attached_index: 0,
                        child_fd: 3,
                    }],
                    ..SpawnRequest::new(9, Vec::new())
                },
            }),
        ),
        ("list_templates", ClientMessage::ListTemplates(TemplateListRequest { id: 10 })),
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    for target in ["decode_client", "handle_request"] {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("create seed dir");
        for (name, message) in &messages {
            let mut bytes = encode(message).expect("encode");
            if target == "handle_request" {
                // The first byte is the number of attached fds.
                bytes.insert(0, 2);
            }
            std::fs::write(dir.join(name), bytes).expect("write seed");
        }
    }
}
