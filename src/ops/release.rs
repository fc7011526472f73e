//! `outbox-cdc quarantine release`: republish a held aggregate's events, in order, and lift the hold.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.
//!
//! Runs while the connector is stopped: it takes the state store's writer role, which also guarantees that
//! no newer event of the aggregate reaches the normal topic before the held ones (see
//! [`crate::quarantine`]). Steps:
//! 1. read the dead-letter topic up to its current end, keeping this hold's records in offset order (one
//!    key, one partition: source order), first occurrence of each event id only;
//! 2. prove that this is the whole hold (below); refuse otherwise, naming what is missing;
//! 3. read the payloads that had to be left out of oversized dead letters back from the outbox table, by
//!    event id (`prune` keeps every row of a held aggregate, so they are there);
//! 4. route each again; a record that is still poison stops the release (nothing produced) unless
//!    `--skip-poison` drops it, which is logged per event and stays visible in the dead-letter topic;
//! 5. produce them to their normal topics and wait for every acknowledgement;
//! 6. remove the hold (and the broker refusals it covered) from the store.
//!
//! # The whole hold
//! A hold's records share one key, hence one partition, and Kafka removes records from a partition only
//! as a prefix (retention, `DeleteRecords`; the connector creates the dead-letter topic with
//! `retention.ms = -1` and `cleanup.policy = delete`, so only an operator's change removes any). The hold
//! stores its first event's id, which is its first record. So the hold is whole iff that first record is
//! among those read: every later record of the hold is behind it in the same partition. If it is missing,
//! an unknown number of the records after it may be missing too, and nothing in the topic says which: the
//! release refuses (definite error, exit 2) with the missing id, the partition's first offset, and the ways
//! out, and lifts nothing. `--accept-missing` is the operator's decision to release anyway (after
//! recovering the missing events from the table): it republishes what was read and lifts the hold.
//!
//! Held events are kept in memory between steps 1 and 5: a hold is one aggregate's events since its
//! poison row, which operators release within hours, not millions of events.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Headers, Message};

use super::ids::IdColumn;
use crate::checkpoint::{Store, Watermark};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kafka::identity::{Context, Tokened};
use crate::kafka::read::{Starts, ToEnd, Until};
use crate::outbox::{quote_ident, TableName};
use crate::poison::{Hold, PoisonKind};
use crate::quarantine::{headers, payload_value, DeadLetter};
use crate::router::{KafkaRecord, Router};
use crate::sink::kafka::client_config;
use crate::sink::KafkaSink;
use crate::source::SourceConn;

/// What a release did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseReport {
    /// Events republished to their normal topics.
    pub republished: u64,
    /// Poison events dropped with `--skip-poison` (they stay in the dead-letter topic).
    pub skipped: Vec<String>,
    /// With `--accept-missing`: the hold's first event, which the dead-letter topic no longer held.
    pub missing_first: Option<String>,
}

/// How long reading the dead-letter topic may make no progress, beyond the longest another producer's open
/// transaction can hold it back.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the dead-letter topic must stay silent after its reported end before the read is complete.
const QUIET: Duration = Duration::from_secs(1);

/// Releases the hold on one aggregate.
///
/// # Errors
/// Definite when the store is in use by a running connector, the aggregate has no hold, the dead-letter
/// topic no longer holds the hold's first event without `accept_missing`, or a held event is still poison
/// without `skip_poison`; transient for Kafka trouble (nothing is removed then, and running
/// the release again is safe: consumers may see the republished events twice, in order).
pub async fn release(
    config: &Config,
    aggregate_type: &str,
    aggregate_id: &str,
    skip_poison: bool,
    accept_missing: bool,
) -> Result<ReleaseReport> {
    let why = "quarantine release needs the connector stopped or its control API (it takes the state store, and \
               no newer event of the aggregate may be published before the held ones)";
    super::with_stopped_store(config, why, async |store| {
        release_from(store, config, aggregate_type, aggregate_id, skip_poison, accept_missing).await
    })
    .await
}

