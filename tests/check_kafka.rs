//! `outbox-cdc check`, the Kafka half, against a real Tansu broker: what it reports about the cluster, each
//! refusal it can produce there (a missing topic, too few partitions, a `max.message.bytes` below the
//! producer's batches or below a dead letter), and the whole command's exit codes with a real MariaDB.
//!
//! Tansu has no ACLs (nor authorizer): a refused permission is tested in `src/sink/check/mod.rs` against
//! librdkafka's mock cluster, which injects CLUSTER_AUTHORIZATION_FAILED into InitProducerId, and the
//! transactional-id and group refusals. Tansu has no transactions either: the exactly-once prerequisites
//! (the state topic, transactions, the transactional ids) are checked here against noida-db, which has
//! them and reports a topic's `cleanup.policy`.

mod common;

use std::time::Duration;

use common::{business_tx, Broker, Connector, Engine, MariaDb};
use outbox_cdc::config::Config;
use outbox_cdc::findings::{Finding, Status};
use outbox_cdc::sink::check::{check, KafkaCheck};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

const TOPIC: &str = "outbox.event.order";
const DEAD_LETTER: &str = "outbox-cdc.dead-letter";
/// The producer's batches with librdkafka's default `batch.size` (1000000) need this much, as the check
/// computes it (`kafka::required_topic_limit`).
const TAKES_BATCHES: &str = "1004433";
const EXIT_TIMEOUT: Duration = Duration::from_secs(120);

/// A config for `broker`, with `kafka` appended to its `[kafka]` section.
fn kafka_config(broker: &Broker, kafka: &str) -> Config {
    config(broker, kafka, "")
}

/// [`kafka_config`] with `sections` (`[state]`, `[delivery]`) after `[kafka]`.
fn config(broker: &Broker, kafka: &str, sections: &str) -> Config {
    let text = format!(
        "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"shop.outbox_events\"\n[kafka]\n\
         bootstrap_servers = \"{}\"\n{kafka}\n{sections}\n",
        broker.bootstrap()
    );
    Config::parse(&text).expect("config")
}

/// Creates `topic` with `partitions` partitions and these topic configs, through the Admin API.
async fn create_topic(broker: &Broker, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = broker.client_config().create().expect("admin");
    let mut new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        new_topic = new_topic.set(k, v);
    }
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let created = admin.create_topics([&new_topic], &options).await.expect("create topic");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
}

/// The finding whose setting is exactly `setting`.
fn finding<'a>(checked: &'a KafkaCheck, setting: &str) -> &'a Finding {
    checked.report.findings.iter().find(|f| f.setting == setting).unwrap_or_else(|| panic!("no {setting}:\n{checked}"))
}

/// A cluster with everything `run` needs: the check passes, and says what it found about the broker.
#[tokio::test(flavor = "multi_thread")]
async fn a_ready_cluster_passes_and_is_described() {
    let broker = Broker::start(Engine::Sqlite);
    let big = ("max.message.bytes", "16777216");
    create_topic(&broker, TOPIC, 3, &[big]).await;
    create_topic(&broker, DEAD_LETTER, 3, &[big]).await;
    let config = kafka_config(&broker, "create_topics = false\ntopic_partitions = 3");

    let checked = check(&config, Ok(vec![TOPIC.into()])).await.expect("check");
    let text = checked.to_string();
    assert!(checked.report.failures().next().is_none(), "{text}");
    assert!(checked.report.findings.iter().all(|f| f.status == Status::Ok), "{text}");
    assert_eq!(checked.cluster_id.as_deref(), Some("tansu_cluster"), "{text}");
    assert_eq!(checked.brokers.len(), 1, "{text}");
    assert!(text.contains("kafka broker version: not part of the Kafka protocol; the broker supports"), "{text}");
    assert!(text.contains("InitProducerId v0-"), "{text}");
    assert!(finding(&checked, "kafka write permission (idempotent producer id)").actual.starts_with("producer id "));
    assert_eq!(finding(&checked, &format!("kafka topic {TOPIC}")).actual, "exists, 3 partition(s)", "{text}");
    assert_eq!(finding(&checked, &format!("kafka topic {DEAD_LETTER} max.message.bytes")).actual, "16777216");
}

