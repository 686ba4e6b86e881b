//! `zygote status`: ask a running zygote for its version, uptime,
//! counters, use per peer uid and spawners, and print them.

use std::time::Duration;

use zygote_client::{Client, DaemonStatus, PeerUse, SpawnerInfo};

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
        let protocol = Protocol {
            version: client.protocol_version(),
            features: client.features(),
        };
        Ok::<_, zygote_client::Error>((status, protocol))
    });
    match asked {
        Ok((status, protocol)) if args.json => {
            println!(
                "{}",
                render_json(&path.display().to_string(), &status, &protocol)
            );
            0
        }
        Ok((status, protocol)) => {
            print!(
                "{}",
                render(&path.display().to_string(), &status, &protocol)
            );
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

fn render(socket: &str, status: &DaemonStatus, protocol: &Protocol) -> String {
    format!(
        "socket:            {socket}\n\
         version:           {}\n\
         {}\
         pid:               {}\n\
         uptime:            {}\n\
         connections:       {} open, {} accepted\n\
         children running:  {}\n\
         spawns:            {} succeeded, {} failed\n\
         {}{}",
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
    )
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
fn render_json(socket: &str, status: &DaemonStatus, protocol: &Protocol) -> String {
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
    })
    .to_string()
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
