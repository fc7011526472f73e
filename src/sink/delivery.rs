//! The delivery callback: the only code that mints a [`Delivered`] proof, and the one that turns a failed
//! delivery into the run's error (a size refusal blamed on a record or on the batch, a refused record, a
//! fenced transactional producer).
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3; the watermark takes the sink's delivery proof, the one seam.
//!
//! # Invariants
//! - Every record handed to librdkafka carries an [`InFlight`] naming its source transaction and its share
//!   of the in-flight budget; its callback returns the budget, and either settles the record with a
//!   [`Delivered`] proof or records a failure that freezes the watermark.
//! - The first failed delivery purges the queue at once ([`SinkContext::fail`]): no later record of the
//!   failed one's partition is sent in this run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, RwLock};

use rdkafka::client::OAuthToken;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::types::{RDKafka, RDKafkaErrorCode};
use rdkafka::ClientContext;
use tokio::sync::{Notify, Semaphore};

use super::limits::{blame_size_refusal, describe_limit, required_topic_limit, SizeBlame};
use super::Delivered;
use crate::checkpoint::{TxId, Watermark};
use crate::error::{classify_kafka, is_fenced_code, is_record_refusal, is_size_refusal, Error};
use crate::health::health;
use crate::kafka::identity::{Tokened, Tokens};
use crate::metrics::metrics;

/// The sink's producer: its callbacks are [`SinkContext`]'s.
pub(super) type SinkProducer = ThreadedProducer<SinkContext>;

/// What travels with each record through librdkafka and back to the delivery callback.
pub(super) struct InFlight {
    /// The source transaction of an event; `None` for the checkpoint record of a Kafka transaction.
    pub(super) tx: Option<TxId>,
    pub(super) permits: u32,
    /// The record's bytes as [`KafkaRecord::size_bytes`] counts them, to judge a size refusal.
    pub(super) record_bytes: u32,
    /// The row's `occurred_at` (Unix ms, read as UTC) for the end-to-end latency histogram.
    pub(super) occurred_at_ms: Option<i64>,
}

/// Delivery callbacks: the only place where [`Delivered`] proofs are made.
pub(super) struct SinkContext {
    pub(super) watermark: Arc<Watermark>,
    pub(super) budget: Arc<Semaphore>,
    /// Set by the first failed delivery and never cleared: from then on nothing more is enqueued.
    pub(super) failed: AtomicBool,
    /// Wakes the pipeline at the first failed delivery, also while its source is idle.
    pub(super) failure_notice: Arc<Notify>,
    /// The producer's librdkafka handle, set once right after it is created; only for
    /// [`SinkContext::purge_queue`].
    pub(super) native: AtomicPtr<RDKafka>,
    /// `max.message.bytes` of each topic in use (`None`: the broker did not say), to judge size refusals.
    pub(super) topic_limits: RwLock<HashMap<String, Option<usize>>>,
    /// The largest batch of several records the producer builds (`min(batch.size, message.max.bytes)`).
    pub(super) batch_limit_bytes: usize,
    /// Whether the producer is transactional: a fenced epoch is then a takeover or a transaction the broker
    /// timed out ([`crate::error::fenced_transaction`]), not a producer fault.
    pub(super) transactional: bool,
    /// The producer's OAUTHBEARER tokens (`kafka.auth = "aws_iam"`).
    pub(super) tokens: Tokens,
}

impl Tokened for SinkContext {
    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

impl SinkContext {
    /// Drops every record still queued (not yet in a request), without waiting: their delivery reports
    /// come back as purged. Records already in flight keep their outcome: the broker's sequence check
    /// refuses any of them that would follow a failed one of its partition.
    pub(super) fn purge_queue(&self) {
        let native = self.native.load(Ordering::Acquire);
        if native.is_null() {
            return;
        }
        let flags = rdkafka::bindings::RD_KAFKA_PURGE_F_QUEUE | rdkafka::bindings::RD_KAFKA_PURGE_F_NON_BLOCKING;
        // SAFETY: `native` is the handle of the producer whose callbacks call this and which outlives them
        // (librdkafka calls back only from its own polling thread, which the producer joins before it is
        // destroyed). rd_kafka_purge may be called from any thread, holds no lock our caller holds, and
        // with NON_BLOCKING does not wait for the broker threads.
        unsafe {
            rdkafka::bindings::rd_kafka_purge(native, flags);
        }
    }

    /// `max.message.bytes` of `topic`, when the broker told us.
    pub(super) fn topic_limit(&self, topic: &str) -> Option<usize> {
        self.topic_limits.read().unwrap_or_else(|p| p.into_inner()).get(topic).copied().flatten()
    }

    /// The code of the producer's fatal error, once it has one (its deliveries then fail with `_FATAL`).
    fn fatal_cause(&self) -> Option<RDKafkaErrorCode> {
        let native = self.native.load(Ordering::Acquire);
        if native.is_null() {
            return None;
        }
        // SAFETY: as in `purge_queue`; rd_kafka_fatal_error may be called from any thread, and a null
        // buffer of size 0 asks for the code only.
        let code = unsafe { rdkafka::bindings::rd_kafka_fatal_error(native, std::ptr::null_mut(), 0) };
        (code != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| code.into())
    }

