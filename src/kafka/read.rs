//! Reading topics to their end: the one reader behind every "read all of it" in the connector, the Kafka
//! state backend's read at start (and `status`, `state copy`), `quarantine release` reading the dead-letter
//! topic, and `audit`.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! # The end is the high watermark, never an end-of-partition event
//! A `read_committed` consumer cannot read past a partition's last stable offset (LSO), the first offset of
//! a transaction still open. librdkafka raises its end-of-partition event there, and its ListOffsets
//! answers the LSO too when the client is `read_committed`. On a topic several producers write (the
//! shared state topic, the shared dead-letter topic), another producer's open transaction, say of a
//! connector killed in the middle of one, would hide every record committed after it: a state read would
//! resume from an old checkpoint and publish again what was committed since; a release would lift a hold
//! whose tail it never read.
//!
//! # Invariants
//! - Each partition's end is its high watermark, asked once when the reader starts, with
//!   `isolation.level = read_uncommitted` (a second client: the reading one stays `read_committed`). For
//!   the state read that is after the fences, so no older producer of ours can commit past it.
//! - A partition is read when the consumer's *position* reaches its end. The position moves past commit
//!   markers and aborted records, offsets at which no record is ever returned, so it is the only measure
//!   that gets there on a transactional topic. End-of-partition events are ignored.
//! - A position that stays below its end is an open transaction holding the reader back: it waits until
//!   the transaction commits or aborts (the broker aborts it at the latest after its producer's
//!   `transaction.timeout.ms`, at most the broker's `transaction.max.timeout.ms`), says so in the log every
//!   [`REPORT_EVERY`], and fails as transient only after [`Until::stall`] without progress.
//! - [`Until::quiet`]: after every end is reached, reading goes on until no record came for that long, for
//!   brokers that report an end too low (Tansu's memory engine answers the base offset of the last batch).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, DefaultConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{classify_kafka, Error, Result};

/// How long one `poll` waits for a record.
const POLL: Duration = Duration::from_millis(100);

/// How often a reader that waits says so, and how often a long read reports its progress.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// Metadata and watermark requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The broker's `transaction.max.timeout.ms` when it does not say (Apache Kafka's default): the longest a
/// transaction can stay open before the broker aborts it.
pub const DEFAULT_TRANSACTION_MAX_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Set once the process is asked to stop ([`stop_waiting`]).
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Makes every read that waits for another producer's transaction give up at once (a transient error): the
/// process is stopping, and a read could otherwise hold the stop back for up to the broker's
/// `transaction.max.timeout.ms`.
pub fn stop_waiting() {
    STOPPING.store(true, Ordering::Release);
}

/// When a read is done, and when it gives up.
#[derive(Debug, Clone, Copy)]
pub struct Until {
    /// After every partition reached its end, read on until no record came for this long (zero: stop at
    /// once). Ten quiet periods after the ends were reached it stops in any case: a live topic keeps growing.
    pub quiet: Duration,
    /// Fail (transient) when no partition moved for this long while one is still below its end.
    pub stall: Duration,
}

/// A partition: (topic, partition).
type Key = (String, i32);

/// Where each partition's reading starts: the beginning unless an offset is given.
pub type Starts = BTreeMap<(String, i32), i64>;

/// A reader of some topics up to the high watermarks they had when it started. See the module's invariants.
pub struct ToEnd<C: ConsumerContext + 'static = DefaultConsumerContext> {
    consumer: BaseConsumer<C>,
    book: Book,
}

/// Where each partition stands, and what was said about it.
struct Book {
    /// What is read, for messages ("the state topic outbox-cdc.state").
    what: String,
    until: Until,
    /// (topic, partition) -> (end, next offset to read).
    partitions: BTreeMap<(String, i32), (i64, i64)>,
    /// Topics that do not exist.
    missing: Vec<String>,
    /// (topic, partition) -> the first offset the partition still holds (its log start).
    log_starts: BTreeMap<(String, i32), i64>,
    /// Records between the starts and the ends when the reader started.
    estimate: u64,
    records: u64,
    /// When a record last came or a position last moved.
    progressed: Instant,
    last_record: Instant,
    reached: Option<Instant>,
    reported: Instant,
}

