//! `zygote status`: ask a running zygote for its version, uptime,
//! counters, use per peer uid, spawners and warm templates, and print
//! them.

use std::time::Duration;

use zygote_client::{Client, DaemonStatus, Feature, PeerUse, SpawnerInfo, TemplateInfo};

use crate::cli::StatusArgs;

/// Exit code when the zygote cannot be asked.
const EXIT_FAILED: u8 = 1;

/// Prints the status of the zygote at `args.socket` and returns the exit
/// code: 0, or 1 when it cannot be reached.
pub fn status(args: &StatusArgs) -> u8 {
    let path = crate::cli::run::socket_path(args.socket.clone());
    let Some(runtime) = crate::cli::run::client_runtime() else {
        return EXIT_FAILED;
    };
    let asked = runtime.block_on(async {
        let client = Client::connect(&path).await?;
        let status = client.status().await?;
        // The rest of the status is worth printing when the list is not.
        let templates = if client.offers(Feature::Templates) {
            client.templates().await.map_err(|error| error.to_string())
        } else {
            Ok(Vec::new())
        };
        let protocol = Protocol {
            version: client.protocol_version(),
            features: client.features(),
        };
        Ok::<_, zygote_client::Error>((status, protocol, templates))
    });
    match asked {
        Ok((status, protocol, templates)) if args.json => {
            let socket = path.display().to_string();
            println!("{}", render_json(&socket, &status, &protocol, &templates));
            0
        }
        Ok((status, protocol, templates)) => {
            let socket = path.display().to_string();
            print!("{}", render(&socket, &status, &protocol, &templates));
            0
        }
        Err(error) => {
            eprintln!("zygote: {error}");
            EXIT_FAILED
        }
    }
}

/// What the handshake told: the protocol version spoken and the zygote's
/// optional features.
struct Protocol {
    version: u32,
    features: Vec<String>,
}

impl Protocol {
    /// The `protocol:` and `features:` lines.
    fn lines(&self) -> String {
        let features = if self.features.is_empty() {
            "none".to_owned()
        } else {
            self.features.join(", ")
        };
        format!(
            "protocol:          {}\n\
             features:          {features}\n",
            self.version
        )
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "protocol_version": self.version, "features": self.features })
    }
}

/// The templates listed, or why they could not be.
type Listed = Result<Vec<TemplateInfo>, String>;

fn render(socket: &str, status: &DaemonStatus, protocol: &Protocol, templates: &Listed) -> String {
    format!(
        "socket:            {socket}\n\
         version:           {}\n\
         {}\
         pid:               {}\n\
         uptime:            {}\n\
         connections:       {} open, {} accepted\n\
         children running:  {}\n\
         spawns:            {} succeeded, {} failed\n\
         {}{}{}",
        status.server_version,
        protocol.lines(),
        status.pid,
        human_duration(status.uptime),
        status.connections_open,
        status.connections_accepted,
        status.children_running,
        status.spawns_succeeded,
        status.spawns_failed,
        peers_table(&status.peers),
        spawners_table(&status.spawners),
        templates_table(templates),
    )
}

/// The warm templates the zygote showed (every uid's to root and the
/// zygote's own uid, the caller's own to anyone else), as a table; nothing
/// when there are none or the zygote does not offer them; one line when
/// they could not be listed.
fn templates_table(templates: &Listed) -> String {
    let templates = match templates {
        Ok(templates) if templates.is_empty() => return String::new(),
        Ok(templates) => templates,
        Err(error) => return format!("\ntemplates:         could not be listed: {error}\n"),
    };
    let mut table = format!(
        "\ntemplates:\n  {:>6}  {:>10}  {:>8}  {:>6}  {:>8}  {:>9}  {:>7}  {:<16}  {}\n",
        "HANDLE", "UID", "PID", "FORKS", "RESTARTS", "AGE", "RSS", "INTERPRETER", "PRELOAD"
    );
    for template in templates {
        let pid = if template.pid > 0 {
            template.pid.to_string()
        } else {
            "-".to_owned()
        };
        let preload = if template.preload.is_empty() {
            "-".to_owned()
        } else {
            template.preload.join(",")
        };
        table.push_str(&format!(
            "  {:>6}  {:>10}  {:>8}  {:>6}  {:>8}  {:>9}  {:>7}  {:<16}  {}\n",
            template.template,
            template.uid,
            pid,
            template.forks,
            template.restarts,
            human_duration(Duration::from_millis(template.age_millis)),
            human_bytes(template.rss_bytes),
            String::from_utf8_lossy(&template.interpreter),
            preload,
        ));
    }
    table
}