/// Each refusal `run` would meet later, reported now with its fix: with `create_topics = false`, a routed
/// topic with fewer partitions than `kafka.topic_partitions`, a topic whose `max.message.bytes` is below
/// the producer's batches (the start-up refusal of issue 16), a dead-letter topic below
/// `kafka.max_record_bytes`, and a routed topic that does not exist.
#[tokio::test(flavor = "multi_thread")]
async fn each_refusal_is_a_failed_finding_with_its_fix() {
    let broker = Broker::start(Engine::Sqlite);
    create_topic(&broker, TOPIC, 1, &[("max.message.bytes", "16777216")]).await;
    create_topic(&broker, "outbox.event.payment", 3, &[("max.message.bytes", "100000")]).await;
    create_topic(&broker, DEAD_LETTER, 3, &[("max.message.bytes", TAKES_BATCHES)]).await;
    let config = kafka_config(&broker, "create_topics = false\ntopic_partitions = 3");
    let routed = vec![TOPIC.into(), "outbox.event.payment".into(), "outbox.event.refund".into()];

    let checked = check(&config, Ok(routed)).await.expect("check");
    let text = checked.to_string();

    let partitions = finding(&checked, &format!("kafka topic {TOPIC}"));
    assert_eq!((partitions.status, partitions.actual.as_str()), (Status::Fail, "1 partition(s)"), "{text}");
    assert!(partitions.fix.contains("kafka.topic_partitions = 1"), "{text}");

    let batches = finding(&checked, "kafka topic outbox.event.payment max.message.bytes");
    assert_eq!((batches.status, batches.actual.as_str()), (Status::Fail, "100000"), "{text}");
    assert!(batches.fix.contains("batch.size") && batches.fix.contains("kafka-configs --alter"), "{text}");

    let dead_letter = finding(&checked, &format!("kafka topic {DEAD_LETTER} max.message.bytes"));
    assert_eq!(dead_letter.status, Status::Fail, "{text}");
    assert!(dead_letter.fix.contains("max.message.bytes=16777216"), "{text}");

    let missing = finding(&checked, "kafka topic outbox.event.refund");
    assert_eq!((missing.status, missing.actual.as_str()), (Status::Fail, "missing"), "{text}");
    assert!(
        missing.fix.contains(
            "kafka-topics --create --topic outbox.event.refund --partitions 3 --config max.message.bytes=16777216"
        ),
        "{text}"
    );

    assert_eq!(checked.report.failures().count(), 4, "{text}");
    assert!(text.contains("[FAIL] kafka topic outbox.event.refund: expected exists with at least 3"), "{text}");
}

/// With `create_topics = true` a missing topic is not a failure when the broker accepts its creation. Tansu
/// ignores `validate_only` and creates it, with the settings `run` would have used (its
/// `max.message.bytes` then passes); the finding says so instead of claiming nothing happened.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_that_may_be_created_passes() {
    let broker = Broker::start(Engine::Sqlite);
    let config = kafka_config(&broker, "create_topics = true\ntopic_partitions = 2");

    let checked = check(&config, Ok(vec![TOPIC.into()])).await.expect("check");
    let text = checked.to_string();
    assert!(checked.report.failures().next().is_none(), "{text}");
    let topic = finding(&checked, &format!("kafka topic {TOPIC}"));
    let once = checked.report.findings.iter().filter(|f| f.setting == topic.setting).count();
    assert_eq!(once, 1, "{text}");
    assert!(
        topic.actual.contains("the broker accepts its creation")
            || topic.actual.contains("created it although asked only to validate"),
        "{text}"
    );
}

/// No broker on the port: the check cannot run (transient, exit 3 from the command), and says so.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_broker_is_a_transient_error() {
    let port = common::free_port();
    let text = format!(
        "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"s.t\"\n[kafka]\n\
         bootstrap_servers = \"127.0.0.1:{port}\"\n"
    );
    let config = Config::parse(&text).unwrap();
    let error = check(&config, Ok(vec![])).await.expect_err("no broker");
    assert!(!error.is_definite(), "{error}");
    assert!(error.to_string().contains("no Kafka broker answered"), "{error}");
}

