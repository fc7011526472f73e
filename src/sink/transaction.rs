//! The Kafka transaction of a transactional sink (`exactly_once`): its lifecycle as one enum whose
//! transitions take the state and return the next one, so that a state the producer cannot be in cannot be
//! written down.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! ```text
//!  Idle ──begin──► Open ──commit──► Committing ──returned: committed──► Idle, or Open with the held records
//!                   │                   │ (records sent meanwhile are held)
//!                   │                   ├──returned: failed──► Open ──abort──► Aborted
//!                   │                   └──returned: outcome unknown (the process stops)──► Unresolved
//!                   └──abort──► Aborted
//! ```
//!
//! # Invariants
//! - librdkafka takes no record while a commit runs: a record sent then is held, in order, holding its
//!   in-flight budget. A commit that returns committed hands the held records back ([`Transaction::finish`])
//!   for the sink to produce into the next transaction, after its `on_commit` ran; one that failed drops
//!   them with its own records and returns their budget: none was produced, none counts as delivered.
//! - A commit whose outcome is not yet known (a call that timed out) is asked again until it is
//!   ([`crate::kafka::commit::until_known`]); it is never taken for an abort. Only a stop ends the asking
//!   ([`crate::kafka::commit::Deadline`]): the transaction is then [`Transaction::Unresolved`], and the next
//!   start's `init_transactions` resolves it.
//! - [`Transaction::Aborted`] and [`Transaction::Unresolved`] are final: nothing more goes into the
//!   producer, and the run restarts from the last commit (or the process stops).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, Producer};
use tokio::sync::Semaphore;
use tokio::task::{JoinError, JoinHandle};

use super::delivery::{InFlight, SinkProducer};
use crate::error::{classify_kafka, Error, Result};
use crate::kafka::commit::{Deadline, Outcome};
use crate::metrics::metrics;
use crate::router::KafkaRecord;

/// A transactional sink's producer id, and where it writes the checkpoint that commits with its records.
#[derive(Debug, Clone)]
pub struct Transactional {
    /// The producer's `transactional.id`.
    pub id: String,
    /// The binlog source's `exactly_once`: each commit writes the checkpoint here. `None` for the polling
    /// relay (`poll.transactional`), whose transactions hold records only: its progress is the table's
    /// `published_at`, written after the commit.
    pub checkpoint: Option<CheckpointRecord>,
}

/// Where a checkpoint record goes: the state topic, under this connector's key.
#[derive(Debug, Clone)]
pub struct CheckpointRecord {
    /// The state topic.
    pub topic: String,
    /// The key of the checkpoint record.
    pub key: String,
}

/// Called once a transaction is committed, with how long its commit took (the run records its checkpoint
/// as saved).
pub type OnCommit = Box<dyn FnOnce(Duration) + Send + Sync>;

/// A record sent while a commit ran, registered with the watermark and holding its budget.
pub(super) struct Held {
    pub(super) record: KafkaRecord,
    pub(super) in_flight: Box<InFlight>,
}

/// The Kafka transaction records are produced in.
pub(super) enum Transaction {
    /// None is open: the next record, or the next checkpoint, begins one.
    Idle,
    /// Begun `since`, and taking records: `bytes` of them so far.
    Open { bytes: usize, since: Instant },
    /// Its commit runs on a blocking thread.
    Committing(Committing),
    /// Aborted, or its commit failed: nothing more goes into this producer.
    Aborted,
    /// Its commit's outcome was left unknown when the process stopped: nothing more goes into this
    /// producer, and it is not aborted (librdkafka refuses while it commits). The next start resolves it.
    Unresolved,
}

/// A Kafka commit in progress: librdkafka takes no record into the producer until it returns.
pub(super) struct Committing {
    task: JoinHandle<Outcome>,
    /// The task's outcome once [`Transaction::returned`] saw it (kept, so waiting is cancel-safe).
    outcome: Option<std::result::Result<Outcome, JoinError>>,
    /// When the commit started.
    started: Instant,
    on_commit: OnCommit,
    /// Records sent meanwhile, in order: they go into the next transaction once this one committed.
    held: VecDeque<Held>,
}

impl Transaction {
    /// Carries out the transition `step` on the state in place, returning what it returns.
    pub(super) fn step<T>(&mut self, step: impl FnOnce(Transaction) -> (Transaction, T)) -> T {
        let (next, out) = step(std::mem::replace(self, Transaction::Aborted));
        *self = next;
        out
    }

