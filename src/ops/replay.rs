//! Controlled replay: re-publish outbox rows still in the table to a separate topic, rate limited.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.
//!
//! A consumer that lost data, or a new consumer that needs history, asks for the events of a time window
//! and/or one aggregate again. `outbox-cdc replay` reads them from the outbox table (not from the binlog,
//! which may be purged) and produces them to `<routed topic><suffix>` (default suffix `.replay`) or to one
//! `--topic`, never to the live topic: live consumers see nothing, and the replay consumer reads a topic
//! whose every record is a replay.
//!
//! # Invariants
//! - The live connector is not touched: replay never opens the state store, and produces with its own
//!   producer (the connector's Kafka settings: idempotent, `acks=all`, murmur2 on the aggregate id).
//! - A record is replayed exactly as the router builds it for the live topic (same key, value, headers),
//!   minus `source: snapshot`, plus `replay: true` and `replayed_at` (start of the run, UTC, server clock).
//! - A replayed record never goes to the topic its row routes to live: a suffix or `--topic` that would
//!   do so is refused.
//! - Success means Kafka acknowledged every record; any failed delivery fails the run (exit non-zero), and
//!   the replay can simply be run again (consumers deduplicate on the `id` header).
//! - At most `rate_per_sec` records per second on average: record `n` is not handed to the producer before
//!   `start + n / rate` (a token bucket holding one token; sleeping late never lets the average overshoot).
//!
//! # Order
//! Rows are read like the initial snapshot reads them, in one consistent read view in keyset chunks along
//! `(aggregate_type, aggregate_id, occurred_at, id)`: each aggregate's events come out in `occurred_at`
//! order, ties by id (in a table without `occurred_at`, in integer id order, as the snapshot reads it),
//! and land on one partition of the replay topic. (The live topic orders by commit;
//! the two agree whenever `occurred_at` follows commit order within an aggregate.) On MySQL, opening the
//! view takes the snapshot's brief lock (`snapshot.lock`).
//!
//! # Selection
//! `since <= occurred_at < until` (either bound optional; compared as the column's `DATETIME`, no zone),
//! `aggregate_type = …`, `aggregate_id = …`, all ANDed. `snapshot.where` does not apply. The aggregate
//! is given as it is published and compared in its column's own type ([`super::ids`]): a BINARY(16) id
//! as the bytes of its UUID text, an integer id as that integer, text as hex with a charset introducer
//! (so it takes the column's collation); none can inject. A value the column cannot hold (a malformed
//! UUID, a non-integer) is a definite error naming the flag and the column's type, not an empty replay.
//! The time bounds reach the SQL as the server's own rendering of them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::checkpoint::Watermark;
use crate::config::Config;
use crate::error::{classify_mysql, Error, Result};
use crate::ops::ids::IdColumn;
use crate::outbox::{quote_ident, TableName};
use crate::progress::Progress;
use crate::router::Router;
use crate::sink::KafkaSink;
use crate::source::{self, snapshot, SourceConn};
use crate::topic::is_legal_topic;

/// Default suffix appended to the routed topic.
pub const DEFAULT_TOPIC_SUFFIX: &str = ".replay";

/// How long to wait for the last acknowledgements after the last record was produced.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What to replay, and how fast.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Only rows with `occurred_at >= since` (`YYYY-MM-DD[ HH:MM:SS[.ffffff]]`, `T` allowed).
    pub since: Option<String>,
    /// Only rows with `occurred_at < until`.
    pub until: Option<String>,
    /// Only this aggregate type.
    pub aggregate_type: Option<String>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Appended to each row's routed topic (default [`DEFAULT_TOPIC_SUFFIX`]); must not be empty.
    pub topic_suffix: String,
    /// Send every record to this topic instead of `<routed><suffix>`.
    pub topic: Option<String>,
    /// Upper bound of records handed to the producer per second, on average.
    pub rate_per_sec: u32,
    /// Read and route, but produce nothing.
    pub dry_run: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            since: None,
            until: None,
            aggregate_type: None,
            aggregate_id: None,
            topic_suffix: DEFAULT_TOPIC_SUFFIX.to_string(),
            topic: None,
            rate_per_sec: 1_000,
            dry_run: false,
        }
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Records produced and acknowledged (with `dry_run`: that would have been produced).
    pub rows: u64,
    /// Their size in bytes (topic, key, value and headers).
    pub bytes: u64,
    /// Topics written to.
    pub topics: BTreeSet<String>,
}

