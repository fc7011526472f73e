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
//!   [`REPORT_EVERY`], and fails as transient only after [`Until::stall`] without progress *of that
//!   partition*: each partition has its own stall clock, and positions are sampled at least every [`POLL`]
//!   whether records come or not. On a busy topic (the shared dead-letter topic) records of other
//!   partitions never stop coming: sampling only when idle, with one clock for all, would neither see a
//!   partition reach its end past a commit marker nor see it stall, and the read would never finish.
//! - **Nothing is skipped.** `auto.offset.reset = error`: when records the reader has not read yet are
//!   deleted under it (retention, `DeleteRecords`), the read fails as definite, naming the partition and
//!   the offset from which records were lost ([`ToEnd::if_lost`] says what that means to the caller).
//!   librdkafka's default would jump to the end and the read would look complete.
//! - **No consumer group is used.** librdkafka refuses `assign()` without a `group.id`, and with one it
//!   looks up the group's coordinator (FindCoordinator) even though this reader never joins, fetches nor
//!   commits group offsets: it reads from explicit offsets. A principal without an ACL on that group gets
//!   GROUP_AUTHORIZATION_FAILED from the lookup; the reader ignores it (logged once), so no ACL on any
//!   group is needed.
//! - [`Until::quiet`]: after every end is reached, reading goes on until no record came for that long, for
//!   brokers that report an end too low (Tansu's memory engine answers the base offset of the last batch).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{classify_kafka, classify_kafka_on, Error, KafkaResource, Result};
use crate::kafka::identity::{self, Context, Tokened, Tokens};

/// How long one `poll` waits for a record, and how often the consumer's positions are sampled.
const POLL: Duration = Duration::from_millis(100);

/// What a reader needs on each topic it reads: the operations of its ACL.
const READ: &[&str] = &["Read", "Describe"];

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
    /// Fail (transient) when a partition below its end did not move for this long.
    pub stall: Duration,
}

/// A partition: (topic, partition).
type Key = (String, i32);

/// Where each partition's reading starts: the beginning unless an offset is given.
pub type Starts = BTreeMap<(String, i32), i64>;

/// A reader of some topics up to the high watermarks they had when it started. See the module's invariants.
pub struct ToEnd<C: ConsumerContext + Tokened + 'static = Context> {
    consumer: BaseConsumer<C>,
    book: Book,
}

/// Where one partition stands.
#[derive(Debug, Clone, Copy)]
struct Progress {
    /// The high watermark when the reader started.
    end: i64,
    /// The next offset to read.
    next: i64,
    /// When `next` last moved (or the reader started): the partition's own stall clock.
    moved: Instant,
}

/// Where each partition stands, and what was said about it.
struct Book {
    /// What is read, for messages ("the state topic outbox-cdc.state").
    what: String,
    /// What records deleted under the reader mean to the caller ([`ToEnd::if_lost`]).
    if_lost: String,
    until: Until,
    partitions: BTreeMap<Key, Progress>,
    /// Topics that do not exist.
    missing: Vec<String>,
    /// (topic, partition) -> the first offset the partition still holds (its log start).
    log_starts: BTreeMap<(String, i32), i64>,
    /// Records between the starts and the ends when the reader started.
    estimate: u64,
    records: u64,
    last_record: Instant,
    reached: Option<Instant>,
    reported: Instant,
    /// When the consumer's positions were last sampled.
    sampled: Instant,
    /// Whether the group lookup's refusal was logged.
    group_refusal_logged: bool,
}

