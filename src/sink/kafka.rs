//! The Kafka producer: idempotent, `acks=all`, murmur2 partitioning, bounded in bytes; with `exactly_once`,
//! transactional ([`super::transaction`]).
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! # Invariants
//! - Every record handed to librdkafka was first registered with the [`Watermark`]; its delivery callback
//!   either settles it with a [`Delivered`] proof or records a failure that freezes the watermark. A record
//!   that librdkafka refuses to enqueue is a failure too: nothing is ever counted as delivered without an
//!   acknowledgement.
//! - At most `max_in_flight_bytes` of records are unacknowledged at any time: [`KafkaSink::send`] waits for
//!   budget, so a slow or absent broker stops the binlog reader instead of growing memory.
//! - Per-aggregate order: records are enqueued in binlog order, keyed by aggregate id, partitioned with
//!   murmur2 (the Java client's default, so other clients agree on placement), and the idempotent producer
//!   keeps per-partition order across retries and reconnects.
//! - No record of a partition is written after one that failed. The restart re-reads from before the
//!   failed record, so a later record that got through would precede it (A2, A1, A2). Hence: records never
//!   time out (`message.timeout.ms = 0`, retries unlimited), a batch that fails for good makes the producer
//!   fatal instead of letting the next batch through (`enable.gapless.guarantee`), and the first failed
//!   delivery purges the queue at once and stops [`KafkaSink::send`] from enqueueing anything more.
//!
//! # Error handling
//! - A broker outage is waited out: records stay queued, the in-flight budget fills, the binlog reader
//!   stops, `outbox_cdc_ready` drops, and [`KafkaSink::send`] logs every [`STALL_REPORT_EVERY`] while it
//!   waits. Shutdown purges what is unacknowledged; none of it is checkpointed.
//! - A fatal producer error is transient for the pipeline ([`Error::producer_fatal`]): the run restarts
//!   from the checkpoint with a new producer; [`crate::app`] bounds how often in a row.
//! - Size refusals blame a record only when that record alone is over the topic's `max.message.bytes`
//!   ([`super::topics`]); a batch over it is a configuration error, which [`KafkaSink::send`] also checks
//!   before a topic's first record.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, PurgeConfig};
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::{Notify, Semaphore};

use super::delivery::{InFlight, SinkContext, SinkProducer};
use super::limits::{describe_limit, RECORD_OVERHEAD_BYTES};
use super::topics::Topics;
use super::transaction::{OnCommit, Transaction, Transactional};
use crate::checkpoint::{TxId, Watermark};
use crate::config::KafkaConfig;
use crate::error::{classify_kafka, is_fenced_code, Error, Result};
use crate::kafka::commit::{abort_within, init_within, Deadline};
use crate::kafka::identity::{self, Tokens};
use crate::lease::Holding;
use crate::metrics::metrics;
use crate::router::KafkaRecord;

/// The Kafka side of the pipeline.
pub struct KafkaSink {
    producer: Arc<SinkProducer>,
    watermark: Arc<Watermark>,
    budget: Arc<Semaphore>,
    max_in_flight_bytes: usize,
    max_record_bytes: usize,
    /// The topics it writes to, checked before each one's first record.
    topics: Topics,
    /// With `exactly_once`: the Kafka transaction records are produced in.
    txn: Option<Transactions>,
    /// With the Kafka state backend: the lease this instance publishes under ([`KafkaSink::publish_while`]).
    lease: Option<Holding>,
}

/// The transactions of a transactional sink.
struct Transactions {
    /// Where the checkpoint that commits with the records goes.
    target: Transactional,
    /// How long `abort_transaction` may take (`transaction.timeout.ms`).
    timeout: Duration,
    /// How often a commit that has not returned says it still waits
    /// ([`crate::kafka::commit::until_known`]): `transaction.timeout.ms`.
    commit_attempt: Duration,
    /// When the waits for the producer's start, a commit's outcome and an abort give up: set by a stop.
    deadline: Deadline,
    state: Transaction,
}

/// How long a transactional sink dropped with its transaction open (the run dropped when the lease is lost)
/// may spend aborting it.
const ABORT_ON_DROP: Duration = Duration::from_secs(2);

impl Drop for KafkaSink {
    /// A run dropped in the middle (the lease lost: `app` drops it at once) would leave its Kafka
    /// transaction open until `transaction.timeout.ms`, holding back every `read_committed` consumer of its
    /// partitions, and every other connector's state read, that long. So the open transaction is aborted
    /// here, best effort and bounded by [`ABORT_ON_DROP`]. It fences nobody: a newer instance that already
    /// started has bumped the producer epoch, and then this abort fails harmlessly. A commit still running
    /// cannot be aborted; librdkafka finishes it.
    fn drop(&mut self) {
        let Some(txn) = &mut self.txn else { return };
        if !txn.state.step(Transaction::abort) {
            return;
        }
        self.producer.purge(PurgeConfig::default().queue().inflight());
        let started = Instant::now();
        match self.producer.abort_transaction(ABORT_ON_DROP) {
            Ok(()) => {
                metrics().transaction_aborted();
                tracing::info!(
                    ms = started.elapsed().as_millis() as u64,
                    "aborted the open Kafka transaction of the stopped run"
                );
            }
            Err(e) => tracing::warn!(
                error = %e,
                "could not abort the open Kafka transaction of the stopped run: read_committed consumers of its \
                 partitions wait until the next instance starts or the broker aborts it (transaction.timeout.ms)"
            ),
        }
    }
}

/// The librdkafka configuration every Kafka client starts from ([`KafkaConfig::client_config`]).
///
/// # Errors
/// A definite error when a secret's variable or file is missing.
pub fn client_config(config: &KafkaConfig) -> Result<ClientConfig> {
    config.client_config()
}