/// [`release`] with the store taken.
pub(super) async fn release_from(
    store: &Store,
    config: &Config,
    aggregate_type: &str,
    aggregate_id: &str,
    skip_poison: bool,
    accept_missing: bool,
) -> Result<ReleaseReport> {
    let cc = hold_reader_config(&config.kafka)?;
    let stall = crate::kafka::read::transaction_max_timeout(&cc.0, cc.1.tokens()).await + READ_TIMEOUT;
    let stored =
        store.holds()?.into_iter().find(|h| h.aggregate_type == aggregate_type && h.aggregate_id == aggregate_id);
    let hold = match stored {
        Some(hold) => Some(hold),
        None if matches!(config.source.kind, crate::config::Source::Poll(_)) => {
            hold_of_parked_row(config, &cc, stall, aggregate_type, aggregate_id).await?
        }
        None => None,
    }
    .ok_or_else(|| {
        Error::definite(format!(
            "no hold on aggregate {aggregate_type}/{aggregate_id}; `outbox-cdc quarantine list` shows the holds"
        ))
    })?;
    let topic = config.kafka.dead_letter_topic.clone();
    let hold_id = hold.hold_id.clone();
    let read = tokio::task::spawn_blocking(move || read_hold(&cc, &topic, &hold_id, stall))
        .await
        .map_err(|e| Error::transient(format!("reading the dead-letter topic: {e}")))??;
    let mut report = ReleaseReport::default();
    if let Err(refusal) = check_whole(&hold, &read, &config.kafka.dead_letter_topic) {
        if !accept_missing {
            return Err(refusal);
        }
        tracing::warn!(%refusal, "--accept-missing: releasing what the dead-letter topic still holds");
        report.missing_first = Some(hold.first_event().unwrap_or("?").to_string());
    }
    let mut letters = read.letters;
    let payloads = payloads_from_table(config, &letters).await?;
    for letter in letters.iter_mut().filter(|l| l.lacks_payload()) {
        let id = letter.row.columns.get("id").and_then(|v| v.as_str());
        let payload = id.and_then(|id| payloads.get(id)).cloned();
        if let Some(payload) = payload.and_then(|p| payload_value(p, config.outbox.payload_encoding)) {
            letter.row.columns.insert("payload".into(), payload);
            letter.payload_omitted = false;
        }
    }

    let router = Router::for_config(config);
    let watermark = Arc::new(Watermark::new(None));
    let mut sink = KafkaSink::new(&config.kafka, watermark.clone())?;
    let mut records = Vec::with_capacity(letters.len());
    let mut ids = Vec::with_capacity(letters.len());
    for letter in &letters {
        let id = letter.row.columns.get("id").and_then(|v| v.as_str()).unwrap_or("?").to_string();
        let row = match letter.lacks_payload() {
            true => Err(crate::poison::Poison::new(
                PoisonKind::TooLarge,
                format!(
                    "event {id}: its payload was left out of the dead letter (too large) and the row is no longer \
                     in {}",
                    letter.row.table
                ),
            )),
            false => {
                let from_snapshot = letter.origin.get("snapshot").and_then(|v| v.as_bool()).unwrap_or(false);
                letter.row.to_row(from_snapshot, config.outbox.payload_encoding).ok_or_else(|| {
                    crate::poison::Poison::new(PoisonKind::Undecodable, format!("event {id} could not be decoded"))
                })
            }
        };
        if let Ok(row) = &row {
            router.resolve(row)?;
        }
        let routed = row.and_then(|row| router.route(&row)).and_then(|record| match sink.fits(&record) {
            true => Ok(record),
            false => Err(crate::poison::Poison::new(
                PoisonKind::TooLarge,
                format!("event {id}: record of {} bytes is over kafka.max_record_bytes", record.size_bytes()),
            )),
        });
        match routed {
            Ok(mut record) => {
                record.headers.push((headers::RELEASED_FROM.into(), hold.hold_id.as_bytes().to_vec()));
                records.push(record);
            }
            Err(poison) if skip_poison => {
                tracing::warn!(id, reason = %poison, "still poison: dropped from the release (--skip-poison); it stays in the dead-letter topic");
                report.skipped.push(id.clone());
            }
            Err(poison) => {
                return Err(Error::poison(
                    poison.kind,
                    format!(
                        "held event {id} of {aggregate_type}/{aggregate_id} is still poison: {poison}. Nothing \
                         was republished. Fix the cause (e.g. raise max.message.bytes of the topic and \
                         kafka.max_record_bytes), or pass --skip-poison to release the aggregate without it"
                    ),
                ));
            }
        }
        ids.push(id);
    }
    republish(&mut sink, &watermark, &records).await?;
    report.republished = records.len() as u64;
    if matches!(config.source.kind, crate::config::Source::Poll(_)) {
        unpark(config, &letters, &ids).await?;
    }
    store.remove_hold(&hold, &ids)?;
    tracing::info!(
        aggregate_type,
        aggregate_id,
        hold = %hold.hold_id,
        republished = report.republished,
        skipped = report.skipped.len(),
        "hold released"
    );
    Ok(report)
}

