//! Property tests of the codec: every message survives a round trip, a
//! strict prefix of a frame is always `Truncated`, and arbitrary bytes never
//! make the decoder panic.

use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

use zygote_proto::{
    AppliedSandbox, ClientMessage, ContinueNotice, Env, EnvVar, ExitNotice, ExitStatus,
    FEATURES_SINCE, FdMapping, FilesystemSpec, Hello, HelloAck, InVersion, KillOnClose,
    LandlockSpec, Limits, MountKind, MountSpec, NetworkMode, PeerUse, ProtoError, ProtocolError,
    ProtocolErrorKind, PtySpec, RequestFailed, ResourceLimit, ResourceUsage, SandboxSpec,
    SeccompSpec, ServerMessage, SignalRequest, SignalSent, SpawnFailed, SpawnRequest, SpawnStage,
    Spawned, SpawnerInfo, StatusReply, StatusRequest, StdioSpec, StopNotice, TemplateInfo,
    TemplateList, TemplateListRequest, TemplateReady, TemplateRequest, TemplateSpawnRequest,
    Timeout, UserSpec, WindowSize, decode, decode_client, decode_server, encode, v2,
};

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..24)
}

fn text() -> impl Strategy<Value = String> {
    any::<String>()
}

fn stdio() -> impl Strategy<Value = StdioSpec> {
    prop_oneof![
        Just(StdioSpec::Null),
        Just(StdioSpec::Pipe),
        any::<u32>().prop_map(StdioSpec::Fd),
    ]
}

fn stage() -> impl Strategy<Value = SpawnStage> {
    prop::sample::select(SpawnStage::ALL.to_vec())
}

fn protocol_error_kind() -> impl Strategy<Value = ProtocolErrorKind> {
    prop::sample::select(ProtocolErrorKind::ALL.to_vec())
}

fn exit_status() -> impl Strategy<Value = ExitStatus> {
    prop_oneof![
        any::<i32>().prop_map(ExitStatus::Exited),
        (any::<i32>(), any::<bool>()).prop_map(|(signal, core_dumped)| ExitStatus::Signaled {
            signal,
            core_dumped
        }),
    ]
}

fn paths() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(bytes(), 0..3)
}

fn sandbox() -> impl Strategy<Value = SandboxSpec> {
    let mount = (
        prop::sample::select(vec![
            MountKind::ReadOnlyBind,
            MountKind::Bind,
            MountKind::Tmpfs,
        ]),
        bytes(),
        bytes(),
    )
        .prop_map(|(kind, source, destination)| MountSpec {
            kind,
            source,
            destination,
        });
    let filesystem =
        prop::collection::vec(mount, 0..4).prop_map(|mounts| FilesystemSpec { mounts });
    let seccomp = prop_oneof![
        text().prop_map(SeccompSpec::Profile),
        text().prop_map(SeccompSpec::Filter),
    ];
    let landlock = (
        (paths(), paths(), paths()),
        prop::collection::vec(any::<u16>(), 0..3),
        prop::collection::vec(any::<u16>(), 0..3),
        any::<bool>(),
    )
        .prop_map(
            |((read_only, read_execute, read_write), tcp_bind, tcp_connect, require)| {
                LandlockSpec {
                    read_only,
                    read_execute,
                    read_write,
                    tcp_bind,
                    tcp_connect,
                    require,
                }
            },
        );
    (
        prop::option::of(text()),
        prop::option::of(filesystem),
        prop::sample::select(vec![NetworkMode::Host, NetworkMode::None]),
        any::<bool>(),
        prop::option::of(text()),
        prop::option::of(seccomp),
        prop::option::of(landlock),
    )
        .prop_map(
            |(profile, filesystem, network, isolate, hostname, seccomp, landlock)| SandboxSpec {
                profile,
                filesystem,
                network,
                isolate,
                hostname,
                seccomp,
                landlock,
            },
        )
}

fn applied_sandbox() -> impl Strategy<Value = AppliedSandbox> {
    (
        prop::option::of(text()),
        prop::collection::vec(text(), 0..4),
        prop::option::of(text()),
        prop::option::of(any::<u32>()),
        any::<bool>(),
    )
        .prop_map(
            |(profile, namespaces, seccomp, landlock_abi, landlock_complete)| AppliedSandbox {
                profile,
                namespaces,
                seccomp,
                landlock_abi,
                landlock_complete,
            },
        )
}