/// `812K`, `24.0M`, `1.5G`: powers of 1024, as ps and top print them.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["K", "M", "G", "T"];
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0}{}", UNITS[0])
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

/// The use of each peer uid the zygote showed (every uid to root and the
/// zygote's own uid, the caller's own to anyone else), as a table; nothing
/// when it showed none (a zygote of protocol version 2 or older).
fn peers_table(peers: &[PeerUse]) -> String {
    if peers.is_empty() {
        return String::new();
    }
    let mut table = format!(
        "\npeers:\n  {:>10}  {:>13}  {:>15}  {}\n",
        "UID", "CONNECTIONS", "CHILDREN", "SANDBOX"
    );
    for peer in peers {
        table.push_str(&format!(
            "  {:>10}  {:>13}  {:>15}  {}\n",
            peer.uid,
            format!("{}/{}", peer.connections, peer.connections_limit),
            format!("{}/{}", peer.children, peer.children_limit),
            peer.sandbox_profile.as_deref().unwrap_or("-"),
        ));
    }
    table
}

/// The zygote's per-uid spawner processes, as a table; nothing when it
/// has none.
fn spawners_table(spawners: &[SpawnerInfo]) -> String {
    if spawners.is_empty() {
        return String::new();
    }
    let mut table = format!(
        "\nspawners:\n  {:>10}  {:>10}  {:>10}  {:>8}\n",
        "UID", "PID", "SPAWNS", "RESTARTS"
    );
    for spawner in spawners {
        table.push_str(&format!(
            "  {:>10}  {:>10}  {:>10}  {:>8}\n",
            spawner.uid, spawner.pid, spawner.spawns, spawner.restarts
        ));
    }
    table
}

/// One JSON object with the same facts; durations in milliseconds.
/// Templates that could not be listed are `null`, with
/// `templates_error` saying why.
fn render_json(
    socket: &str,
    status: &DaemonStatus,
    protocol: &Protocol,
    templates: &Listed,
) -> String {
    serde_json::json!({
        "socket": socket,
        "version": status.server_version,
        "protocol_version": protocol.json()["protocol_version"],
        "features": protocol.json()["features"],
        "pid": status.pid,
        "uptime_ms": u64::try_from(status.uptime.as_millis()).unwrap_or(u64::MAX),
        "connections_open": status.connections_open,
        "connections_accepted": status.connections_accepted,
        "children_running": status.children_running,
        "spawns_succeeded": status.spawns_succeeded,
        "spawns_failed": status.spawns_failed,
        "peers": status.peers.iter().map(|peer| serde_json::json!({
            "uid": peer.uid,
            "connections": peer.connections,
            "connections_limit": peer.connections_limit,
            "children": peer.children,
            "children_limit": peer.children_limit,
            "sandbox_profile": peer.sandbox_profile,
        })).collect::<Vec<_>>(),
        "spawners": status.spawners.iter().map(|spawner| serde_json::json!({
            "uid": spawner.uid,
            "pid": spawner.pid,
            "spawns": spawner.spawns,
            "restarts": spawner.restarts,
        })).collect::<Vec<_>>(),
        "templates": templates.as_ref().ok().map(|templates| {
            templates.iter().map(template_json).collect::<Vec<_>>()
        }),
        "templates_error": templates.as_ref().err(),
    })
    .to_string()
}

/// One template in `--json`: the interpreter as text (lossy), the age in
/// milliseconds, the RSS in bytes.
fn template_json(template: &TemplateInfo) -> serde_json::Value {
    serde_json::json!({
        "handle": template.template,
        "uid": template.uid,
        "pid": template.pid,
        "kind": template.kind,
        "interpreter": String::from_utf8_lossy(&template.interpreter),
        "preload": template.preload,
        "forks": template.forks,
        "restarts": template.restarts,
        "age_ms": template.age_millis,
        "rss_bytes": template.rss_bytes,
    })
}