/// Paces records to at most `rate` per second on average.
#[derive(Debug)]
struct Pacer {
    start: tokio::time::Instant,
    rate_per_sec: u32,
    sent: u64,
}

impl Pacer {
    fn new(rate_per_sec: u32) -> Self {
        Pacer { start: tokio::time::Instant::now(), rate_per_sec: rate_per_sec.max(1), sent: 0 }
    }

    /// When record `n` (from 0) may go, after the start: `n / rate`, exact in nanoseconds (no rounding that
    /// accumulates over a long replay).
    fn due(&self, n: u64) -> Duration {
        let nanos = u128::from(n) * 1_000_000_000 / u128::from(self.rate_per_sec);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Waits until the next record may go.
    async fn ready(&mut self) {
        tokio::time::sleep_until(self.start + self.due(self.sent)).await;
        self.sent += 1;
    }
}

/// Replays the selected rows.
///
/// # Errors
/// Definite for invalid options (bounds the server cannot read, a target topic that would be the live one,
/// a zero rate) and rows that cannot be routed; classified server and Kafka errors; a failed or
/// unacknowledged delivery fails the run.
pub async fn replay(config: &Config, options: &ReplayOptions) -> Result<ReplayReport> {
    if options.rate_per_sec == 0 {
        return Err(Error::definite("the replay rate must be at least 1 record per second"));
    }
    if options.topic.is_none() && options.topic_suffix.is_empty() {
        return Err(Error::definite(
            "an empty topic suffix would replay into the live topics; give a suffix or --topic",
        ));
    }
    if let Some(topic) = options.topic.as_deref() {
        if !is_legal_topic(topic) {
            return Err(Error::definite(format!("--topic {topic:?} is not a legal Kafka topic name")));
        }
        // Checked up front: rows of other aggregate types would otherwise land in a live topic before the
        // per-record check below meets a row that routes there.
        if template_could_render(&config.kafka.topic, topic) {
            return Err(Error::definite(format!(
                "--topic {topic:?} could be a live topic (kafka.topic = {:?}); choose a name outside the template",
                config.kafka.topic
            )));
        }
    }
    let router = Router::for_config(config);
    let source = SourceConn::from_config(config)?;
    let mut conn = source.connect().await?;
    let info = source::server_info(&mut conn).await?;
    let filter = selection(&mut conn, config, options).await?;
    let replayed_at: String = conn
        .query_first("SELECT DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%fZ')")
        .await
        .map_err(|e| classify_mysql(&e))?
        .unwrap_or_default();
    drop(conn);

    let mut scan_config = config.clone();
    scan_config.snapshot.r#where = filter.clone();
    let (mut scanner, view) = snapshot::open(&source, &info, &scan_config, scan_config.tables(), None).await?;
    tracing::info!(
        position = %view,
        filter = filter.as_deref().unwrap_or("(all rows)"),
        rate_per_sec = options.rate_per_sec,
        "replay: reading the outbox"
    );
    let result = async {
        // Without a filter the server's statistics suffice for a progress bar, and cost no table scan.
        let total = match filter.as_deref() {
            Some(filter) => count(scanner.view_conn(), config.tables(), filter).await?,
            None => scanner.estimate_rows().await?,
        };
        let watermark = Arc::new(Watermark::new(None));
        let mut sink = if options.dry_run { None } else { Some(KafkaSink::new(&config.kafka, watermark.clone())?) };
        let tx = watermark.open();
        let progress = Progress::labelled("replay", "rows", total, 0);
        let mut scanner = scanner.prefetch();
        let mut pacer = Pacer::new(options.rate_per_sec);
        let mut report = ReplayReport::default();
        loop {
            let Some(chunk) = scanner.next_chunk().await? else {
                break;
            };
            for mut row in chunk.rows {
                row.from_snapshot = false;
                router.resolve(&row)?;
                let mut record = router.route(&row)?;
                let live = std::mem::take(&mut record.topic);
                record.topic = match &options.topic {
                    Some(topic) => topic.clone(),
                    None => format!("{live}{}", options.topic_suffix),
                };
                if record.topic == live {
                    return Err(Error::definite(format!(
                        "row id={} would be replayed into its live topic {live:?}; choose another --topic",
                        row.id
                    )));
                }
                if !is_legal_topic(&record.topic) {
                    return Err(Error::definite(format!(
                        "replay topic {:?} (row id={}) is not a legal Kafka topic name; choose another suffix",
                        record.topic, row.id
                    )));
                }
                record.headers.push(("replay".into(), b"true".to_vec()));
                record.headers.push(("replayed_at".into(), replayed_at.clone().into_bytes()));
                if let Some(sink) = sink.as_mut() {
                    pacer.ready().await;
                    sink.send(tx, &record, None).await?;
                    if let Some(error) = watermark.take_failure() {
                        sink.abort();
                        return Err(error.context("replay"));
                    }
                }
                report.rows += 1;
                report.bytes += record.size_bytes() as u64;
                if !report.topics.contains(&record.topic) {
                    report.topics.insert(record.topic.clone());
                }
                progress.set(report.rows);
            }
        }
        if let Some(sink) = &sink {
            if !sink.drain(DRAIN_TIMEOUT).await {
                sink.abort();
                return Err(match watermark.take_failure() {
                    Some(error) => error.context("replay"),
                    None => Error::transient(format!(
                        "replay: {} record(s) not acknowledged by Kafka within {DRAIN_TIMEOUT:?}; run the replay again",
                        watermark.unsettled()
                    )),
                });
            }
        }
        progress.finish(report.rows);
        Ok::<_, Error>(report)
    }
    .await;
    let report = result?;
    tracing::info!(
        rows = report.rows,
        bytes = report.bytes,
        topics = ?report.topics,
        dry_run = options.dry_run,
        "replay done"
    );
    Ok(report)
}

/// Whether some values of the placeholders render `template` as `topic` (placeholders match any text).
fn template_could_render(template: &str, topic: &str) -> bool {
    // Literal pieces between placeholders; a placeholder is `${...}` (the router validated the names).
    let mut literals = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        literals.push(&rest[..start]);
        rest = rest[start..].find('}').map_or("", |end| &rest[start + end + 1..]);
    }
    literals.push(rest);
    if literals.len() == 1 {
        return template == topic;
    }
    let (first, last) = (literals[0], literals[literals.len() - 1]);
    if !topic.starts_with(first) || topic.len() < first.len() + last.len() || !topic.ends_with(last) {
        return false;
    }
    let mut middle = &topic[first.len()..topic.len() - last.len()];
    for literal in &literals[1..literals.len() - 1] {
        match middle.find(literal) {
            Some(at) => middle = &middle[at + literal.len()..],
            None => return false,
        }
    }
    true
}