    /// Idle → Open: before the first record of a transaction or its checkpoint; an open one stays open.
    ///
    /// # Errors
    /// As librdkafka's `begin_transaction`; transient while a commit runs or after an abort.
    pub(super) fn begin(self, producer: &SinkProducer) -> (Transaction, Result<()>) {
        match self {
            Transaction::Idle => match producer.begin_transaction() {
                Ok(()) => (Transaction::Open { bytes: 0, since: Instant::now() }, Ok(())),
                Err(e) => (Transaction::Idle, Err(classify_kafka(&e).context("beginning a Kafka transaction"))),
            },
            open @ Transaction::Open { .. } => (open, Ok(())),
            committing @ Transaction::Committing(_) => {
                (committing, Err(Error::transient("no Kafka transaction begins while one commits")))
            }
            Transaction::Aborted => (Transaction::Aborted, Err(aborted())),
            Transaction::Unresolved => (Transaction::Unresolved, Err(unresolved())),
        }
    }

    /// Counts a record of `bytes` produced into the open transaction.
    pub(super) fn add(&mut self, record_bytes: usize) {
        if let Transaction::Open { bytes, .. } = self {
            *bytes += record_bytes;
        }
    }

    /// Record bytes in the open transaction; `None` when none is open or it is committing.
    pub(super) fn open_bytes(&self) -> Option<usize> {
        match self {
            Transaction::Open { bytes, .. } => Some(*bytes),
            _ => None,
        }
    }

    /// How long the open transaction has been open; `None` when none is open or it is committing.
    pub(super) fn open_for(&self) -> Option<Duration> {
        match self {
            Transaction::Open { since, .. } => Some(since.elapsed()),
            _ => None,
        }
    }

    /// Open (begun first if idle) → Committing: writes `checkpoint`, if any, into the transaction under
    /// `target`'s key and starts its commit on a blocking thread, which says every `attempt` that it still
    /// waits, and gives up at `deadline`.
    ///
    /// # Errors
    /// As [`Transaction::begin`]; when the checkpoint record is refused, or `target` has no place for it,
    /// the error with the transaction still open: the caller aborts it.
    pub(super) fn commit(
        self,
        producer: &Arc<SinkProducer>,
        target: &Transactional,
        attempt: Duration,
        deadline: &Deadline,
        checkpoint: Option<&[u8]>,
        on_commit: OnCommit,
    ) -> (Transaction, Result<()>) {
        let (open, begun) = self.begin(producer);
        if let Err(error) = begun {
            return (open, Err(error));
        }
        match (checkpoint, &target.checkpoint) {
            (None, _) => {}
            (Some(_), None) => {
                return (open, Err(Error::definite("this transactional producer writes no checkpoint record")));
            }
            (Some(checkpoint), Some(place)) => {
                let record_bytes = checkpoint.len() as u32;
                let in_flight = InFlight { tx: None, permits: 0, record_bytes, occurred_at_ms: None };
                let record =
                    BaseRecord::with_opaque_to(&place.topic, Box::new(in_flight)).key(&place.key).payload(checkpoint);
                if let Err((e, _)) = producer.send(record) {
                    let error = classify_kafka(&e).context("writing the checkpoint into the Kafka transaction");
                    return (open, Err(error));
                }
            }
        }
        crate::failpoint!("before_kafka_commit");
        let (producer, deadline) = (producer.clone(), deadline.clone());
        let task =
            tokio::task::spawn_blocking(move || crate::kafka::commit::until_known(&*producer, attempt, &deadline));
        let committing = Committing { task, outcome: None, started: Instant::now(), on_commit, held: VecDeque::new() };
        (Transaction::Committing(committing), Ok(()))
    }

    /// Holds a record sent while a commit runs; hands it back when none runs (the sink produces it).
    pub(super) fn hold(&mut self, record: &KafkaRecord, in_flight: Box<InFlight>) -> Option<Box<InFlight>> {
        match self {
            Transaction::Committing(c) => {
                c.held.push_back(Held { record: record.clone(), in_flight });
                None
            }
            _ => Some(in_flight),
        }
    }

    /// Whether a commit runs.
    pub(super) fn is_committing(&self) -> bool {
        matches!(self, Transaction::Committing(_))
    }