/// `1d 2h 3m 4s`, leaving out leading zero units.
fn human_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let first = parts.iter().position(|(n, _)| *n != 0).unwrap_or(3);
    parts[first..]
        .iter()
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_drop_leading_zero_units() {
        assert_eq!(human_duration(Duration::from_millis(900)), "0s");
        assert_eq!(human_duration(Duration::from_secs(61)), "1m 1s");
        assert_eq!(human_duration(Duration::from_secs(90_061)), "1d 1h 1m 1s");
    }

    #[test]
    fn peers_and_spawners_print_as_tables() {
        let peers = [
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
                connections: 2,
                children: 3,
                children_limit: 1024,
                connections_limit: 256,
                sandbox_profile: Some("build".to_owned()),
            },
        ];
        assert_eq!(
            peers_table(&peers),
            "\npeers:\n\
             \x20        UID    CONNECTIONS         CHILDREN  SANDBOX\n\
             \x20          0         1/1024           0/4096  -\n\
             \x20       1000          2/256           3/1024  build\n"
        );
        assert_eq!(peers_table(&[]), "");
        let spawners = [SpawnerInfo {
            uid: 1000,
            pid: 77,
            spawns: 5,
            restarts: 1,
        }];
        assert_eq!(
            spawners_table(&spawners),
            "\nspawners:\n\
             \x20        UID         PID      SPAWNS  RESTARTS\n\
             \x20       1000          77           5         1\n"
        );
        assert_eq!(spawners_table(&[]), "");
    }

    fn template(handle: u64, pid: i32, preload: &[&str]) -> TemplateInfo {
        TemplateInfo {
            template: handle,
            uid: 1000,
            pid,
            kind: "python".to_owned(),
            interpreter: b"/usr/bin/python3".to_vec(),
            preload: preload.iter().map(|name| (*name).to_owned()).collect(),
            forks: 300,
            restarts: 1,
            age_millis: 61_000,
            rss_bytes: 25 << 20,
        }
    }

    #[test]
    fn templates_print_as_a_table_and_in_json() {
        let templates = [template(3, 4300, &["json", "decimal"]), template(4, 0, &[])];
        let listed: Listed = Ok(templates.to_vec());
        assert_eq!(
            templates_table(&listed),
            "\ntemplates:\n\
             \x20 HANDLE         UID       PID   FORKS  RESTARTS        AGE      RSS  \
             INTERPRETER       PRELOAD\n\
             \x20      3        1000      4300     300         1      1m 1s    25.0M  \
             /usr/bin/python3  json,decimal\n\
             \x20      4        1000         -     300         1      1m 1s    25.0M  \
             /usr/bin/python3  -\n"
        );
        assert_eq!(templates_table(&Ok(Vec::new())), "");
        assert_eq!(
            template_json(&templates[0]),
            serde_json::json!({
                "handle": 3, "uid": 1000, "pid": 4300, "kind": "python",
                "interpreter": "/usr/bin/python3", "preload": ["json", "decimal"],
                "forks": 300, "restarts": 1, "age_ms": 61000, "rss_bytes": 26214400u64,
            })
        );
        assert_eq!(human_bytes(812 * 1024), "812K");
        assert_eq!(human_bytes(3 << 30), "3.0G");
    }

    #[test]
    fn templates_that_cannot_be_listed_are_one_line() {
        let listed: Listed = Err("list templates failed: Operation not permitted".to_owned());
        assert_eq!(
            templates_table(&listed),
            "\ntemplates:         could not be listed: list templates failed: Operation not \
             permitted\n"
        );
    }

    #[test]
    fn status_names_the_protocol_and_features() {
        let protocol = Protocol {
            version: 2,
            features: vec!["pty".to_owned(), "large_args".to_owned()],
        };
        assert_eq!(
            protocol.lines(),
            "protocol:          2\nfeatures:          pty, large_args\n"
        );
        assert_eq!(
            protocol.json(),
            serde_json::json!({ "protocol_version": 2, "features": ["pty", "large_args"] })
        );
        let none = Protocol {
            version: 1,
            features: Vec::new(),
        };
        assert!(none.lines().ends_with("features:          none\n"));
    }
}