impl<C: ConsumerContext + 'static> ToEnd<C> {
    /// Assigns every partition of `topics` from `starts` (the beginning where none is given) and takes each
    /// one's end (its high watermark, read_uncommitted). `config` is the reading client's configuration
    /// (its `isolation.level` is the caller's; end-of-partition events are turned off).
    ///
    /// # Errors
    /// Transient when the broker cannot be reached.
    pub fn start(
        config: &ClientConfig,
        context: C,
        topics: &[String],
        starts: &Starts,
        until: Until,
        what: impl Into<String>,
    ) -> Result<Self> {
        let what = what.into();
        let mut cc = config.clone();
        cc.set("enable.partition.eof", "false");
        let consumer: BaseConsumer<C> =
            cc.create_with_context(context).map_err(|e| classify_kafka(&e).context(format_args!("reading {what}")))?;
        let mut uncommitted = config.clone();
        uncommitted.set("isolation.level", "read_uncommitted");
        let ends: BaseConsumer = uncommitted.create().map_err(|e| classify_kafka(&e))?;
        let mut assignment = TopicPartitionList::new();
        let mut partitions = BTreeMap::new();
        let mut missing = Vec::new();
        let mut log_starts = BTreeMap::new();
        let mut estimate = 0;
        for topic in topics {
            let metadata = ends
                .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
                .map_err(|e| classify_kafka(&e).context(format_args!("reading the metadata of {topic}")))?;
            let Some(t) = metadata.topics().iter().find(|t| t.name() == topic && t.error().is_none()) else {
                missing.push(topic.clone());
                continue;
            };
            for p in t.partitions() {
                let (low, high) = ends
                    .fetch_watermarks(topic, p.id(), REQUEST_TIMEOUT)
                    .map_err(|e| classify_kafka(&e).context(format_args!("the end offsets of {topic}/{}", p.id())))?;
                let from = starts.get(&(topic.clone(), p.id())).copied();
                let offset = from.map_or(Offset::Beginning, Offset::Offset);
                assignment.add_partition_offset(topic, p.id(), offset).map_err(|e| classify_kafka(&e))?;
                let next = from.unwrap_or(low).max(low);
                estimate += (high - next).max(0) as u64;
                partitions.insert((topic.clone(), p.id()), (high, next));
                log_starts.insert((topic.clone(), p.id()), low);
            }
        }
        if !partitions.is_empty() {
            consumer.assign(&assignment).map_err(|e| classify_kafka(&e).context(format_args!("reading {what}")))?;
        }
        let now = Instant::now();
        Ok(ToEnd {
            consumer,
            book: Book {
                what,
                until,
                partitions,
                missing,
                log_starts,
                estimate,
                records: 0,
                progressed: now,
                last_record: now,
                reached: None,
                reported: now,
            },
        })
    }

    /// The next record, or `None` once every partition is read to its end (and [`Until::quiet`] passed).
    ///
    /// # Errors
    /// Transient when the broker fails the read, or when a partition made no progress for
    /// [`Until::stall`].
    pub fn next_record(&mut self) -> Result<Option<BorrowedMessage<'_>>> {
        let consumer = &self.consumer;
        let book = &mut self.book;
        loop {
            if book.is_done() {
                return Ok(None);
            }
            book.check()?;
            match consumer.poll(POLL) {
                Some(Ok(message)) => {
                    book.record(message.topic(), message.partition(), message.offset());
                    return Ok(Some(message));
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => return Err(classify_kafka(&e).context(format_args!("reading {}", book.what))),
                None => book.advance(consumer_positions(consumer)),
            }
        }
    }

    /// Topics asked for that do not exist.
    pub fn missing(&self) -> &[String] {
        &self.book.missing
    }

    /// Records between the starts and the ends when the reader started (an estimate: compacted and
    /// aborted records, and markers, are never returned).
    pub fn estimate(&self) -> u64 {
        self.book.estimate
    }

    /// The first offset each partition still held when the reader started (its log start).
    pub fn log_starts(&self) -> BTreeMap<(String, i32), i64> {
        self.book.log_starts.clone()
    }

    /// Records returned so far.
    pub fn records(&self) -> u64 {
        self.book.records
    }

    /// Where the next read of each partition would start: its end once the reader is done.
    pub fn positions(&self) -> Starts {
        self.book.partitions.iter().map(|(k, (_, next))| (k.clone(), *next)).collect()
    }
}

impl Book {
    /// A partition not yet read to its end: `((topic, partition), (end, next offset))`.
    fn behind(&self) -> Option<(&Key, &(i64, i64))> {
        self.partitions.iter().find(|(_, (end, next))| next < end)
    }

    fn is_done(&mut self) -> bool {
        if self.partitions.is_empty() {
            return true;
        }
        if self.behind().is_some() {
            return false;
        }
        let reached = *self.reached.get_or_insert_with(Instant::now);
        let quiet = self.until.quiet;
        quiet.is_zero() || self.last_record.elapsed() >= quiet || reached.elapsed() >= quiet * 10
    }