/// The producer's librdkafka configuration (the configured properties, with the delivery guarantee's settings
/// over them) and the largest batch of several records it builds (`min(batch.size, message.max.bytes)`):
/// what `run` produces with, and what `check` tests ([`super::check`]).
///
/// # Errors
/// A definite error for a `batch.size` that is not a number, or a secret's missing variable or file.
pub(super) fn producer_config(config: &KafkaConfig) -> Result<(ClientConfig, usize)> {
    let mut cc = client_config(config)?;
    // The delivery guarantee's settings (config validation refuses other values for them): see the
    // module's invariants.
    cc.set("enable.idempotence", "true")
        .set("enable.gapless.guarantee", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "0")
        .set("partitioner", "murmur2_random")
        .set("compression.type", &config.compression)
        .set("allow.auto.create.topics", "false")
        .set("message.max.bytes", config.max_record_bytes.to_string())
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "2097151")
        .set("statistics.interval.ms", "5000");
    if !config.properties.contains_key("linger.ms") {
        cc.set("linger.ms", "5");
    }
    let batch_size = match config.properties.get("batch.size") {
        Some(v) => v.trim().parse::<usize>().map_err(|_| {
            Error::definite(format!("kafka.properties.\"batch.size\" = {v:?} is not a number of bytes"))
        })?,
        None => DEFAULT_BATCH_SIZE,
    };
    Ok((cc, batch_size.min(config.max_record_bytes)))
}

/// librdkafka's default `batch.size`.
const DEFAULT_BATCH_SIZE: usize = 1_000_000;

/// How often [`KafkaSink::send`] says that it is still waiting for the broker.
pub const STALL_REPORT_EVERY: Duration = Duration::from_secs(30);

/// How long [`KafkaSink::send`] waits, after librdkafka refused a record because the producer failed
/// fatally, for the delivery report of the batch that made it fail: that report names the cause.
const FATAL_CAUSE_WAIT: Duration = Duration::from_secs(2);

/// Memory a record costs in librdkafka beyond its own bytes until it is acknowledged: the message struct,
/// one allocation per header, its copy in the uncompressed and the compressed batch. Measured with the
/// broker paused (docs/PERFORMANCE.md, "Memory under pressure"): ~1 KB per 630-byte record. Counted in the
/// in-flight budget so that `max_in_flight_bytes` bounds memory, not just record bytes.
pub const IN_FLIGHT_OVERHEAD_BYTES: usize = 1024;

impl KafkaSink {
    /// Creates the producer.
    ///
    /// # Errors
    /// A definite error for an invalid librdkafka configuration.
    pub fn new(config: &KafkaConfig, watermark: Arc<Watermark>) -> Result<Self> {
        KafkaSink::with(config, watermark, |_| {})
    }

    /// [`KafkaSink::new`] with `adjust` applied to the producer's configuration.
    fn with(config: &KafkaConfig, watermark: Arc<Watermark>, adjust: impl FnOnce(&mut ClientConfig)) -> Result<Self> {
        let budget = Arc::new(Semaphore::new(config.max_in_flight_bytes));
        let (mut cc, batch_limit_bytes) = producer_config(config)?;
        adjust(&mut cc);
        let transactional = cc.get("transactional.id").is_some();
        let context = SinkContext {
            watermark: watermark.clone(),
            budget: budget.clone(),
            failed: AtomicBool::new(false),
            failure_notice: Arc::new(Notify::new()),
            native: AtomicPtr::new(std::ptr::null_mut()),
            topic_limits: RwLock::new(HashMap::new()),
            batch_limit_bytes,
            transactional,
            tokens: Tokens::of(config)?,
        };
        let producer: SinkProducer = identity::create(&cc, context)?;
        producer.context().native.store(producer.client().native_ptr(), Ordering::Release);
        let topics = Topics::new(config, batch_limit_bytes)?;
        let producer = Arc::new(producer);
        tokio::spawn(super::probe::probe_brokers(Arc::downgrade(&producer), config.dead_letter_topic.clone()));
        Ok(KafkaSink {
            producer,
            watermark,
            budget,
            max_in_flight_bytes: config.max_in_flight_bytes,
            max_record_bytes: config.max_record_bytes,
            topics,
            txn: None,
            lease: None,
        })
    }

    /// A sink whose records go out in Kafka transactions that commit with the checkpoint covering them
    /// (`exactly_once`, see docs/CONTRACT.md): the producer gets `transactional.id`, and its start fences
    /// any older producer with that id (an instance that lost its lease, a run that crashed), aborting the
    /// transaction that one left open. Its start, commits and aborts wait for Kafka until `deadline` at
    /// most (a stop sets it).
    ///
    /// # Errors
    /// Transient when the broker cannot be reached; definite for an invalid configuration (e.g. a
    /// `transaction.timeout.ms` above the broker's `transaction.max.timeout.ms`).
    pub async fn transactional(
        config: &KafkaConfig,
        watermark: Arc<Watermark>,
        settings: Transactional,
        deadline: &Deadline,
    ) -> Result<Self> {
        let timeout_ms = config.transaction_timeout_ms()?;
        let mut sink = KafkaSink::with(config, watermark, |cc| {
            // A record in a transaction cannot outlive it: librdkafka refuses a message timeout above the
            // transaction's. A record that times out fails the transaction, which is aborted as a whole.
            cc.set("transactional.id", &settings.id)
                .set("transaction.timeout.ms", timeout_ms.to_string())
                .set("message.timeout.ms", timeout_ms.to_string());
        })?;
        let (producer, deadline) = (sink.producer.clone(), deadline.clone());
        let timeout = Duration::from_millis(timeout_ms);
        let init = deadline.clone();
        tokio::task::spawn_blocking(move || init_within(&*producer, timeout, &init))
            .await
            .map_err(|e| Error::transient(format!("the producer's start failed: {e}")))?
            .map_err(|e| classify_kafka(&e).context("starting the transactional producer (init_transactions)"))?;
        let state = Transaction::Idle;
        sink.txn = Some(Transactions { target: settings, timeout, commit_attempt: timeout, deadline, state });
        Ok(sink)
    }