/// The polling relay parks a hold's rows (unpublished, never due: `relay`), which holds the
/// aggregate in every relay; once their events are republished (or skipped), they are marked published, so
/// the aggregate's later rows follow them. Before the hold is removed: a failure keeps the hold, and running
/// the release again is safe.
async fn unpark(config: &Config, letters: &[DeadLetter], ids: &[String]) -> Result<()> {
    let mut conn = SourceConn::from_config(config)?.connect().await?;
    let mut by_table: HashMap<&str, Vec<String>> = HashMap::new();
    for (letter, id) in letters.iter().zip(ids) {
        by_table.entry(letter.row.table.as_str()).or_default().push(id.clone());
    }
    for (table, ids) in by_table {
        let table = TableName::parse(table).map_err(Error::definite)?;
        let marked = crate::relay::mark_released(&mut conn, &table, &config.outbox.columns, &ids).await?;
        tracing::info!(%table, rows = marked, "released rows marked published: the aggregate's later rows follow");
    }
    let _ = conn.disconnect().await;
    Ok(())
}

/// The polling relay's hold on an aggregate, from the table and the dead-letter topic, for a release run
/// on a relay other than the one that dead-lettered the row (whose state store has the hold): the parked
/// row (the first of the aggregate, in the table's order) names the event, and that event's dead letter
/// names the hold. `None` when the aggregate has no parked row.
async fn hold_of_parked_row(
    config: &Config,
    cc: &(ClientConfig, Context),
    stall: Duration,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Option<Hold>> {
    let mut conn = SourceConn::from_config(config)?.connect().await?;
    let c = &config.outbox.columns;
    let mut parked: Option<String> = None;
    for table in config.tables() {
        let roles = crate::source::snapshot::role_columns(&mut conn, table, c).await?;
        let id_text = match roles[0].flatten() {
            Some(family) => crate::source::column_types::text_sql(family, &quote_ident(&c.id)),
            None => quote_ident(&c.id),
        };
        let found = crate::relay::columns_of(&mut conn, table).await?;
        let order = match crate::relay::order_key(&found, c, config.poll.order) {
            Some(crate::relay::OrderKey::Sequence(column)) => quote_ident(&column),
            _ => format!("{}, {}", quote_ident(&c.occurred_at), quote_ident(&c.id)),
        };
        parked = conn
            .exec_first(
                format!(
                    "SELECT {id_text} FROM {} WHERE {} AND next_attempt_at = '{}' AND {} = ? \
                     AND {} = ? ORDER BY {order} LIMIT 1",
                    table.quoted(),
                    crate::relay::NOT_PUBLISHED,
                    crate::relay::PARKED_UNTIL,
                    quote_ident(&c.aggregate_type),
                    quote_ident(&c.aggregate_id)
                ),
                (aggregate_type, aggregate_id),
            )
            .await
            .map_err(|e| {
                crate::error::classify_mysql(&e).context(format_args!("reading the parked rows of {table}"))
            })?;
        if parked.is_some() {
            break;
        }
    }
    let _ = conn.disconnect().await;
    let Some(event) = parked else { return Ok(None) };
    let topic = config.kafka.dead_letter_topic.clone();
    let (cc, wanted) = (cc.clone(), event.clone());
    let letter = tokio::task::spawn_blocking(move || find_dead_letter(&cc, &topic, &wanted, stall))
        .await
        .map_err(|e| Error::transient(format!("reading the dead-letter topic: {e}")))??;
    let Some(letter) = letter else {
        return Err(Error::definite(format!(
            "aggregate {aggregate_type}/{aggregate_id} is held by its parked row {event}, whose dead letter is not in \
             {}: nothing to republish it from. Mark the row published by hand once its event is dealt with \
             (UPDATE … SET published_at = UTC_TIMESTAMP(6) WHERE id = …); the active relay then publishes the \
             rows it held",
            config.kafka.dead_letter_topic
        )));
    };
    let Some(hold_id) = letter.hold_id.clone() else { return Ok(None) };
    tracing::info!(%hold_id, event, "the hold is not in this state store: found through the parked row");
    Ok(Some(Hold {
        aggregate_type: aggregate_type.to_string(),
        aggregate_id: aggregate_id.to_string(),
        hold_id,
        kind: letter.kind,
        reason: letter.reason,
        origin: letter.origin.to_string(),
        held_at_ms: 0,
        first_event: Some(event),
        start: None,
    }))
}

/// The first dead letter of event `id` in the dead-letter topic, read to its high watermark.
fn find_dead_letter(
    cc: &(ClientConfig, Context),
    topic: &str,
    id: &str,
    stall: Duration,
) -> Result<Option<DeadLetter>> {
    let until = Until { quiet: QUIET, stall };
    let topics = [topic.to_string()];
    let what = format!("the dead-letter topic {topic}");
    let reader = ToEnd::start(&cc.0, cc.1.clone(), &topics, &Starts::new(), until, what)?;
    let mut reader = reader.if_lost(format!(
        "the dead letter of event {id} may have been among them. Nothing was changed; run the release again"
    ));
    while let Some(message) = reader.next_record()? {
        let named = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == headers::ID).and_then(|h| h.value.map(<[u8]>::to_vec)));
        if named.as_deref() == Some(id.as_bytes()) {
            let letter = serde_json::from_slice(message.payload().unwrap_or_default()).map_err(|e| {
                Error::definite(format!(
                    "dead-letter record at {topic}/{}@{} is unreadable: {e}",
                    message.partition(),
                    message.offset()
                ))
            })?;
            return Ok(Some(letter));
        }
    }
    Ok(None)
}