fn peer_use() -> impl Strategy<Value = PeerUse> {
    (
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::option::of(text()),
    )
        .prop_map(
            |(uid, connections, children, children_limit, connections_limit, sandbox_profile)| {
                PeerUse {
                    uid,
                    connections,
                    children,
                    children_limit,
                    connections_limit,
                    sandbox_profile,
                }
            },
        )
}

fn spawner_info() -> impl Strategy<Value = SpawnerInfo> {
    (any::<u32>(), any::<i32>(), any::<u64>(), any::<u64>()).prop_map(
        |(uid, pid, spawns, restarts)| SpawnerInfo {
            uid,
            pid,
            spawns,
            restarts,
        },
    )
}

fn spawn_request() -> impl Strategy<Value = SpawnRequest> {
    (spawn_request_without_sandbox(), prop::option::of(sandbox()))
        .prop_map(|(request, sandbox)| SpawnRequest { sandbox, ..request })
}

fn env() -> impl Strategy<Value = Env> {
    prop::collection::vec(
        (bytes(), bytes()).prop_map(|(key, value)| EnvVar { key, value }),
        0..6,
    )
    .prop_map(Env::from)
}

fn template_request() -> impl Strategy<Value = TemplateRequest> {
    (
        any::<u64>(),
        text(),
        bytes(),
        prop::collection::vec(text(), 0..4),
        env(),
        prop::option::of(bytes()),
    )
        .prop_map(
            |(id, kind, interpreter, preload, env, cwd)| TemplateRequest {
                id,
                kind,
                interpreter,
                preload,
                env,
                cwd,
            },
        )
}

fn template_info() -> impl Strategy<Value = TemplateInfo> {
    (
        (any::<u64>(), any::<u32>(), any::<i32>(), text(), bytes()),
        prop::collection::vec(text(), 0..4),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
    )
        .prop_map(
            |(
                (template, uid, pid, kind, interpreter),
                preload,
                (forks, restarts, age_millis, rss_bytes),
            )| TemplateInfo {
                template,
                uid,
                pid,
                kind,
                interpreter,
                preload,
                forks,
                restarts,
                age_millis,
                rss_bytes,
            },
        )
}

/// The messages version 4 appended.
fn template_client_message() -> impl Strategy<Value = ClientMessage> {
    prop_oneof![
        template_request().prop_map(ClientMessage::Template),
        (any::<u64>(), spawn_request()).prop_map(|(template, spawn)| {
            ClientMessage::SpawnFromTemplate(TemplateSpawnRequest { template, spawn })
        }),
        any::<u64>().prop_map(|id| ClientMessage::ListTemplates(TemplateListRequest { id })),
    ]
}

fn template_server_message() -> impl Strategy<Value = ServerMessage> {
    prop_oneof![
        (any::<u64>(), any::<u64>(), any::<i32>(), any::<bool>()).prop_map(
            |(id, template, pid, reused)| ServerMessage::TemplateReady(TemplateReady {
                id,
                template,
                pid,
                reused,
            })
        ),
        (any::<u64>(), prop::collection::vec(template_info(), 0..3))
            .prop_map(|(id, templates)| ServerMessage::Templates(TemplateList { id, templates })),
    ]
}

fn is_template_message(message: &ClientMessage) -> bool {
    matches!(
        message,
        ClientMessage::Template(_)
            | ClientMessage::SpawnFromTemplate(_)
            | ClientMessage::ListTemplates(_)
    )
}

