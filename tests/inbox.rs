//! The inbox (the `outbox-cdc-inbox` crate, `inbox/`) and its example consumer
//! (`inbox/examples/inbox_consumer.rs`) against a real MariaDB and a real Kafka-protocol broker (Tansu,
//! memory engine): a consumer killed at random applies every event exactly once, a record without an `id`
//! header stops it, and the two crash windows (before and after the database commit) are also made on
//! purpose through the library API.
//!
//! # Why this test has its own `main`
//! The consumer must be a separate process to be killed with SIGKILL, and it must be the example's code.
//! `cargo test --tests` does not build examples, so this binary compiles the example's source as a module
//! and runs it when started with [`CHILD_FLAG`] (it starts itself; `harness = false` in Cargo.toml).

mod common;

#[path = "../inbox/examples/inbox_consumer.rs"]
#[allow(dead_code)] // the example's own `main` is not used here
mod inbox_consumer;

use common::process;
use common::{wait_until, Broker, Engine, MariaDb};
use mysql_async::prelude::Queryable;
use outbox_cdc_inbox::{commit_after, Inbox, InboxError, Outcome};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// First argument that makes this binary run the example consumer instead of the tests.
const CHILD_FLAG: &str = "--run-inbox-consumer";

/// How long the consumer may take to catch up after the last kill.
const CATCH_UP: Duration = Duration::from_secs(30);

type Test = (&'static str, fn(&MariaDb, &Broker));

const TESTS: &[Test] = &[
    ("exactly_once_across_random_kills", exactly_once_across_random_kills),
    ("record_without_id_stops_the_consumer", record_without_id_stops_the_consumer),
    ("redelivered_after_the_database_commit_is_skipped", redelivered_after_the_database_commit_is_skipped),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(CHILD_FLAG) {
        run_consumer_child(&args[1..]);
    }
    if args.iter().any(|a| a == "--list") {
        for (name, _) in TESTS {
            println!("{name}: test");
        }
        return;
    }
    // libtest's conventions, as far as they matter here: positional arguments filter by substring, `--skip X`
    // leaves out names containing X, other options (`--test-threads=N`, `--nocapture`) change nothing.
    let (mut filters, mut skips) = (Vec::new(), Vec::new());
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--skip" {
            skips.extend(rest.next());
        } else if !arg.starts_with('-') {
            filters.push(arg);
        }
    }
    let selected: Vec<&Test> = TESTS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .filter(|(name, _)| !skips.iter().any(|s| name.contains(s.as_str())))
        .collect();
    println!("\nrunning {} tests", selected.len());
    if selected.is_empty() {
        return;
    }
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    for (name, test) in &selected {
        println!("test {name} ...");
        test(&db, &broker);
        println!("test {name} ... ok");
    }
    println!("\ntest result: ok. {} passed", selected.len());
}

/// The example consumer, in this process (started by [`Consumer::spawn`]).
fn run_consumer_child(args: &[String]) -> ! {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the consumer's runtime");
    match runtime.block_on(inbox_consumer::run(args)) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("inbox_consumer: {e}");
            std::process::exit(1)
        }
    }
}