/// The whole command against a real MariaDB and Tansu: the source passes, the Kafka findings are printed
/// after the source's, and a Kafka failure is a configuration problem (exit 2) like a source one; fixed,
/// the command passes (exit 0).
#[tokio::test(flavor = "multi_thread")]
async fn the_check_command_fails_on_a_kafka_problem_and_passes_once_fixed() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Sqlite);
    let mut conn = db.conn().await;
    business_tx(&mut conn, "A-1").await.unwrap();
    create_topic(&broker, TOPIC, 1, &[("max.message.bytes", "16777216")]).await;
    create_topic(&broker, DEAD_LETTER, 1, &[("max.message.bytes", "16777216")]).await;
    let connector = Connector::new();
    connector.write_config(&db, &broker, "");
    let config = connector.config_path();
    let strict = std::fs::read_to_string(&config)
        .unwrap()
        .replace("[state]", "create_topics = false\ntopic_partitions = 2\n\n[state]");
    std::fs::write(&config, &strict).unwrap();

    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    let source = out.find("[ok  ] log_bin").expect(&out);
    let kafka = out.find("kafka: cluster id tansu_cluster; broker(s): ").expect(&out);
    assert!(source < kafka, "{out}");
    assert!(out.contains(&format!("[FAIL] kafka topic {TOPIC}: expected exists with at least 2")), "{out}");
    assert!(out.contains("2 check(s) failed"), "{out}");

    std::fs::write(&config, strict.replace("topic_partitions = 2", "topic_partitions = 1")).unwrap();
    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("[ok  ] kafka write permission (idempotent producer id)"), "{out}");
    assert!(out.ends_with("all checks passed\n"), "{out}");
}

/// The source half of the same command reads the binlog retention where the server's provider keeps it
/// (issue 20): this self-managed MariaDB by its variables, as MySQL's rules say (0: never expire; a short
/// retention warns with the server's own fix, and does not fail the check).
#[tokio::test(flavor = "multi_thread")]
async fn the_check_command_reports_the_binlog_retention() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    connector.write_config(&db, &broker, "");

    db.sql("SET GLOBAL binlog_expire_logs_seconds = 0");
    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("[ok  ] binlog retention: expected at least 24 h"), "{out}");
    assert!(out.contains("actual binlogs never expire"), "{out}");

    db.sql("SET GLOBAL binlog_expire_logs_seconds = 3600");
    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("[WARN] binlog retention: expected at least 24 h"), "{out}");
    assert!(out.contains("actual 3600 s") && out.contains("SET GLOBAL binlog_expire_logs_seconds = 604800"), "{out}");
}

/// Credentials the broker refuses are a configuration problem: definite (exit 2), naming the properties to
/// fix, not "unreachable" (exit 3). Tansu started without `--authentication` answers the SASL handshake with
/// UNSUPPORTED_SASL_MECHANISM, which librdkafka reports as an authentication failure. Guards against the
/// refusal going unseen (librdkafka queues it until the client is polled): it read as "no Kafka broker
/// answered", exit 3.
#[tokio::test(flavor = "multi_thread")]
async fn refused_credentials_are_definite() {
    let broker = Broker::start(Engine::Memory);
    let properties = "[kafka.properties]\n\"security.protocol\" = \"sasl_plaintext\"\n\"sasl.mechanism\" = \"PLAIN\"\n\
                      \"sasl.username\" = \"cdc\"\n\"sasl.password\" = \"not-the-password\"";
    let config = kafka_config(&broker, properties);
    let error = check(&config, Ok(vec![])).await.expect_err("refused");
    assert!(error.is_definite(), "{error}");
    assert!(error.to_string().contains("security.protocol, ssl.* and sasl.*"), "{error}");
    assert!(!error.to_string().contains("not-the-password"), "{error}");
}