fn spawn_request_without_sandbox() -> impl Strategy<Value = SpawnRequest> {
    let env = env();
    let fd_mappings = prop::collection::vec(
        (any::<u32>(), any::<i32>()).prop_map(|(attached_index, child_fd)| FdMapping {
            attached_index,
            child_fd,
        }),
        0..6,
    );
    let rlimits = prop::collection::vec(
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(resource, soft, hard)| {
            ResourceLimit {
                resource,
                soft,
                hard,
            }
        }),
        0..4,
    );
    (
        (
            any::<u64>(),
            bytes(),
            prop::option::of(bytes()),
            prop::collection::vec(bytes(), 0..6),
            env,
            prop::option::of(bytes()),
        ),
        (stdio(), stdio(), stdio()),
        (
            fd_mappings,
            any::<bool>(),
            prop::option::of(any::<i32>()),
            prop::option::of(any::<u32>()),
            rlimits,
        ),
        (
            prop::option::of(
                (
                    any::<u32>(),
                    any::<u32>(),
                    prop::collection::vec(any::<u32>(), 0..4),
                )
                    .prop_map(|(uid, gid, groups)| UserSpec { uid, gid, groups }),
            ),
            prop::option::of(
                (any::<i32>(), any::<bool>()).prop_map(|(signal, process_group)| KillOnClose {
                    signal,
                    process_group,
                }),
            ),
            prop::option::of(
                (any::<u64>(), any::<u64>()).prop_map(|(millis, grace_millis)| Timeout {
                    millis,
                    grace_millis,
                }),
            ),
            prop::option::of(
                (any::<u16>(), any::<u16>()).prop_map(|(rows, cols)| PtySpec {
                    window: WindowSize { rows, cols },
                }),
            ),
            any::<bool>(),
        ),
        (
            any::<u64>(),
            prop::option::of(any::<i32>()),
            prop::collection::vec(any::<u32>(), 0..4),
            prop::option::of(any::<i32>()),
            prop::option::of(any::<u32>()),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (id, program, argv0, args, env, cwd),
                (stdin, stdout, stderr),
                (fd_mappings, new_session, process_group, umask, rlimits),
                (user, kill_on_close, timeout, pty, report_stops),
                (ignored_signals, nice, cpu_affinity, oom_score_adj, large_args, defer_spawned),
            )| SpawnRequest {
                id,
                program,
                argv0,
                args,
                env,
                cwd,
                stdin,
                stdout,
                stderr,
                fd_mappings,
                new_session,
                process_group,
                umask,
                rlimits,
                user,
                kill_on_close,
                timeout,
                pty,
                report_stops,
                cgroup: None,
                ignored_signals,
                nice,
                cpu_affinity,
                oom_score_adj,
                large_args,
                defer_spawned,
                sandbox: None,
            },
        )
}

fn client_message() -> impl Strategy<Value = ClientMessage> {
    prop_oneof![
        (any::<u32>(), text()).prop_map(|(protocol_version, client)| {
            ClientMessage::Hello(Hello {
                protocol_version,
                client,
            })
        }),
        spawn_request().prop_map(ClientMessage::Spawn),
        (any::<u64>(), any::<u64>(), any::<i32>()).prop_map(|(id, spawn_id, signal)| {
            ClientMessage::Signal(SignalRequest {
                id,
                spawn_id,
                signal,
            })
        }),
        any::<u64>().prop_map(|id| ClientMessage::Status(StatusRequest { id })),
        template_client_message(),
    ]
}

fn server_message() -> impl Strategy<Value = ServerMessage> {
    prop_oneof![
        (
            any::<u32>(),
            text(),
            any::<u32>(),
            any::<u32>(),
            proptest::collection::vec(text(), 0..4)
        )
            .prop_map(
                |(protocol_version, server_version, max_frame_bytes, max_fds_per_frame, names)| {
                    // Version 1's layout has no room for features.
                    let features = if protocol_version >= FEATURES_SINCE {
                        names
                    } else {
                        Vec::new()
                    };
                    ServerMessage::HelloAck(HelloAck {
                        protocol_version,
                        server_version,
                        limits: Limits {
                            max_frame_bytes,
                            max_fds_per_frame,
                        },
                        features,
                    })
                }
            ),
        (
            any::<u64>(),
            any::<i32>(),
            prop::option::of(applied_sandbox())
        )
            .prop_map(|(id, pid, sandbox)| ServerMessage::Spawned(Spawned {
                id,
                pid,
                sandbox
            })),
        (any::<u64>(), stage(), any::<i32>(), text()).prop_map(|(id, stage, errno, message)| {
            ServerMessage::SpawnFailed(SpawnFailed {
                id,
                stage,
                errno,
                message,
            })
        }),
        (
            any::<u64>(),
            exit_status(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<bool>(),
            any::<i32>()
        )
            .prop_map(
                |(id, status, user_micros, system_micros, max_rss_kib, timed_out, pid)| {
                    ServerMessage::Exited(ExitNotice {
                        id,
                        status,
                        usage: ResourceUsage {
                            user_micros,
                            system_micros,
                            max_rss_kib,
                        },
                        timed_out,
                        tree: None,
                        pid,
                    })
                }
            ),
        any::<u64>().prop_map(|id| ServerMessage::SignalSent(SignalSent { id })),
        (any::<u64>(), any::<i32>(), text()).prop_map(|(id, errno, message)| {
            ServerMessage::RequestFailed(RequestFailed { id, errno, message })
        }),
        (protocol_error_kind(), text()).prop_map(|(kind, message)| {
            ServerMessage::ProtocolError(ProtocolError { kind, message })
        }),
        (
            (any::<u64>(), text(), any::<i32>(), any::<u64>()),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>()
            ),
            (
                prop::collection::vec(peer_use(), 0..3),
                prop::collection::vec(spawner_info(), 0..3)
            ),
        )
            .prop_map(
                |(
                    (id, server_version, pid, uptime_millis),
                    (
                        connections_open,
                        connections_accepted,
                        children_running,
                        spawns_succeeded,
                        spawns_failed,
                    ),
                    (peers, spawners),
                )| {
                    ServerMessage::Status(StatusReply {
                        id,
                        server_version,
                        pid,
                        uptime_millis,
                        connections_open,
                        connections_accepted,
                        children_running,
                        spawns_succeeded,
                        spawns_failed,
                        peers,
                        spawners,
                    })
                }
            ),
        (any::<u64>(), any::<i32>())
            .prop_map(|(id, signal)| ServerMessage::Stopped(StopNotice { id, signal })),
        any::<u64>().prop_map(|id| ServerMessage::Continued(ContinueNotice { id })),
        template_server_message(),
    ]
}