/// Every deposit is applied exactly once although the topic holds duplicates (a connector's replay after a
/// crash) and the consumer is killed with SIGKILL eight times at random points of the stream: each event id
/// has exactly one journal row and one `consumed_events` row, and every balance is the sum of its distinct
/// deposits. Guards against a side effect applied twice (dedup missing: fails with the ids applied twice)
/// and against one lost or half applied by a crash (journal, `consumed_events` and balances must agree).
fn exactly_once_across_random_kills(db: &MariaDb, broker: &Broker) {
    let topic = "deposits";
    broker.create_topic(topic, 3);
    let database = create_database(db, "inbox_kills");

    // 300 deposits to 12 accounts; after every 50, the previous 15 again, in order, as a connector that
    // crashed before its checkpoint publishes them.
    let events: Vec<(String, String, i64)> =
        (0..300).map(|i| (format!("dep-{i:04}"), format!("acct-{:02}", i % 12), 1 + (i * 7) % 100)).collect();
    let mut records = Vec::new();
    for (i, event) in events.iter().enumerate() {
        records.push(event);
        if (i + 1) % 50 == 0 {
            records.extend(&events[i + 1 - 15..=i]);
        }
    }
    produce(broker, topic, records.iter().map(|(id, account, amount)| (Some(id.as_str()), account.as_str(), *amount)));
    let duplicates = records.len() - events.len();
    let in_topic = broker.read_all(topic, records.len(), Duration::from_secs(30));
    assert_eq!(in_topic.len(), records.len(), "the topic holds every produced record, duplicates included");

    let dir = tempfile::tempdir().expect("temp dir for consumer logs");
    let args = [broker.bootstrap(), topic.to_owned(), "billing".to_owned(), database_url(db, &database)];
    for kill in 0..8 {
        let mut consumer = Consumer::spawn(&args, dir.path(), kill);
        // A random point of the stream: after 1 to 30 more records, then up to 5 ms later (inside the next
        // record's transaction or between its database commit and its offset commit, or between records).
        let more = rand::random_range(1..=30);
        let progressed = poll_until(Duration::from_secs(30), || consumer.handled() >= more || consumer.exited());
        let jitter = rand::random_range(0..5);
        std::thread::sleep(Duration::from_millis(jitter));
        assert!(progressed && !consumer.exited(), "consumer run {kill} did not get going:\n{}", consumer.output());
        consumer.kill();
    }
    let applied_before = count(db, &database, "SELECT COUNT(*) FROM consumed_events");
    assert!(
        applied_before < events.len(),
        "the kills happened before the end of the stream ({applied_before} applied)"
    );

    let mut consumer = Consumer::spawn(&args, dir.path(), 8);
    let caught_up =
        wait_until(CATCH_UP, || count(db, &database, "SELECT COUNT(*) FROM consumed_events") == events.len());
    assert!(caught_up, "not every event was applied within {CATCH_UP:?}:\n{}", consumer.output());
    // Let it read to the end of the topic (the last duplicates), then stop it gracefully.
    let mut last = consumer.handled();
    let quiet = wait_until(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(500));
        let now = consumer.handled();
        std::mem::replace(&mut last, now) == now
    });
    assert!(quiet, "the last run kept handling records:\n{}", consumer.output());
    let status = consumer.terminate();
    assert!(status.success(), "SIGTERM must stop the consumer cleanly, got {status}:\n{}", consumer.output());
    assert!(consumer.output().contains("stopped: "), "{}", consumer.output());

    // Each side effect exactly once.
    let twice = db.sql(&format!(
        "SELECT event_id, COUNT(*) FROM {database}.applied_effects GROUP BY event_id HAVING COUNT(*) <> 1"
    ));
    assert_eq!(twice, "", "event ids applied more than once (id, times)");
    let journal: BTreeSet<String> =
        db.sql(&format!("SELECT event_id FROM {database}.applied_effects")).lines().map(str::to_owned).collect();
    let consumed: BTreeSet<String> = db
        .sql(&format!("SELECT event_id FROM {database}.consumed_events WHERE consumer_group = 'billing'"))
        .lines()
        .map(str::to_owned)
        .collect();
    let ids: BTreeSet<String> = events.iter().map(|(id, _, _)| id.clone()).collect();
    assert_eq!(journal, ids, "the journal holds every event id");
    assert_eq!(consumed, ids, "consumed_events holds every event id");
    assert_eq!(count(db, &database, "SELECT COUNT(*) FROM applied_effects"), ids.len());
    assert_eq!(count(db, &database, "SELECT COUNT(*) FROM consumed_events"), ids.len());

    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for (_, account, amount) in &events {
        *expected.entry(account.clone()).or_default() += amount;
    }
    let balances: BTreeMap<String, i64> = db
        .sql(&format!("SELECT account, balance FROM {database}.accounts"))
        .lines()
        .map(|line| {
            let (account, balance) = line.split_once('\t').expect("two columns");
            (account.to_owned(), balance.parse().expect("a number"))
        })
        .collect();
    assert_eq!(balances, expected, "each balance is the sum of its distinct deposits");

    // The duplicates were read and skipped, not merely absent (a skip can be read again after a kill).
    let skipped: usize = (0..=8).map(|run| Consumer::skipped_in(dir.path(), run)).sum();
    assert!(skipped >= duplicates, "{skipped} records skipped, {duplicates} duplicates in the topic");
    println!(
        "  {} events, {duplicates} duplicates, 8 kills ({applied_before} applied before the last run), {skipped} skips",
        events.len()
    );
}

/// A record without an `id` header is never applied and never skipped: the consumer stops on it with an
/// error naming its topic, partition and offset, before committing it, and stops on it again when restarted;
/// the records before it are applied.
fn record_without_id_stops_the_consumer(db: &MariaDb, broker: &Broker) {
    let topic = "deposits-no-id";
    broker.create_topic(topic, 1);
    let database = create_database(db, "inbox_no_id");
    produce(broker, topic, [(Some("ok-1"), "acct-1", 5), (None, "acct-1", 7), (Some("ok-2"), "acct-1", 11)]);

    let dir = tempfile::tempdir().expect("temp dir for consumer logs");
    let args = [broker.bootstrap(), topic.to_owned(), "billing".to_owned(), database_url(db, &database)];
    for run in 0..2 {
        let mut consumer = Consumer::spawn(&args, dir.path(), run);
        let exited = wait_until(Duration::from_secs(30), || consumer.exited());
        assert!(exited, "the consumer must stop on the record without id:\n{}", consumer.output());
        let status = consumer.terminate();
        let output = consumer.output();
        assert_eq!(status.code(), Some(1), "{output}");
        assert!(output.contains(&format!("record {topic}[0]@1 has no `id` header")), "{output}");
    }
    let journal = db.sql(&format!("SELECT event_id, amount FROM {database}.applied_effects"));
    assert_eq!(journal, "ok-1\t5\n", "only the record before it is applied");
    let balance = db.sql(&format!("SELECT balance FROM {database}.accounts WHERE account = 'acct-1'"));
    assert_eq!(balance.trim(), "5");
}