/// Produces `records` in order and waits for all acknowledgements.
async fn republish(sink: &mut KafkaSink, watermark: &Watermark, records: &[KafkaRecord]) -> Result<()> {
    let tx = watermark.open();
    for record in records {
        sink.send(tx, record, None).await?;
    }
    if !sink.drain(READ_TIMEOUT).await {
        return Err(watermark.take_failure().unwrap_or_else(|| {
            Error::transient("Kafka did not acknowledge the released events in time; the hold stays, run again")
        }));
    }
    match watermark.take_failure() {
        Some(error) => Err(error.context("republishing released events; the hold stays, run again")),
        None => Ok(()),
    }
}

/// What release read of a hold from the dead-letter topic.
#[derive(Debug, Default)]
struct HoldRead {
    /// The hold's records, in offset order, first occurrence of each event id.
    letters: Vec<DeadLetter>,
    /// Per partition of the topic: the first offset it still holds (its log start).
    log_starts: Vec<i64>,
    /// Where the hold's first record read was: (partition, offset).
    first_at: Option<(i32, i64)>,
}

/// The release refusal when the dead-letter topic no longer holds the hold's first record (module doc).
fn check_whole(hold: &Hold, read: &HoldRead, topic: &str) -> Result<()> {
    let id_of = |l: &DeadLetter| l.row.columns.get("id").and_then(|v| v.as_str()).map(String::from);
    let found = match hold.first_event() {
        Some(first) => read.letters.iter().any(|l| id_of(l).as_deref() == Some(first)),
        // The first row's id did not decode: its record is the hold's one record of a poison kind.
        None => read.letters.iter().any(|l| l.kind != PoisonKind::Quarantined),
    };
    if found {
        return Ok(());
    }
    let first = hold.first_event().unwrap_or("(its id did not decode)");
    let (aggregate_type, aggregate_id) = (&hold.aggregate_type, &hold.aggregate_id);
    let what_was_read = match (read.letters.first().and_then(id_of), read.first_at) {
        (Some(id), Some((p, offset))) => format!(
            "{} record(s) of the hold were read, the earliest event {id} at {topic}/{p}@{offset}, whose partition \
             now starts at offset {}",
            read.letters.len(),
            read.log_starts.get(p as usize).copied().unwrap_or(0)
        ),
        _ => format!("no record of the hold was read from {topic}"),
    };
    Err(Error::definite(format!(
        "cannot prove the hold on {aggregate_type}/{aggregate_id} is whole: its first event {first} (held since \
         {}) is not in the dead-letter topic {topic}; {what_was_read}. Records were removed from the topic \
         (retention.ms, DeleteRecords, or the topic was recreated), or kafka.dead_letter_topic is not the topic \
         the connector wrote the hold to. Events of the hold after {first} may be missing as well, and nothing \
         in the topic says which. Nothing was republished and the hold stays. If dead_letter_topic was changed, \
         set it back and run the release again. Otherwise the outbox table still holds every row of the \
         aggregate (prune keeps the rows of held aggregates): recover the aggregate's events from {first} on \
         from there (`outbox-cdc replay --aggregate-type {aggregate_type} --aggregate-id {aggregate_id}` \
         writes them to a replay topic; see the runbook), then release with --accept-missing, which \
         republishes what the topic still holds and lifts the hold",
        hold.origin
    )))
}

