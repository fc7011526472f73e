//! The polling relay under the write patterns production has (`tests/relay_patterns.rs`): the judge that
//! reads **every** record of a topic against the table's committed events, the relay in either of its two
//! modes ([`Mode`]), and the bookkeeping of each case (the table's order, waiting, the figures for
//! `scripts/reliability`).
//!
//! # The judge
//! [`judge`] takes what must arrive (each aggregate's event ids in sequence order, as the table holds them)
//! and the records read, sorted by partition and offset. Per aggregate, every record is one of:
//! - a *first occurrence*: in order when no later event of its aggregate came before it; otherwise an
//!   **order violation** (an event published after a later one of its aggregate);
//! - a *repeat* of an event already seen: a **duplicate**. A repeat right after the event before it
//!   continues a replay run; a repeat at or before the previous record's event starts one (a *step
//!   back*); any other repeat skips events inside a replay, a **broken replay**. A replay run ends at a
//!   step back or at the aggregate's next new event.
//!
//! Two verdicts come of it. Without a crash ([`Verdict::assert_exact`]) each aggregate's records must be
//! exactly its events in order: nothing missing, no duplicate, no order violation. With a crash (a kill,
//! a paused relay; [`Verdict::assert_replays_only`]) nothing may be missing or out of order, and every
//! step back must replay a contiguous, in-order run of the aggregate's events; duplicates are counted.
//! `audit::audit` (and `outbox-cdc audit`) judge first occurrences only, so an event republished after a
//! later one (a step back) is invisible to them: that is what this judge adds.
//!
//! # Invariants
//! - The expectation comes from the table ([`table_expected`]), in sequence order, and the test checks it
//!   against what its writers know they committed ([`assert_table_holds`]).
//! - Every wait here waits for a condition (a record, a row state, a log line) with a timeout, never for a
//!   time.

use super::audit::Expected;
use super::broker::{Broker, Received};
use super::connector::{toml_str, Connector, EPHEMERAL_METRICS};
use super::mariadb::{progress_ddl, MariaDb};
use super::reliability::{full, OUT_ENV};
use super::workload::Patterned;
use mysql_async::prelude::Queryable;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::time::{Duration, Instant};

/// The topic of `aggregate_type = 'order'`.
pub const TOPIC: &str = "outbox.event.order";
/// The default dead-letter topic.
pub const DLQ: &str = "outbox-cdc.dead-letter";
/// Password of the `relay` user.
pub const RELAY_PASSWORD: &str = "relay-secret";
/// The progress table of the reference schema (`deploy/mysql-init.sql`).
pub const PROGRESS_TABLE: &str = "outbox_relay_progress";
/// `published_at` of a row the progress table's number passed while its aggregate was held.
pub const HELD_AT: &str = "1000-01-01 00:00:00";

/// How the relay records what it published: the two modes every case runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each published row's `published_at` (no progress table).
    Marking,
    /// `[poll] progress_table`: one number per outbox table, plus held rows.
    ProgressTable,
}

impl Mode {
    /// The `[poll]` line that chooses the mode.
    pub fn poll_toml(self) -> String {
        match self {
            Mode::Marking => String::new(),
            Mode::ProgressTable => format!("progress_table = \"{PROGRESS_TABLE}\"\n"),
        }
    }

    /// The mode's name in figures and messages.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Marking => "per-row marking",
            Mode::ProgressTable => "progress table",
        }
    }
}

/// Creates the `relay` user with what every relay needs (`SELECT, UPDATE` on the outbox table, `PROCESS` to
/// prove a gap free) and, for [`Mode::ProgressTable`], the progress table with `SELECT, INSERT, UPDATE` on
/// it, as the README says.
pub fn prepare(db: &MariaDb, mode: Mode) {
    db.sql(&format!(
        "CREATE USER 'relay'@'127.0.0.1' IDENTIFIED BY '{RELAY_PASSWORD}';
         GRANT SELECT, UPDATE ON shop.outbox_events TO 'relay'@'127.0.0.1';
         GRANT PROCESS ON *.* TO 'relay'@'127.0.0.1';"
    ));
    if mode == Mode::ProgressTable {
        db.sql(&format!(
            "{};
             GRANT SELECT, INSERT, UPDATE ON shop.{PROGRESS_TABLE} TO 'relay'@'127.0.0.1';",
            progress_ddl()
        ));
    }
}