impl<C: ConsumerContext + Tokened + 'static> ToEnd<C> {
    /// Assigns every partition of `topics` from `starts` (the beginning where none is given) and takes each
    /// one's end (its high watermark, read_uncommitted). `config` is the reading client's configuration
    /// (its `isolation.level` is the caller's; end-of-partition events are turned off).
    ///
    /// # Errors
    /// Transient when the broker cannot be reached; definite when the principal may not read a topic.
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
        cc.set("enable.partition.eof", "false").set("auto.offset.reset", "error").set("enable.auto.commit", "false");
        let tokens = context.tokens().clone();
        let consumer: BaseConsumer<C> =
            identity::create(&cc, context).map_err(|e| e.context(format_args!("reading {what}")))?;
        let mut uncommitted = config.clone();
        uncommitted.set("isolation.level", "read_uncommitted");
        let ends: BaseConsumer<Context> = identity::create(&uncommitted, Context::new(tokens))?;
        let mut assignment = TopicPartitionList::new();
        let mut partitions = BTreeMap::new();
        let mut missing = Vec::new();
        let mut log_starts = BTreeMap::new();
        let mut estimate = 0;
        for topic in topics {
            let metadata = ends
                .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
                .map_err(|e| classify_kafka(&e).context(format_args!("reading the metadata of {topic}")))?;
            let acl = Some(KafkaResource::Topic(topic, READ));
            let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
                missing.push(topic.clone());
                continue;
            };
            match t.error().map(rdkafka::types::RDKafkaErrorCode::from) {
                None => {}
                Some(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition) => {
                    missing.push(topic.clone());
                    continue;
                }
                // A refused topic is not a missing one: `status` would say "no state", a release "no hold".
                Some(code) => {
                    return Err(classify_kafka_on(&KafkaError::MetadataFetch(code), acl)
                        .context(format_args!("reading the metadata of {topic}")))
                }
            }
            for p in t.partitions() {
                let (low, high) = ends.fetch_watermarks(topic, p.id(), REQUEST_TIMEOUT).map_err(|e| {
                    classify_kafka_on(&e, acl).context(format_args!("the end offsets of {topic}/{}", p.id()))
                })?;
                let from = starts.get(&(topic.clone(), p.id())).copied();
                let offset = from.map_or(Offset::Beginning, Offset::Offset);
                assignment.add_partition_offset(topic, p.id(), offset).map_err(|e| classify_kafka(&e))?;
                // A given start below the log start is kept: its records are gone, and the read fails on them.
                let next = from.unwrap_or(low);
                estimate += (high - next.max(low)).max(0) as u64;
                partitions.insert((topic.clone(), p.id()), Progress { end: high, next, moved: Instant::now() });
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
                if_lost: "the read is incomplete".to_string(),
                what,
                until,
                partitions,
                missing,
                log_starts,
                estimate,
                records: 0,
                last_record: now,
                reached: None,
                reported: now,
                sampled: now,
                group_refusal_logged: false,
            },
        })
    }

    /// Says what records deleted under the reader mean to the caller, and what to do (appended to the
    /// definite error that names the partition and offset).
    pub fn if_lost(mut self, advice: impl Into<String>) -> Self {
        self.book.if_lost = advice.into();
        self
    }

    /// The next record, or `None` once every partition is read to its end (and [`Until::quiet`] passed).
    ///
    /// # Errors
    /// Transient when the broker fails the read, or when a partition made no progress for
    /// [`Until::stall`]; definite when records not yet read were deleted under the reader, or the principal
    /// may not read a topic.
    pub fn next_record(&mut self) -> Result<Option<BorrowedMessage<'_>>> {
        let consumer = &self.consumer;
        let book = &mut self.book;
        loop {
            if book.sampled.elapsed() >= POLL {
                book.advance(consumer_positions(consumer));
            }
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
                Some(Err(e)) => match e.rdkafka_error_code() {
                    Some(RDKafkaErrorCode::AutoOffsetReset) => return Err(book.lost(consumer)),
                    // The group lookup librdkafka makes for every consumer with a group.id; this reader never
                    // uses the group (module doc).
                    Some(RDKafkaErrorCode::GroupAuthorizationFailed) => {
                        if !std::mem::replace(&mut book.group_refusal_logged, true) {
                            tracing::debug!(%e, "reading {}: no ACL on the consumer group, which is not used", book.what);
                        }
                    }
                    _ => {
                        let acl = book.only_topic().map(|t| KafkaResource::Topic(t, READ));
                        return Err(classify_kafka_on(&e, acl).context(format_args!("reading {}", book.what)));
                    }
                },
                None => book.advance(consumer_positions(consumer)),
            }
        }
    }

    /// The number of partitions of `topic` the reader reads (0 when it does not exist).
    pub fn partition_count(&self, topic: &str) -> usize {
        self.book.partitions.keys().filter(|(t, _)| t == topic).count()
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
        self.book.partitions.iter().map(|(k, p)| (k.clone(), p.next)).collect()
    }
}

impl Book {
    /// The partition below its end that has not moved for the longest.
    fn behind(&self) -> Option<(&Key, &Progress)> {
        self.partitions.iter().filter(|(_, p)| p.next < p.end).min_by_key(|(_, p)| p.moved)
    }

    /// The one topic read, when there is one.
    fn only_topic(&self) -> Option<&str> {
        let mut topics = self.partitions.keys().map(|(t, _)| t.as_str());
        let first = topics.next()?;
        topics.all(|t| t == first).then_some(first)
    }