/// The payloads that oversized dead letters left out, read from the outbox table by event id: id → payload
/// for the rows still there.
///
/// # Errors
/// Classified server errors.
async fn payloads_from_table(config: &Config, letters: &[DeadLetter]) -> Result<HashMap<String, Vec<u8>>> {
    let mut wanted: Vec<(&str, &str)> = Vec::new();
    for letter in letters.iter().filter(|l| l.lacks_payload()) {
        if let Some(id) = letter.row.columns.get("id").and_then(|v| v.as_str()) {
            wanted.push((letter.row.table.as_str(), id));
        }
    }
    let mut payloads = HashMap::new();
    if wanted.is_empty() {
        return Ok(payloads);
    }
    let mut conn = SourceConn::from_config(config)?.connect().await?;
    let columns = &config.outbox.columns;
    for (table, id) in wanted {
        let Some((database, name)) = table.split_once('.') else { continue };
        // The id as published (a BINARY(16) as UUID text, an integer in decimal) back to the column's value;
        // one the column cannot hold is not in the table.
        let outbox = TableName { database: database.into(), table: name.into() };
        let id_column = IdColumn::require(&mut conn, &outbox, &columns.id).await?;
        let payload: Option<Vec<u8>> = match id_column.value(id) {
            Ok(value) => {
                let sql = format!(
                    "SELECT {} FROM {}.{} WHERE {} = ?",
                    quote_ident(&columns.payload),
                    quote_ident(database),
                    quote_ident(name),
                    quote_ident(&id_column.name),
                );
                let payload: Option<Option<Vec<u8>>> = conn.exec_first(sql, (value.param(),)).await.map_err(|e| {
                    crate::error::classify_mysql(&e).context(format_args!("reading event {id} from {table}"))
                })?;
                payload.flatten()
            }
            Err(_) => None,
        };
        match payload {
            Some(payload) => {
                tracing::info!(id, %table, bytes = payload.len(), "payload left out of the dead letter read from the table");
                payloads.insert(id.to_string(), payload);
            }
            None => tracing::warn!(id, %table, "payload left out of the dead letter, and the row is not in the table"),
        }
    }
    let _ = conn.disconnect().await;
    Ok(payloads)
}

