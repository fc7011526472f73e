//! Measuring instruments for `scripts/bench` (issue 7). Not a test: it measures and prints, it asserts
//! nothing. Every subcommand prints one JSON object on stdout; the script turns them into tables.
//!
//! - `run-until`: starts a command (the connector), waits until its stored checkpoint covers a GTID (or the
//!   snapshot is done), and reports wall time, CPU time (all threads, from /proc) and peak RSS (VmHWM, plus
//!   an RSS series sampled every 100 ms).
//! - `produce-floor`: produces N records that are byte-for-byte the connector's (rows read from the outbox
//!   table and routed by `outbox_cdc::router::Router`) with the connector's producer settings.
//! - `decode-floor`: reads the binlog through the connector's own `BinlogReader` (mysql_async's binlog
//!   stream + `ChangeDecoder`), optionally routing each row, without Kafka.
//! - `writer`: a steady business-transaction writer at a fixed rate over several connections.
//! - `latency`: the writer plus a consumer of the connector's topic plus a checkpoint sampler, in one
//!   process on one monotonic clock: commit→consumable latency and commit→checkpoint lag.
//! - `broker-latency`: the same records produced at the same rate straight to the broker, consumed the
//!   same way: send→ack and send→consumable latency of the broker alone.
//!
//! `run-until` and `latency` read the connector's stored checkpoint from `--state` (the local store) or,
//! with `--config`, from wherever that configuration keeps it: with `[state] backend = "kafka"` by tailing
//! the state topic with one `read_committed` consumer (the checkpoint record is visible there the moment
//! its write, or under `exactly_once` its Kafka transaction, commits).
//!
//! # Why commit→consumable
//! The connector's own histogram (`outbox_cdc_end_to_end_latency_seconds`) measures `occurred_at`→ack with
//! buckets that double from 1 ms, too coarse for a 20 ms target, and `occurred_at` is taken before the
//! commit. Here the writer records the instant its COMMIT returned and a consumer records when the event
//! becomes readable; the broker-only run measures send→readable with the same consumer settings, so the
//! difference of the two is what the connector adds (binlog read, decode, route, produce batching).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use clap::{Parser, Subcommand};
use mysql_async::prelude::Queryable;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use serde_json::json;

/// The connector's allocator, tuned the same way: the floors measure its decoder and producer the way the
/// binary runs them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
outbox_cdc::tune_allocator_before_main!();

use outbox_cdc::checkpoint::{Checkpoint, Store};
use outbox_cdc::config::{Config, ServerSource, Source, StateBackend};
use outbox_cdc::outbox::{OutboxRow, TableName};
use outbox_cdc::position::mariadb::GtidPos;
use outbox_cdc::position::Gtids;
use outbox_cdc::router::{KafkaRecord, Router};
use outbox_cdc::source::binlog::{BinlogReader, Change, ReaderSettings};
use outbox_cdc::source::{server_info, start_position, SourceConn};
use outbox_cdc::topic::TopicTemplate;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command until its checkpoint covers a GTID (or the snapshot is done); report time, CPU, RSS.
    RunUntil {
        /// The connector's state directory.
        #[arg(long, required_unless_present = "config")]
        state: Option<PathBuf>,
        /// Or the connector's configuration: its checkpoint is read where `[state]` keeps it.
        #[arg(long, conflicts_with = "state")]
        config: Option<PathBuf>,
        /// Stop when the checkpoint's GTID position covers this one (MariaDB notation).
        #[arg(long)]
        gtid: Option<String>,
        /// Like --gtid, read from this file once it exists (the target is known only later).
        #[arg(long)]
        gtid_file: Option<PathBuf>,
        /// Stop when the checkpoint says the snapshot is done.
        #[arg(long)]
        snapshot_done: bool,
        /// Write "ms_since_start rss_kb" every 100 ms here.
        #[arg(long)]
        rss_csv: Option<PathBuf>,
        /// Write the child's pid here (for perf record -p).
        #[arg(long)]
        pid_file: Option<PathBuf>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 1800)]
        timeout_s: u64,
        /// Also note when the connector's /metrics (host:port) first counts this many acknowledged events:
        /// the time to the last ack, without the checkpoint cadence.
        #[arg(long)]
        metrics: Option<String>,
        #[arg(long, default_value_t = 0)]
        acked: u64,
        /// Stop when the sum of this counter's series on --metrics reaches --until-value instead (the
        /// polling relay, which has no checkpoint: `outbox_cdc_poll_rows_published_total`). Scraped every
        /// 200 ms.
        #[arg(long, requires_all = ["metrics", "until_value"])]
        until_metric: Option<String>,
        #[arg(long)]
        until_value: Option<u64>,
        /// Write the last /metrics page here when done (with --metrics).
        #[arg(long)]
        metrics_out: Option<PathBuf>,
        /// The command.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Produce N records shaped exactly like the connector's; report events/s and CPU.
    ProduceFloor {
        #[command(flatten)]
        kafka: KafkaArgs,
        #[arg(long)]
        mysql_url: String,
        #[arg(long)]
        events: usize,
        /// Bound unacknowledged bytes like the connector's kafka.max_in_flight_bytes; 0 = unbounded.
        #[arg(long, default_value_t = 16 * 1024 * 1024)]
        max_in_flight_bytes: usize,
    },
    /// Read the binlog through the connector's reader and decoder only; report events/s and CPU.
    DecodeFloor {
        /// A connector configuration (source and outbox sections are used).
        #[arg(long)]
        config: PathBuf,
        /// Stop after the transaction whose position covers this one (MariaDB notation).
        #[arg(long)]
        gtid: String,
        /// Also route each row into its Kafka record (JSON envelope, headers), still without Kafka.
        #[arg(long)]
        route: bool,
        /// Only mysql_async's binlog stream (events framed and parsed by mysql_common), no ChangeDecoder:
        /// from the first binlog to the server's current end. `--events` gives the rate's numerator.
        #[arg(long)]
        stream_only: bool,
        #[arg(long, default_value_t = 0)]
        events: u64,
    },
    /// Write business transactions at a fixed rate; report the achieved rate.
    Writer {
        #[command(flatten)]
        writer: WriterArgs,
    },
    /// Writer + consumer + checkpoint sampler: commit→consumable latency and checkpoint lag.
    Latency {
        #[command(flatten)]
        writer: WriterArgs,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// The running connector's state directory (checkpoint lag); omit to skip.
        #[arg(long)]
        state: Option<PathBuf>,
        /// Or its configuration (checkpoint lag, read where `[state]` keeps it).
        #[arg(long, conflicts_with = "state")]
        config: Option<PathBuf>,
        /// Also follow a second connector reading the same writer at the same time (a paired run): its
        /// topic; with --pair-config.
        #[arg(long, requires = "pair_config")]
        pair_topic: Option<String>,
        /// The second connector's configuration (its checkpoint).
        #[arg(long, requires = "pair_topic")]
        pair_config: Option<PathBuf>,
        /// Events committed in the first seconds are not counted (connections, metadata, first batches).
        #[arg(long, default_value_t = 5)]
        warmup_s: u64,
    },
    /// Produce at a fixed rate straight to the broker: send→ack and send→consumable latency.
    BrokerLatency {
        #[command(flatten)]
        kafka: KafkaArgs,
        #[arg(long)]
        mysql_url: String,
        #[arg(long)]
        rate: u64,
        #[arg(long)]
        seconds: u64,
        #[arg(long, default_value_t = 5)]
        warmup_s: u64,
    },
}

