//! The README's "Kafka ACLs" table against the code, the way `tests/docs_in_step.rs` holds the config
//! tables to the config parser.
//!
//! - **The table and `sink::check::acls`**: for every command, the (resource, operation) pairs the code's
//!   table needs under any of several configs (at-least-once and exactly-once, the local and the Kafka
//!   backend, with and without `kafka.create_topics`) are exactly those the README's rows for that command
//!   name: nothing missing, and no operation the code never needs.
//! - **`sink::check::acls` and the refusals the code makes**: the ACL each refusal names in its
//!   `kafka-acls` command, from the real code paths on librdkafka's mock cluster (the only broker here that
//!   can refuse a request: Tansu and noida-db have no authorizer), is the one the table gives for that
//!   command and resource: the state writer's transactional id as `KafkaStore::open` fences it, the state
//!   topic as `status` reads it, a topic as every reader reads it, and the probe id `check` proves an id with.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use outbox_cdc::checkpoint::kafka::KafkaStore;
use outbox_cdc::config::Config;
use outbox_cdc::kafka::commit::Deadline;
use outbox_cdc::kafka::identity::Context;
use outbox_cdc::kafka::read::{Starts, ToEnd, Until};
use outbox_cdc::sink::check::acls::{needs, operations_on, state_writer_id, Command, Resource};
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

/// Every resource the table can name.
const RESOURCES: [Resource; 8] = [
    Resource::RoutedTopics,
    Resource::DeadLetterTopic,
    Resource::StateTopic,
    Resource::ReplayTopics,
    Resource::AuditedTopics,
    Resource::TransactionalId,
    Resource::StateWriterId,
    Resource::Cluster,
];

/// Kafka's ACL operations, as `kafka-acls --operation` spells them.
const OPERATIONS: [&str; 13] = [
    "All",
    "Read",
    "Write",
    "Create",
    "Delete",
    "Alter",
    "Describe",
    "ClusterAction",
    "DescribeConfigs",
    "AlterConfigs",
    "IdempotentWrite",
    "CreateTokens",
    "DescribeTokens",
];

/// A config with `sections` after a minimal source, outbox and Kafka.
fn config(bootstrap: &str, sections: &str) -> Config {
    Config::parse(&format!(
        "[source]\nhost = \"127.0.0.1\"\nuser = \"u\"\npassword = \"p\"\nserver_id = 7\n\
         [outbox]\ntable = \"shop.outbox_events\"\n[kafka]\nbootstrap_servers = \"{bootstrap}\"\n{sections}"
    ))
    .unwrap_or_else(|e| panic!("{sections}: {e}"))
}

/// The configs under which each command's needs are gathered: every branch of `acls::needs`.
fn configs() -> Vec<Config> {
    let kafka = "[state]\nbackend = \"kafka\"\nname = \"orders\"\n";
    let exactly_once = "[delivery]\nguarantee = \"exactly_once\"\n";
    let fixed = "create_topics = false\n";
    vec![
        config("b:9092", ""),
        config("b:9092", fixed),
        config("b:9092", kafka),
        config("b:9092", &format!("{fixed}{kafka}")),
        config("b:9092", &format!("{kafka}{exactly_once}")),
    ]
}

/// One row of the README's table: the command cell, the resources its resource cell names, and the
/// operations its operations cell names outside parentheses (which hold asides such as "later ones take
/// Write on a topic").
#[derive(Debug)]
struct Row {
    command: String,
    resources: Vec<Resource>,
    operations: BTreeSet<String>,
}

fn readme_rows() -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let section = readme.split("\n## Kafka ACLs\n").nth(1).expect("a `## Kafka ACLs` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let rows: Vec<Row> = section
        .lines()
        .skip_while(|l| !l.starts_with("| command | resource | operations |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 3, "a row of three cells: {line}");
            let resources = RESOURCES.into_iter().filter(|r| cells[1].contains(r.readme_name())).collect();
            let mut outside = String::new();
            let mut depth = 0;
            for c in cells[2].chars() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ if depth == 0 => outside.push(c),
                    _ => {}
                }
            }
            let operations = outside
                .split(|c: char| !c.is_ascii_alphabetic())
                .filter(|w| OPERATIONS.contains(w))
                .map(str::to_string)
                .collect();
            Row { command: cells[0].to_string(), resources, operations }
        })
        .collect();
    assert!(rows.len() >= 10, "the table under `## Kafka ACLs` has {} rows: has its header changed?", rows.len());
    rows
}

/// Every row names one known command and at least one known resource; for each command, the README's
/// (resource, operation) pairs are the ones the code needs under some config, no more, no fewer.
#[test]
fn the_readme_table_is_the_code_table() {
    let rows = readme_rows();
    for row in &rows {
        assert!(
            Command::ALL.iter().any(|c| c.readme_name() == row.command),
            "the README's row for {} names no command of the code's table ({:?})",
            row.command,
            Command::ALL.map(Command::readme_name)
        );
        assert!(!row.resources.is_empty(), "the row for {} names no known resource: {row:?}", row.command);
    }
    for command in Command::ALL {
        let mut code: BTreeSet<(Resource, String)> = BTreeSet::new();
        for config in configs() {
            for acl in needs(command, &config) {
                code.extend(acl.operations.iter().map(|op| (acl.resource, op.to_string())));
            }
        }
        let readme: BTreeSet<(Resource, String)> = rows
            .iter()
            .filter(|r| r.command == command.readme_name())
            .flat_map(|r| r.resources.iter().flat_map(|res| r.operations.iter().map(move |op| (*res, op.clone()))))
            .collect();
        let missing: Vec<_> = code.difference(&readme).collect();
        let extra: Vec<_> = readme.difference(&code).collect();
        assert!(missing.is_empty(), "{}: the README does not name {missing:?}", command.readme_name());
        assert!(extra.is_empty(), "{}: the README names {extra:?}, which the code never needs", command.readme_name());
    }
}