    /// The definite error of records deleted under the reader (librdkafka's `_AUTO_OFFSET_RESET`, which does
    /// not say which partition): each partition below its end whose log start is now past where it was
    /// read to lost the records in between; when the broker does not show it (the log start is not past),
    /// every partition below its end is named with the offset it was read to.
    fn lost<C: ConsumerContext + 'static>(&self, consumer: &BaseConsumer<C>) -> Error {
        let behind: Vec<(&Key, &Progress)> = self.partitions.iter().filter(|(_, p)| p.next < p.end).collect();
        let mut gone = Vec::new();
        for ((topic, partition), p) in &behind {
            if let Ok((low, _)) = consumer.fetch_watermarks(topic, *partition, REQUEST_TIMEOUT) {
                if low > p.next {
                    gone.push(format!(
                        "{topic}/{partition} offsets {} to {} (the partition now starts at {low})",
                        p.next,
                        low - 1
                    ));
                }
            }
        }
        if gone.is_empty() {
            gone = behind.iter().map(|((t, p), at)| format!("{t}/{p} from offset {}", at.next)).collect();
        }
        Error::records_deleted(format!(
            "reading {}: records this read had not reached yet were deleted from the topic (retention.ms, \
             retention.bytes or DeleteRecords): {}. The read stopped instead of skipping them: {}",
            self.what,
            gone.join(", "),
            self.if_lost
        ))
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
        self.records += 1;
        self.last_record = Instant::now();
        self.moved_to(topic, partition, offset + 1);
    }

    fn advance(&mut self, positions: Vec<(String, i32, i64)>) {
        self.sampled = Instant::now();
        for (topic, partition, at) in positions {
            self.moved_to(&topic, partition, at);
        }
    }

    /// `topic/partition` is read up to `next` (exclusive); its stall clock restarts when that is further.
    fn moved_to(&mut self, topic: &str, partition: i32, next: i64) {
        if let Some(p) = self.partitions.get_mut(&(topic.to_string(), partition)) {
            if next > p.next {
                p.next = next;
                p.moved = Instant::now();
            }
        }
    }

    /// Fails after [`Until::stall`] without progress below an end; says every [`REPORT_EVERY`] why it waits,
    /// or how far a long read is.
    fn check(&mut self) -> Result<()> {
        let Some(((topic, partition), Progress { end, next, moved })) =
            self.behind().map(|((t, p), progress)| ((t.clone(), *p), *progress))
        else {
            return Ok(());
        };
        let still = moved.elapsed();
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
pub async fn transaction_max_timeout(config: &ClientConfig, tokens: &Tokens) -> Duration {
    let cc = config.clone();
    let context = Context::new(tokens.clone());
    let broker = tokio::task::spawn_blocking(move || {
        let client: BaseConsumer<Context> = identity::create(&cc, context).ok()?;
        let metadata = client.fetch_metadata(None, REQUEST_TIMEOUT).ok()?;
        metadata.brokers().first().map(|b| b.id())
    });
    let Ok(Some(broker)) = broker.await else { return DEFAULT_TRANSACTION_MAX_TIMEOUT };
    let Ok(admin) = identity::create::<AdminClient<Context>, _>(config, Context::new(tokens.clone())) else {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn book(stall: Duration, partitions: &[(i32, i64, i64)]) -> Book {
        let now = Instant::now();
        Book {
            what: "t".into(),
            if_lost: String::new(),
            until: Until { quiet: Duration::ZERO, stall },
            partitions: partitions
                .iter()
                .map(|&(p, end, next)| (("t".to_string(), p), Progress { end, next, moved: now }))
                .collect(),
            missing: Vec::new(),
            log_starts: BTreeMap::new(),
            estimate: 0,
            records: 0,
            last_record: now,
            reached: None,
            reported: now,
            sampled: now,
            group_refusal_logged: false,
        }
    }

    /// Guards against one global stall clock (issue 46, finding 6): on a busy topic, records of one
    /// partition kept restarting the clock of another that stood still below its end, so the read neither
    /// finished nor failed. Each partition stalls on its own clock, and the error names it.
    #[test]
    fn a_partition_stalls_on_its_own_clock_while_another_is_busy() {
        let stall = Duration::from_millis(200);
        let mut book = book(stall, &[(0, 10, 9), (1, 1_000_000, 0)]);
        let started = Instant::now();
        let mut offset = 0;
        let err = loop {
            assert!(started.elapsed() < stall * 20, "partition 0 never stalled while partition 1 was busy");
            book.record("t", 1, offset);
            offset += 1;
            assert!(!book.is_done());
            if let Err(e) = book.check() {
                break e;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(!err.is_definite() && err.to_string().contains("t/0 stayed at offset 9"), "{err}");
    }

    /// A partition is done at the end sampled when the reader started, whatever the others do.
    #[test]
    fn each_partition_is_done_at_its_own_end() {
        let mut book = book(Duration::from_secs(60), &[(0, 10, 9), (1, 5, 0)]);
        book.advance(vec![("t".into(), 0, 10)]);
        assert!(!book.is_done(), "partition 1 is still below its end");
        for offset in 0..5 {
            book.record("t", 1, offset);
        }
        assert!(book.is_done());
    }

    /// Records deleted under the reader (librdkafka's `_AUTO_OFFSET_RESET`, after OFFSET_OUT_OF_RANGE) are
    /// [`crate::error::Kind::RecordsDeleted`], definite, naming each partition below its end and the
    /// caller's advice. (`tests/state_topic_acls.rs` deletes records under a real read.)
    #[test]
    fn records_deleted_under_the_reader_are_their_kind() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        cluster.create_topic("t", 2, 1).unwrap();
        let consumer: BaseConsumer =
            ClientConfig::new().set("bootstrap.servers", cluster.bootstrap_servers()).create().unwrap();
        let mut book = book(Duration::from_secs(60), &[(0, 10, 4), (1, 5, 5)]);
        book.if_lost = "the caller's advice".into();
        let err = book.lost(&consumer);
        assert!(err.is_definite() && err.kind() == &crate::error::Kind::RecordsDeleted, "{err}");
        assert!(err.to_string().contains("t/0 from offset 4") && !err.to_string().contains("t/1"), "{err}");
        assert!(err.to_string().contains("the caller's advice"), "{err}");
    }
}