#[derive(clap::Args, Clone)]
struct KafkaArgs {
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    /// Partitions of the topic when this tool creates it (the connector's default).
    #[arg(long, default_value_t = 12)]
    partitions: i32,
}

#[derive(clap::Args, Clone)]
struct WriterArgs {
    /// e.g. mysql://bench:bench@127.0.0.1:23306/shop
    #[arg(long)]
    mysql_url: String,
    /// Business transactions per second.
    #[arg(long)]
    rate: u64,
    #[arg(long)]
    seconds: u64,
    #[arg(long, default_value_t = 16)]
    connections: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    outbox_cdc::allocator::tune();
    match Cli::parse().command {
        Command::RunUntil {
            state,
            config,
            gtid,
            gtid_file,
            snapshot_done,
            rss_csv,
            pid_file,
            timeout_s,
            metrics,
            acked,
            until_metric,
            until_value,
            metrics_out,
            cmd,
        } => {
            let target = match (gtid, gtid_file, snapshot_done, until_metric) {
                (Some(g), None, false, None) => Target::Gtid(g),
                (None, Some(f), false, None) => Target::GtidFile(f),
                (None, None, true, None) => Target::SnapshotDone,
                (None, None, false, Some(name)) => Target::Metric(name, until_value.unwrap_or(0)),
                _ => bail!("give exactly one of --gtid, --gtid-file, --snapshot-done, --until-metric"),
            };
            let checkpoints = Checkpoints::new(state, config)?.context("give --state or --config")?;
            let probe = metrics.map(|addr| MetricsProbe { addr, acked, out: metrics_out });
            tokio::task::spawn_blocking(move || {
                run_until(checkpoints, target, rss_csv, pid_file, timeout_s, probe, &cmd)
            })
            .await?
        }
        Command::ProduceFloor { kafka, mysql_url, events, max_in_flight_bytes } => {
            produce_floor(&kafka, &mysql_url, events, max_in_flight_bytes).await
        }
        Command::DecodeFloor { config, stream_only: true, events, .. } => stream_floor(&config, events).await,
        Command::DecodeFloor { config, gtid, route, .. } => decode_floor(&config, &gtid, route).await,
        Command::Writer { writer } => {
            let clock = Clock::new();
            let log = Arc::new(CommitLog::new((writer.rate * writer.seconds) as usize + 1));
            let report = write_steadily(&writer, &clock, log).await?;
            println!(
                "{}",
                json!({ "target_rate": writer.rate, "achieved_rate": report.achieved_rate, "committed": report.committed })
            );
            Ok(())
        }
        Command::Latency { writer, kafka, state, config, pair_topic, pair_config, warmup_s } => {
            let pair = match (pair_topic, Checkpoints::new(None, pair_config)?) {
                (Some(topic), Some(checkpoints)) => Some((topic, checkpoints)),
                _ => None,
            };
            latency(&writer, &kafka, Checkpoints::new(state, config)?, pair, warmup_s).await
        }
        Command::BrokerLatency { kafka, mysql_url, rate, seconds, warmup_s } => {
            broker_latency(&kafka, &mysql_url, rate, seconds, warmup_s).await
        }
    }
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("{e}")
}

// ---------------------------------------------------------------------------------------------------------
// /proc readings

/// CPU seconds (user + system, all threads) of a process.
fn cpu_seconds(pid: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may contain spaces; fields after the closing parenthesis are fixed.
    let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow!("bad stat"))? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?; // utime, stime
    Ok(ticks / clock_ticks())
}