/// Round trip, and every strict prefix is `Truncated`, and a trailing byte
/// is `TrailingBytes`.
fn check_message<T>(message: &T) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let bytes = encode(message).expect("messages always encode");
    prop_assert!(
        !bytes.is_empty(),
        "an empty frame would read as end of stream"
    );
    prop_assert_eq!(&decode::<T>(&bytes).expect("own encoding decodes"), message);
    for cut in 0..bytes.len() {
        let result = decode::<T>(&bytes[..cut]);
        prop_assert!(
            matches!(result, Err(ProtoError::Truncated)),
            "prefix of {} of {} bytes gave {:?}",
            cut,
            bytes.len(),
            result
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    let result = decode::<T>(&longer);
    prop_assert!(
        matches!(result, Err(ProtoError::TrailingBytes { count: 1 })),
        "one trailing byte gave {:?}",
        result
    );
    Ok(())
}

/// Decoding arbitrary bytes must not panic, and whatever it accepts must be
/// a value that re-encodes to something no longer than the input and decodes
/// back to itself.
///
/// It need not re-encode to exactly the input: postcard 1.1.3 accepts
/// over-long varints (e.g. `88 00` for 8), so the encoding is canonical only
/// on the sending side. See `overlong_varints_are_accepted`.
fn check_arbitrary<T>(input: &[u8]) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    if let Ok(message) = decode::<T>(input) {
        let again = encode(&message).expect("messages always encode");
        prop_assert!(again.len() <= input.len());
        prop_assert_eq!(decode::<T>(&again).expect("own encoding decodes"), message);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn client_messages_round_trip(message in client_message()) {
        check_message(&message)?;
    }

    #[test]
    fn server_messages_round_trip(message in server_message()) {
        check_message(&message)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..256)) {
        check_arbitrary::<ClientMessage>(&input)?;
        check_arbitrary::<ServerMessage>(&input)?;
    }

    /// In the layout of version 2, a server message loses only its
    /// version-3 content, and a client message without a sandbox survives
    /// whole; one with a sandbox does not encode.
    #[test]
    fn messages_round_trip_in_version_2(
        server in server_message(),
        client in client_message(),
    ) {
        let bytes = encode(&InVersion::new(&server, 2)).expect("encodes");
        let expected = ServerMessage::from(v2::ServerMessage::from(server.clone()));
        prop_assert_eq!(decode_server(&bytes, 2).expect("decodes"), expected);
        let sandboxed = matches!(&client, ClientMessage::Spawn(request) if request.sandbox.is_some());
        let refused = sandboxed || is_template_message(&client);
        match encode(&InVersion::new(&client, 2)) {
            Ok(bytes) => {
                prop_assert!(!refused);
                prop_assert_eq!(decode_client(&bytes, 2).expect("decodes"), client);
            }
            Err(_) => prop_assert!(refused),
        }
    }

    /// Version 4 only appended variants: in the layout of version 3, every
    /// message version 3 had is the same bytes as in version 4 and decodes
    /// back whole. A template message does not encode for version 3, and
    /// the daemon's template replies and stage reach such a connection
    /// only as variants it knows.
    #[test]
    fn version_3_layouts_are_version_4_layouts(
        server in server_message(),
        client in client_message(),
    ) {
        let in_v3 = encode(&InVersion::new(&server, 3)).expect("encodes");
        let expected = match &server {
            ServerMessage::TemplateReady(TemplateReady { id, .. })
            | ServerMessage::Templates(TemplateList { id, .. }) => {
                ServerMessage::RequestFailed(RequestFailed {
                    id: *id,
                    errno: rustix::io::Errno::PROTO.raw_os_error(),
                    message: "templates need protocol version 4".to_owned(),
                })
            }
            ServerMessage::SpawnFailed(failed) if failed.stage == SpawnStage::Template => {
                ServerMessage::SpawnFailed(SpawnFailed {
                    stage: SpawnStage::Exec,
                    ..failed.clone()
                })
            }
            other => {
                prop_assert_eq!(&in_v3, &encode(other).expect("encodes"));
                other.clone()
            }
        };
        prop_assert_eq!(decode_server(&in_v3, 3).expect("decodes"), expected);
        match encode(&InVersion::new(&client, 3)) {
            Ok(bytes) => {
                prop_assert!(!is_template_message(&client));
                prop_assert_eq!(&bytes, &encode(&client).expect("encodes"));
                prop_assert_eq!(decode_client(&bytes, 3).expect("decodes"), client);
            }
            Err(_) => prop_assert!(is_template_message(&client)),
        }
    }

    /// Random bytes rarely get past the first byte; corrupting one byte of a
    /// valid frame reaches the deeper paths of the decoder.
    #[test]
    fn corrupted_client_frames_never_panic(
        message in client_message(),
        position in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = encode(&message).expect("messages always encode");
        let at = position.index(bytes.len());
        bytes[at] = byte;
        check_arbitrary::<ClientMessage>(&bytes)?;
    }

    #[test]
    fn corrupted_server_frames_never_panic(
        message in server_message(),
        position in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = encode(&message).expect("messages always encode");
        let at = position.index(bytes.len());
        bytes[at] = byte;
        check_arbitrary::<ServerMessage>(&bytes)?;
    }
}