/// A relay's config, not started: user `relay`, `poll` and the mode's line in `[poll]`, `extra` appended
/// (other tables), metrics on `metrics_port` (an ephemeral port when `None`).
pub fn relay_config(
    db: &MariaDb,
    broker: &Broker,
    mode: Mode,
    poll: &str,
    extra: &str,
    metrics_port: Option<u16>,
) -> Connector {
    let c = Connector::new();
    let metrics = match metrics_port {
        Some(port) => format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
        None => EPHEMERAL_METRICS.to_owned(),
    };
    let text = format!(
        "[source]\nkind = \"poll\"\nhost = \"127.0.0.1\"\nport = {port}\nuser = \"relay\"\npassword = {password}\n\
         [outbox]\ntable = \"shop.outbox_events\"\n\
         [kafka]\nbootstrap_servers = {bootstrap}\ntopic = \"outbox.event.${{aggregate_type}}\"\n\
         [state]\ndir = {state}\n[snapshot]\nmode = \"never\"\n{metrics}\n[poll]\n{poll}\n{mode}\n{extra}\n",
        port = db.port(),
        password = toml_str(RELAY_PASSWORD),
        bootstrap = toml_str(&broker.bootstrap()),
        state = toml_str(&c.state_dir().to_string_lossy()),
        mode = mode.poll_toml(),
    );
    std::fs::write(c.config_path(), text).expect("write relay config");
    c
}

/// [`relay_config`], started.
pub fn start_relay(db: &MariaDb, broker: &Broker, mode: Mode, poll: &str, extra: &str) -> Connector {
    let mut c = relay_config(db, broker, mode, poll, extra, None);
    c.run(&c.config_path());
    c
}

/// The stderr of a connector's latest start only (the harness writes a line before each).
pub fn latest_stderr(c: &Connector) -> String {
    let all = c.stderr();
    match all.rfind("=== harness: start #") {
        Some(at) => all[at..].to_owned(),
        None => all,
    }
}

/// Waits until `c`'s latest start logged `line`; false after `timeout`.
pub fn wait_logged(c: &Connector, line: &str, timeout: Duration) -> bool {
    super::wait_until(timeout, || latest_stderr(c).contains(line))
}

/// The last lines of each relay's log, for assertion messages.
pub fn logs(relays: &[&Connector]) -> String {
    relays.iter().map(|r| super::tail_file(&r.dir().join("stderr.log"), 60)).collect::<Vec<_>>().join("\n-----\n")
}

/// One row of the outbox table as the judge needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEvent {
    /// The sequence column.
    pub seq: u64,
    /// Kafka key.
    pub aggregate_id: String,
    /// Event id (header `id`).
    pub id: String,
}

/// Every row of `shop.outbox_events`, in sequence order.
pub async fn table_events(db: &MariaDb) -> Vec<TableEvent> {
    let mut conn = db.conn().await;
    let rows: Vec<(u64, String, String)> =
        conn.query("SELECT seq, aggregate_id, id FROM outbox_events ORDER BY seq").await.expect("read the table");
    rows.into_iter().map(|(seq, aggregate_id, id)| TableEvent { seq, aggregate_id, id }).collect()
}

/// What must reach the topic: `events` per aggregate in sequence order, without `leave_out` (dead-lettered
/// rows, which go to the dead-letter topic instead).
pub fn expected_of(events: &[TableEvent], leave_out: &HashSet<String>) -> Expected {
    let mut expected = Expected::default();
    let mut sorted: Vec<&TableEvent> = events.iter().collect();
    sorted.sort_by_key(|e| e.seq);
    for e in sorted.into_iter().filter(|e| !leave_out.contains(&e.id)) {
        expected.per_aggregate.entry(e.aggregate_id.clone()).or_default().push(e.id.clone());
    }
    expected
}