/// USER_HZ; 100 on every Linux we run on (checked by scripts/bench with `getconf CLK_TCK`).
fn clock_ticks() -> f64 {
    std::env::var("CLK_TCK").ok().and_then(|v| v.parse().ok()).unwrap_or(100.0)
}

/// A `VmXXX:` line of /proc/<pid>/status, in kB.
fn status_kb(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

// ---------------------------------------------------------------------------------------------------------
// run-until

/// A target GTID position in MariaDB notation (what the bench's MariaDB reports).
fn mariadb_gtids(text: &str) -> anyhow::Result<Gtids> {
    Ok(Gtids::MariaDb(text.trim().parse::<GtidPos>().map_err(|e| anyhow!("GTID position {text:?}: {e}"))?))
}

/// The connector's /metrics (host:port) as run-until reads it: when it first counts `acked` acknowledged
/// events, and where to write its last page.
struct MetricsProbe {
    addr: String,
    acked: u64,
    out: Option<PathBuf>,
}

enum Target {
    Gtid(String),
    GtidFile(PathBuf),
    SnapshotDone,
    /// A counter on the connector's /metrics reaching a value.
    Metric(String, u64),
}

fn run_until(
    mut checkpoints: Checkpoints,
    target: Target,
    rss_csv: Option<PathBuf>,
    pid_file: Option<PathBuf>,
    timeout_s: u64,
    probe: Option<MetricsProbe>,
    cmd: &[String],
) -> anyhow::Result<()> {
    let mut next_scrape = Instant::now();
    let mut acked_at: Option<f64> = None;
    let start = Instant::now();
    let mut child = std::process::Command::new(&cmd[0]).args(&cmd[1..]).spawn().context("starting the command")?;
    let pid = child.id().to_string();
    if let Some(f) = &pid_file {
        std::fs::write(f, &pid)?;
    }
    let mut csv = rss_csv.map(std::fs::File::create).transpose()?;
    let mut max_sampled_kb = 0u64;
    let mut next_sample = start;
    let mut gtid = match &target {
        Target::Gtid(g) => Some(mariadb_gtids(g)?),
        _ => None,
    };
    let (seconds, cpu_s, peak_kb) = loop {
        let now = Instant::now();
        if now >= next_sample {
            if let Some(kb) = status_kb(&pid, "VmRSS:") {
                max_sampled_kb = max_sampled_kb.max(kb);
                if let Some(f) = csv.as_mut() {
                    use std::io::Write;
                    writeln!(f, "{} {kb}", start.elapsed().as_millis())?;
                }
            }
            next_sample += Duration::from_millis(100);
        }
        if let Some(status) = child.try_wait()? {
            bail!("the command exited early ({status})");
        }
        if start.elapsed() > Duration::from_secs(timeout_s) {
            let _ = std::process::Command::new("kill").arg(&pid).status();
            bail!("timed out after {timeout_s} s");
        }
        if gtid.is_none() {
            if let Target::GtidFile(f) = &target {
                // Complete once its line is: a prefix of a GTID would be covered too early.
                if let Some(line) = std::fs::read_to_string(f).ok().filter(|s| s.ends_with('\n')) {
                    gtid = Some(mariadb_gtids(&line)?);
                }
            }
        }
        if let (None, Some(p), false) = (acked_at, &probe, matches!(target, Target::Metric(..))) {
            if acknowledged(&p.addr).is_some_and(|a| a >= p.acked) {
                acked_at = Some(start.elapsed().as_secs_f64());
            }
        }
        let by_metric = match (&target, &probe) {
            (Target::Metric(name, n), Some(p)) if Instant::now() >= next_scrape => {
                next_scrape = Instant::now() + Duration::from_millis(200);
                Some(scrape(&p.addr).is_some_and(|page| counter_sum(&page, name) >= *n as f64))
            }
            (Target::Metric(..), _) => Some(false),
            _ => None,
        };
        // A read error (the writer holds the file mid-commit) is just another poll.
        let done = by_metric.unwrap_or_else(|| match checkpoints.latest() {
            Some(cp) => match &target {
                Target::SnapshotDone => cp.snapshot().as_ref().is_some_and(|s| s.done),
                // The checkpoint may be past the target when more was committed after it.
                _ => gtid.as_ref().is_some_and(|g| g.is_within(&cp.position().gtids) == Some(true)),
            },
            _ => false,
        });
        if done {
            let seconds = start.elapsed().as_secs_f64();
            break (seconds, cpu_seconds(&pid)?, status_kb(&pid, "VmHWM:").unwrap_or(0));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Some(MetricsProbe { addr, out: Some(out), .. }) = &probe {
        std::fs::write(out, scrape(addr).unwrap_or_default())?;
    }
    std::process::Command::new("kill").args(["-TERM", &pid]).status()?;
    child.wait()?;
    println!(
        "{}",
        json!({ "seconds": seconds, "cpu_s": cpu_s, "peak_rss_kb": peak_kb, "max_sampled_rss_kb": max_sampled_kb,
                "acked_seconds": acked_at })
    );
    Ok(())
}

/// The connector's count of acknowledged events, from its /metrics endpoint.
fn acknowledged(addr: &str) -> Option<u64> {
    Some(counter_sum(&scrape(addr)?, "outbox_cdc_events_acknowledged_total") as u64)
}

/// The connector's /metrics page (plain HTTP/1.0).
fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The sum of every series of `name` (with or without labels) on a metrics page.
fn counter_sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------------------------
// The connector's stored checkpoint

/// Where the running connector's checkpoint is read from.
enum Checkpoints {
    /// The local store in this directory (read-only opens, as `outbox-cdc status` does).
    Local(PathBuf),
    /// The state topic, tailed.
    Kafka(Box<StateTail>),
}

/// One `read_committed` consumer of the state topic, created once the topic exists, that keeps the newest
/// checkpoint record of one connector. Cheaper and sharper than `Store::inspect_for` per poll, which
/// builds a client and reads the whole topic from the beginning each time: the topic gains a record per
/// checkpoint (ten a second in the bench), and a poll every 20 ms would re-read it fifty times a second.
struct StateTail {
    config: Config,
    consumer: Option<BaseConsumer>,
    latest: Option<Checkpoint>,
}

impl Checkpoints {
    /// From `--state` or `--config`; `None` when neither is given.
    fn new(state: Option<PathBuf>, config: Option<PathBuf>) -> anyhow::Result<Option<Checkpoints>> {
        Ok(match (state, config) {
            (Some(dir), _) => Some(Checkpoints::Local(dir)),
            (None, Some(path)) => {
                let config = Config::load(&path).map_err(err)?;
                Some(match config.state.backend {
                    StateBackend::Local => Checkpoints::Local(config.state.dir.clone()),
                    StateBackend::Kafka => {
                        Checkpoints::Kafka(Box::new(StateTail { config, consumer: None, latest: None }))
                    }
                })
            }
            (None, None) => None,
        })
    }

    /// The newest stored checkpoint, `None` before the first (or on a read error: just another poll).
    fn latest(&mut self) -> Option<Checkpoint> {
        match self {
            Checkpoints::Local(dir) => Store::read_only(dir).ok().flatten(),
            Checkpoints::Kafka(tail) => tail.poll(),
        }
    }
}

impl StateTail {
    fn poll(&mut self) -> Option<Checkpoint> {
        if self.consumer.is_none() {
            self.consumer = self.subscribe().ok().flatten();
        }
        let consumer = self.consumer.as_ref()?;
        let key = format!("{}/checkpoint", self.config.state.name);
        while let Some(Ok(m)) = consumer.poll(Duration::ZERO) {
            if m.key() == Some(key.as_bytes()) {
                self.latest = m.payload().and_then(|v| serde_json::from_slice(v).ok());
            }
        }
        self.latest.clone()
    }

    /// A consumer assigned to every partition of the state topic from the beginning, once the connector
    /// has created it (assigning a topic that does not exist yet would wait for a metadata refresh).
    fn subscribe(&self) -> anyhow::Result<Option<BaseConsumer>> {
        let topic = &self.config.state.topic;
        let consumer: BaseConsumer = self
            .config
            .kafka
            .client_config()
            .map_err(err)?
            .set("group.id", "outbox-cdc-bench-state")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "10")
            .create()?;
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(1))?;
        let partitions = metadata.topics().iter().find(|t| t.name() == topic).map_or(0, |t| t.partitions().len());
        if partitions == 0 {
            return Ok(None);
        }
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions as i32 {
            assignment.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&assignment)?;
        Ok(Some(consumer))
    }
}

// ---------------------------------------------------------------------------------------------------------
// The connector's records, built from real outbox rows

/// id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers, occurred_at.
type OutboxColumns = (String, String, String, String, u16, String, Option<String>, String);

/// Up to `limit` rows of the outbox table, routed exactly as the connector routes them (default topic
/// template replaced by `topic`, envelope value format).
async fn connector_records(mysql_url: &str, topic: &str, limit: usize) -> anyhow::Result<Vec<KafkaRecord>> {
    let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(mysql_url)?).await?;
    let rows: Vec<OutboxColumns> = conn
        .query(format!(
            "SELECT id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers, \
             DATE_FORMAT(occurred_at, '%Y-%m-%dT%H:%i:%s.%f') FROM shop.outbox_events LIMIT {limit}"
        ))
        .await?;
    conn.disconnect().await?;
    if rows.is_empty() {
        bail!("shop.outbox_events is empty: load the workload first");
    }
    let table = Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() });
    let router = Router::new(TopicTemplate::parse(topic).map_err(err)?, Default::default());
    rows.into_iter()
        .map(|(id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers, occurred_at)| {
            let row = OutboxRow {
                table: table.clone(),
                id,
                aggregate_type,
                aggregate_id,
                event_type: Some(event_type),
                schema_version: Some(schema_version.into()),
                payload: payload.into(),
                headers,
                occurred_at: Some(occurred_at),
                additional: Vec::new(),
                from_snapshot: false,
                snapshot_id: None,
            };
            router.route(&row).map_err(err)
        })
        .collect()
}