/// Documents a property of postcard 1.1.3 that `PROTOCOL.md` relies on:
/// senders emit the shortest varint, receivers also accept longer ones.
/// If postcard starts rejecting them, tighten `check_arbitrary` to demand
/// that accepted input re-encodes to exactly itself.
#[test]
fn overlong_varints_are_accepted() {
    let canonical = [0x04, 0x08];
    let overlong = [0x04, 0x88, 0x80, 0x00];
    let expected = ServerMessage::SignalSent(SignalSent { id: 8 });
    assert_eq!(decode::<ServerMessage>(&canonical).unwrap(), expected);
    assert_eq!(decode::<ServerMessage>(&overlong).unwrap(), expected);
    assert_eq!(encode(&expected).unwrap(), canonical);
}

/// Out-of-range values that the spec says are errors.
#[test]
fn invalid_values_are_malformed() {
    let malformed = |bytes: &[u8]| {
        assert!(
            matches!(
                decode::<ServerMessage>(bytes),
                Err(ProtoError::Malformed(_))
            ),
            "{bytes:02x?} should be malformed"
        );
    };
    // Variant index 12 does not exist (11, `Templates`, is the last).
    malformed(&[0x0c]);
    // An Exited notice whose `core_dumped` is 2.
    malformed(&[0x03, 0x07, 0x01, 0x12, 0x02, 0x00, 0x00, 0x00]);
    // A SpawnFailed whose message is not UTF-8.
    malformed(&[0x02, 0x09, 0x0a, 0x04, 0x01, 0xff]);
    // A u64 varint of 11 bytes.
    malformed(&[
        0x04, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
    ]);
    // A u64 varint whose 10th byte carries more than the 64th bit.
    malformed(&[
        0x04, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
    ]);
    // A u32 varint (the variant index) whose 5th byte is over 0x0f.
    malformed(&[0x80, 0x80, 0x80, 0x80, 0x10]);
    // A SpawnFailed whose stage is 21 (20, `Template`, is the last).
    malformed(&[0x02, 0x09, 0x15, 0x04, 0x00]);
    // Client variant index 8 does not exist (7, `ListTemplates`, is the last).
    assert!(matches!(
        decode::<ClientMessage>(&[0x08]),
        Err(ProtoError::Malformed(_))
    ));
    // A TemplateReady whose `reused` is 2.
    malformed(&[0x0a, 0x01, 0x02, 0x03, 0x02]);
    // An Option tag of 2 (SpawnRequest.argv0).
    assert!(matches!(
        decode::<ClientMessage>(&[0x01, 0x07, 0x00, 0x02]),
        Err(ProtoError::Malformed(_))
    ));
}
