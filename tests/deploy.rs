//! The deployment files (`deploy/`) against the connector itself: every metric the Grafana dashboard and
//! the PrometheusRule query is one the running binary exposes on `/metrics`, and the shipped configs are
//! ones it accepts. The schema, unit-file and compose checks that need no binary are in
//! `scripts/check-deploy`.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{free_port, insert_event, wait_until, Broker, Connector, Engine, MariaDb, OutboxRow};

/// Files whose queries name our metrics, relative to the repository root.
const QUERYING_FILES: &[&str] =
    &["deploy/grafana/outbox-cdc.json", "deploy/kubernetes/prometheus-operator/prometheusrule.yaml"];

/// Body of `GET /metrics` on 127.0.0.1:`port`; `None` while nothing answers 200.
fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// Every series name a Prometheus server can store from this page: each sample's name, and for each
/// `# TYPE` line the names its type produces.
fn exposed_series(page: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in page.lines() {
        if let Some(declaration) = line.strip_prefix("# TYPE ") {
            let mut parts = declaration.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty()) {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The `outbox_cdc_*` identifiers in a file's text (queries, legends, descriptions alike).
fn referenced_metrics(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("outbox_cdc_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        found.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    found
}

/// Guards against a dashboard panel or an alert that silently shows "no data" forever: a metric renamed
/// or removed in `src/metrics.rs` (or misspelled in `deploy/`) while the dashboard and the alert rules
/// still query the old name.
#[tokio::test(flavor = "multi_thread")]
async fn dashboard_and_alerts_query_only_exposed_metrics() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    // Labelled families (per topic, partition, aggregate type) appear on the page with their first
    // event: stream a few, as in production.
    let mut conn = db.conn().await;
    for i in 0..3 {
        insert_event(&mut conn, &OutboxRow::new(format!("A-{i}"))).await.unwrap();
    }
    let port = free_port();
    let connector = Connector::start(&db, &broker, &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let mut page = None;
    assert!(
        wait_until(Duration::from_secs(120), || {
            page = scrape(port);
            page.as_deref().is_some_and(|p| {
                p.contains("outbox_cdc_end_to_end_latency_seconds_count{")
                    && p.contains("outbox_cdc_partition_events_total{")
            })
        }),
        "/metrics never showed the streamed events: {page:?}\n{}",
        connector.logs()
    );
    let exposed = exposed_series(&page.expect("scraped above"));

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in QUERYING_FILES {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        let referenced = referenced_metrics(&text);
        assert!(!referenced.is_empty(), "{file} queries no outbox_cdc_* metric: is this the right file?");
        let missing: Vec<_> = referenced.difference(&exposed).collect();
        assert!(
            missing.is_empty(),
            "{file} queries metrics that /metrics does not expose: {missing:?}\nexposed: {exposed:?}"
        );
    }
}

/// The `connector.toml` a file embeds as a YAML block scalar (`  connector.toml: |`), unindented.
fn embedded_toml(yaml: &str) -> String {
    let lines = yaml.lines().skip_while(|l| l.trim() != "connector.toml: |").skip(1);
    let first = lines.clone().find(|l| !l.trim().is_empty()).expect("connector.toml block is empty");
    let indent = first.len() - first.trim_start().len();
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
        .map(|l| l.get(indent..).unwrap_or("").to_string() + "\n")
        .collect()
}

/// Guards against shipping a config the connector refuses at start (an invented or misspelled key: unknown
/// keys are definite errors, so a pod or container would crash-loop on its first start).
#[test]
fn shipped_configs_are_accepted_by_the_connector() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["deploy/kubernetes/configmap.yaml", "deploy/kubernetes/active-standby/configmap.yaml"] {
        let configmap = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        let from_configmap = embedded_toml(&configmap);
        assert!(from_configmap.contains("[state]"), "{file}: the block ended early:\n{from_configmap}");
        outbox_cdc::config::Config::parse(&from_configmap).unwrap_or_else(|e| panic!("{file}: {e}\n{from_configmap}"));
    }
    let compose = std::fs::read_to_string(root.join("deploy/connector.docker.toml")).unwrap();
    outbox_cdc::config::Config::parse(&compose).unwrap_or_else(|e| panic!("deploy/connector.docker.toml: {e}"));
}

/// The rules of `exposed_series` and `referenced_metrics`, on a page and queries written by hand.
#[test]
fn series_names_follow_each_metric_type() {
    let page = "# HELP a x.\n# TYPE outbox_cdc_a counter\n# TYPE outbox_cdc_h histogram\n\
                # TYPE outbox_cdc_g gauge\noutbox_cdc_g 1\noutbox_cdc_a_total{topic=\"t\"} 3\n# EOF\n";
    let exposed = exposed_series(page);
    for name in ["outbox_cdc_a_total", "outbox_cdc_h_bucket", "outbox_cdc_h_sum", "outbox_cdc_h_count", "outbox_cdc_g"]
    {
        assert!(exposed.contains(name), "{name} missing from {exposed:?}");
    }
    assert!(!exposed.contains("outbox_cdc_a"), "a counter is stored as name_total only");
    let referenced =
        referenced_metrics("rate(outbox_cdc_a_total{x=\"y\"}[5m]) / outbox_cdc_g > 0\nexpr: outbox_cdc_h_bucket");
    assert_eq!(
        referenced.into_iter().collect::<Vec<_>>(),
        ["outbox_cdc_a_total", "outbox_cdc_g", "outbox_cdc_h_bucket"]
    );
}