/// The librdkafka settings of `outbox_cdc::sink::KafkaSink` (keep in step with src/sink/kafka.rs).
fn producer_config(bootstrap: &str) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", bootstrap)
        .set("client.id", "outbox-cdc-bench")
        .set("enable.idempotence", "true")
        .set("enable.gapless.guarantee", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "0")
        .set("partitioner", "murmur2_random")
        .set("compression.type", "lz4")
        .set("allow.auto.create.topics", "false")
        .set("message.max.bytes", (16 * 1024 * 1024).to_string())
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "2097151")
        .set("linger.ms", "5");
    cc
}

async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for r in admin.create_topics([&new], &opts).await? {
        match r {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => bail!("creating {name}: {code:?}"),
        }
    }
    Ok(())
}

fn with_id(record: &KafkaRecord, id: &str) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
    for (key, value) in &record.headers {
        let value: &[u8] = if key == "id" { id.as_bytes() } else { value };
        headers = headers.insert(Header { key, value: Some(value) });
    }
    headers
}

/// Event ids that carry a sequence number, shaped like the UUIDs the workload uses (36 characters). The
/// first group tells runs apart (the outbox id is the table's primary key).
fn seq_id(seq: u64) -> String {
    static RUN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(0)
            ^ std::process::id()
    });
    format!("{run:08x}-0000-4000-8000-{seq:012}")
}

