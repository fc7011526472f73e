//! Committing a Kafka transaction until its outcome is known.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::{Producer, ProducerContext, ThreadedProducer};

/// Commits the open transaction, calling `commit_transaction` again for as long as it fails retriably.
///
/// A commit that times out (or fails retriably) has an outcome nobody knows yet: librdkafka keeps
/// committing in the background, refuses an abort meanwhile, and requires the call to be repeated until it
/// succeeds or fails for good. Taking a timeout for an abort would restart the run from the previous
/// checkpoint while the transaction may still commit: its records would then be published twice. So
/// this returns only a known outcome: committed, or failed (abortable or fatal).
///
/// # Errors
/// The commit's definite failure: abortable (abort the transaction) or fatal (the producer is done).
pub fn until_known<C: ProducerContext + 'static>(
    producer: &ThreadedProducer<C>,
    attempt: Duration,
) -> rdkafka::error::KafkaResult<()> {
    let started = Instant::now();
    loop {
        match producer.commit_transaction(attempt) {
            // rust-rdkafka flushes before it commits: a flush that timed out has left records in flight,
            // whose outcome is as unknown as the commit's.
            Err(e @ KafkaError::Flush(rdkafka::types::RDKafkaErrorCode::OperationTimedOut)) => tracing::warn!(
                error = %e,
                waited_s = started.elapsed().as_secs(),
                "the records of the Kafka transaction are not all acknowledged yet: asking again"
            ),
            Err(KafkaError::Transaction(e)) if e.is_retriable() => tracing::warn!(
                error = %e,
                waited_s = started.elapsed().as_secs(),
                "the Kafka commit has not completed: its outcome is unknown until it does (it may still commit), \
                 so it is neither aborted nor counted as committed; asking again"
            ),
            outcome => return outcome,
        }
    }
}
