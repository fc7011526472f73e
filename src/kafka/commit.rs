//! Waiting for the outcome of a Kafka transaction (its commit, its abort, the producer's start) for as long
//! as the process is not stopping.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! # Invariants
//! - A commit that times out has an outcome nobody knows yet: librdkafka keeps committing in the
//!   background, refuses an abort meanwhile, and requires the call to be repeated until it succeeds or
//!   fails for good. Taking a timeout for a failure would make the caller redo the work (restart the run
//!   from the previous checkpoint, write a release again) while the transaction may still commit: its
//!   records would then be published twice. So [`until_known`] asks again, and returns a failure only when
//!   librdkafka says it is one.
//! - While Kafka is unreachable no outcome ever comes, and a graceful stop must end all the same. Every
//!   wait here ends at the [`Deadline`] a stop sets, leaving the outcome unknown ([`Outcome::Unknown`]):
//!   nothing is then counted as committed, and nothing is aborted or redone.
//!
//! # Why an unknown outcome loses nothing
//! The next start of a producer with the same `transactional.id` (`init_transactions`) makes the broker
//! finish the transaction before it answers: a commit whose `EndTxn` reached it completes, any other is
//! aborted. The state is read after that fence (`KafkaStore::open` fences the event producer's id too), so
//! the next run resumes from whichever checkpoint the outcome left: the new one with its records visible,
//! or the previous one with the records aborted and read again.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;

/// The longest one call to librdkafka waits here: a stop that sets the [`Deadline`] during a call is
/// noticed within this.
const CALL: Duration = Duration::from_secs(1);

/// When the waits for Kafka's outcomes give up: never, until a stop sets an instant ([`Deadline::set`]).
/// Clones share the instant.
#[derive(Debug, Clone, Default)]
pub struct Deadline(Arc<Mutex<Option<Instant>>>);

impl Deadline {
    /// Makes every wait sharing this deadline end by `at`; an earlier instant already set stays.
    pub fn set(&self, at: Instant) {
        let mut deadline = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *deadline = Some(deadline.map_or(at, |set| set.min(at)));
    }

    /// How long a call may wait now: `limit`, or less when the deadline comes first; `None` once it passed.
    fn allow(&self, limit: Duration) -> Option<Duration> {
        match *self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Some(limit),
            Some(at) => Some(at.saturating_duration_since(Instant::now()).min(limit)).filter(|d| !d.is_zero()),
        }
    }
}

/// What became of a commit.
#[derive(Debug)]
pub enum Outcome {
    /// Committed, or failed for good (abortable or fatal).
    Known(KafkaResult<()>),
    /// The [`Deadline`] passed first: the transaction may still commit, or be aborted by the next start.
    Unknown,
}

