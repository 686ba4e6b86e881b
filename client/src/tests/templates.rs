//! Warm templates against the fake daemon: what the client sends for a
//! template and its children, the handle it names, the one re-creation
//! after `ENOENT`, and every refusal made before anything is sent.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::thread::JoinHandle;

use zygote_proto::{
    ClientMessage, HelloAck, LIMITS, PROTOCOL_VERSION, RequestFailed, ServerMessage, SpawnFailed,
    SpawnStage, Spawned, StdioSpec, TemplateInfo, TemplateList, TemplateReady, TemplateRequest,
};

use super::{PROMPTLY, fake_daemon, join, reap, sleeper};
use crate::{Client, Error, Stdio, blocking};

/// Handles the fake daemon answers with `ENOENT`, as if it had stopped
/// their templates.
const STALE_BELOW: u64 = 8;

/// A fake zygote of version 4 offering `features`. It answers a template
/// request with handle 7, 8, 9... in turn (`RequestFailed` `EPROTO` with a
/// traceback when a preload is named `raises`); a spawn from a handle
/// below `stale_below` with `SpawnFailed` (`Validate`, `ENOENT`); any
/// other spawn with `Exited` (code: the number of arguments), after
/// writing its arguments to an attached stdout; a list request with one
/// entry. Returns every message received after the hello.
fn template_daemon(
    features: &'static [&'static str],
    stale_below: u64,
    pidfd: OwnedFd,
) -> (OwnedFd, JoinHandle<Vec<ClientMessage>>) {
    fake_daemon(move |mut daemon| {
        assert!(matches!(daemon.recv(), Some((ClientMessage::Hello(_), _))));
        daemon.send(
            ServerMessage::HelloAck(HelloAck {
                protocol_version: PROTOCOL_VERSION,
                server_version: "fake/4".into(),
                limits: LIMITS,
                features: features.iter().map(|name| (*name).to_owned()).collect(),
            }),
            &[],
        );
        let mut received = Vec::new();
        let mut next_handle = 7;
        while let Some((message, attached)) = daemon.recv() {
            match &message {
                ClientMessage::Template(request)
                    if request.preload.iter().any(|m| m == "raises") =>
                {
                    let failed = RequestFailed {
                        id: request.id,
                        errno: libc::EPROTO,
                        message: "preload raises raised:\nTraceback (most recent call last):\n  \
                                  ValueError: no"
                            .into(),
                    };
                    daemon.send(ServerMessage::RequestFailed(failed), &[]);
                }
                ClientMessage::Template(request) => {
                    let ready = TemplateReady {
                        id: request.id,
                        template: next_handle,
                        pid: 99,
                        reused: next_handle > 7,
                    };
                    next_handle += 1;
                    daemon.send(ServerMessage::TemplateReady(ready), &[]);
                }
                ClientMessage::SpawnFromTemplate(request) if request.template < stale_below => {
                    let failed = SpawnFailed {
                        id: request.spawn.id,
                        stage: SpawnStage::Validate,
                        errno: libc::ENOENT,
                        message: format!("no template {}", request.template),
                    };
                    daemon.send(ServerMessage::SpawnFailed(failed), &[]);
                }
                ClientMessage::SpawnFromTemplate(request) => {
                    let spawn = &request.spawn;
                    if let StdioSpec::Fd(index) = spawn.stdout
                        && spawn.stdin == StdioSpec::Null
                    {
                        let text = spawn
                            .args
                            .iter()
                            .map(|arg| String::from_utf8_lossy(arg).into_owned())
                            .collect::<Vec<_>>()
                            .join(" ");
                        let mut pipe = File::from(attached[index as usize].try_clone().unwrap());
                        pipe.write_all(text.as_bytes()).unwrap();
                    }
                    drop(attached);
                    if !spawn.defer_spawned {
                        let spawned = Spawned {
                            id: spawn.id,
                            pid: 4242,
                            sandbox: None,
                        };
                        daemon.send(ServerMessage::Spawned(spawned), &[pidfd.as_fd()]);
                    }
                    daemon.exited(spawn.id, i32::try_from(spawn.args.len()).unwrap());
                }
                ClientMessage::ListTemplates(request) => {
                    let list = TemplateList {
                        id: request.id,
                        templates: vec![TemplateInfo {
                            template: 7,
                            uid: 1000,
                            pid: 99,
                            kind: "python".into(),
                            interpreter: b"python3".to_vec(),
                            preload: vec!["json".into()],
                            forks: 2,
                            restarts: 0,
                            age_millis: 5,
                            rss_bytes: 1 << 20,
                        }],
                    };
                    daemon.send(ServerMessage::Templates(list), &[]);
                }
                other => panic!("unexpected {other:?}"),
            }
            received.push(message);
        }
        received
    })
}

fn template_request(message: &ClientMessage) -> &TemplateRequest {
    match message {
        ClientMessage::Template(request) => request,
        other => panic!("expected Template, got {other:?}"),
    }
}