/// [`expected_of`] the table as it is now.
pub async fn table_expected(db: &MariaDb, leave_out: &HashSet<String>) -> Expected {
    expected_of(&table_events(db).await, leave_out)
}

/// The table holds exactly what `written` committed among its aggregates, none of what it rolled back, and
/// each aggregate's events in the order its row lock gave them (sequence order = version order).
///
/// # Panics
/// When it does not, naming the first difference.
pub fn assert_table_holds(events: &[TableEvent], written: &Patterned) {
    assert!(written.uncertain.is_empty(), "commits with unknown outcome: {:?}", written.uncertain);
    let in_table: HashSet<&str> = events.iter().map(|e| e.id.as_str()).collect();
    let back: Vec<&String> = written.rolled_back.iter().filter(|id| in_table.contains(id.as_str())).collect();
    assert!(back.is_empty(), "{} rolled-back ids are in the table: {:?}", back.len(), &back[..back.len().min(5)]);
    let table = expected_of(events, &HashSet::new());
    for (aggregate, ids) in &written.expected().per_aggregate {
        let of_table: Vec<&String> = table.per_aggregate.get(aggregate).map(|v| v.iter().collect()).unwrap_or_default();
        let ours: HashSet<&String> = ids.iter().collect();
        let of_table: Vec<&String> = of_table.into_iter().filter(|id| ours.contains(id)).collect();
        let ids: Vec<&String> = ids.iter().collect();
        assert_eq!(of_table, ids, "aggregate {aggregate}: the table's sequence order is not the writers' order");
    }
}

/// Reads `topic` (read_committed) until every id `expected` names was seen and nothing new came for 1 s, or
/// `timeout` passed; returns every record read (duplicates included), for [`judge`].
pub fn read_until_seen(broker: &Broker, topic: &str, expected: &Expected, timeout: Duration) -> Vec<Received> {
    let deadline = Instant::now() + timeout;
    let wanted: HashSet<&str> = expected.per_aggregate.values().flatten().map(String::as_str).collect();
    let mut want = wanted.len();
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
        let records = broker.read_all(topic, want, left);
        let seen: HashSet<&str> = records.iter().filter_map(|r| r.header_str("id")).collect();
        if wanted.iter().all(|id| seen.contains(id)) || Instant::now() >= deadline {
            return records;
        }
        want = records.len() + 1;
    }
}

/// What [`judge`] found. See the module docs for the rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// Records judged.
    pub records: usize,
    /// Expected ids never seen, sorted.
    pub missing: Vec<String>,
    /// Records whose id was seen before.
    pub duplicates: usize,
    /// Distinct ids seen more than once.
    pub duplicated_ids: usize,
    /// Step backs: repeats at or before the previous record's event of their aggregate, each starting a
    /// replay run.
    pub step_backs: usize,
    /// First occurrences after a later event of their aggregate.
    pub order_violations: Vec<String>,
    /// Repeats that neither continue a replay run nor start one (they skip events inside it).
    pub broken_replays: Vec<String>,
    /// Records without a usable `id` header, or with an id nobody expected.
    pub unexpected: Vec<String>,
    /// Aggregates whose records landed on more than one partition.
    pub split_aggregates: Vec<String>,
    /// Aggregates whose last record is not their last event (a consumer keeping the latest event per key
    /// ends on an old one).
    pub stale_tails: Vec<String>,
    /// The aggregate to look at first: the first with an order violation, else with a broken replay, else
    /// with a duplicate. [`trace`] shows it.
    pub first_bad: Option<String>,
}

impl Verdict {
    /// Nothing missing, no duplicate, no order violation, nothing unexpected, no split aggregate: each
    /// aggregate's records are exactly its events, in order, once.
    pub fn is_exact(&self) -> bool {
        self.duplicates == 0 && self.is_replays_only()
    }

    /// Nothing missing, no order violation, no broken replay, nothing unexpected, no split aggregate:
    /// every step back replays a contiguous in-order run.
    pub fn is_replays_only(&self) -> bool {
        self.missing.is_empty()
            && self.order_violations.is_empty()
            && self.broken_replays.is_empty()
            && self.unexpected.is_empty()
            && self.split_aggregates.is_empty()
    }