fn id_seq(id: &[u8]) -> Option<u64> {
    std::str::from_utf8(id.get(24..36)?).ok()?.parse().ok()
}

// ---------------------------------------------------------------------------------------------------------
// produce-floor

/// Bytes in flight, shared with the delivery callback.
struct Budget {
    used: Mutex<usize>,
    freed: Condvar,
    acked: AtomicU64,
    failed: AtomicU64,
    ack_at_ns: Option<Arc<TimeLog>>,
    clock: Clock,
}

impl ClientContext for Budget {}

impl ProducerContext for Budget {
    type DeliveryOpaque = Box<(usize, u64)>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        let (bytes, seq) = *opaque;
        match result {
            Ok(_) => {
                self.acked.fetch_add(1, Ordering::Relaxed);
                if let Some(log) = &self.ack_at_ns {
                    log.set(seq, self.clock.now_ns());
                }
            }
            Err((e, _)) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("delivery failed: {e}");
                }
            }
        }
        let mut used = self.used.lock().unwrap();
        *used -= bytes;
        self.freed.notify_one();
    }
}

fn send_blocking(
    producer: &ThreadedProducer<Budget>,
    record: &KafkaRecord,
    seq: u64,
    limit: usize,
) -> anyhow::Result<()> {
    // Counted as the connector's sink counts it: the record plus librdkafka's per-record overhead.
    let bytes = record.size_bytes() + outbox_cdc::sink::IN_FLIGHT_OVERHEAD_BYTES;
    if limit > 0 {
        let budget = producer.context();
        let mut used = budget.used.lock().unwrap();
        while *used + bytes > limit && *used > 0 {
            used = budget.freed.wait(used).unwrap();
        }
        *used += bytes;
    } else {
        *producer.context().used.lock().unwrap() += bytes;
    }
    let id = seq_id(seq);
    let mut pending = BaseRecord::with_opaque_to(&record.topic, Box::new((bytes, seq)))
        .key(&record.key)
        .payload(&record.value)
        .headers(with_id(record, &id));
    loop {
        match producer.send(pending) {
            Ok(()) => return Ok(()),
            Err((rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), back)) => {
                pending = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => bail!("produce: {e}"),
        }
    }
}

async fn produce_floor(kafka: &KafkaArgs, mysql_url: &str, events: usize, limit: usize) -> anyhow::Result<()> {
    let records = connector_records(mysql_url, &kafka.topic, 10_000).await?;
    create_topic(&kafka.bootstrap, &kafka.topic, kafka.partitions).await?;
    let kafka = kafka.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let producer: ThreadedProducer<Budget> = producer_config(&kafka.bootstrap).create_with_context(Budget {
            used: Mutex::new(0),
            freed: Condvar::new(),
            acked: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            ack_at_ns: None,
            clock: Clock::new(),
        })?;
        producer.client().fetch_metadata(Some(&kafka.topic), Duration::from_secs(10))?;
        let cpu0 = cpu_seconds("self")?;
        let start = Instant::now();
        for i in 0..events {
            send_blocking(&producer, &records[i % records.len()], i as u64, limit)?;
        }
        let ctx = producer.context();
        while ctx.acked.load(Ordering::Relaxed) + ctx.failed.load(Ordering::Relaxed) < events as u64 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let seconds = start.elapsed().as_secs_f64();
        let cpu_s = cpu_seconds("self")? - cpu0;
        let failed = ctx.failed.load(Ordering::Relaxed);
        let avg_bytes = records.iter().map(KafkaRecord::size_bytes).sum::<usize>() / records.len();
        println!(
            "{}",
            json!({ "events": events, "seconds": seconds, "events_per_s": events as f64 / seconds, "cpu_s": cpu_s,
                    "failed": failed, "avg_record_bytes": avg_bytes, "peak_rss_kb": status_kb("self", "VmHWM:") })
        );
        Ok(())
    })
    .await?
}

// ---------------------------------------------------------------------------------------------------------
// decode-floor

/// The live server of a `source.kind = "server"` config: the floors read its replication stream.
fn live_server(config: &Config) -> anyhow::Result<&ServerSource> {
    match &config.source.kind {
        Source::Server(server) => Ok(server),
        _ => Err(anyhow!("this benchmark reads a live server's binlog: set source.kind = \"server\"")),
    }
}