/// The SQL condition for the options, or `None` for every row.
async fn selection(conn: &mut Conn, config: &Config, options: &ReplayOptions) -> Result<Option<String>> {
    let c = &config.outbox.columns;
    if options.since.is_some() || options.until.is_some() {
        for table in config.tables() {
            if crate::source::snapshot::role_columns(conn, table, c).await?[7].is_none() {
                return Err(Error::definite(format!(
                    "--since/--until select rows by occurred_at, and {table} has no `{}` column; select by \
                     --aggregate-type/--aggregate-id instead",
                    c.occurred_at
                )));
            }
        }
    }
    let mut conditions = Vec::new();
    for (bound, op, name) in [(&options.since, ">=", "since"), (&options.until, "<", "until")] {
        if let Some(text) = bound {
            let at = server_datetime(conn, text).await?.ok_or_else(|| {
                Error::definite(format!(
                    "--{name} {text:?} is not a date-time the server can read; write e.g. 2026-11-30 or \
                     \"2026-11-30 12:00:00\""
                ))
            })?;
            conditions.push(format!("{} {op} '{at}'", quote_ident(&c.occurred_at)));
        }
    }
    let flags = [
        ("--aggregate-type", &options.aggregate_type, &c.aggregate_type),
        ("--aggregate-id", &options.aggregate_id, &c.aggregate_id),
    ];
    for (flag, value, column) in flags {
        if let Some(value) = value {
            conditions.push(typed_condition(conn, config.tables(), flag, column, value).await?);
        }
    }
    Ok((!conditions.is_empty()).then(|| conditions.join(" AND ")))
}