    /// The counts, and the first few entries of each list.
    pub fn summary(&self) -> String {
        fn head(v: &[String]) -> String {
            let shown: Vec<&str> = v.iter().take(3).map(String::as_str).collect();
            match v.len().saturating_sub(3) {
                0 => format!("{shown:?}"),
                more => format!("{shown:?} (+{more} more)"),
            }
        }
        format!(
            "records={} missing={} {} duplicates={} (ids {}) step_backs={} order_violations={} {} \
             broken_replays={} {} unexpected={} {} split_aggregates={} {} stale_tails={} {}",
            self.records,
            self.missing.len(),
            head(&self.missing),
            self.duplicates,
            self.duplicated_ids,
            self.step_backs,
            self.order_violations.len(),
            head(&self.order_violations),
            self.broken_replays.len(),
            head(&self.broken_replays),
            self.unexpected.len(),
            head(&self.unexpected),
            self.split_aggregates.len(),
            head(&self.split_aggregates),
            self.stale_tails.len(),
            head(&self.stale_tails),
        )
    }

    /// # Panics
    /// Unless [`Verdict::is_exact`]; the message names `what` and carries the summary and `logs`.
    pub fn assert_exact(&self, what: &str, logs: &str) {
        assert!(self.is_exact(), "{what}: not every event once and in order: {}\n{logs}", self.summary());
    }

    /// # Panics
    /// Unless [`Verdict::is_replays_only`]; the message names `what` and carries the summary and `logs`.
    pub fn assert_replays_only(&self, what: &str, logs: &str) {
        assert!(
            self.is_replays_only(),
            "{what}: missing, or a step back that is no replay: {}\n{logs}",
            self.summary()
        );
    }
}

/// Judges every record of `records` (any order; sorted here by partition, offset) against `expected`: see
/// the module docs.
pub fn judge(expected: &Expected, records: &[Received]) -> Verdict {
    // id -> (aggregate, position in the aggregate's order)
    let mut index: HashMap<&str, (&str, usize)> = HashMap::new();
    for (aggregate, ids) in &expected.per_aggregate {
        for (i, id) in ids.iter().enumerate() {
            index.insert(id.as_str(), (aggregate.as_str(), i));
        }
    }
    let mut sorted: Vec<&Received> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));

    /// Per aggregate: the highest event seen (position, id, where), and the previous record's position.
    #[derive(Default)]
    struct Walk<'a> {
        high: Option<(usize, &'a str, String)>,
        previous: Option<usize>,
    }
    let mut verdict = Verdict { records: sorted.len(), ..Verdict::default() };
    let mut walks: HashMap<&str, Walk> = HashMap::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut partitions: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
    let mut first_duplicate: Option<String> = None;
    for r in sorted {
        let at = format!("{}:{}", r.partition, r.offset);
        let Some(id) = r.header_str("id") else {
            verdict.unexpected.push(format!("{at}: no utf-8 `id` header"));
            continue;
        };
        let Some(&(aggregate, pos)) = index.get(id) else {
            verdict.unexpected.push(format!("{at}: id {id} is no expected event"));
            continue;
        };
        partitions.entry(aggregate).or_default().insert(r.partition);
        let walk = walks.entry(aggregate).or_default();
        let times = seen.entry(id).or_insert(0);
        *times += 1;
        if *times == 1 {
            match &walk.high {
                Some((high, high_id, high_at)) if *high > pos => verdict.order_violations.push(format!(
                    "aggregate {aggregate}: event #{pos} ({id}) first at {at}, after event #{high} ({high_id}) at {high_at}"
                )),
                _ => walk.high = Some((pos, id, at.clone())),
            }
        } else {
            first_duplicate.get_or_insert_with(|| aggregate.to_owned());
            verdict.duplicates += 1;
            if *times == 2 {
                verdict.duplicated_ids += 1;
            }
            match walk.previous {
                Some(previous) if pos == previous + 1 => {}
                Some(previous) if pos <= previous => verdict.step_backs += 1,
                previous => verdict.broken_replays.push(format!(
                    "aggregate {aggregate}: event #{pos} ({id}) repeated at {at} right after event #{}: events \
                     skipped inside a replay",
                    previous.map_or("none".to_owned(), |p| p.to_string())
                )),
            }
        }
        walk.previous = Some(pos);
    }
    fn first_of(lines: &[String]) -> Option<String> {
        lines.first().and_then(|l| l.strip_prefix("aggregate ")?.split(':').next()).map(str::to_owned)
    }
    verdict.first_bad =
        first_of(&verdict.order_violations).or_else(|| first_of(&verdict.broken_replays)).or(first_duplicate);
    for (aggregate, ids) in &expected.per_aggregate {
        verdict.missing.extend(
            ids.iter().filter(|id| !seen.contains_key(id.as_str()) && !expected.uncertain.contains(*id)).cloned(),
        );
        if let Some(p) = partitions.get(aggregate.as_str()).filter(|p| p.len() > 1) {
            verdict.split_aggregates.push(format!("aggregate {aggregate} on partitions {p:?}"));
        }
        let last = ids.iter().rposition(|id| !expected.uncertain.contains(id));
        let tail = walks.get(aggregate.as_str()).and_then(|w| w.previous);
        if let (Some(last), Some(tail)) = (last, tail) {
            if tail < last {
                verdict.stale_tails.push(format!("aggregate {aggregate}: last record is event #{tail}, not #{last}"));
            }
        }
    }
    verdict.missing.sort();
    verdict
}