/// The crash windows a random kill hits only by luck, made on purpose with the library API: a side effect that
/// fails rolls back the event id with it (the record is applied on the next try), and a record whose database
/// commit happened but whose offset commit did not (the consumer died between them) is delivered again from
/// the offset [`commit_after`] committed to Kafka, and skipped.
fn redelivered_after_the_database_commit_is_skipped(db: &MariaDb, broker: &Broker) {
    let topic = "deposits-redelivery";
    broker.create_topic(topic, 1);
    let database = create_database(db, "inbox_redelivery");
    db.sql(&format!("CREATE TABLE {database}.journal (event_id VARCHAR(64) NOT NULL)"));
    produce(broker, topic, [(Some("r-1"), "acct-1", 1), (Some("r-2"), "acct-1", 2), (Some("r-3"), "acct-1", 3)]);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let mut conn = mysql_async::Conn::from_url(database_url(db, &database)).await.expect("connect");
        let inbox = Inbox::new("redelivery");
        inbox.ensure_table(&mut conn).await.expect("create consumed_events");
        let journal = async |tx: &mut mysql_async::Transaction<'_>, id: &str| {
            tx.exec_drop("INSERT INTO journal (event_id) VALUES (?)", (id,)).await
        };

        // First consumer: r-1 applied and committed; r-2's side effect fails, then succeeds, then it "dies"
        // before committing r-2's offset.
        let first = group_consumer(broker, topic);
        let r1 = next_record(&first);
        assert_eq!(r1.offset(), 0);
        let outcome = inbox.handle(&mut conn, &r1, async |tx| journal(tx, "r-1").await).await.expect("apply r-1");
        assert_eq!(outcome, Outcome::Applied(()));
        commit_after(&first, &r1).expect("commit r-1's offset");

        let r2 = next_record(&first);
        let failed = inbox
            .handle(&mut conn, &r2, async |tx| {
                journal(tx, "r-2").await?;
                Err::<(), Box<dyn std::error::Error + Send + Sync>>("payment service refused".into())
            })
            .await;
        assert!(matches!(&failed, Err(InboxError::SideEffect { id, .. }) if id == "r-2"), "{failed:?}");
        assert_eq!(db.sql(&format!("SELECT event_id FROM {database}.journal")), "r-1\n", "r-2's insert rolled back");
        assert_eq!(count(db, &database, "SELECT COUNT(*) FROM consumed_events"), 1, "and its id with it");

        let outcome = inbox.handle(&mut conn, &r2, async |tx| journal(tx, "r-2").await).await.expect("apply r-2");
        assert_eq!(outcome, Outcome::Applied(()));
        // Dies here: r-2 is in the database, its offset is not in Kafka. (librdkafka's destroy waits for the
        // consumer's messages: they go first.)
        drop((r1, r2));
        drop(first);

        // Second consumer of the same group: resumes at the committed offset, gets r-2 again, skips it.
        let second = group_consumer(broker, topic);
        let again = next_record(&second);
        assert_eq!(again.offset(), 1, "resumes after the last committed offset");
        let outcome =
            inbox.handle(&mut conn, &again, async |tx| journal(tx, "r-2 again").await).await.expect("handle r-2 again");
        assert_eq!(outcome, Outcome::Skipped);
        commit_after(&second, &again).expect("commit r-2's offset");
        let r3 = next_record(&second);
        let outcome = inbox.handle(&mut conn, &r3, async |tx| journal(tx, "r-3").await).await.expect("apply r-3");
        assert_eq!(outcome, Outcome::Applied(()));
        commit_after(&second, &r3).expect("commit r-3's offset");
    });
    let journal = db.sql(&format!("SELECT event_id FROM {database}.journal ORDER BY event_id"));
    assert_eq!(journal, "r-1\nr-2\nr-3\n", "each side effect once");
    let positions = runtime.block_on(async {
        let mut conn = mysql_async::Conn::from_url(database_url(db, &database)).await.expect("connect");
        Inbox::new("redelivery").positions(&mut conn, topic).await.expect("positions")
    });
    assert_eq!(positions, BTreeMap::from([(0, 3)]), "the table's resume point is after r-3");
}