/// The template request carries the kind, interpreter, preloads, the
/// caller's environment with the builder's changes, and the working
/// directory; its children are spawns from the handle, with no program and
/// the Python arguments, and give the same `Output` as a cold command.
#[tokio::test]
async fn a_template_and_its_children_go_out_as_specified() {
    let (sleeper, pidfd) = sleeper();
    let (client_end, daemon) = template_daemon(&["templates"], 0, pidfd);
    let client = Client::from_fd(client_end).await.unwrap();
    let template = client
        .python_template(["json", "xml.etree"])
        .python("/opt/py/bin/python3")
        .env("TEMPLATE_ONLY", "1")
        .env_remove("HOME")
        .current_dir("/tmp")
        .start()
        .await
        .unwrap();
    assert_eq!((template.handle(), template.pid()), (7, 99));
    assert!(!template.reused());
    assert_eq!(template.preload(), ["json", "xml.etree"]);
    let output = template
        .command(["-c", "print(1)"])
        .arg("extra")
        .env("CHILD_ONLY", "2")
        .output()
        .await
        .unwrap();
    assert_eq!(output.stdout, b"-c print(1) extra");
    assert_eq!(output.status.code(), Some(3));
    let mut child = template
        .command(["-m", "http.server"])
        .stdout(Stdio::null())
        .spawn()
        .await
        .unwrap();
    assert_eq!(child.id(), 4242);
    assert_eq!(child.wait().await.unwrap().code(), Some(2));
    drop((child, template));
    drop(client);
    let received = join(daemon).await;
    assert_eq!(received.len(), 3, "{received:?}");
    let request = template_request(&received[0]);
    assert_eq!(request.kind, "python");
    assert_eq!(request.interpreter, b"/opt/py/bin/python3");
    assert_eq!(request.preload, ["json", "xml.etree"]);
    assert_eq!(request.cwd.as_deref(), Some(&b"/tmp"[..]));
    let env: Vec<_> = request.env.iter().collect();
    assert!(env.contains(&(&b"TEMPLATE_ONLY"[..], &b"1"[..])), "{env:?}");
    assert!(!env.iter().any(|(key, _)| *key == b"HOME"), "{env:?}");
    for message in &received[1..] {
        let ClientMessage::SpawnFromTemplate(spawn) = message else {
            panic!("expected SpawnFromTemplate, got {message:?}");
        };
        assert_eq!(spawn.template, 7);
        assert!(spawn.spawn.program.is_empty());
        assert!(spawn.spawn.argv0.is_none() && spawn.spawn.user.is_none());
    }
    let ClientMessage::SpawnFromTemplate(first) = &received[1] else {
        unreachable!()
    };
    let child_env: Vec<_> = first.spawn.env.iter().collect();
    assert!(child_env.contains(&(&b"CHILD_ONLY"[..], &b"2"[..])));
    assert!(!child_env.iter().any(|(key, _)| *key == b"TEMPLATE_ONLY"));
    reap(sleeper);
}