/// `aggregate`'s records in partition order, each as `#<position> seq <n> @<partition>:<offset>` (its
/// sequence number from `events`), for failure messages: what [`Verdict::first_bad`] points at. Shows 40
/// records from five before the first that is not the aggregate's next event.
pub fn trace(aggregate: &str, expected: &Expected, records: &[Received], events: &[TableEvent]) -> String {
    let positions: HashMap<&str, usize> = expected
        .per_aggregate
        .get(aggregate)
        .map(|ids| ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect())
        .unwrap_or_default();
    let seqs: HashMap<&str, u64> = events.iter().map(|e| (e.id.as_str(), e.seq)).collect();
    let mut of_aggregate: Vec<&Received> = records.iter().filter(|r| r.key_str() == Some(aggregate)).collect();
    of_aggregate.sort_by_key(|r| (r.partition, r.offset));
    // From a few records before the first that is not the next event, 40 records.
    let mut high: Option<usize> = None;
    let first_off = of_aggregate.iter().position(|r| {
        let pos = r.header_str("id").and_then(|id| positions.get(id).copied());
        let off = pos.is_none_or(|p| p != high.map_or(0, |h| h + 1));
        high = high.max(pos);
        off
    });
    let from = first_off.unwrap_or(0).saturating_sub(5);
    let shown: Vec<String> = of_aggregate[from..]
        .iter()
        .take(40)
        .map(|r| {
            let id = r.header_str("id").unwrap_or("?");
            let pos = positions.get(id).map_or("?".to_owned(), |p| p.to_string());
            let seq = seqs.get(id).map_or("?".to_owned(), |s| s.to_string());
            format!("#{pos} seq {seq} @{}:{}", r.partition, r.offset)
        })
        .collect();
    let more = of_aggregate.len() - from - shown.len();
    format!(
        "aggregate {aggregate}'s records from #{from} of {}: {}{}",
        of_aggregate.len(),
        shown.join(", "),
        if more > 0 { format!(" (+{more} more)") } else { String::new() }
    )
}