/// Commits the open transaction, calling `commit_transaction` again for as long as it fails retriably,
/// until `deadline`. Says every `report_every` that it still waits.
pub fn until_known<P: Producer<C>, C: rdkafka::producer::ProducerContext>(
    producer: &P,
    report_every: Duration,
    deadline: &Deadline,
) -> Outcome {
    let started = Instant::now();
    let mut reported = started;
    loop {
        let Some(call) = deadline.allow(CALL.min(report_every)) else {
            tracing::warn!(
                waited_s = started.elapsed().as_secs(),
                "stopping: the outcome of the Kafka commit is left unknown and its checkpoint is not counted as \
                 saved; the next start's init_transactions completes or aborts the transaction, and resumes \
                 from the checkpoint that outcome left"
            );
            return Outcome::Unknown;
        };
        match producer.commit_transaction(call) {
            // rust-rdkafka flushes before it commits: a flush that timed out has left records in flight,
            // whose outcome is as unknown as the commit's.
            Err(e @ KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {
                if reported.elapsed() >= report_every {
                    reported = Instant::now();
                    tracing::warn!(
                        error = %e,
                        waited_s = started.elapsed().as_secs(),
                        "the records of the Kafka transaction are not all acknowledged yet: asking again"
                    );
                }
            }
            // A broker without transactions answers every commit so (librdkafka calls it retriable): known,
            // and definite (`classify_kafka`), not a commit to ask about again.
            Err(e @ KafkaError::Transaction(_))
                if matches!(
                    e.rdkafka_error_code(),
                    Some(RDKafkaErrorCode::UnsupportedFeature | RDKafkaErrorCode::UnsupportedVersion)
                ) =>
            {
                return Outcome::Known(Err(e))
            }
            Err(KafkaError::Transaction(e)) if e.is_retriable() => {
                if reported.elapsed() >= report_every {
                    reported = Instant::now();
                    tracing::warn!(
                        error = %e,
                        waited_s = started.elapsed().as_secs(),
                        "the Kafka commit has not completed: its outcome is unknown until it does (it may still \
                         commit), so it is neither aborted nor counted as committed; asking again"
                    );
                }
            }
            outcome => return Outcome::Known(outcome),
        }
    }
}

/// Starts the producer's transactions (`init_transactions`), fencing every older producer with its id, for
/// up to `timeout` and never past `deadline`.
///
/// # Errors
/// librdkafka's, or its timeout once `timeout` or `deadline` passed.
pub fn init_within<P: Producer<C>, C: rdkafka::producer::ProducerContext>(
    producer: &P,
    timeout: Duration,
    deadline: &Deadline,
) -> KafkaResult<()> {
    retry_within(timeout, deadline, |call| producer.init_transactions(call))
}

/// Aborts the open transaction (`abort_transaction`) for up to `timeout` and never past `deadline`.
///
/// # Errors
/// librdkafka's, or its timeout once `timeout` or `deadline` passed: the transaction is then aborted by
/// the next start of a producer with this id, or by the broker at `transaction.timeout.ms`.
pub fn abort_within<P: Producer<C>, C: rdkafka::producer::ProducerContext>(
    producer: &P,
    timeout: Duration,
    deadline: &Deadline,
) -> KafkaResult<()> {
    retry_within(timeout, deadline, |call| producer.abort_transaction(call))
}

/// Calls `call` with waits of at most [`CALL`] while it times out (a retriable error: librdkafka resumes
/// the operation on the next call), until `timeout` or `deadline`; returns the last outcome.
fn retry_within(timeout: Duration, deadline: &Deadline, call: impl Fn(Duration) -> KafkaResult<()>) -> KafkaResult<()> {
    let ends = Instant::now() + timeout;
    loop {
        let left = ends.saturating_duration_since(Instant::now());
        let wait = deadline.allow(CALL.min(left)).unwrap_or_default();
        let outcome = call(wait);
        let timed_out = matches!(&outcome, Err(KafkaError::Transaction(e)) if e.is_retriable());
        if !timed_out || wait.is_zero() || Instant::now() >= ends || deadline.allow(CALL).is_none() {
            return outcome;
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, ThreadedProducer};
    use rdkafka::{Offset, TopicPartitionList};

    use super::*;

    const STATE: &str = "state";

    fn cluster() -> MockCluster<'static, DefaultProducerContext> {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic(STATE, 1, 1).unwrap();
        cluster
    }

    /// A producer configured as the state writer is (`checkpoint::kafka`), its transactions started.
    fn state_writer(bootstrap: &str) -> ThreadedProducer<DefaultProducerContext> {
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("transactional.id", "c.state")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .create()
            .unwrap();
        producer.init_transactions(Duration::from_secs(30)).unwrap();
        producer
    }

    /// Every record of the state topic, read_uncommitted (the mock cluster does not hide aborted ones).
    fn state_records(bootstrap: &str) -> usize {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.partition.eof", "true")
            .set("group.id", "t")
            .create()
            .unwrap();
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(STATE, 0, Offset::Beginning).unwrap();
        consumer.assign(&assignment).unwrap();
        let mut records = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(_)) => records += 1,
                Some(Err(KafkaError::PartitionEOF(_))) => return records,
                Some(Err(e)) => panic!("reading {STATE}: {e}"),
                None => {}
            }
        }
        panic!("no end of {STATE} within 30 s")
    }

    /// Guards against a `.state` commit that times out being taken for a failure (issue 46, finding 7): the
    /// writer's caller (a quarantine release, a hold) then did its work again while the first transaction
    /// could still commit, and the release record was published twice. The broker answers after each call
    /// gave up: the commit is asked again and comes back committed, and the record is in the topic once.
    /// (An EndTxn answered with REQUEST_TIMED_OUT is not such a case: librdkafka reports it as abortable,
    /// a known failure.)
    #[test]
    fn a_state_commit_that_times_out_is_asked_again_until_it_commits() {
        let cluster = cluster();
        let bootstrap = cluster.bootstrap_servers();
        let writer = state_writer(&bootstrap);
        writer.begin_transaction().unwrap();
        let record = BaseRecord::<str, [u8]>::to(STATE).key("c/hold/order\u{0}A1");
        writer.send(record).map_err(|(e, _)| e).unwrap();
        cluster.broker_round_trip_time(1, Duration::from_millis(400)).unwrap();
        // Each call gives up long before the broker's answer: only asking again gets it.
        match until_known(&writer, Duration::from_millis(50), &Deadline::default()) {
            Outcome::Known(Ok(())) => {}
            other => panic!("the commit's outcome: {other:?}"),
        }
        cluster.broker_round_trip_time(1, Duration::ZERO).unwrap();
        assert_eq!(state_records(&bootstrap), 1, "the release record, once");
    }

    /// Guards against a stop that never ends while Kafka is unreachable (issue 46, finding 6): a commit
    /// whose broker is down has no outcome, and it was asked for without limit. Once a stop sets the
    /// deadline, the wait ends with the outcome unknown.
    #[test]
    fn a_commit_without_an_outcome_gives_up_at_the_deadline() {
        let cluster = cluster();
        let writer = state_writer(&cluster.bootstrap_servers());
        writer.begin_transaction().unwrap();
        writer.send(BaseRecord::<str, [u8]>::to(STATE).key("k").payload(b"v")).map_err(|(e, _)| e).unwrap();
        cluster.broker_down(1).unwrap();
        let deadline = Deadline::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = deadline.clone();
        let task = std::thread::spawn(move || {
            let outcome = until_known(&writer, Duration::from_millis(100), &waiting);
            tx.send(format!("{outcome:?}")).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_secs(2)).is_err(), "no outcome while the broker is down");
        deadline.set(Instant::now());
        let outcome = rx.recv_timeout(Duration::from_secs(30)).expect("the wait ended at the deadline");
        assert_eq!(outcome, "Unknown");
        task.join().unwrap();
        // And so do an abort and a producer's start.
        let writer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("transactional.id", "c.state")
            .create()
            .unwrap();
        assert!(init_within(&writer, Duration::from_secs(3600), &deadline).is_err(), "the start gave up");
    }

    /// The deadline keeps the earliest instant it was given, and cuts each call's wait down to it.
    #[test]
    fn a_deadline_keeps_the_earliest_instant_and_bounds_each_call() {
        let deadline = Deadline::default();
        assert_eq!(deadline.allow(CALL), Some(CALL), "no stop yet: the whole call");
        deadline.set(Instant::now() + Duration::from_secs(3600));
        assert_eq!(deadline.allow(CALL), Some(CALL));
        deadline.clone().set(Instant::now() + Duration::from_millis(200));
        let allowed = deadline.allow(CALL).expect("not passed yet");
        assert!(allowed <= Duration::from_millis(200), "{allowed:?}");
        deadline.set(Instant::now() + Duration::from_secs(3600));
        assert!(deadline.allow(CALL).expect("not passed yet") <= Duration::from_millis(200), "a later one is ignored");
        deadline.set(Instant::now());
        assert_eq!(deadline.allow(CALL), None, "passed");
    }
}