/// `column = value` with `value` (as the connector publishes it) typed as the column is, one condition for
/// every table (the scan applies one filter to each).
///
/// # Errors
/// A definite error naming `flag` when `value` cannot be a value of the column (a malformed UUID for a
/// BINARY(16), not an integer for an integer column), or when the tables' columns have types that need
/// different conditions.
async fn typed_condition(
    conn: &mut Conn,
    tables: &[TableName],
    flag: &str,
    column: &str,
    value: &str,
) -> Result<String> {
    let mut chosen: Option<(String, &TableName, IdColumn)> = None;
    for table in tables {
        let id_column = IdColumn::require(conn, table, column).await?;
        let condition = id_column.equals_literal(&id_column.flag_value(flag, value, table)?);
        match &chosen {
            None => chosen = Some((condition, table, id_column)),
            Some((first, first_table, first_column)) if *first != condition => {
                return Err(Error::definite(format!(
                    "{flag} selects rows by the column's own type, and `{column}` is {} in {first_table} but {} \
                     in {table}; replay with a configuration that lists one of these tables",
                    first_column.sql_type, id_column.sql_type
                )));
            }
            Some(_) => {}
        }
    }
    Ok(chosen.map(|(condition, _, _)| condition).unwrap_or_default())
}

/// The server's `DATETIME(6)` rendering of `text`, `None` when it is not a date-time.
async fn server_datetime(conn: &mut Conn, text: &str) -> Result<Option<String>> {
    let rendered: Option<Option<String>> = conn
        .exec_first("SELECT DATE_FORMAT(CAST(? AS DATETIME(6)), '%Y-%m-%d %H:%i:%s.%f')", (text.replacen('T', " ", 1),))
        .await
        .map_err(|e| classify_mysql(&e))?;
    Ok(rendered.flatten().filter(|s| s.bytes().all(|b| b.is_ascii_digit() || b" -:.".contains(&b))))
}

/// Rows the selection holds, in the view (for the progress total).
async fn count(view: &mut Conn, tables: &[TableName], filter: &str) -> Result<u64> {
    let mut total = 0;
    for t in tables {
        let sql = format!("SELECT COUNT(*) FROM {}.{} WHERE {filter}", quote_ident(&t.database), quote_ident(&t.table));
        let n: Option<u64> = view.query_first(sql).await.map_err(|e| classify_mysql(&e).context("counting rows"))?;
        total += n.unwrap_or(0);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_the_template_could_render_are_recognised() {
        let t = "outbox.event.${aggregate_type}";
        assert!(template_could_render(t, "outbox.event.order"));
        assert!(template_could_render(t, "outbox.event."));
        assert!(!template_could_render(t, "orders.backfill"));
        assert!(!template_could_render(t, "outbox.events"));
        let t = "${database}.${table}.${event_type}";
        assert!(template_could_render(t, "shop.outbox.Created"));
        assert!(!template_could_render(t, "shop-outbox"));
        assert!(template_could_render("fixed", "fixed"));
        assert!(!template_could_render("fixed", "fixed.replay"));
        assert!(template_could_render("a${x}b${y}c", "a1b2c"));
        assert!(!template_could_render("a${x}b${y}c", "a12c"));
        assert!(!template_could_render("ab${x}ba", "aba"), "overlapping prefix and suffix");
    }

    #[test]
    fn pacer_lets_record_n_go_at_n_over_rate() {
        let pacer = Pacer::new(200);
        assert_eq!(pacer.due(0), Duration::ZERO);
        assert_eq!(pacer.due(1), Duration::from_millis(5));
        assert_eq!(pacer.due(400), Duration::from_secs(2));
        let thirds = Pacer::new(3);
        assert_eq!(thirds.due(3_000_000_000), Duration::from_secs(1_000_000_000), "no accumulated rounding");
        assert_eq!(Pacer::new(0).due(5), Duration::from_secs(5), "a zero rate is treated as 1/s");
    }
}