    /// Begins a Kafka transaction before the first record of one (transactional sinks only).
    fn begin(&mut self) -> Result<()> {
        let Some(txn) = &mut self.txn else { return Ok(()) };
        txn.state.step(|state| state.begin(&self.producer))
    }

    /// Makes [`KafkaSink::send`] refuse every record once `lease` is no longer provably held (the Kafka
    /// backend's active/standby: see [`crate::lease`]).
    pub fn publish_while(&mut self, lease: Holding) {
        self.lease = Some(lease);
    }

    /// Record bytes in the open Kafka transaction, while one is open and not committing (`None` without
    /// one, and for a sink that is not transactional).
    pub fn transaction_bytes(&self) -> Option<usize> {
        self.txn.as_ref().and_then(|t| t.state.open_bytes())
    }

    /// How long the open Kafka transaction has been open, while one is open and not committing.
    pub fn transaction_open_for(&self) -> Option<Duration> {
        self.txn.as_ref().and_then(|t| t.state.open_for())
    }

    /// Whether a commit is running ([`KafkaSink::start_commit`]).
    pub fn is_committing(&self) -> bool {
        self.txn.as_ref().is_some_and(|t| t.state.is_committing())
    }

    /// Whether a commit was started and has returned: [`KafkaSink::finish_commit`] would not wait.
    pub fn commit_has_returned(&self) -> bool {
        self.txn.as_ref().is_some_and(|t| t.state.has_returned())
    }

    /// Returns once the running commit returned (at once without one); cancel-safe. The run then calls
    /// [`KafkaSink::finish_commit`].
    pub async fn commit_returned(&mut self) {
        if let Some(txn) = &mut self.txn {
            txn.state.returned().await;
        }
    }

    /// Writes `checkpoint` (the checkpointer's JSON record), if any, into the open transaction (beginning
    /// one if none is open) and commits it: every record produced since the last commit becomes visible to
    /// `read_committed` consumers together with the checkpoint that covers them, or none does.
    ///
    /// # Errors
    /// As [`KafkaSink::finish_commit`].
    pub async fn commit(&mut self, checkpoint: Option<Vec<u8>>, on_commit: OnCommit) -> Result<()> {
        self.start_commit(checkpoint, on_commit).await?;
        self.finish_commit().await
    }

    /// [`KafkaSink::commit`] without waiting for the broker: the commit runs on a blocking thread while
    /// the run reads on. Records sent meanwhile are held, within the in-flight budget, and go into the
    /// next transaction when [`KafkaSink::finish_commit`] sees the commit return; `on_commit` is called
    /// then, if it committed. A commit still running is finished first.
    ///
    /// # Errors
    /// As [`KafkaSink::finish_commit`], for the commit before; transient when the checkpoint record is
    /// refused (the transaction is aborted).
    pub async fn start_commit(&mut self, checkpoint: Option<Vec<u8>>, on_commit: OnCommit) -> Result<()> {
        self.finish_commit().await?;
        let Some(txn) = &mut self.txn else {
            return Err(Error::definite(
                "a commit needs a transactional producer (delivery.guarantee = \"exactly_once\")",
            ));
        };
        let (producer, attempt, deadline) = (&self.producer, txn.commit_attempt, &txn.deadline);
        let target = &txn.target;
        let started =
            txn.state.step(|state| state.commit(producer, target, attempt, deadline, checkpoint.as_deref(), on_commit));
        if let Err(error) = started {
            self.abort_transaction().await;
            return Err(error);
        }
        Ok(())
    }

    /// Waits for the running commit, if any, to return. Committed: its `on_commit` is called, then the
    /// records held meanwhile go into the next transaction, in the order they were sent.
    ///
    /// # Errors
    /// Transient for a failed commit (the transaction is aborted and the held records dropped; the run
    /// restarts from the last committed checkpoint); transient too when a newer producer fenced this one
    /// (another instance took over).
    pub async fn finish_commit(&mut self) -> Result<()> {
        let Some(txn) = &mut self.txn else { return Ok(()) };
        txn.state.returned().await;
        let budget = &self.budget;
        let held = match txn.state.step(|state| state.finish(budget)) {
            Ok(held) => held,
            Err(error) => {
                self.abort_open().await;
                return Err(error);
            }
        };
        if !held.is_empty() {
            self.begin()?;
        }
        for held in held {
            self.enqueue(&held.record, held.in_flight).await?;
        }
        Ok(())
    }

    /// Aborts the open transaction, if any: none of its records becomes visible to `read_committed`
    /// consumers. Queued records are purged first. Without an open transaction it does nothing.
    pub async fn abort_transaction(&mut self) {
        if self.is_committing() {
            // librdkafka cannot abort while it commits: let the commit end. If it committed, its records
            // are visible and its checkpoint is recorded, and the records held meanwhile are in the next
            // transaction, aborted below; if not, it aborted already.
            if let Err(error) = self.finish_commit().await {
                tracing::debug!(%error, "the commit running when the transaction was aborted");
            }
        }
        self.abort_open().await;
    }

