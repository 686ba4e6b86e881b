//! The Prometheus endpoint, checked with Prometheus's own tools: promtool
//! on the exposition, and a real Prometheus server scraping the daemon.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use zygote_client::blocking::Client;

use crate::tools::{Process, free_port, have_tool, http_get, serve, temp_dir};
use crate::util::{eventually, output_within};

/// A daemon serving metrics on a free loopback port.
fn serve_with_metrics(dir: &std::path::Path) -> (Process, std::path::PathBuf, SocketAddr) {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let (daemon, socket) = serve(dir, &["--metrics-listen", &address.to_string()], &[]);
    (daemon, socket, address)
}

/// The value of the sample line `series` (name and labels, exactly) in an
/// exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

#[test]
fn metrics_count_spawns_and_pass_promtool() {
    let dir = temp_dir("promtool");
    let (_daemon, socket, address) = serve_with_metrics(dir.path());
    let client = Client::connect(&socket).unwrap();
    for _ in 0..3 {
        assert!(client.command("true").status().unwrap().success());
    }
    assert!(
        client
            .command("sh")
            .args(["-c", "kill -9 $$"])
            .status()
            .is_ok()
    );
    assert!(client.command("zygote-no-such-program").status().is_err());
    // Fails in the child, at chdir.
    assert!(
        client
            .command("true")
            .current_dir("/no/such/dir")
            .status()
            .is_err()
    );

    // Refused by the daemon before anything exists: a profile it does
    // not know (the client cannot check that).
    let unknown = zygote_client::Sandbox::new().seccomp_profile("zygote-no-such-profile");
    assert!(client.command("true").sandbox(unknown).status().is_err());

    let (code, text) = http_get(address, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{text}");
    let expect = [
        ("zygote_spawns_total{result=\"ok\"}", 4.0),
        ("zygote_spawns_total{result=\"failed\"}", 2.0),
        ("zygote_spawns_total{result=\"refused\"}", 1.0),
        ("zygote_peer_spawns_total{result=\"ok\",uid=\"0\"}", 4.0),
        ("zygote_exec_errors_total{errno=\"ENOENT\"}", 1.0),
        ("zygote_child_exits_total{kind=\"exited\"}", 3.0),
        ("zygote_child_exits_total{kind=\"signaled\"}", 1.0),
        ("zygote_children_running", 0.0),
        ("zygote_connections_open", 1.0),
        // The harness's readiness probe, then the client.
        ("zygote_connections_accepted_total", 2.0),
        ("zygote_spawn_duration_seconds_count", 7.0),
        ("zygote_protocol_errors_total{reason=\"malformed\"}", 0.0),
    ];
    for (series, value) in expect {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    assert!(sample(&text, "process_open_fds").is_some_and(|fds| fds > 0.0));
    assert!(sample(&text, "process_resident_memory_bytes").is_some_and(|rss| rss > 0.0));
    // The Status reply reads the same counters (its failures include
    // the refusal).
    let status = client.status().unwrap();
    assert_eq!((status.spawns_succeeded, status.spawns_failed), (4, 3));

    assert_eq!(http_get(address, "/").unwrap().0, 404);

    if !have_tool("promtool", "prometheus") {
        return;
    }
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = output_within(promtool, Duration::from_secs(60), "promtool");
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}\n{}{}",
        checked.status,
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The value of the single sample of a Prometheus instant query, if the
/// query has exactly one.
fn query(prometheus: SocketAddr, promql: &str) -> Option<String> {
    let (code, body) = http_get(
        prometheus,
        &format!("/api/v1/query?query={}", encode(promql)),
    )
    .ok()?;
    if code != 200 || !body.contains("\"status\":\"success\"") {
        return None;
    }
    // {"status":"success","data":{"resultType":"vector","result":[{"metric":{...},"value":[1700000000.1,"5"]}]}}
    let mut values = body.match_indices("\"value\":[").map(|(at, key)| {
        let rest = &body[at + key.len()..];
        let rest = &rest[rest.find(',')? + 1..];
        let rest = rest.strip_prefix('"')?;
        Some(rest[..rest.find('"')?].to_owned())
    });
    let first = values.next()??;
    values.next().is_none().then_some(first)
}

#[test]
fn prometheus_scrapes_the_spawn_count() {
    if !have_tool("prometheus", "prometheus") {
        return;
    }
    let dir = temp_dir("prometheus");
    let (_daemon, socket, metrics) = serve_with_metrics(dir.path());
    let web = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: zygote\n    static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .unwrap();
    let log = dir.path().join("prometheus.log");
    let mut server = Process::start(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // A file, not a pipe nobody reads until the end.
            .stderr(std::fs::File::create(&log).unwrap()),
        "prometheus",
    );

    // Spawns run while Prometheus scrapes.
    const SPAWNS: usize = 7;
    let client = Client::connect(&socket).unwrap();
    for _ in 0..SPAWNS {
        assert!(client.command("true").status().unwrap().success());
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline {
        last = query(web, "zygote_spawns_total{result=\"ok\",job=\"zygote\"}");
        if last.as_deref() == Some(&SPAWNS.to_string()) {
            break;
        }
        if let Some(exit) = server.wait_timeout(Duration::from_millis(500)) {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("prometheus exited: {exit}\n{log}");
        }
    }
    assert_eq!(
        last.as_deref(),
        Some(SPAWNS.to_string().as_str()),
        "Prometheus never saw the spawn count"
    );
    // docs/service.md's queries are valid PromQL that Prometheus evaluates;
    // rate() needs two scrapes in its window, so poll until it has them.
    let children = query(web, "zygote_children_running");
    assert_eq!(children.as_deref(), Some("0"));
    for promql in [
        "histogram_quantile(0.99, sum by (le) (rate(zygote_spawn_duration_seconds_bucket[5m])))",
        "sum(rate(zygote_spawns_total{result!=\"ok\"}[5m])) / sum(rate(zygote_spawns_total[5m]))",
    ] {
        let answered = eventually(deadline.saturating_duration_since(Instant::now()), || {
            query(web, promql).is_some()
        });
        assert!(answered, "{promql} never had a value");
    }
    let up = query(web, "up{job=\"zygote\"}");
    assert_eq!(up.as_deref(), Some("1"));
}