/// One case's figures, as `common::reliability::record` writes them for `scripts/reliability` (same keys),
/// from the judge's verdict; appended to `$OUTBOX_CDC_RELIABILITY_OUT` when set, and printed.
pub fn record(name: &str, events_written: usize, table_rows: usize, verdict: &Verdict, elapsed: Duration, note: &str) {
    eprintln!("[{name}] {:.1} s, {events_written} events written: {}", elapsed.as_secs_f64(), verdict.summary());
    let Some(path) = std::env::var_os(OUT_ENV) else { return };
    let line = serde_json::json!({
        "scenario": name,
        "full": full(),
        "events_written": events_written,
        "table_rows": table_rows,
        "kafka_records": verdict.records,
        "missing": verdict.missing.len(),
        "duplicated_ids": verdict.duplicated_ids,
        "duplicate_records": verdict.duplicates,
        "order_violations": verdict.order_violations.len() + verdict.broken_replays.len(),
        "step_backs": verdict.step_backs,
        "stale_tails": verdict.stale_tails.len(),
        "recovery_ms": serde_json::Value::Null,
        "elapsed_ms": elapsed.as_millis() as u64,
        "note": format!("{note}; judged on every record"),
    });
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("open the reliability file");
    writeln!(file, "{line}").expect("append to the reliability file");
}

/// `SELECT COUNT(*) FROM outbox_events WHERE <condition>`.
pub async fn count(db: &MariaDb, condition: &str) -> u64 {
    let mut conn = db.conn().await;
    let n: Option<u64> =
        conn.query_first(format!("SELECT COUNT(*) FROM outbox_events WHERE {condition}")).await.expect("count rows");
    n.unwrap_or(0)
}

/// The progress table's number for the outbox table (0 without one, or without its row).
pub async fn published_through(db: &MariaDb) -> u64 {
    let mut conn = db.conn().await;
    let through: Result<Option<u64>, _> = conn
        .query_first(format!(
            "SELECT published_through FROM {PROGRESS_TABLE} WHERE outbox_table = 'shop.outbox_events'"
        ))
        .await;
    through.ok().flatten().unwrap_or(0)
}

/// `MAX(seq)` of the outbox table (0 when empty).
pub async fn max_seq(db: &MariaDb) -> u64 {
    let mut conn = db.conn().await;
    conn.query_first("SELECT COALESCE(MAX(seq), 0) FROM outbox_events").await.unwrap().unwrap_or(0)
}

/// The rows not published, as the README defines it in both modes: `published_at` NULL and (with a progress
/// table) `seq` above its number, or `published_at` = [`HELD_AT`]. Parked rows count.
pub async fn unpublished(db: &MariaDb) -> u64 {
    let through = published_through(db).await;
    count(db, &format!("(published_at IS NULL AND seq > {through}) OR published_at = '{HELD_AT}'")).await
}

/// [`unpublished`] among the rows with a sequence number up to `seq`.
pub async fn unpublished_up_to(db: &MariaDb, seq: u64) -> u64 {
    let through = published_through(db).await;
    count(db, &format!("seq <= {seq} AND ((published_at IS NULL AND seq > {through}) OR published_at = '{HELD_AT}')"))
        .await
}

/// The rows published: [`unpublished`]'s complement.
pub async fn published(db: &MariaDb) -> u64 {
    let through = published_through(db).await;
    count(db, &format!("(published_at IS NULL AND seq <= {through}) OR published_at > '{HELD_AT}'")).await
}

/// Waits until the table says every row is published ([`unpublished`] is 0); false after `timeout`.
pub async fn wait_table_published(db: &MariaDb, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if unpublished(db).await == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of one sample line `series value` of a metrics page.
pub fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The first SQL statement in `text` that changes `table` (an `UPDATE` or a `DELETE`), as the text shows
/// it: from the keyword to the first `;`, line end, or double quote. For the fix a refusal prints.
pub fn statement_on(text: &str, table: &str) -> Option<String> {
    for keyword in ["UPDATE ", "DELETE FROM "] {
        for (at, _) in text.match_indices(keyword) {
            let rest = &text[at..];
            let end = rest.find([';', '\n', '"']).unwrap_or(rest.len());
            let mut statement = rest[..end].trim_end_matches(['.', ',', ' ']);
            // A closing parenthesis or backquote of the prose around it, not of the statement.
            while (statement.ends_with(')') && statement.matches('(').count() < statement.matches(')').count())
                || (statement.ends_with('`') && statement.matches('`').count() % 2 == 1)
            {
                statement = statement[..statement.len() - 1].trim_end_matches(['.', ',', ' ']);
            }
            if statement.contains(table) {
                return Some(statement.to_owned());
            }
        }
    }
    None
}
