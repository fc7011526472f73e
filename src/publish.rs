//! Decides what record a source row becomes: its routed record, or a dead-letter record (poison rows and
//! the later events of quarantined aggregates; see [`crate::quarantine`]).

use std::sync::Arc;

use crate::checkpoint::Store;
use crate::config::{Config, OnPoison};
use crate::error::{Error, Result};
use crate::metrics::{metrics, parse_occurred_at_ms};
use crate::quarantine::{dead_letter_record, new_hold, DeadLetter, DeadRow, Origin, Poison, PoisonKind, Quarantine};
use crate::router::{KafkaRecord, Router};
use crate::source::decode::Undecodable;
use crate::source::OutboxRow;

/// A row as the source delivered it.
pub enum SourceRow<'a> {
    /// Decoded.
    Decoded(&'a OutboxRow),
    /// Could not be decoded.
    Undecodable(&'a Undecodable),
}

/// A record ready for the sink.
pub struct Prepared {
    /// The record.
    pub record: KafkaRecord,
    /// The row's `occurred_at` in Unix ms, for streamed rows on their normal topic (latency metric).
    pub occurred_at_ms: Option<i64>,
}

/// Routes rows, diverting poison and held aggregates to the dead-letter topic.
pub struct Publisher {
    router: Router,
    quarantine: Quarantine,
    store: Arc<Store>,
    on_poison: OnPoison,
    dead_letter_topic: String,
    max_record_bytes: usize,
}

impl Publisher {
    /// A publisher with the quarantine loaded from `store`.
    ///
    /// # Errors
    /// Store read errors.
    pub fn new(config: &Config, router: Router, store: Arc<Store>) -> Result<Self> {
        Ok(Publisher {
            router,
            quarantine: Quarantine::load(&store)?,
            store,
            on_poison: config.outbox.on_poison,
            dead_letter_topic: config.kafka.dead_letter_topic.clone(),
            max_record_bytes: config.kafka.max_record_bytes,
        })
    }

    /// The record for `row`, read at `origin` (built only for dead letters). `fits` says whether a record is
    /// small enough to produce.
    ///
    /// # Errors
    /// A definite error for poison with `on_poison = "fail"`, or when a hold cannot be stored.
    pub fn prepare(
        &mut self,
        row: SourceRow<'_>,
        origin: impl FnOnce() -> Origin,
        fits: impl Fn(&KafkaRecord) -> bool,
    ) -> Result<Prepared> {
        let row = match row {
            SourceRow::Decoded(row) => row,
            SourceRow::Undecodable(bad) => {
                let poison = Poison::new(PoisonKind::Undecodable, bad.message.clone());
                let dead = DeadRow::from_undecodable(bad);
                let aggregate = bad.aggregate_type.as_deref().zip(bad.aggregate_id.as_deref());
                return self.dead_letter(bad.id.as_deref(), aggregate, dead, poison, &origin());
            }
        };
        if let Some(hold) = self.quarantine.hold_of(&row.aggregate_type, &row.aggregate_id) {
            let poison = Poison::new(
                PoisonKind::Quarantined,
                format!("aggregate held since event {} ({})", hold.hold_id, hold.kind.as_str()),
            );
            return self.dead_letter_row(row, poison, &origin());
        }
        if let Some(refused) = self.quarantine.known_poison(&row.id) {
            let poison = Poison::new(PoisonKind::RejectedByBroker, refused.message.clone());
            return self.dead_letter_row(row, poison, &origin());
        }
        match self.router.route(row) {
            Ok(record) if fits(&record) => {
                metrics().event_read(&record.topic);
                let occurred_at_ms = if row.from_snapshot { None } else { parse_occurred_at_ms(&row.occurred_at) };
                Ok(Prepared { record, occurred_at_ms })
            }
            Ok(record) => {
                let poison = Poison::new(
                    PoisonKind::TooLarge,
                    format!(
                        "outbox row id={} in {}: the record for topic {} is {} bytes, over kafka.max_record_bytes \
                         = {} (with framing headroom)",
                        row.id,
                        row.table,
                        record.topic,
                        record.size_bytes(),
                        self.max_record_bytes
                    ),
                );
                self.dead_letter_row(row, poison, &origin())
            }
            Err(poison) => self.dead_letter_row(row, poison, &origin()),
        }
    }

    fn dead_letter_row(&mut self, row: &OutboxRow, poison: Poison, origin: &Origin) -> Result<Prepared> {
        let aggregate = Some((row.aggregate_type.as_str(), row.aggregate_id.as_str()));
        self.dead_letter(Some(&row.id), aggregate, DeadRow::from_row(row), poison, origin)
    }

    fn dead_letter(
        &mut self,
        id: Option<&str>,
        aggregate: Option<(&str, &str)>,
        row: DeadRow,
        poison: Poison,
        origin: &Origin,
    ) -> Result<Prepared> {
        if self.on_poison == OnPoison::Fail && poison.kind != PoisonKind::Quarantined {
            return Err(Error::definite(format!(
                "{poison} at {origin} (outbox.on_poison = \"fail\"). Fix or remove the row, or set \
                 outbox.on_poison = \"dead_letter\" to divert it and hold its aggregate"
            )));
        }
        // The hold must be durable before this record (or any later one of the aggregate) is produced.
        let hold = match aggregate {
            Some((aggregate_type, aggregate_id)) => {
                let hold = new_hold(aggregate_type, aggregate_id, id.unwrap_or("unknown"), &poison, origin);
                Some(self.quarantine.hold(&self.store, hold)?)
            }
            None => None,
        };
        if poison.kind != PoisonKind::Quarantined {
            tracing::error!(
                id = id.unwrap_or("?"),
                kind = poison.kind.as_str(),
                %origin,
                topic = %self.dead_letter_topic,
                "poison row sent to the dead-letter topic: {}",
                poison.message
            );
        }
        metrics().dead_letter(poison.kind.as_str());
        let letter = DeadLetter {
            kind: poison.kind,
            reason: poison.message,
            hold_id: hold.as_ref().map(|h| h.hold_id.clone()),
            origin: serde_json::to_value(origin).expect("serializes"),
            row,
        };
        let key = aggregate.map(|(_, aggregate_id)| aggregate_id).filter(|k| !k.is_empty()).or(id).unwrap_or("");
        let record = dead_letter_record(
            &self.dead_letter_topic,
            key,
            id,
            aggregate.map(|(t, _)| t),
            &letter,
            self.max_record_bytes,
        );
        Ok(Prepared { record, occurred_at_ms: None })
    }
}