    fn record(&mut self, topic: &str, partition: i32, offset: i64) {
        let now = Instant::now();
        self.records += 1;
        self.last_record = now;
        self.progressed = now;
        if let Some((_, next)) = self.partitions.get_mut(&(topic.to_string(), partition)) {
            *next = (*next).max(offset + 1);
        }
    }

    fn advance(&mut self, positions: Vec<(String, i32, i64)>) {
        for (topic, partition, at) in positions {
            if let Some((_, next)) = self.partitions.get_mut(&(topic, partition)) {
                if at > *next {
                    *next = at;
                    self.progressed = Instant::now();
                }
            }
        }
    }

    /// Fails after [`Until::stall`] without progress below an end; says every [`REPORT_EVERY`] why it waits,
    /// or how far a long read is.
    fn check(&mut self) -> Result<()> {
        let Some(((topic, partition), (end, next))) = self.behind().map(|((t, p), (e, n))| ((t.clone(), *p), (*e, *n)))
        else {
            return Ok(());
        };
        let still = self.progressed.elapsed();
        if still >= POLL * 5 && STOPPING.load(Ordering::Acquire) {
            return Err(Error::transient(format!(
                "reading {}: stopped waiting at {topic}/{partition} offset {next} (end {end}): the process is stopping",
                self.what
            )));
        }
        if still >= self.until.stall {
            return Err(Error::transient(format!(
                "reading {}: {topic}/{partition} stayed at offset {next}, below its end {end}, for {:?}. A transaction \
                 another producer left open there holds read_committed readers back, and the broker did not abort \
                 it in that time (or the broker stopped answering). Try again; if it persists, find the producer \
                 (kafka-transactions --describe) and abort it",
                self.what, self.until.stall
            )));
        }
        if self.reported.elapsed() < REPORT_EVERY {
            return Ok(());
        }
        self.reported = Instant::now();
        if still >= REPORT_EVERY {
            tracing::warn!(
                partition = format!("{topic}/{partition}"),
                at = next,
                end,
                waited_s = still.as_secs(),
                gives_up_in_s = (self.until.stall - still).as_secs(),
                "reading {}: waiting for a transaction another producer left open at this offset to commit or \
                 abort (read_committed cannot pass it; the broker aborts it after its transaction.timeout.ms at \
                 the latest). Reading it earlier would miss what was committed after it",
                self.what
            );
        } else {
            tracing::info!(records = self.records, estimate = self.estimate, "reading {}", self.what);
        }
        Ok(())
    }
}

/// Where a consumer will read next in each assigned partition: `(topic, partition, offset)`. A
/// `read_committed` consumer of a transactional topic moves past commit markers and aborted records,
/// offsets at which no record is ever returned: a reader that waits for a record at the end offset minus
/// one would wait for ever, this position is where it really is.
pub fn consumer_positions<C: ConsumerContext + 'static>(consumer: &BaseConsumer<C>) -> Vec<(String, i32, i64)> {
    let Ok(positions) = consumer.position() else { return Vec::new() };
    positions
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(at) => Some((e.topic().to_string(), e.partition(), at)),
            _ => None,
        })
        .collect()
}

/// The longest a transaction can stay open on the broker of `config` (its `transaction.max.timeout.ms`),
/// [`DEFAULT_TRANSACTION_MAX_TIMEOUT`] when it does not say: how long a reader may have to wait out another
/// producer's open transaction.
pub async fn transaction_max_timeout(config: &ClientConfig) -> Duration {
    let cc = config.clone();
    let broker = tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = cc.create().ok()?;
        let metadata = client.fetch_metadata(None, REQUEST_TIMEOUT).ok()?;
        metadata.brokers().first().map(|b| b.id())
    });
    let Ok(Some(broker)) = broker.await else { return DEFAULT_TRANSACTION_MAX_TIMEOUT };
    let Ok(admin) = config.create::<AdminClient<DefaultClientContext>>() else {
        return DEFAULT_TRANSACTION_MAX_TIMEOUT;
    };
    let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let described = admin.describe_configs([&ResourceSpecifier::Broker(broker)], &options).await;
    described
        .ok()
        .and_then(|results| results.into_iter().next())
        .and_then(|r| r.ok())
        .and_then(|r| r.get("transaction.max.timeout.ms").and_then(|e| e.value.clone()))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(DEFAULT_TRANSACTION_MAX_TIMEOUT, Duration::from_millis)
}