/// A consumer of group `redelivery` with partition 0 of `topic` assigned at its committed offset (the start
/// when there is none), committing nothing by itself.
fn group_consumer(broker: &Broker, topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = broker
        .client_config()
        .set("group.id", "redelivery")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "20")
        .create()
        .expect("create consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, 0, Offset::Stored).expect("assignment");
    consumer.assign(&assignment).expect("assign");
    consumer
}

/// The consumer's next record (the test fails after 30 s without one).
fn next_record(consumer: &BaseConsumer) -> BorrowedMessage<'_> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(record)) => return record,
            Some(Err(e)) => panic!("consume: {e}"),
            None => {}
        }
    }
    panic!("no record within 30 s");
}

/// One run of the example consumer as a child process (this binary with [`CHILD_FLAG`]), its stdout and
/// stderr in `run-N.log`.
struct Consumer {
    child: Child,
    log: PathBuf,
}

impl Consumer {
    fn spawn(args: &[String], dir: &Path, run: usize) -> Consumer {
        let log = Self::log_path(dir, run);
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
        cmd.arg(CHILD_FLAG)
            .args(args)
            .stdin(Stdio::null())
            .stdout(process::append_log(&log))
            .stderr(process::append_log(&log));
        let child = process::spawn(cmd).expect("start the consumer");
        Consumer { child, log }
    }

    fn log_path(dir: &Path, run: usize) -> PathBuf {
        dir.join(format!("run-{run}.log"))
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Records this run handled (applied or skipped, offset committed): the lines it printed for them.
    fn handled(&self) -> usize {
        self.output().lines().filter(|l| l.starts_with("applied ") || l.starts_with("skipped ")).count()
    }

    fn skipped_in(dir: &Path, run: usize) -> usize {
        let text = std::fs::read_to_string(Self::log_path(dir, run)).unwrap_or_default();
        text.lines().filter(|l| l.starts_with("skipped ")).count()
    }

    fn exited(&self) -> bool {
        // `try_wait` needs `&mut`; peek at /proc instead so that `wait_until` closures can borrow shared.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        stat.is_empty() || stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
    }

    fn kill(&mut self) {
        process::kill_now(&mut self.child);
    }

    fn terminate(&mut self) -> ExitStatus {
        let (status, graceful) = process::terminate(&mut self.child, Duration::from_secs(10));
        assert!(graceful, "the consumer ignored SIGTERM for 10 s:\n{}", self.output());
        status
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        process::kill_now(&mut self.child);
    }
}

/// Produces deposits in outbox-cdc's envelope, keyed by account, with the `id` header when there is one.
fn produce<'a>(broker: &Broker, topic: &str, deposits: impl IntoIterator<Item = (Option<&'a str>, &'a str, i64)>) {
    // One record per batch: Tansu 0.6's memory engine answers a fetch at an offset inside a batch with nothing
    // (seen: a consumer resuming in the middle of a partition's last batch waits forever), so every offset a
    // killed consumer may resume at must start a batch.
    let producer: BaseProducer =
        broker.client_config().set("batch.num.messages", "1").set("linger.ms", "0").create().expect("create producer");
    for (id, account, amount) in deposits {
        let value = serde_json::json!({
            "event_id": id.unwrap_or("missing"), "type": "Deposited", "aggregate_type": "account",
            "aggregate_id": account, "data": { "amount": amount },
        })
        .to_string();
        let mut headers = OwnedHeaders::new();
        if let Some(id) = id {
            headers = headers.insert(Header { key: "id", value: Some(id) });
        }
        headers = headers.insert(Header { key: "aggregate_type", value: Some("account") });
        let record = BaseRecord::to(topic).key(account).payload(&value).headers(headers);
        producer.send(record).map_err(|(e, _)| e).expect("enqueue record");
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).expect("every record acknowledged");
}

/// [`wait_until`] polling every millisecond: the consumer handles a record in about that time, so the 50 ms
/// of `wait_until` would put every kill tens of records later than drawn.
fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn create_database(db: &MariaDb, name: &str) -> String {
    db.sql(&format!("CREATE DATABASE {name}"));
    name.to_owned()
}

fn database_url(db: &MariaDb, database: &str) -> String {
    format!("mysql://root@127.0.0.1:{}/{database}?prefer_socket=false", db.port())
}

fn count(db: &MariaDb, database: &str, query: &str) -> usize {
    let out = db.sql(&format!("USE {database}; {query}"));
    out.trim().parse().unwrap_or_else(|e| panic!("{query}: {out:?}: {e}"))
}
