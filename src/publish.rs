//! Decides what record a source row becomes: its routed record, or a dead-letter record (poison rows and
//! the later events of quarantined aggregates; see [`crate::quarantine`]).
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.

use std::sync::Arc;

use crate::checkpoint::Store;
use crate::config::{Config, OnPoison};
use crate::error::{Error, Result};
use crate::metrics::metrics;
use crate::outbox::OutboxRow;
use crate::poison::{new_hold, Origin, Poison, PoisonKind, ResumePoint};
use crate::quarantine::{dead_letter_record, DeadLetter, DeadRow, Quarantine};
use crate::router::{KafkaRecord, Router};
use crate::source::decode::Undecodable;
use crate::telemetry::EventSpans;
use crate::time::parse_occurred_at_ms;

/// A row as the source delivered it.
pub enum SourceRow<'a> {
    /// Decoded.
    Decoded(&'a OutboxRow),
    /// Could not be decoded.
    Undecodable(&'a Undecodable),
}

/// A record ready for the sink.
pub struct Prepared<'a> {
    /// The record.
    pub record: &'a KafkaRecord,
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
    /// The record [`Publisher::prepare`] returns: routed into in place, so its buffers are reused.
    record: KafkaRecord,
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
            record: KafkaRecord::default(),
        })
    }

    /// A run begins reading at `resume`: holds whose start it reads again divert only from their start on
    /// (see [`crate::quarantine`]). Without this call every hold diverts every event of its aggregate.
    pub fn resume(&mut self, resume: ResumePoint<'_>) {
        self.quarantine.resume(resume);
    }

    /// The record for `row`, read at `origin` (built only for dead letters and rows of held aggregates).
    /// `fits` says whether a record is small enough to produce.
    ///
    /// # Errors
    /// A definite error for poison with `on_poison = "fail"`, or when a hold cannot be stored.
    pub fn prepare(
        &mut self,
        row: SourceRow<'_>,
        origin: impl FnOnce() -> Origin,
        fits: impl Fn(&KafkaRecord) -> bool,
    ) -> Result<Prepared<'_>> {
        let row = match row {
            SourceRow::Decoded(row) => row,
            SourceRow::Undecodable(bad) => {
                let poison = Poison::new(PoisonKind::Undecodable, bad.message.clone());
                let dead = DeadRow::from_undecodable(bad);
                let aggregate = bad.aggregate_type.as_deref().zip(bad.aggregate_id.as_deref());
                return self.dead_letter(bad.id.as_deref(), aggregate, dead, poison, &origin());
            }
        };
        let mut origin = Lazy::new(origin);
        if self.quarantine.hold_of(&row.aggregate_type, &row.aggregate_id).is_some() {
            if let Some(hold) = self.quarantine.divert(&row.aggregate_type, &row.aggregate_id, &row.id, origin.get()) {
                let poison = match hold.first_event() == Some(row.id.as_str()) {
                    // The hold's own poison row, read again (a restart before its checkpoint): its dead
                    // letter says what is wrong with it, as the first one did.
                    true => Poison::new(hold.kind, hold.reason.clone()),
                    false => Poison::new(
                        PoisonKind::Quarantined,
                        format!("aggregate held since event {} ({})", hold.hold_id, hold.kind.as_str()),
                    ),
                };
                return self.dead_letter_row(row, poison, origin.get());
            }
        }
        if let Some(refused) = self.quarantine.known_poison(&row.id) {
            let poison = Poison::new(PoisonKind::RejectedByBroker, refused.message.clone());
            return self.dead_letter_row(row, poison, origin.get());
        }
        // The registry is asked here, outside routing, so that its absence is a transient error (waited
        // out), never a poison verdict.
        self.router.resolve(row)?;
        let routed = self.router.route_into(row, &mut self.record);
        let occurred_at = || row.occurred_at.as_deref().and_then(parse_occurred_at_ms);
        if let (Ok(()), Some(telemetry)) = (&routed, crate::telemetry::tracer()) {
            let event = EventSpans {
                table: &row.table,
                id: &row.id,
                aggregate_id: &row.aggregate_id,
                event_type: row.event_type.as_deref(),
                occurred_at_ms: occurred_at(),
            };
            telemetry.trace(&mut self.record, &event);
        }
        match routed {
            Ok(()) if fits(&self.record) => {
                metrics().event_read(&self.record.topic);
                let occurred_at_ms = if row.from_snapshot { None } else { occurred_at() };
                Ok(Prepared { record: &self.record, occurred_at_ms })
            }
            Ok(()) => {
                let record = &self.record;
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
                self.dead_letter_row(row, poison, origin.get())
            }
            Err(poison) => self.dead_letter_row(row, poison, origin.get()),
        }
    }

    fn dead_letter_row(&mut self, row: &OutboxRow, poison: Poison, origin: &Origin) -> Result<Prepared<'_>> {
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
    ) -> Result<Prepared<'_>> {
        if self.on_poison == OnPoison::Fail && poison.kind != PoisonKind::Quarantined {
            return Err(Error::poison(
                poison.kind,
                format!(
                    "{poison} at {origin} (outbox.on_poison = \"fail\"). Fix or remove the row, or set \
                     outbox.on_poison = \"dead_letter\" to divert it and hold its aggregate"
                ),
            ));
        }
        // The hold must be durable before this record (or any later one of the aggregate) is produced.
        let hold = match aggregate {
            Some((aggregate_type, aggregate_id)) => {
                let hold = new_hold(aggregate_type, aggregate_id, id, &poison, origin);
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
            payload_omitted: false,
        };
        let key = aggregate.map(|(_, aggregate_id)| aggregate_id).filter(|k| !k.is_empty()).or(id).unwrap_or("");
        self.record = dead_letter_record(
            &self.dead_letter_topic,
            key,
            id,
            aggregate.map(|(t, _)| t),
            &letter,
            self.max_record_bytes,
        );
        Ok(Prepared { record: &self.record, occurred_at_ms: None })
    }
}