    /// Aborts the open transaction, if any (none is committing).
    async fn abort_open(&mut self) {
        let Some(txn) = &mut self.txn else { return };
        if !txn.state.step(Transaction::abort) {
            return;
        }
        self.producer.purge(PurgeConfig::default().queue().inflight());
        let (producer, timeout, deadline) = (self.producer.clone(), txn.timeout, txn.deadline.clone());
        let aborted = tokio::task::spawn_blocking(move || abort_within(&*producer, timeout, &deadline)).await;
        match aborted {
            Ok(Ok(())) => metrics().transaction_aborted(),
            // A fenced or fatal producer cannot abort; the broker aborts its transaction when the next
            // producer with the id starts, or at transaction.timeout.ms.
            Ok(Err(e)) => tracing::debug!(error = %e, "aborting the Kafka transaction"),
            Err(e) => tracing::debug!(error = %e, "aborting the Kafka transaction"),
        }
    }

    /// Whether `record` is within `kafka.max_record_bytes` and, once the sink knows it, its topic's
    /// `max.message.bytes`, with room for librdkafka's own per-record overhead (which it counts against
    /// `message.max.bytes` too).
    pub fn fits(&self, record: &KafkaRecord) -> bool {
        let limit = self.topic_limit(&record.topic).map_or(self.max_record_bytes, |l| l.min(self.max_record_bytes));
        record.size_bytes() + RECORD_OVERHEAD_BYTES <= limit
    }