/// The RDS/Aurora retention query against a real server: `CALL mysql.rds_show_configuration` as RDS
/// defines it (a result set of name, value, description; here a stand-in procedure of that shape, since
/// no RDS is at hand), read for the NULL default and for a set value, and a user without EXECUTE on it
/// gets the refusal as the reading's error, not a failed check.
#[tokio::test(flavor = "multi_thread")]
async fn the_rds_retention_query_reads_null_hours_and_refusals() {
    use outbox_cdc::source::managed::Retention;
    use outbox_cdc::source::purge::rds_retention;
    let db = MariaDb::start();
    let procedure = |hours: &str| {
        format!(
            "DROP PROCEDURE IF EXISTS mysql.rds_show_configuration; \
             CREATE PROCEDURE mysql.rds_show_configuration() SELECT 'binlog retention hours' AS name, \
             {hours} AS value, 'binlog retention hours specifies the duration in hours before binary logs are \
             automatically deleted.' AS description UNION ALL SELECT 'source delay', '0', 'source delay'"
        )
    };
    db.sql(&procedure("CAST(NULL AS CHAR)"));
    let mut root = db.conn().await;
    assert_eq!(rds_retention(&mut root).await.unwrap(), Ok(Retention::AsSoonAsPossible));
    db.sql(&procedure("'168'"));
    assert_eq!(rds_retention(&mut root).await.unwrap(), Ok(Retention::Seconds(168 * 3600)));

    let cdc_opts = mysql_async::Opts::from_url(&db.url_cdc()).unwrap();
    let mut cdc = mysql_async::Conn::new(cdc_opts.clone()).await.unwrap();
    let refused = rds_retention(&mut cdc).await.unwrap().expect_err("cdc has no EXECUTE on it");
    assert!(refused.starts_with("CALL mysql.rds_show_configuration was refused: "), "{refused}");
    db.sql("GRANT EXECUTE ON PROCEDURE mysql.rds_show_configuration TO 'cdc'@'127.0.0.1'");
    let mut cdc = mysql_async::Conn::new(cdc_opts).await.unwrap();
    assert_eq!(rds_retention(&mut cdc).await.unwrap(), Ok(Retention::Seconds(168 * 3600)));
}

/// `check` with `source.kind = "files"` tests Kafka too: a topic template that depends on no column names
/// its topics without a table, and a missing one fails (here with `create_topics = false`) like any other.
#[tokio::test(flavor = "multi_thread")]
async fn the_check_command_tests_kafka_for_binlog_files() {
    let broker = Broker::start(Engine::Sqlite);
    create_topic(&broker, DEAD_LETTER, 1, &[("max.message.bytes", "16777216")]).await;
    let connector = Connector::new();
    let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/binlog/mariadb-operator-mariadb-poc/domain_id_0.mariadb-repl-bin.000010");
    let text = format!(
        "[source]\nkind = \"files\"\nbinlog_files = [{file}]\n\n[outbox]\ntable = \"shop.outbox_events\"\n\n\
         [kafka]\nbootstrap_servers = {bootstrap}\ntopic = \"outbox.${{table}}\"\ncreate_topics = false\n\
         topic_partitions = 1\n\n[state]\ndir = {state}\n\n[snapshot]\nmode = \"never\"\n\n[metrics]\nenabled = false\n",
        file = common::connector::toml_str(&file.to_string_lossy()),
        bootstrap = common::connector::toml_str(&broker.bootstrap()),
        state = common::connector::toml_str(&connector.state_dir().to_string_lossy()),
    );
    std::fs::write(connector.config_path(), text).unwrap();

    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert!(out.contains("kafka: cluster id tansu_cluster; broker(s): "), "{out}");
    assert!(out.contains("[FAIL] kafka topic outbox.outbox_events: expected exists with at least 1"), "{out}");
    assert!(out.contains(&format!("[ok  ] kafka topic {DEAD_LETTER}:")), "{out}");
    assert!(out.contains("1 check(s) failed"), "{out}");
}

/// The exactly-once sections of a config: the Kafka state backend, connector `orders`.
const EXACTLY_ONCE: &str =
    "[state]\nbackend = \"kafka\"\nname = \"orders\"\n[delivery]\nguarantee = \"exactly_once\"\n";

/// The state topic as the connector creates it (`checkpoint::kafka`): compact only, kept for good, in
/// segments compaction reaches within the hour.
const COMPACT: [(&str, &str); 5] = [
    ("cleanup.policy", "compact"),
    ("retention.ms", "-1"),
    ("segment.ms", "3600000"),
    ("segment.bytes", "16777216"),
    ("min.cleanable.dirty.ratio", "0.1"),
];