/// This hold's dead-letter records, in offset order, first occurrence of each event id, read to the
/// topic's high watermark ([`crate::reading`]): another producer's open transaction on the shared
/// dead-letter topic is waited out (at most `stall`), never taken for the end, or the release would lift a
/// hold whose tail it never read and those events would never be republished.
fn read_hold(cc: &(ClientConfig, Context), topic: &str, hold_id: &str, stall: Duration) -> Result<HoldRead> {
    let until = Until { quiet: QUIET, stall };
    let what = format!("the dead-letter topic {topic}");
    let topics = [topic.to_string()];
    let reader = ToEnd::start(&cc.0, cc.1.clone(), &topics, &Starts::new(), until, what)?;
    let mut reader = reader.if_lost(format!(
        "records of hold {hold_id} among them cannot be republished from Kafka. Nothing was republished and the \
         hold stays. Run the release again: it reads what {topic} still holds, and refuses, naming the ways out, \
         if the hold's first event is gone (the outbox table still has the aggregate's rows unless they were \
         pruned: `outbox-cdc replay` recovers them, then --accept-missing lifts the hold). Keep the dead-letter \
         topic's retention.ms = -1 so that a hold's records stay until it is released"
    ));
    let log_starts = reader.log_starts().into_values().collect();
    let mut seen = HashSet::new();
    let mut letters = Vec::new();
    let mut first_at = None;
    while let Some(message) = reader.next_record()? {
        let p = message.partition();
        let header = |name: &str| {
            message.headers().and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value.map(<[u8]>::to_vec)))
        };
        if header(headers::HOLD).as_deref() == Some(hold_id.as_bytes()) {
            let letter: DeadLetter = serde_json::from_slice(message.payload().unwrap_or_default()).map_err(|e| {
                Error::definite(format!("dead-letter record at {topic}/{p}@{} is unreadable: {e}", message.offset()))
            })?;
            let id = letter.row.columns.get("id").and_then(|v| v.as_str()).unwrap_or_default().to_string();
            if seen.insert(id) {
                first_at.get_or_insert((p, message.offset()));
                letters.push(letter);
            }
        }
    }
    Ok(HoldRead { letters, log_starts, first_at })
}

/// The dead-letter reader's librdkafka settings: the connector's, `read_committed`, no group offsets (the
/// `group.id` is librdkafka's condition for `assign()`; it needs no ACL: [`crate::kafka::read`]), and the
/// context (its tokens) of each reader.
fn hold_reader_config(config: &crate::config::KafkaConfig) -> Result<(ClientConfig, Context)> {
    let mut cc = client_config(config)?;
    cc.set("group.id", "outbox-cdc-quarantine-release")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed");
    Ok((cc, Context::of(config)?))
}

/// Human summary of holds for `quarantine list`.
pub fn describe(holds: &[Hold]) -> String {
    if holds.is_empty() {
        return "no aggregate is quarantined\n".to_string();
    }
    let mut out = format!("{} aggregate(s) quarantined:\n", holds.len());
    let now_ms = crate::time::now_ms();
    for h in holds {
        let since = now_ms.saturating_sub(h.held_at_ms) / 1000;
        out.push_str(&format!(
            "  {}/{}  held since {} ({since} s ago) at {}\n    first event {} ({}): {}\n    release: outbox-cdc quarantine release {} {}\n",
            h.aggregate_type,
            h.aggregate_id,
            crate::time::utc_text(h.held_at_ms),
            h.origin,
            h.hold_id,
            h.kind.as_str(),
            h.reason,
            shell_quote(&h.aggregate_type),
            shell_quote(&h.aggregate_id),
        ));
    }
    out
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:/@".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}