    /// Records a failed delivery: the first one freezes the watermark, stops the sink and purges the queue,
    /// so that no later record of the failed one's partition is sent in this run.
    fn fail(&self, error: Error) {
        self.watermark.fail(error);
        if !self.failed.swap(true, Ordering::AcqRel) {
            self.purge_queue();
            self.failure_notice.notify_one();
        }
    }
}

impl ClientContext for SinkContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.tokens.generate()
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", fac, "{log_message}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", fac, "{log_message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{log_message}"),
            L::Debug => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Broker-down and similar conditions arrive here while librdkafka keeps retrying: informational
        // unless fatal, which the delivery callbacks and `send` report as failures.
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown) => health().set_broker_connected(false),
            // The producer's fatal error comes with its cause's code (e.g. GaplessGuarantee).
            Some(code) if code == RDKafkaErrorCode::GaplessGuarantee || crate::error::is_producer_fatal(code) => {
                tracing::error!(target: "librdkafka", %error, "{reason}: the producer stopped; the run restarts from the checkpoint with a new one");
                return;
            }
            _ => {}
        }
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        // Bootstrap entries (nodeid -1) are not cluster members.
        let brokers = statistics.brokers.values().filter(|b| b.nodeid >= 0);
        metrics().produce_retries_total(brokers.map(|b| b.txretries).sum());
    }
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = Box<InFlight>;

    fn delivery(&self, result: &DeliveryResult<'_>, in_flight: Box<InFlight>) {
        let m = metrics();
        m.record_settled(in_flight.permits as usize);
        match result {
            Ok(message) => {
                let Some(tx) = in_flight.tx else {
                    self.budget.add_permits(in_flight.permits as usize);
                    return;
                };
                self.watermark.settle(Delivered::new(tx));
                // Only the latency histogram needs it (by aggregate type), and only streamed rows have one.
                let aggregate_type = match in_flight.occurred_at_ms {
                    Some(_) => aggregate_type(message).unwrap_or(""),
                    None => "",
                };
                m.event_acknowledged(message.topic(), message.partition(), aggregate_type, in_flight.occurred_at_ms);
            }
            Err((error, message)) => {
                let code = error.rdkafka_error_code();
                m.produce_error(&code.map_or_else(|| "Unknown".to_string(), |c| format!("{c:?}")));
                let topic = message.topic();
                let error = match code {
                    Some(c)
                        if self.transactional
                            && (is_fenced_code(c) || self.fatal_cause().is_some_and(is_fenced_code)) =>
                    {
                        crate::error::fenced_transaction(format_args!("delivery to topic {topic} failed ({error})"))
                    }
                    Some(c) if is_size_refusal(c) => self.size_refusal(error, message, in_flight.record_bytes),
                    Some(c) if is_record_refusal(c) => match header(message, "id") {
                        Some(id) => Error::refused_record(id.to_string(), format!("{error} (topic {topic})")),
                        None => classify_kafka(error),
                    },
                    _ => classify_kafka(error).context(format_args!(
                        "delivery to topic {topic} failed (the watermark stops before this record)"
                    )),
                };
                self.fail(error);
            }
        }
        self.budget.add_permits(in_flight.permits as usize);
    }
}

impl SinkContext {
    /// The broker refused the batch that held `message` as too large: the record's fault only if it alone
    /// is over the limit, a configuration error otherwise.
    fn size_refusal(&self, error: &KafkaError, message: &rdkafka::message::BorrowedMessage<'_>, bytes: u32) -> Error {
        let topic = message.topic();
        let limit = self.topic_limit(topic);
        match (blame_size_refusal(bytes as usize, limit, self.batch_limit_bytes), header(message, "id")) {
            (SizeBlame::Record, Some(id)) => Error::refused_record(
                id.to_string(),
                format!(
                    "{error}: the record alone ({bytes} bytes) is over topic {topic}'s max.message.bytes ({})",
                    describe_limit(limit)
                ),
            ),
            _ => Error::definite(format!(
                "Kafka refused a batch of records for topic {topic} as too large ({error}); no single record is \
                 at fault. The topic's max.message.bytes ({}) is below the producer's batches of up to {} bytes \
                 (min of kafka.properties.\"batch.size\" and kafka.max_record_bytes). Raise the topic's \
                 max.message.bytes to at least {}, or set kafka.properties.\"batch.size\" below it; nothing \
                 was quarantined and the checkpoint is before this batch",
                describe_limit(limit),
                self.batch_limit_bytes,
                required_topic_limit(self.batch_limit_bytes),
            )),
        }
    }
}

/// The `aggregate_type` header's value: looked up where the router puts it first (a linear search by name
/// costs a fifth of the delivery callbacks' time at 100k records/s).
fn aggregate_type<'a>(message: &'a rdkafka::message::BorrowedMessage<'_>) -> Option<&'a str> {
    use rdkafka::message::Headers;
    match message.headers()?.try_get(crate::router::AGGREGATE_TYPE_HEADER_INDEX) {
        Some(h) if h.key == "aggregate_type" => h.value.and_then(|v| std::str::from_utf8(v).ok()),
        _ => header(message, "aggregate_type"),
    }
}

/// A header's value as text.
fn header<'a>(message: &'a rdkafka::message::BorrowedMessage<'_>, name: &str) -> Option<&'a str> {
    use rdkafka::message::Headers;
    message.headers()?.iter().find(|h| h.key == name).and_then(|h| std::str::from_utf8(h.value?).ok())
}