async fn decode_floor(config_path: &std::path::Path, gtid: &str, route: bool) -> anyhow::Result<()> {
    let config = Config::load(config_path).map_err(err)?;
    let source = SourceConn::from_config(&config).map_err(err)?;
    let mut conn = source.connect().await.map_err(err)?;
    let info = server_info(&mut conn).await.map_err(err)?;
    let server = live_server(&config)?;
    let position = start_position(&mut conn, &info, server).await.map_err(err)?;
    drop(conn);
    let settings = Arc::new(ReaderSettings {
        server_id: server.server_id + 100,
        tables: config.tables().to_vec(),
        columns: config.outbox.columns.clone(),
        on_update: config.outbox.on_update,
        heartbeat: server.heartbeat_interval,
        signal_table: None,
    });
    let router = Router::new(TopicTemplate::parse(&config.kafka.topic).map_err(err)?, config.kafka.value_format);
    let target = mariadb_gtids(gtid)?;
    let cpu0 = cpu_seconds("self")?;
    let start = Instant::now();
    let mut reader = BinlogReader::start(&source, &info, settings, position).await.map_err(err)?;
    let (mut rows, mut txs, mut bytes) = (0u64, 0u64, 0usize);
    loop {
        match reader.next().await.map_err(err)? {
            Change::Row(row) => {
                rows += 1;
                if route {
                    bytes += router.route(&row).map_err(err)?.size_bytes();
                } else {
                    bytes += row.payload.len();
                }
            }
            Change::Undecodable(_) => bail!("undecodable row in the benchmark workload"),
            Change::Signal(_) => bail!("a signal in the benchmark workload: no signal table is configured"),
            Change::Commit { position, .. } => {
                txs += 1;
                if target.is_within(&position.gtids) == Some(true) {
                    break;
                }
            }
            Change::Begin(_) => {}
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds("self")? - cpu0;
    println!(
        "{}",
        json!({ "events": rows, "transactions": txs, "seconds": seconds, "events_per_s": rows as f64 / seconds,
                "cpu_s": cpu_s, "bytes": bytes, "routed": route })
    );
    Ok(())
}

/// The transport and event-parsing floor: mysql_async's binlog stream alone (MariaDB only), from the first
/// binlog file to the end coordinate the server reports at start.
async fn stream_floor(config_path: &std::path::Path, events: u64) -> anyhow::Result<()> {
    use futures_util::StreamExt;
    let config = Config::load(config_path).map_err(err)?;
    let source = SourceConn::from_config(&config).map_err(err)?;
    let mut conn = source.connect().await.map_err(err)?;
    let logs: Vec<(String, u64)> = conn.query("SHOW BINARY LOGS").await?;
    let (first, _) = logs.first().cloned().ok_or_else(|| anyhow!("no binlogs"))?;
    let status: mysql_async::Row =
        conn.query_first("SHOW MASTER STATUS").await?.ok_or_else(|| anyhow!("binlog off"))?;
    let (end_file, end_pos): (String, u64) =
        (status.get(0).ok_or_else(|| anyhow!("no File"))?, status.get(1).ok_or_else(|| anyhow!("no Position"))?);
    conn.query_drop("SET @mariadb_slave_capability = 4").await?;
    let cpu0 = cpu_seconds("self")?;
    let start = Instant::now();
    let request = mysql_async::BinlogStreamRequest::new(live_server(&config)?.server_id + 200)
        .with_filename(first.as_bytes())
        .with_pos(4);
    let mut stream = conn.get_binlog_stream(request).await?;
    let (mut n, mut bytes, mut file) = (0u64, 0u64, first.clone());
    while let Some(event) = stream.next().await {
        let event = event?;
        n += 1;
        bytes += u64::from(event.header().event_size());
        if let Ok(Some(mysql_common::binlog::events::EventData::RotateEvent(r))) = event.read_data() {
            file = String::from_utf8_lossy(r.name_raw()).into_owned();
        }
        if file.starts_with(&end_file) && u64::from(event.header().log_pos()) >= end_pos {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds("self")? - cpu0;
    println!(
        "{}",
        json!({ "events": events, "binlog_events": n, "binlog_bytes": bytes, "seconds": seconds,
                "events_per_s": events as f64 / seconds, "cpu_s": cpu_s })
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// Clock and per-sequence time logs

/// One monotonic clock for every timestamp of a run.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn new() -> Self {
        Clock(Instant::now())
    }
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// A timestamp per sequence number (0 = not yet), written from any thread without locks.
struct TimeLog(Vec<AtomicU64>);

impl TimeLog {
    fn new(n: usize) -> Self {
        TimeLog((0..n).map(|_| AtomicU64::new(0)).collect())
    }
    fn set(&self, seq: u64, ns: u64) {
        if let Some(slot) = self.0.get(seq as usize) {
            // First sighting wins (a retried duplicate is not a new arrival).
            let _ = slot.compare_exchange(0, ns.max(1), Ordering::Relaxed, Ordering::Relaxed);
        }
    }
    fn get(&self, seq: u64) -> Option<u64> {
        self.0.get(seq as usize).map(|s| s.load(Ordering::Relaxed)).filter(|&v| v != 0)
    }
}

/// What the writer knows of each transaction it committed.
struct CommitLog {
    committed_ns: TimeLog,
    /// MariaDB GTID sequence number of each committed transaction (`@@last_gtid`).
    gtid_seq: Vec<AtomicU64>,
}

impl CommitLog {
    fn new(n: usize) -> Self {
        CommitLog { committed_ns: TimeLog::new(n), gtid_seq: (0..n).map(|_| AtomicU64::new(0)).collect() }
    }
}

/// Latency distribution in milliseconds.
fn summary(mut ms: Vec<f64>) -> serde_json::Value {
    if ms.is_empty() {
        return json!({ "count": 0 });
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1];
    let round = |v: f64| (v * 100.0).round() / 100.0;
    json!({ "count": ms.len(), "p50_ms": round(q(0.50)), "p99_ms": round(q(0.99)), "p999_ms": round(q(0.999)),
            "max_ms": round(ms[ms.len() - 1]) })
}

// ---------------------------------------------------------------------------------------------------------
// writer

struct WriterReport {
    committed: u64,
    achieved_rate: f64,
}

/// Commits `rate * seconds` business transactions (one `orders` row + one outbox row, the workload's
/// payload) at a fixed schedule: transaction k is due at start + k/rate; a connection that falls behind
/// commits at once (the schedule is not shifted, so a slow server shows as a lower achieved rate).
async fn write_steadily(args: &WriterArgs, clock: &Clock, log: Arc<CommitLog>) -> anyhow::Result<WriterReport> {
    let pool_opts = mysql_async::Opts::from_url(&args.mysql_url)?;
    let total = args.rate * args.seconds;
    let next = Arc::new(AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let period_ns = 1_000_000_000 / args.rate.max(1);
    let mut tasks = Vec::new();
    for _ in 0..args.connections {
        let (opts, next, log, clock) = (pool_opts.clone(), next.clone(), log.clone(), *clock);
        tasks.push(tokio::spawn(async move {
            let mut conn = mysql_async::Conn::new(opts).await?;
            loop {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                if seq >= total {
                    break;
                }
                tokio::time::sleep_until(start + Duration::from_nanos(seq * period_ns)).await;
                let sql = business_tx_sql(seq);
                let mut result = conn.query_iter(sql).await?;
                let mut last_gtid = None;
                while !result.is_empty() {
                    let values: Vec<String> = result.collect().await?;
                    if let Some(v) = values.into_iter().next() {
                        last_gtid = Some(v);
                    }
                }
                drop(result);
                log.committed_ns.set(seq, clock.now_ns());
                if let Some(seq_no) = last_gtid.and_then(|g| g.rsplit('-').next().and_then(|s| s.parse().ok())) {
                    log.gtid_seq[seq as usize].store(seq_no, Ordering::Relaxed);
                }
            }
            conn.disconnect().await?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(WriterReport { committed: total, achieved_rate: total as f64 / elapsed })
}

/// One business transaction in one round trip: `shop.write_event` (created by scripts/bench) inserts the
/// orders row and the outbox row, commits, and returns `@@last_gtid`. A procedure rather than the SQL text
/// because the server parses a procedure once per connection: the writer must not be what limits the rate.
fn business_tx_sql(seq: u64) -> String {
    format!("CALL shop.write_event('{}', {seq})", seq_id(seq))
}

// ---------------------------------------------------------------------------------------------------------
// Consumer shared by both latency measurements

/// Reads `topic` from the beginning (assigned partitions, no group) and logs when each sequence number
/// first becomes readable, until `stop`.
fn consume_arrivals(
    kafka: &KafkaArgs,
    clock: Clock,
    arrivals: Arc<TimeLog>,
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicUsize>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("group.id", "outbox-cdc-bench")
        .set("enable.auto.commit", "false")
        // librdkafka's default, stated: under `exactly_once` an event is consumable once its Kafka
        // transaction commits.
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .set("fetch.min.bytes", "1")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..kafka.partitions {
        assignment.add_partition_offset(&kafka.topic, p, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
                let now = clock.now_ns();
                let header =
                    |name: &str| m.headers().and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value));
                // A snapshot on demand's records (the bench's `ondemand` section) are the table's rows again,
                // not the writer's events.
                if header("snapshot_id").is_some() {
                    continue;
                }
                if let Some(seq) = header("id").and_then(id_seq) {
                    arrivals.set(seq, now);
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }))
}

/// Waits until `expected` arrivals were seen or no new one came for `quiet`.
async fn wait_arrivals(seen: &AtomicUsize, expected: usize, quiet: Duration) {
    let mut last = (seen.load(Ordering::Relaxed), Instant::now());
    while seen.load(Ordering::Relaxed) < expected {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = seen.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > quiet {
            break;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// latency (through the connector)

async fn latency(
    writer: &WriterArgs,
    kafka: &KafkaArgs,
    checkpoints: Option<Checkpoints>,
    pair: Option<(String, Checkpoints)>,
    warmup_s: u64,
) -> anyhow::Result<()> {
    let clock = Clock::new();
    let total = (writer.rate * writer.seconds) as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let mut followed = vec![Followed::start(kafka, checkpoints, total, clock, stop.clone()).await?];
    if let Some((topic, checkpoints)) = pair {
        let kafka = KafkaArgs { topic, ..kafka.clone() };
        followed.push(Followed::start(&kafka, Some(checkpoints), total, clock, stop.clone()).await?);
    }
    let log = Arc::new(CommitLog::new(total));
    let report = write_steadily(writer, &clock, log.clone()).await?;
    for f in &followed {
        wait_arrivals(&f.seen, total, Duration::from_secs(10)).await;
    }
    // Let the checkpoint cover the end.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, Ordering::Relaxed);
    let first = writer.rate * warmup_s;
    let mut results = Vec::new();
    for f in followed {
        results.push(f.finish(&log, first, total)?);
    }
    let mut out = json!({ "target_rate": writer.rate, "achieved_rate": report.achieved_rate, "seconds": writer.seconds,
                          "warmup_s": warmup_s });
    let pair = (results.len() > 1).then(|| results.pop()).flatten();
    for (k, v) in results.pop().expect("one followed connector").as_object().expect("an object") {
        out[k] = v.clone();
    }
    if let Some(pair) = pair {
        out["pair"] = pair;
    }
    println!("{out}");
    Ok(())
}

/// One connector's topic and checkpoint, followed while the writer writes.
struct Followed {
    arrivals: Arc<TimeLog>,
    seen: Arc<AtomicUsize>,
    consumer: std::thread::JoinHandle<()>,
    /// Checkpoint samples: (instant, GTID seq_no covered).
    samples: Arc<Mutex<Vec<(u64, u64)>>>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl Followed {
    async fn start(
        kafka: &KafkaArgs,
        checkpoints: Option<Checkpoints>,
        total: usize,
        clock: Clock,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<Followed> {
        create_topic(&kafka.bootstrap, &kafka.topic, kafka.partitions).await?;
        let (arrivals, seen) = (Arc::new(TimeLog::new(total)), Arc::new(AtomicUsize::new(0)));
        let consumer = consume_arrivals(kafka, clock, arrivals.clone(), stop.clone(), seen.clone())?;
        let samples = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
        let sampler = checkpoints.map(|mut checkpoints| {
            let samples = samples.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(cp) = checkpoints.latest() {
                        let text = cp.position().gtids.to_string();
                        if let Some(seq) = text.rsplit('-').next().and_then(|s| s.parse().ok()) {
                            samples.lock().unwrap().push((clock.now_ns(), seq));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(25));
                }
            })
        });
        Ok(Followed { arrivals, seen, consumer, samples, sampler })
    }

    /// Joins the threads (after `stop`) and summarises: commit→consumable, commit→checkpoint, slowest.
    fn finish(self, log: &CommitLog, first: u64, total: usize) -> anyhow::Result<serde_json::Value> {
        let Followed { arrivals, consumer, samples, sampler, .. } = self;
        consumer.join().map_err(|_| anyhow!("consumer panicked"))?;
        if let Some(s) = sampler {
            s.join().map_err(|_| anyhow!("sampler panicked"))?;
        }
        let mut lat = Vec::new();
        let mut missing = 0u64;
        // (commit second since start, latency ms) of every measured event, for the slowest list.
        let mut timed = Vec::new();
        for seq in first..total as u64 {
            match (log.committed_ns.get(seq), arrivals.get(seq)) {
                (Some(c), Some(a)) => {
                    let ms = (a as f64 - c as f64) / 1e6;
                    lat.push(ms);
                    timed.push((c as f64 / 1e9, ms));
                }
                _ => missing += 1,
            }
        }
        // The slowest events and when they were committed: periodic spikes point at a periodic cause.
        timed.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        let slowest: Vec<String> = timed.iter().take(12).map(|(at, ms)| format!("{at:.2}s:{ms:.0}ms")).collect();
        // Checkpoint lag: for each measured transaction, the first sample whose position covers it.
        let samples = samples.lock().unwrap();
        let mut lag = Vec::new();
        if !samples.is_empty() {
            for seq in first..total as u64 {
                let (Some(c), gtid) = (log.committed_ns.get(seq), log.gtid_seq[seq as usize].load(Ordering::Relaxed))
                else {
                    continue;
                };
                if gtid == 0 {
                    continue;
                }
                let i = samples.partition_point(|&(_, covered)| covered < gtid);
                if let Some(&(at, _)) = samples.get(i) {
                    lag.push((at as f64 - c as f64) / 1e6);
                }
            }
        }
        Ok(json!({ "missing": missing, "commit_to_consumable": summary(lat), "commit_to_checkpoint": summary(lag),
                   "slowest": slowest }))
    }
}

// ---------------------------------------------------------------------------------------------------------
// broker-latency

async fn broker_latency(
    kafka: &KafkaArgs,
    mysql_url: &str,
    rate: u64,
    seconds: u64,
    warmup_s: u64,
) -> anyhow::Result<()> {
    let records = connector_records(mysql_url, &kafka.topic, 10_000).await?;
    create_topic(&kafka.bootstrap, &kafka.topic, kafka.partitions).await?;
    let clock = Clock::new();
    let total = (rate * seconds) as usize;
    let (arrivals, stop, seen) =
        (Arc::new(TimeLog::new(total)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let consumer = consume_arrivals(kafka, clock, arrivals.clone(), stop.clone(), seen.clone())?;
    let acks = Arc::new(TimeLog::new(total));
    let sent = Arc::new(TimeLog::new(total));
    let (k, acks2, sent2) = (kafka.clone(), acks.clone(), sent.clone());
    let achieved = tokio::task::spawn_blocking(move || -> anyhow::Result<f64> {
        let producer: ThreadedProducer<Budget> = producer_config(&k.bootstrap).create_with_context(Budget {
            used: Mutex::new(0),
            freed: Condvar::new(),
            acked: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            ack_at_ns: Some(acks2),
            clock,
        })?;
        producer.client().fetch_metadata(Some(&k.topic), Duration::from_secs(10))?;
        let start = Instant::now();
        let period = Duration::from_nanos(1_000_000_000 / rate.max(1));
        for seq in 0..total as u64 {
            let due = start + period * seq as u32;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            sent2.set(seq, clock.now_ns());
            send_blocking(&producer, &records[seq as usize % records.len()], seq, 16 * 1024 * 1024)?;
        }
        let achieved = total as f64 / start.elapsed().as_secs_f64();
        producer.flush(Duration::from_secs(30))?;
        Ok(achieved)
    })
    .await??;
    wait_arrivals(&seen, total, Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    consumer.join().map_err(|_| anyhow!("consumer panicked"))?;
    let first = rate * warmup_s;
    let collect = |log: &TimeLog| -> Vec<f64> {
        (first..total as u64).filter_map(|s| Some((log.get(s)? as f64 - sent.get(s)? as f64) / 1e6)).collect()
    };
    println!(
        "{}",
        json!({ "target_rate": rate, "achieved_rate": achieved, "seconds": seconds, "warmup_s": warmup_s,
                "send_to_ack": summary(collect(&acks)), "send_to_consumable": summary(collect(&arrivals)) })
    );
    Ok(())
}
