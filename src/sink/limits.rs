//! Topic limits and the size rule: what a topic's `max.message.bytes` must take, and whom a size refusal
//! blames. Pure: the delivery callback judges refusals with it, the sink and `check` check topics with it.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! # Invariants
//! - A record is blamed for a size refusal only when it alone is over the topic's `max.message.bytes`
//!   ([`blame_size_refusal`]); a batch over it is a configuration error, checked before a topic's first
//!   record ([`check_topic_limit`]).

use crate::error::{Error, Result};

/// Headroom for librdkafka's per-record framing when checking a record against `message.max.bytes`, and
/// for a record batch's header against a topic's `max.message.bytes`.
pub(super) const RECORD_OVERHEAD_BYTES: usize = 512;

/// Who a size refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SizeBlame {
    /// The record alone is over the limit: it is poison.
    Record,
    /// The record fits; the batch it was in did not: a configuration error.
    Batch,
}

/// Decides a size refusal of the batch that held a record of `record_bytes`. The record alone is at fault
/// when it is over the topic's limit (`topic_limit`, if the broker told us), or, with the limit unknown,
/// when it is over `batch_limit`: librdkafka never adds a record to a batch it would push past the batch
/// limit, so such a record was alone in its batch. Otherwise the batch may have held innocent records.
pub(super) fn blame_size_refusal(record_bytes: usize, topic_limit: Option<usize>, batch_limit: usize) -> SizeBlame {
    let alone = record_bytes + RECORD_OVERHEAD_BYTES;
    match topic_limit {
        Some(limit) if alone > limit => SizeBlame::Record,
        Some(_) => SizeBlame::Batch,
        None if alone > batch_limit => SizeBlame::Record,
        None => SizeBlame::Batch,
    }
}

/// The smallest topic `max.message.bytes` that takes every batch of up to `batch_limit` bytes:
/// compression may grow incompressible data (lz4 by 1/255 at worst), and the batch has its own header.
pub(super) fn required_topic_limit(batch_limit: usize) -> usize {
    batch_limit + batch_limit / 255 + RECORD_OVERHEAD_BYTES
}

/// Checks a topic's `max.message.bytes` against the producer's batches before its first record.
///
/// # Errors
/// A definite error naming both limits and what to change when a batch of small records could be refused.
pub(super) fn check_topic_limit(topic: &str, limit: usize, batch_limit: usize) -> Result<()> {
    let required = required_topic_limit(batch_limit);
    if limit >= required {
        return Ok(());
    }
    Err(Error::definite(format!(
        "Kafka topic {topic:?} has max.message.bytes = {limit}, but the producer sends batches of up to \
         {batch_limit} bytes (min of kafka.properties.\"batch.size\", default 1000000, and kafka.max_record_bytes): \
         the broker would refuse a batch of valid records. Raise the topic's max.message.bytes to at least \
         {required} (kafka-configs --alter --entity-type topics --entity-name {topic} --add-config \
         max.message.bytes={required}), or set kafka.properties.\"batch.size\" to at most {}",
        limit.saturating_sub(RECORD_OVERHEAD_BYTES) / 256 * 255
    )))
}

pub(super) fn describe_limit(limit: Option<usize>) -> String {
    limit.map_or_else(|| "unknown: the broker did not say".to_string(), |l| l.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size rule: a record is blamed for a size refusal only when it alone is over the limit.
    #[test]
    fn a_size_refusal_blames_a_record_only_when_it_alone_is_over_the_limit() {
        let batch = 1_000_000;
        let cases: &[(usize, Option<usize>, SizeBlame)] = &[
            (2_000_000, Some(1_048_588), SizeBlame::Record),
            (1_048_588, Some(1_048_588), SizeBlame::Record),
            (1_000, Some(1_048_588), SizeBlame::Batch),
            (1_000, Some(100_000), SizeBlame::Batch),
            (200_000, Some(100_000), SizeBlame::Record),
            (2_000_000, None, SizeBlame::Record),
            (999_000, None, SizeBlame::Batch),
            (1_000, None, SizeBlame::Batch),
        ];
        for &(record, topic, blame) in cases {
            assert_eq!(blame_size_refusal(record, topic, batch), blame, "record {record}, topic limit {topic:?}");
        }
    }

    /// The start check: a topic must take the producer's largest batch of several records, and the error
    /// says what to set.
    #[test]
    fn a_topic_limit_below_the_producers_batches_is_a_definite_error() {
        assert!(check_topic_limit("t", 1_048_588, 1_000_000).is_ok(), "Kafka's default topic limit");
        assert!(check_topic_limit("t", 16 * 1024 * 1024, 1_000_000).is_ok());
        let err = check_topic_limit("t", 100_000, 1_000_000).unwrap_err();
        let text = err.to_string();
        assert!(err.is_definite(), "{text}");
        assert!(text.contains("max.message.bytes = 100000") && text.contains("batch.size"), "{text}");
        // The batch.size it proposes passes the check.
        let proposed: usize = text.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(check_topic_limit("t", 100_000, proposed).is_ok(), "{proposed}");
    }
}