/// An origin built on first use (only rows of held aggregates and dead letters need one).
struct Lazy<F> {
    make: Option<F>,
    value: Option<Origin>,
}

impl<F: FnOnce() -> Origin> Lazy<F> {
    fn new(make: F) -> Self {
        Lazy { make: Some(make), value: None }
    }

    fn get(&mut self) -> &Origin {
        if self.value.is_none() {
            let make = self.make.take().expect("made once");
            self.value = Some(make());
        }
        self.value.as_ref().expect("just made")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ValueFormat;
    use crate::error::Kind;
    use crate::outbox::TableName;
    use crate::poison::KnownPoison;
    use crate::topic::TopicTemplate;

    fn config(extra: &str) -> Config {
        Config::parse(&format!(
            "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 7\n[outbox]\ntable = \"shop.outbox_events\"\n{extra}\n\
             [kafka]\nbootstrap_servers = \"b:9092\"\ndead_letter_topic = \"dlq\"\n"
        ))
        .unwrap()
    }

    fn row(id: &str, aggregate_id: &str) -> OutboxRow {
        OutboxRow {
            table: Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() }),
            id: id.into(),
            aggregate_type: "order".into(),
            aggregate_id: aggregate_id.into(),
            event_type: Some("Created".into()),
            schema_version: Some(crate::outbox::SchemaVersion::Integer(1)),
            payload: "{}".into(),
            headers: None,
            occurred_at: Some("2026-11-30T00:00:00.000000".into()),
            additional: Vec::new(),
            from_snapshot: false,
            snapshot_id: None,
        }
    }

    fn publisher(config: &Config, store: Arc<Store>) -> Publisher {
        let router =
            Router::new(TopicTemplate::parse("outbox.event.${aggregate_type}").unwrap(), ValueFormat::Envelope);
        Publisher::new(config, router, store).unwrap()
    }

    fn kind<'a>(prepared: &'a Prepared<'_>) -> Option<&'a str> {
        let header = prepared.record.headers.iter().find(|(k, _)| k == "dead_letter_kind")?;
        std::str::from_utf8(&header.1).ok()
    }

    /// A record the broker refused for good takes the dead-letter path on the pass after the restart, holds
    /// its aggregate (durably: a new publisher on the same store still holds it), and later events of that
    /// aggregate follow it; other aggregates are untouched.
    #[test]
    fn broker_refusal_is_dead_lettered_and_holds_the_aggregate() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        store.add_known_poison(&KnownPoison { id: "e-1".into(), message: "MessageSizeTooLarge".into() }).unwrap();
        let config = config("");
        let mut p = publisher(&config, store.clone());
        let fits = |_: &KafkaRecord| true;
        let refused = p.prepare(SourceRow::Decoded(&row("e-1", "A")), Origin::default, fits).unwrap();
        assert_eq!(refused.record.topic, "dlq");
        assert_eq!(kind(&refused), Some("rejected_by_broker"));
        assert_eq!(refused.record.key, b"A");
        let other = p.prepare(SourceRow::Decoded(&row("e-2", "B")), Origin::default, fits).unwrap();
        assert_eq!((other.record.topic.as_str(), kind(&other)), ("outbox.event.order", None));
        drop(p);
        let mut p = publisher(&config, store);
        let follower = p.prepare(SourceRow::Decoded(&row("e-3", "A")), Origin::default, fits).unwrap();
        assert_eq!((follower.record.topic.as_str(), kind(&follower)), ("dlq", Some("quarantined")));
    }

    fn at(gtid: &str, row_index: u64) -> impl FnOnce() -> Origin {
        let gtid = gtid.to_string();
        move || Origin { snapshot: false, gtid: Some(gtid), file: "bin.000001".into(), position: 500, row_index }
    }

    fn resume_at(gtids: &str) -> crate::position::Position {
        crate::position::Position {
            gtids: crate::position::Gtids::MariaDb(gtids.parse().unwrap()),
            coord: crate::position::BinlogCoord { file: "bin.000001".into(), pos: 4 },
        }
    }

    /// Guards against a restart that re-reads the events of a held aggregate from *before* its poison row
    /// (an earlier transaction not yet checkpointed, an earlier row of the poison row's own transaction)
    /// and diverts them to the dead-letter topic behind the poison row, where release would republish them
    /// after it (issue 16, item 5). Only the rows from the hold's start on are diverted; once the run is
    /// past the start, every row of the aggregate is.
    #[test]
    fn a_restart_diverts_only_from_the_start_of_the_hold() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let config = config("");
        let topic = |p: &Prepared<'_>| (p.record.topic.clone(), kind(p).map(String::from));
        let normal = ("outbox.event.order".to_string(), None);
        let quarantined = ("dlq".to_string(), Some("quarantined".to_string()));

        // First run: 0-1-9 writes e-0; 0-1-10 writes e-1, then the poison e-2 (too large), then e-3.
        let mut p = publisher(&config, store.clone());
        p.resume(ResumePoint::Stream(&resume_at("0-1-8")));
        let ok = |_: &KafkaRecord| true;
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-0", "A")), at("0-1-9", 0), ok).unwrap()), normal);
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-1", "A")), at("0-1-10", 0), ok).unwrap()), normal);
        let poison = p.prepare(SourceRow::Decoded(&row("e-2", "A")), at("0-1-10", 1), |_| false).unwrap();
        assert_eq!(kind(&poison), Some("too_large"));
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-3", "A")), at("0-1-10", 2), ok).unwrap()), quarantined);
        drop(p);

        // Crash before any checkpoint past 0-1-8: the restart reads all of it again.
        let mut p = publisher(&config, store.clone());
        p.resume(ResumePoint::Stream(&resume_at("0-1-8")));
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-0", "A")), at("0-1-9", 0), ok).unwrap()), normal);
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-1", "A")), at("0-1-10", 0), ok).unwrap()), normal);
        let other = p.prepare(SourceRow::Decoded(&row("x-1", "B")), at("0-1-10", 1), ok).unwrap();
        assert_eq!(topic(&other), normal, "another aggregate");
        // The poison row itself, read again, keeps its real kind (it was `quarantined`, hiding why).
        let too_large = ("dlq".to_string(), Some("too_large".to_string()));
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-2", "A")), at("0-1-10", 1), ok).unwrap()), too_large);
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-3", "A")), at("0-1-10", 2), ok).unwrap()), quarantined);
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-4", "A")), at("0-1-11", 0), ok).unwrap()), quarantined);
        drop(p);

        // A run that starts past the hold's transaction diverts everything of the aggregate.
        let mut p = publisher(&config, store);
        p.resume(ResumePoint::Stream(&resume_at("0-1-10")));
        assert_eq!(topic(&p.prepare(SourceRow::Decoded(&row("e-4", "A")), at("0-1-11", 0), ok).unwrap()), quarantined);
    }

    #[test]
    fn too_large_is_poison_and_fail_mode_stops() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let mut p = publisher(&config(""), store.clone());
        let too_big = p.prepare(SourceRow::Decoded(&row("e-1", "A")), Origin::default, |_| false).unwrap();
        assert_eq!(kind(&too_big), Some("too_large"));
        let mut strict =
            publisher(&config("on_poison = \"fail\""), Arc::new(Store::open(&dir.path().join("b")).unwrap()));
        let err = strict.prepare(SourceRow::Decoded(&row("e-9", "")), Origin::default, |_| true).err().unwrap();
        assert!(err.is_definite() && err.to_string().contains("e-9"), "{err}");
        assert_eq!(err.kind(), &Kind::Poison(PoisonKind::EmptyAggregateId), "{err}");
    }
}