/// A cluster ready for `exactly_once`: the check probes transactions, the two transactional ids (through
/// probe ids, which noida-db, without an authorizer, grants), the state topic and the readers' group
/// lookup, and every finding passes. noida-db: it has transactions and reports topic configs; Tansu has
/// neither transactions nor a transaction coordinator. Guards against `check` probing none of the
/// exactly-once prerequisites (issue 46, finding 7).
#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_prerequisites_are_probed_and_pass() {
    let broker = Broker::start(Engine::Noida);
    let big = ("max.message.bytes", "16777216");
    create_topic(&broker, TOPIC, 1, &[big]).await;
    create_topic(&broker, DEAD_LETTER, 1, &[big]).await;
    create_topic(&broker, "outbox-cdc.state", 1, &COMPACT).await;
    let config = config(&broker, "create_topics = false\ntopic_partitions = 1", EXACTLY_ONCE);

    let checked = check(&config, Ok(vec![TOPIC.into()])).await.expect("check");
    let text = checked.to_string();
    assert!(checked.report.findings.iter().all(|f| f.status == Status::Ok), "{text}");
    assert_eq!(finding(&checked, "kafka state topic outbox-cdc.state").actual, "exists, 1 partition", "{text}");
    assert_eq!(finding(&checked, "kafka state topic outbox-cdc.state cleanup.policy").actual, "compact", "{text}");
    assert!(finding(&checked, "kafka transactions").actual.starts_with("yes: "), "{text}");
    for id in ["orders", "orders.state"] {
        let granted = &finding(&checked, &format!("kafka transactional id {id}")).actual;
        assert!(granted.contains(&format!("{id}.outbox-cdc-check got a producer id")), "{text}");
        assert!(granted.contains("no running instance was fenced"), "{text}");
    }
    let group = finding(&checked, "kafka consumer group orders.state-reader (the readers' lookup)");
    assert!(group.actual.contains("the lookup was answered"), "{text}");
}

/// The state topic `run` refuses, each reported now with `run`'s own fix: three partitions (issue 46,
/// finding 1: records replayed across partitions in arrival order) and a `delete` policy (holds and an
/// idle checkpoint expire). noida-db: it reports the topic's `cleanup.policy` through DescribeConfigs (the
/// mock cluster answers no DescribeConfigs), and keeps a topic's partitions as created.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_topic_run_would_refuse_fails_the_check() {
    let broker = Broker::start(Engine::Noida);
    create_topic(&broker, DEAD_LETTER, 1, &[("max.message.bytes", "16777216")]).await;
    create_topic(&broker, "three.state", 3, &COMPACT).await;
    create_topic(&broker, "deleting.state", 1, &[("cleanup.policy", "delete")]).await;
    let sections = |topic: &str| format!("[state]\nbackend = \"kafka\"\nname = \"orders\"\ntopic = \"{topic}\"\n");

    let three = config(&broker, "create_topics = false\ntopic_partitions = 1", &sections("three.state"));
    let checked = check(&three, Ok(vec![])).await.expect("check");
    let text = checked.to_string();
    let partitions = finding(&checked, "kafka state topic three.state");
    assert_eq!((partitions.status, partitions.actual.as_str()), (Status::Fail, "3 partitions"), "{text}");
    assert!(partitions.fix.contains("it must have exactly 1") && partitions.fix.contains("state copy --to local"));
    assert_eq!(checked.report.failures().count(), 1, "{text}");

    let deleting = config(&broker, "create_topics = false\ntopic_partitions = 1", &sections("deleting.state"));
    let checked = check(&deleting, Ok(vec![])).await.expect("check");
    let text = checked.to_string();
    let policy = finding(&checked, "kafka state topic deleting.state cleanup.policy");
    assert_eq!((policy.status, policy.actual.as_str()), (Status::Fail, "delete"), "{text}");
    assert!(policy.fix.contains("--entity-name deleting.state --add-config cleanup.policy=compact"), "{text}");
    assert_eq!(checked.report.failures().count(), 1, "{text}");
}

/// The whole command with a three-partition state topic: before, `check` stopped at reading the
/// checkpoint with that refusal alone (exit 2, no findings); now the source and Kafka findings are
/// printed, with the state topic's among them. Real MariaDB and noida-db (the Kafka backend needs
/// transactions).
#[tokio::test(flavor = "multi_thread")]
async fn the_check_command_reports_a_state_topic_of_three_partitions() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    create_topic(&broker, "outbox-cdc.state", 3, &COMPACT).await;
    let connector = Connector::new();
    connector.write_config(&db, &broker, "[state]\nbackend = \"kafka\"\n");

    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert!(out.contains("[ok  ] log_bin"), "{out}");
    assert!(out.contains("[FAIL] checkpoint in Kafka topic outbox-cdc.state"), "{out}");
    assert!(
        out.contains("[FAIL] kafka state topic outbox-cdc.state: expected exists with exactly 1 partition"),
        "{out}"
    );
    assert!(out.contains("[ok  ] kafka transactional id outbox-cdc.state:"), "{out}");
}