    /// Whether a commit runs and has returned: [`Transaction::returned`] would not wait.
    pub(super) fn has_returned(&self) -> bool {
        matches!(self, Transaction::Committing(c) if c.outcome.is_some() || c.task.is_finished())
    }

    /// Returns once the running commit returned (at once without one); cancel-safe.
    pub(super) async fn returned(&mut self) {
        if let Transaction::Committing(c) = self {
            if c.outcome.is_none() {
                c.outcome = Some((&mut c.task).await);
            }
        }
    }

    /// Committing, returned → committed: Idle, its `on_commit` called, and the records held meanwhile
    /// handed back in the order they were sent, to go into the next transaction. Failed: Open (the caller
    /// aborts it), the held records dropped and their budget returned to `budget`. Outcome unknown (the
    /// process stops): Unresolved, the held records dropped likewise. Any other state, or a commit that
    /// has not returned ([`Transaction::returned`]), stays as it is with nothing held.
    ///
    /// # Errors
    /// Transient for a failed commit (nothing of the transaction is visible; the run restarts from the last
    /// committed checkpoint), also when a newer producer fenced this one (another instance took over), and
    /// for a commit whose outcome was left unknown.
    pub(super) fn finish(self, budget: &Semaphore) -> (Transaction, Result<VecDeque<Held>>) {
        let mut c = match self {
            Transaction::Committing(c) => c,
            other => return (other, Ok(VecDeque::new())),
        };
        let Some(outcome) = c.outcome.take() else {
            return (Transaction::Committing(c), Ok(VecDeque::new()));
        };
        let error = match outcome {
            Ok(Outcome::Known(Ok(()))) => {
                let took = c.started.elapsed();
                metrics().transaction_committed(took);
                crate::failpoint!("after_kafka_commit");
                (c.on_commit)(took);
                return (Transaction::Idle, Ok(c.held));
            }
            // The commit's outcome is unknown: nothing more goes into this producer.
            Err(e) => Error::transient(format!("the commit task failed: {e}")),
            Ok(Outcome::Unknown) => {
                drop_held(c.held, budget);
                return (Transaction::Unresolved, Err(unresolved()));
            }
            Ok(Outcome::Known(Err(e))) if crate::error::is_fenced(&e) => Error::producer_fenced(format!(
                "the Kafka transaction could not commit: {e}. A newer producer with this transactional.id \
                 started (another instance took over); nothing of this transaction is visible"
            )),
            // A known failure is definite: the commit failed for good, and the transaction was (or, the
            // producer being fatal, will be) aborted.
            Ok(Outcome::Known(Err(e))) => classify_kafka(&e).context(
                "committing the Kafka transaction (it failed and is aborted: nothing of it is visible; the run \
                 restarts from the last committed checkpoint)",
            ),
        };
        drop_held(c.held, budget);
        (Transaction::Open { bytes: 0, since: Instant::now() }, Err(error))
    }

    /// Open → Aborted: returns whether a transaction was open, which the caller then aborts with librdkafka
    /// (purging its queue first). A running commit cannot be aborted (the caller lets it return first);
    /// idle stays idle, and so does an unresolved one.
    pub(super) fn abort(self) -> (Transaction, bool) {
        match self {
            Transaction::Open { .. } => (Transaction::Aborted, true),
            other => (other, false),
        }
    }
}

#[cfg(test)]
impl Committing {
    /// How many records are held.
    pub(super) fn held(&self) -> usize {
        self.held.len()
    }
}

/// Drops records held during a commit that failed: they were never produced, so none is counted as
/// delivered, and they are read again after the restart. Their budget is returned.
fn drop_held(held: VecDeque<Held>, budget: &Semaphore) {
    for Held { in_flight, .. } in held {
        metrics().record_settled(in_flight.permits as usize);
        budget.add_permits(in_flight.permits as usize);
    }
}

/// Why nothing more goes into a producer whose commit's outcome was left unknown.
fn unresolved() -> Error {
    Error::commit_unknown(
        "the process stops with the outcome of the last Kafka commit unknown: its checkpoint is not counted as \
         saved, and the next start completes or aborts the transaction before it reads where to resume",
    )
}

/// Why nothing more goes into a producer whose transaction was aborted.
fn aborted() -> Error {
    Error::transient("the Kafka transaction was aborted: the run restarts from the last committed checkpoint")
}