    /// The largest record this sink produces.
    pub fn max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }

    /// Hands one record of transaction `tx` to the producer, waiting for in-flight budget first.
    /// `occurred_at_ms` feeds the end-to-end latency histogram.
    ///
    /// # Errors
    /// Definite when the topic is missing and may not be created, its `max.message.bytes` is below the
    /// producer's batches, or the record is refused for good; transient for broker unavailability during
    /// topic checks, and after an earlier record of this run failed (the first failure is returned).
    pub async fn send(&mut self, tx: TxId, record: &KafkaRecord, occurred_at_ms: Option<i64>) -> Result<()> {
        if self.lease.as_ref().is_some_and(|l| !l.is_held()) {
            return Err(Error::lease_lost(
                "the lease is no longer provably held (its renewal is overdue): stopped handing records to the \
                 producer; waiting as a standby",
            ));
        }
        self.topics.ensure(&self.producer, &record.topic).await?;
        if !self.fits(record) {
            // Only the first record of a topic gets here: later ones met the topic's limit in `fits`. It is
            // refused before it is produced; the restart dead-letters it.
            let id = record.headers.iter().find(|(k, _)| k == "id").map(|(_, v)| String::from_utf8_lossy(v));
            let message = format!(
                "the record of {} bytes is over topic {}'s max.message.bytes ({})",
                record.size_bytes(),
                record.topic,
                describe_limit(self.topic_limit(&record.topic))
            );
            return Err(match id {
                Some(id) if record.topic != self.topics.dead_letter_topic() => {
                    Error::refused_record(id.into_owned(), message)
                }
                _ => Error::definite(message),
            });
        }
        let permits = (record.size_bytes() + IN_FLIGHT_OVERHEAD_BYTES).min(self.max_in_flight_bytes) as u32;
        if self.is_committing() {
            // A record is held only within the budget; past it, the commit must return first (its
            // records are acknowledged by then, so the budget is free for the held ones).
            if self.commit_has_returned() || self.budget.available_permits() < permits as usize {
                self.finish_commit().await?;
            }
        }
        self.acquire_budget(permits).await;
        if self.context().failed.load(Ordering::Acquire) {
            self.budget.add_permits(permits as usize);
            return Err(self.failure());
        }
        self.watermark.add_record(tx);
        metrics().event_produced(&record.topic, permits as usize);
        let in_flight =
            Box::new(InFlight { tx: Some(tx), permits, record_bytes: record.size_bytes() as u32, occurred_at_ms });
        let in_flight = match &mut self.txn {
            Some(txn) => match txn.state.hold(record, in_flight) {
                Some(in_flight) => in_flight,
                None => return Ok(()),
            },
            None => in_flight,
        };
        self.begin()?;
        self.enqueue(record, in_flight).await
    }

    /// Hands `record`, registered with the watermark and holding its budget, to librdkafka.
    async fn enqueue(&mut self, record: &KafkaRecord, in_flight: Box<InFlight>) -> Result<()> {
        let permits = in_flight.permits;
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header { key, value: Some(value) });
        }
        let mut pending = BaseRecord::with_opaque_to(&record.topic, in_flight)
            .key(&record.key)
            .payload(&record.value)
            .headers(headers);
        if record.tombstone {
            pending.payload = None;
        }
        pending.timestamp = record.timestamp_ms;
        loop {
            match self.producer.send(pending) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    pending = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((error, _)) => {
                    metrics().record_settled(permits as usize);
                    self.budget.add_permits(permits as usize);
                    if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                        return Err(self.fatal_failure().await);
                    }
                    let error = classify_kafka(&error).context(format_args!(
                        "producing to {} (key {})",
                        record.topic,
                        String::from_utf8_lossy(&record.key)
                    ));
                    self.watermark.fail(Error::transient(error.to_string()));
                    return Err(error);
                }
            }
        }
        if let Some(txn) = &mut self.txn {
            txn.state.add(record.size_bytes());
        }
        // A delivery that failed while this record was being enqueued purged the queue before it was in:
        // purge again, so that it cannot follow the failed one.
        if self.context().failed.load(Ordering::Acquire) {
            self.context().purge_queue();
        }
        Ok(())
    }

    /// Notified (once) at the first failed delivery of this sink: the pipeline then ends the run at once,
    /// instead of at its next source change.
    pub fn failure_notice(&self) -> Arc<Notify> {
        self.context().failure_notice.clone()
    }

    fn context(&self) -> &SinkContext {
        self.producer.context()
    }

    /// `max.message.bytes` of `topic`, when the broker told us.
    fn topic_limit(&self, topic: &str) -> Option<usize> {
        self.context().topic_limit(topic)
    }

    /// Waits for `permits` of in-flight budget, saying every [`STALL_REPORT_EVERY`] that it still waits:
    /// records never time out, so a broker outage shows here (and in `outbox_cdc_ready`), not as errors.
    async fn acquire_budget(&self, permits: u32) {
        if let Ok(p) = self.budget.try_acquire_many(permits) {
            p.forget();
            return;
        }
        let since = Instant::now();
        loop {
            match tokio::time::timeout(STALL_REPORT_EVERY, self.budget.acquire_many(permits)).await {
                Ok(p) => {
                    p.expect("the budget semaphore is never closed").forget();
                    if since.elapsed() >= STALL_REPORT_EVERY {
                        tracing::info!(waited_s = since.elapsed().as_secs(), "Kafka is acknowledging again");
                    }
                    return;
                }
                Err(_) => tracing::warn!(
                    waited_s = since.elapsed().as_secs(),
                    unacknowledged = self.watermark.unsettled(),
                    "waiting for Kafka: kafka.max_in_flight_bytes of records are unacknowledged (broker down or \
                     slow; see outbox_cdc_ready and librdkafka's messages). Records never time out; nothing \
                     unacknowledged is checkpointed"
                ),
            }
        }
    }

    /// The first failure of this run, for a record that is not enqueued because of it.
    fn failure(&self) -> Error {
        self.watermark.take_failure().unwrap_or_else(|| {
            Error::transient("an earlier record of this run was not delivered; restarting from the checkpoint")
        })
    }

    /// The failure to report when librdkafka refused a record because the producer failed fatally: the
    /// failed delivery that made it fatal (which may be a refused record to dead-letter), once its report
    /// arrives, else the fatal error itself.
    async fn fatal_failure(&self) -> Error {
        let deadline = Instant::now() + FATAL_CAUSE_WAIT;
        while !self.context().failed.load(Ordering::Acquire) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let fatal = match self.producer.client().fatal_error() {
            Some((code, reason)) if self.txn.is_some() && is_fenced_code(code) => {
                crate::error::fenced_transaction(format_args!("the Kafka producer stopped ({code:?}: {reason})"))
            }
            Some((code, reason)) => Error::producer_fatal(format!(
                "the Kafka producer failed fatally ({code:?}: {reason}); the run restarts from the checkpoint \
                 with a new producer"
            )),
            None => Error::producer_fatal("the Kafka producer failed fatally; the run restarts with a new producer"),
        };
        self.watermark.take_failure().unwrap_or(fatal)
    }

    /// Waits until every record handed to the producer is acknowledged (or failed), up to `timeout`.
    /// Returns whether everything settled.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.watermark.unsettled() == 0 {
                return true;
            }
            if self.watermark.failed() || Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Drops every queued and in-flight record without waiting (after a failure): they were never
    /// acknowledged, so the watermark never counts them, and they are produced again after the restart.
    pub fn abort(&self) {
        self.producer.purge(PurgeConfig::default().queue().inflight());
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    use rdkafka::{Offset, TopicPartitionList};

    use super::*;
    use crate::error::Kind;
    use crate::sink::CheckpointRecord;

    const TOPIC: &str = "outbox.event.order";

    /// Regression guard for the build: the SASL mechanisms and codecs the README promises are in the
    /// librdkafka this binary links. A change of the rdkafka features (or of the system libraries its
    /// build finds) that drops one fails here, not at a user's first connection to a managed cluster.
    #[test]
    fn librdkafka_has_the_promised_features() {
        let features = ClientConfig::new().create_native_config().unwrap().get("builtin.features").unwrap();
        let features: Vec<&str> = features.split(',').collect();
        for (feature, why) in [
            ("ssl", "TLS: security.protocol = ssl / sasl_ssl"),
            ("sasl_plain", "SASL/PLAIN (Confluent Cloud API keys, Azure Event Hubs)"),
            ("sasl_scram", "SASL/SCRAM-SHA-256 and -512 (MSK, Aiven, Redpanda)"),
            ("sasl_oauthbearer", "SASL/OAUTHBEARER"),
            ("oidc", "sasl.oauthbearer.method = oidc: librdkafka fetches tokens itself (libcurl)"),
            ("sasl_gssapi", "SASL/GSSAPI: Kerberos (libsasl2)"),
            ("zstd", "kafka.compression = zstd"),
            ("lz4", "kafka.compression = lz4, the default"),
            ("snappy", "kafka.compression = snappy"),
            ("gzip", "kafka.compression = gzip"),
        ] {
            assert!(features.contains(&feature), "librdkafka lacks {feature} ({why}); it has {features:?}");
        }
    }

    /// Every client is configured through [`client_config`]: a secret from `properties_file` and one from
    /// `properties_env` reach the producer's, the admin client's and the consumers' configuration.
    #[test]
    fn secrets_from_files_and_the_environment_reach_the_client() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client-secret");
        std::fs::write(&file, "oidc-secret\n").unwrap();
        let mut config = kafka_config("127.0.0.1:9", "\"sasl.mechanism\" = \"OAUTHBEARER\"");
        config.properties_file.insert("sasl.oauthbearer.client.secret".into(), file.clone());
        config.properties_env.insert("sasl.username".into(), "PATH".into());
        let (producer, _) = producer_config(&config).unwrap();
        for cc in [client_config(&config).unwrap(), producer] {
            assert_eq!(cc.get("sasl.oauthbearer.client.secret"), Some("oidc-secret"));
            assert_eq!(cc.get("sasl.username"), std::env::var("PATH").ok().as_deref());
            assert_eq!(cc.get("sasl.mechanism"), Some("OAUTHBEARER"));
        }
        std::fs::remove_file(&file).unwrap();
        let error = client_config(&config).unwrap_err();
        assert!(error.is_definite() && error.to_string().contains("client-secret"), "{error}");
    }

    fn kafka_config(bootstrap: &str, properties: &str) -> KafkaConfig {
        let text = format!(
            "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"s.t\"\n[kafka]\n\
             bootstrap_servers = \"{bootstrap}\"\ncreate_topics = false\n[kafka.properties]\n{properties}\n"
        );
        crate::config::Config::parse(&text).unwrap().kafka
    }

    fn record(id: &str, value_bytes: usize) -> KafkaRecord {
        KafkaRecord {
            topic: TOPIC.into(),
            key: "A".into(),
            value: vec![b'x'; value_bytes],
            headers: vec![("id".into(), id.as_bytes().to_vec())],
            ..KafkaRecord::default()
        }
    }

    /// A mock cluster with [`TOPIC`] on one partition.
    fn cluster() -> MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic(TOPIC, 1, 1).unwrap();
        cluster
    }

    /// Waits until every record sent so far came back (acknowledged or failed): all budget is returned.
    async fn settled(sink: &KafkaSink) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while sink.budget.available_permits() < sink.max_in_flight_bytes {
            assert!(Instant::now() < deadline, "{} records never came back", sink.watermark.unsettled());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The `id` headers of the partition, in offset order.
    fn read_ids(bootstrap: &str) -> Vec<String> {
        use rdkafka::message::Headers;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "test")
            .set("enable.partition.eof", "true")
            .create()
            .unwrap();
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(TOPIC, 0, Offset::Beginning).unwrap();
        consumer.assign(&assignment).unwrap();
        let mut ids = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    let id = m.headers().and_then(|h| h.iter().find(|h| h.key == "id").and_then(|h| h.value));
                    ids.push(String::from_utf8_lossy(id.unwrap_or_default()).into_owned());
                }
                Some(Err(KafkaError::PartitionEOF(_))) => return ids,
                Some(Err(e)) => panic!("reading {TOPIC}: {e}"),
                None => {}
            }
        }
        panic!("no end of partition within 30 s; read {ids:?}")
    }

    /// Guards against the order hole of a failed delivery: librdkafka's idempotent producer failed the
    /// batch that failed for good and went on with the records behind it (a bumped epoch), so a partition
    /// held A2..A10 before the restart wrote A1..A10 again: A2, A1, A2. The mock cluster fails A1's produce
    /// request for good; A2..A10 are handed to the sink after that failure came back, as the pipeline does
    /// until it notices it. After the "restart" (a new sink re-sending the transaction, as the pipeline does
    /// from the checkpoint) every record's first occurrence must be in order.
    ///
    /// Records already built into a request when A1's failed are not covered here: a real broker refuses
    /// them by their sequence numbers (OUT_OF_ORDER_SEQUENCE_NUMBER), but the mock cluster checks sequence
    /// numbers of transactional producers only, and would write them.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_failed_delivery_lets_no_later_record_of_its_partition_through() {
        let cluster = cluster();
        let bootstrap = cluster.bootstrap_servers();
        let config = kafka_config(&bootstrap, "");
        let ids: Vec<String> = (1..=10).map(|i| format!("A{i}")).collect();
        cluster.request_errors(RDKafkaApiKey::Produce, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN]);

        let watermark = Arc::new(Watermark::new(None));
        let mut sink = KafkaSink::new(&config, watermark.clone()).unwrap();
        let tx = watermark.open();
        sink.send(tx, &record(&ids[0], 100), None).await.unwrap();
        settled(&sink).await;
        let mut failure = None;
        for id in &ids[1..] {
            if let Err(e) = sink.send(tx, &record(id, 100), None).await {
                failure = Some(e);
                break;
            }
        }
        settled(&sink).await;
        drop(sink);
        let failure = failure.or_else(|| watermark.take_failure()).expect("A1 failed");
        assert!(!failure.is_definite(), "{failure}");

        // The restart: a new producer re-sends the transaction, which was never acknowledged as a whole.
        let watermark = Arc::new(Watermark::new(None));
        let mut sink = KafkaSink::new(&config, watermark.clone()).unwrap();
        let tx = watermark.open();
        for id in &ids {
            sink.send(tx, &record(id, 100), None).await.unwrap();
        }
        settled(&sink).await;
        assert!(watermark.take_failure().is_none());

        let partition = read_ids(&bootstrap);
        let mut first_seen: Vec<&str> = Vec::new();
        for id in &partition {
            if !first_seen.contains(&id.as_str()) {
                first_seen.push(id);
            }
        }
        assert_eq!(first_seen, ids, "first occurrences out of order; the partition holds {partition:?}");
    }

    /// Guards against exit 2 on a fatal idempotent-producer error: after OUT_OF_ORDER_SEQUENCE_NUMBER at the
    /// head of the line, librdkafka refuses every later record with ERR__FATAL, which was classified as
    /// definite. It must be transient and marked, so that the run restarts with a new producer.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_fatal_producer_error_restarts_the_run_instead_of_stopping() {
        let cluster = cluster();
        let config = kafka_config(&cluster.bootstrap_servers(), "");
        cluster
            .request_errors(RDKafkaApiKey::Produce, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER]);
        let watermark = Arc::new(Watermark::new(None));
        let mut sink = KafkaSink::new(&config, watermark.clone()).unwrap();
        let tx = watermark.open();
        sink.send(tx, &record("A1", 100), None).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while sink.producer.client().fatal_error().is_none() {
            assert!(Instant::now() < deadline, "the producer never failed fatally");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let error = sink.send(tx, &record("A2", 100), None).await.unwrap_err();
        assert!(!error.is_definite() && error.kind() == &Kind::ProducerFatal, "{error}");
    }

    /// Guards against quarantining an innocent aggregate: the broker refused a *batch* of small records as
    /// too large, and the first record of it was taken for poison. No record is blamed; the error is a
    /// definite configuration error that names the limits.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_refused_as_too_large_blames_no_record() {
        let cluster = cluster();
        let config = kafka_config(&cluster.bootstrap_servers(), "\"linger.ms\" = \"200\"");
        cluster.request_errors(RDKafkaApiKey::Produce, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE]);
        let watermark = Arc::new(Watermark::new(None));
        let mut sink = KafkaSink::new(&config, watermark.clone()).unwrap();
        let tx = watermark.open();
        for i in 1..=5 {
            let _ = sink.send(tx, &record(&format!("A{i}"), 100), None).await;
        }
        settled(&sink).await;
        let error = watermark.take_failure().expect("the batch was refused");
        assert_eq!(error.kind(), &Kind::Other, "a record was blamed: {error}");
        assert!(error.is_definite() && error.to_string().contains("max.message.bytes"), "{error}");
    }

    /// The other side of the size rule: a record over the batch limit was alone in its request, so a size
    /// refusal is its own, and it is dead-lettered (the topic's limit being unknown on the mock cluster).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_record_refused_alone_as_too_large_is_poison() {
        let cluster = cluster();
        let config = kafka_config(&cluster.bootstrap_servers(), "\"batch.size\" = \"2000\"");
        cluster.request_errors(RDKafkaApiKey::Produce, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE]);
        let watermark = Arc::new(Watermark::new(None));
        let mut sink = KafkaSink::new(&config, watermark.clone()).unwrap();
        let tx = watermark.open();
        sink.send(tx, &record("big", 5_000), None).await.unwrap();
        settled(&sink).await;
        let error = watermark.take_failure().expect("the record was refused");
        assert!(matches!(error.kind(), Kind::RecordRefused(r) if r.id == "big"), "{error}");
    }

    /// A transactional sink on the mock cluster (which runs the transaction protocol, though it does not
    /// hide aborted records) whose commits take at least `round_trip` on the broker.
    async fn transactional_sink(
        cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        round_trip: Duration,
    ) -> (KafkaSink, Arc<Watermark>) {
        cluster.create_topic("state", 1, 1).unwrap();
        let config = kafka_config(&cluster.bootstrap_servers(), "");
        let settings = Transactional {
            id: "t".into(),
            checkpoint: Some(CheckpointRecord { topic: "state".into(), key: "c/checkpoint".into() }),
        };
        let watermark = Arc::new(Watermark::new(None));
        let sink = KafkaSink::transactional(&config, watermark.clone(), settings, &Deadline::default()).await.unwrap();
        cluster.broker_round_trip_time(1, round_trip).unwrap();
        (sink, watermark)
    }

    fn held(sink: &KafkaSink) -> usize {
        match &sink.txn.as_ref().unwrap().state {
            Transaction::Committing(committing) => committing.held(),
            _ => 0,
        }
    }

    /// Keeping the pipeline busy while Kafka commits must not cost order or completeness: records sent
    /// while a commit runs are held, and go into the next transaction in the order they were sent, after
    /// the commit's checkpoint counts as saved.
    #[tokio::test(flavor = "multi_thread")]
    async fn records_sent_while_a_commit_runs_go_into_the_next_transaction_in_order() {
        let cluster = cluster();
        let (mut sink, watermark) = transactional_sink(&cluster, Duration::from_millis(300)).await;
        let ids: Vec<String> = (1..=10).map(|i| format!("A{i}")).collect();
        let tx = watermark.open();
        for id in &ids[..5] {
            sink.send(tx, &record(id, 100), None).await.unwrap();
        }
        let committed = Arc::new(AtomicBool::new(false));
        let on_commit = committed.clone();
        sink.start_commit(Some(b"{}".to_vec()), Box::new(move |_| on_commit.store(true, Ordering::Release)))
            .await
            .unwrap();
        for id in &ids[5..] {
            sink.send(tx, &record(id, 100), None).await.unwrap();
        }
        assert_eq!(held(&sink), 5, "sent during a commit of at least 300 ms");
        assert!(!committed.load(Ordering::Acquire), "the commit cannot have returned yet");

        sink.commit_returned().await;
        sink.finish_commit().await.unwrap();
        assert!(committed.load(Ordering::Acquire), "committed: its checkpoint counts as saved");
        assert_eq!(held(&sink), 0);
        assert!(sink.transaction_bytes().is_some(), "the held records are in the next transaction");
        sink.commit(Some(b"{}".to_vec()), Box::new(|_| {})).await.unwrap();
        settled(&sink).await;
        assert!(watermark.take_failure().is_none());
        assert_eq!(read_ids(&cluster.bootstrap_servers()), ids);
    }

    /// A commit that fails takes the records held meanwhile with it: none is produced, none counts as
    /// delivered, their budget is returned, and the run gets a transient error (it restarts from the last
    /// commit, where they are read again).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_failed_commit_drops_the_records_held_meanwhile() {
        let cluster = cluster();
        let (mut sink, watermark) = transactional_sink(&cluster, Duration::from_millis(300)).await;
        cluster.request_errors(RDKafkaApiKey::EndTxn, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED]);
        let tx = watermark.open();
        sink.send(tx, &record("A1", 100), None).await.unwrap();
        let committed = Arc::new(AtomicBool::new(false));
        let on_commit = committed.clone();
        sink.start_commit(Some(b"{}".to_vec()), Box::new(move |_| on_commit.store(true, Ordering::Release)))
            .await
            .unwrap();
        sink.send(tx, &record("A2", 100), None).await.unwrap();
        assert_eq!(held(&sink), 1);

        let error = sink.finish_commit().await.unwrap_err();
        assert!(!error.is_definite() && error.kind() == &Kind::ProducerFenced, "{error}");
        assert!(!committed.load(Ordering::Acquire), "nothing of a failed commit counts as saved");
        assert_eq!(held(&sink), 0);
        settled(&sink).await;
        assert_eq!(watermark.unsettled(), 1, "A2 was never produced, so never acknowledged");
    }

    /// A `transaction.timeout.ms` above the broker's `transaction.max.timeout.ms` can never start: a definite
    /// error naming the setting, not a transient one retried for ever.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_transaction_timeout_the_broker_refuses_is_definite() {
        let cluster = cluster();
        cluster.create_topic("state", 1, 1).unwrap();
        cluster.request_errors(
            RDKafkaApiKey::InitProducerId,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_TRANSACTION_TIMEOUT],
        );
        let config = kafka_config(&cluster.bootstrap_servers(), "");
        let settings = Transactional {
            id: "t".into(),
            checkpoint: Some(CheckpointRecord { topic: "state".into(), key: "c/checkpoint".into() }),
        };
        let Err(error) =
            KafkaSink::transactional(&config, Arc::new(Watermark::new(None)), settings, &Deadline::default()).await
        else {
            panic!("the producer started")
        };
        assert!(error.is_definite() && error.to_string().contains("transaction.max.timeout.ms"), "{error}");
    }

    /// A transactional producer fenced while records are in flight (another instance started, or the
    /// broker aborted a transaction open past `transaction.timeout.ms`) is a transient error that does not
    /// count as a producer fault: five in a row used to stop the connector blaming lost partitions.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_fenced_transactional_producer_is_not_a_producer_fault() {
        let cluster = cluster();
        let (mut sink, watermark) = transactional_sink(&cluster, Duration::ZERO).await;
        cluster.request_errors(RDKafkaApiKey::Produce, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED]);
        let tx = watermark.open();
        let sent = sink.send(tx, &record("A1", 100), None).await;
        settled(&sink).await;
        let error = sent.err().or_else(|| watermark.take_failure()).expect("the delivery failed");
        assert!(!error.is_definite() && error.kind() == &Kind::ProducerFenced, "{error}");
    }

    /// A commit that times out is still running in librdkafka and may commit: it is asked again until its
    /// outcome is known, never taken for an abort (the run would restart from the previous checkpoint and
    /// publish the transaction's records a second time once it commits).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_commit_that_times_out_is_retried_until_it_commits() {
        let cluster = cluster();
        let (mut sink, watermark) = transactional_sink(&cluster, Duration::from_millis(400)).await;
        // Each call gives up long before the broker's answer comes: only the retries get it.
        sink.txn.as_mut().unwrap().commit_attempt = Duration::from_millis(50);
        let tx = watermark.open();
        sink.send(tx, &record("A1", 100), None).await.unwrap();
        let committed = Arc::new(AtomicBool::new(false));
        let on_commit = committed.clone();
        sink.commit(Some(b"{}".to_vec()), Box::new(move |_| on_commit.store(true, Ordering::Release))).await.unwrap();
        assert!(committed.load(Ordering::Acquire), "committed after the retries: its checkpoint counts as saved");
        settled(&sink).await;
        assert!(watermark.take_failure().is_none());
        assert_eq!(read_ids(&cluster.bootstrap_servers()), ["A1"]);
    }

    /// Guards against a stop that waits for ever for a commit while Kafka is unreachable (issue 46, finding
    /// 6). Once the stop's deadline passes the commit is left unknown: not counted as committed (its
    /// checkpoint is not saved), not aborted, nothing more produced; the sink drops without waiting.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_commit_left_unknown_at_a_stop_is_neither_committed_nor_aborted() {
        let cluster = cluster();
        let (mut sink, watermark) = transactional_sink(&cluster, Duration::ZERO).await;
        sink.txn.as_mut().unwrap().commit_attempt = Duration::from_millis(100);
        let tx = watermark.open();
        sink.send(tx, &record("A1", 100), None).await.unwrap();
        cluster.broker_down(1).unwrap();
        let committed = Arc::new(AtomicBool::new(false));
        let on_commit = committed.clone();
        sink.start_commit(Some(b"{}".to_vec()), Box::new(move |_| on_commit.store(true, Ordering::Release)))
            .await
            .unwrap();
        sink.txn.as_ref().unwrap().deadline.set(Instant::now() + Duration::from_millis(500));
        let error = sink.finish_commit().await.unwrap_err();
        assert!(!error.is_definite() && error.kind() == &Kind::CommitUnknown, "{error}");
        assert!(!committed.load(Ordering::Acquire), "an unknown outcome is not a commit");
        assert!(matches!(sink.txn.as_ref().unwrap().state, Transaction::Unresolved), "left to the next start");
        let refused = sink.send(tx, &record("A2", 100), None).await.expect_err("nothing more goes into the producer");
        assert_eq!(refused.kind(), &Kind::CommitUnknown, "{refused}");
        drop(sink);
    }
}