/// `(operations, resource)` of every `kafka-acls … --operation X … --<kind> <name>` in `text`.
fn grants(text: &str) -> Vec<(BTreeSet<String>, String)> {
    text.split("kafka-acls ")
        .skip(1)
        .map(|command| {
            let words: Vec<&str> = command.split_whitespace().collect();
            let mut operations = BTreeSet::new();
            let mut resource = String::new();
            for pair in words.windows(2) {
                match pair[0] {
                    "--operation" => drop(operations.insert(pair[1].trim_end_matches([',', ')', '.']).to_string())),
                    "--topic" | "--transactional-id" | "--group" if resource.is_empty() => {
                        resource = format!("{} {}", pair[0], pair[1].trim_end_matches([',', ')', '.']))
                    }
                    _ => {}
                }
            }
            (operations, resource)
        })
        .collect()
}

fn set(operations: &[&str]) -> BTreeSet<String> {
    operations.iter().map(|s| s.to_string()).collect()
}

/// A mock cluster with a one-partition state topic, and a Kafka-backend config for it.
fn cluster() -> (MockCluster<'static, rdkafka::producer::DefaultProducerContext>, Config) {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("outbox-cdc.state", 1, 1).expect("state topic");
    let config = config(
        &cluster.bootstrap_servers(),
        "create_topics = false\n[state]\nbackend = \"kafka\"\nname = \"orders\"\n",
    );
    (cluster, config)
}

/// The state writer's id, as `KafkaStore::open` fences it, is the table's `<transactional_id>.state`, with
/// the table's operations: a refused InitProducerId names exactly those.
#[tokio::test(flavor = "multi_thread")]
async fn the_state_writer_refusal_names_the_tables_acl() {
    let (cluster, config) = cluster();
    cluster.request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED; 20],
    );
    let refused = KafkaStore::open(&config, &Deadline::default()).await.expect_err("refused").to_string();
    let wanted = operations_on(Command::Run, &config, Resource::StateWriterId);
    let id = state_writer_id(&config);
    assert_eq!(id, "orders.state");
    assert_eq!(grants(&refused), [(set(&wanted), format!("--transactional-id {id}"))], "{refused}");
}

/// The state topic as `status` reads it: a refused topic names the table's operations for `status`.
#[tokio::test(flavor = "multi_thread")]
async fn the_state_read_refusal_names_the_tables_acl() {
    let (cluster, config) = cluster();
    cluster.topic_error("outbox-cdc.state", RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED).unwrap();
    let refused = KafkaStore::inspect(&config).await.expect_err("refused").to_string();
    let wanted = operations_on(Command::ReadState, &config, Resource::StateTopic);
    assert_eq!(grants(&refused), [(set(&wanted), "--topic outbox-cdc.state".to_string())], "{refused}");
}

/// Every reader (the state read, `quarantine release`'s dead-letter read, `audit`) reads through
/// `kafka::read::ToEnd`: a refused topic names the table's operations for reading the dead-letter topic and
/// for `audit`.
#[tokio::test(flavor = "multi_thread")]
async fn a_readers_refusal_names_the_tables_acl() {
    let (cluster, config) = cluster();
    cluster.create_topic("dead-letters", 1, 1).unwrap();
    cluster.topic_error("dead-letters", RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let refused = tokio::task::spawn_blocking(move || {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &bootstrap).set("group.id", "g").set("isolation.level", "read_committed");
        let until = Until { quiet: Duration::ZERO, stall: Duration::from_secs(30) };
        let topics = ["dead-letters".to_string()];
        ToEnd::start(&cc, Context::default(), &topics, &Starts::new(), until, "dead-letters").err()
    })
    .await
    .unwrap()
    .expect("refused")
    .to_string();
    for (command, resource) in
        [(Command::QuarantineRelease, Resource::DeadLetterTopic), (Command::Audit, Resource::AuditedTopics)]
    {
        let wanted = operations_on(command, &config, resource);
        assert_eq!(grants(&refused), [(set(&wanted), "--topic dead-letters".to_string())], "{command:?}: {refused}");
    }
}

/// `check`'s fix for a transactional id it could not prove grants the table's operations on that id (by
/// prefix), for `check` and for `run` alike.
#[tokio::test(flavor = "multi_thread")]
async fn checks_grant_is_the_tables_acl() {
    let (cluster, config) = cluster();
    cluster.create_topic("outbox-cdc.dead-letter", 1, 1).unwrap();
    cluster.request_errors(
        RDKafkaApiKey::FindCoordinator,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED],
    );
    let checked = outbox_cdc::sink::check::check(&config, Ok(vec![])).await.expect("check");
    let finding = checked.report.findings.iter().find(|f| f.setting == "kafka transactional id orders.state");
    let fix = &finding.unwrap_or_else(|| panic!("{checked}")).fix;
    for command in [Command::Check, Command::Run] {
        let wanted = set(&operations_on(command, &config, Resource::StateWriterId));
        let named = grants(fix);
        assert!(
            !named.is_empty()
                && named.iter().all(|(ops, id)| *ops == wanted && id == "--transactional-id orders.state")
        );
    }
}