/// A spawn from a template the zygote no longer knows asks for the same
/// template once and spawns once more from the new handle; a second
/// `ENOENT` is the caller's error, not a loop.
#[tokio::test]
async fn an_unknown_template_is_created_again_once() {
    let (sleeper, pidfd) = sleeper();
    let (client_end, daemon) = template_daemon(&["templates"], STALE_BELOW, pidfd);
    let client = Client::from_fd(client_end).await.unwrap();
    let template = client.python_template(["json"]).start().await.unwrap();
    assert_eq!(template.handle(), 7);
    let status = template.command(["-c", "pass"]).status().await.unwrap();
    assert_eq!(status.code(), Some(2));
    assert_eq!(template.handle(), 8, "the new handle is kept");
    assert!(template.reused());
    drop(template);
    drop(client);
    let received = join(daemon).await;
    let kinds: Vec<_> = received
        .iter()
        .map(|message| match message {
            ClientMessage::Template(_) => "template".to_owned(),
            ClientMessage::SpawnFromTemplate(spawn) => format!("spawn {}", spawn.template),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["template", "spawn 7", "template", "spawn 8"]);
    let (first, again) = (
        template_request(&received[0]),
        template_request(&received[2]),
    );
    assert_eq!(
        TemplateRequest {
            id: 0,
            ..first.clone()
        },
        TemplateRequest {
            id: 0,
            ..again.clone()
        },
        "the same spec"
    );

    let (sleeper2, pidfd) = super::sleeper();
    let (client_end, daemon) = template_daemon(&["templates"], u64::MAX, pidfd);
    let client = Client::from_fd(client_end).await.unwrap();
    let template = client.python_template(["json"]).start().await.unwrap();
    let error = tokio::time::timeout(PROMPTLY, template.command(["-c", "pass"]).status())
        .await
        .expect("one re-creation, not a loop")
        .expect_err("every handle is stale");
    assert_eq!(error.raw_os_error(), Some(libc::ENOENT), "{error}");
    assert!(
        matches!(
            &error,
            Error::Spawn {
                stage: SpawnStage::Validate,
                ..
            }
        ),
        "{error:?}"
    );
    drop(template);
    drop(client);
    assert_eq!(
        join(daemon).await.len(),
        4,
        "template, spawn, template, spawn"
    );
    reap(sleeper);
    reap(sleeper2);
}

/// Nothing is sent for a template the zygote does not offer, a bad
/// preload name, or a child the zygote would refuse (arguments that are
/// not Python's, another user, `argv[0]`, a sandbox); each error says why.
#[tokio::test]
async fn bad_templates_and_children_are_refused_before_sending() {
    let (sleeper, pidfd) = sleeper();
    let (client_end, daemon) = template_daemon(&["pty"], 0, pidfd.try_clone().unwrap());
    let client = Client::from_fd(client_end).await.unwrap();
    let error = client
        .python_template(["json"])
        .start()
        .await
        .expect_err("not offered");
    assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP), "{error}");
    assert!(error.to_string().contains("feature templates"), "{error}");
    let error = client.templates().await.expect_err("not offered");
    assert!(
        matches!(&error, Error::Request { op: "list templates", errno, .. } if *errno == libc::EOPNOTSUPP),
        "{error:?}"
    );
    assert!(error.to_string().contains("feature templates"), "{error}");
    drop(client);
    assert!(join(daemon).await.is_empty(), "nothing was sent");

    let (client_end, daemon) = template_daemon(&["templates"], 0, pidfd);
    let client = Client::from_fd(client_end).await.unwrap();
    for (preload, needle) in [
        ("os-path", "not a module name"),
        ("1x", "not a module name"),
    ] {
        let error = client
            .python_template([preload])
            .start()
            .await
            .expect_err("bad preload");
        assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
        assert!(error.to_string().contains(needle), "{error}");
    }
    let error = client
        .python_template(["json"])
        .python("")
        .start()
        .await
        .expect_err("empty interpreter");
    assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
    let template = client.python_template(["json"]).start().await.unwrap();
    let error = template
        .command(["-u", "-c", "pass"])
        .status()
        .await
        .expect_err("not -c, -m or a script");
    assert!(error.to_string().contains("-c CODE"), "{error}");
    let refusals = [
        template.command(["-c", "pass"]).uid(0).status().await,
        template.command(["-c", "pass"]).arg0("py").status().await,
        template
            .command(["-c", "pass"])
            .sandbox(crate::Sandbox::new().isolate())
            .status()
            .await,
    ];
    for refused in refusals {
        let error = refused.expect_err("a template child cannot take it");
        assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP), "{error}");
        assert!(error.to_string().contains("cannot take"), "{error}");
    }
    drop(template);
    drop(client);
    let received = join(daemon).await;
    assert_eq!(received.len(), 1, "only the good template: {received:?}");
    reap(sleeper);
}

/// A template that fails to start is `Error::Request` with the zygote's
/// errno and message (the traceback), and the connection carries on: the
/// list of templates comes back next.
#[tokio::test]
async fn a_failed_template_reports_the_traceback_and_the_list_follows() {
    let (sleeper, pidfd) = sleeper();
    let (client_end, daemon) = template_daemon(&["templates"], 0, pidfd);
    let client = Client::from_fd(client_end).await.unwrap();
    let error = client
        .python_template(["json", "raises"])
        .start()
        .await
        .expect_err("a preload raised");
    assert!(
        matches!(&error, Error::Request { op: "template", errno, .. } if *errno == libc::EPROTO),
        "{error:?}"
    );
    assert!(error.to_string().contains("Traceback"), "{error}");
    let templates = client.templates().await.unwrap();
    assert_eq!(templates.len(), 1);
    assert_eq!(templates[0].preload, ["json"]);
    assert_eq!(templates[0].rss_bytes, 1 << 20);
    assert!(client.is_connected());
    drop(client);
    assert_eq!(join(daemon).await.len(), 2);
    reap(sleeper);
}

/// The blocking flavour: a template, a child's output, the list.
#[test]
fn the_blocking_client_uses_templates() {
    let (sleeper, pidfd) = sleeper();
    let (client_end, daemon) = template_daemon(&["templates"], 0, pidfd);
    let client = blocking::Client::from_fd(client_end).unwrap();
    let template = client
        .python_template(["json"])
        .env("A", "b")
        .start()
        .unwrap();
    assert_eq!(template.handle(), 7);
    let output = template.command(["script.py", "x"]).output().unwrap();
    assert_eq!(output.stdout, b"script.py x");
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(client.templates().unwrap()[0].template, 7);
    drop(template);
    drop(client);
    assert_eq!(daemon.join().unwrap().len(), 3);
    reap(sleeper);
}
