//! The switch from the binlog source to the polling relay, as docs/RUNBOOK.md tells an operator to make it
//! ("Switching between the relay and the binlog source", **Binlog → relay**), under load, in both relay modes
//! (per-row marking, and `[poll] progress_table`). Issue 45, finding 6: the RUNBOOK marked every row up to the
//! last one the binlog source published, which loses a row of a transaction that took a smaller number and
//! committed after the binlog source stopped.
//!
//! The statements run are the RUNBOOK's own: its five ```` ```sql ```` blocks of that bullet are read from
//! the file and each sent as it is (one text, several statements), in one session (they keep their notes in
//! it), and `outbox-cdc status` of the binlog source is read for the `position:` the RUNBOOK says to compare.
//! Meanwhile:
//! - 4 writers commit steadily over 64 aggregates (each transaction locks its aggregate's row) from before
//!   the switch to after it, and the binlog source publishes them;
//! - a long transaction takes a number below `N` before the operator notes `N`, and ends only once the
//!   RUNBOOK's wait shows nothing else open (step 2 must wait for it);
//! - another long transaction takes a number after the note and stays open across the binlog source's stop,
//!   the marking and the relay's start, committing only once the relay polls. It is what a marking `UPDATE`
//!   in `REPEATABLE READ` waited for until its lock wait timeout (seen in one run, when the server chose to
//!   scan the whole table): the RUNBOOK's runs in `READ COMMITTED`.
//!
//! Every record of the topic is judged against the table's committed events (`common::patterns::judge`):
//! nothing missing (both long transactions' events included), nothing out of order, every repeat a replay of
//! a contiguous run; and every duplicated event numbered `N` or above (the binlog source published it, then
//! the relay did): each row below `N` once.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::patterns::{
    assert_table_holds, count, expected_of, judge, logs, prepare, read_until_seen, record, start_relay, table_events,
    trace, wait_logged, Mode, TOPIC,
};
use common::workload::{PatternConfig, PatternWriter};
use common::{insert_event, Broker, Connector, Engine, MariaDb, OutboxRow};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use outbox_cdc::position::mariadb::GtidPos;

/// How long the relay may take to publish everything once the writers stopped: past its 30 s sweep, which
/// finds a row committed long after its number was read.
const CATCH_UP: Duration = Duration::from_secs(90);
/// How long a step of the procedure may wait for its condition.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// The relay's `[poll]` settings.
const POLL: &str = "poll_interval_ms = 50";

/// The statements of the RUNBOOK's binlog → relay procedure, each block as the RUNBOOK shows it.
struct Procedure {
    /// Step 1: note `N` and the transactions open.
    note: String,
    /// Step 2: how many of those are still open (repeated until 0).
    check: String,
    /// Step 3: the server's position.
    position: String,
    /// Step 4, marking: mark the rows below `N`.
    mark: String,
    /// Step 4, with a progress table: record `N − 1`.
    progress: String,
}

impl Procedure {
    /// Reads the five SQL blocks of the **Binlog → relay** bullet of docs/RUNBOOK.md.
    fn from_runbook() -> Procedure {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/RUNBOOK.md");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let start = text.find("- **Binlog → relay.**").expect("the RUNBOOK has a **Binlog → relay.** bullet");
        let bullet = &text[start..];
        let bullet = &bullet[..bullet.find("\n## ").unwrap_or(bullet.len())];
        let mut blocks = sql_blocks(bullet).into_iter();
        let mut next = |what: &str, starts: &str| {
            let block = blocks.next().unwrap_or_else(|| panic!("the RUNBOOK's binlog → relay has no block for {what}"));
            assert!(block.starts_with(starts), "the RUNBOOK's block for {what} should start with {starts:?}:\n{block}");
            block
        };
        let procedure = Procedure {
            note: next("step 1", "SELECT COALESCE(MAX(seq), 0) + 1 INTO @next_seq"),
            check: next("step 2", "SELECT @next_seq"),
            position: next("step 3", "SELECT @@gtid_binlog_pos"),
            mark: next("step 4 (marking)", "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;"),
            progress: next("step 4 (progress table)", "INSERT INTO outbox_relay_progress"),
        };
        assert!(blocks.next().is_none(), "the RUNBOOK's binlog → relay has more SQL blocks than this test runs");
        procedure
    }
}

/// The ```` ```sql ```` blocks of a Markdown text, each without the indentation of its fence.
fn sql_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.strip_prefix("```").is_some_and(|info| info.trim() == "sql") {
            let indent = line.len() - trimmed.len();
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.trim_start().starts_with("```"))
                .map(|l| l.get(indent.min(l.len() - l.trim_start().len())..).unwrap_or(""))
                .collect();
            blocks.push(body.join("\n"));
        }
    }
    blocks
}

/// A transaction held open on its own connection, with the one event it inserted.
struct Held {
    /// The connection holding it open.
    conn: Conn,
    /// The event's id.
    id: String,
    /// Its sequence number.
    seq: u64,
}

impl Held {
    /// Begins a transaction and inserts one event of `aggregate` (no writer writes it).
    async fn begin(db: &MariaDb, aggregate: &str) -> Held {
        let mut conn = db.conn().await;
        conn.query_drop("START TRANSACTION").await.expect("begin");
        let row = OutboxRow::new(aggregate);
        insert_event(&mut conn, &row).await.expect("insert the held event");
        let seq: Option<u64> =
            conn.exec_first("SELECT seq FROM outbox_events WHERE id = ?", (&row.id,)).await.expect("its number");
        Held { conn, id: row.id, seq: seq.expect("the transaction sees its own row") }
    }

    /// Ends it with `COMMIT`.
    async fn commit(mut self) {
        self.conn.query_drop("COMMIT").await.expect("commit the held transaction");
    }
}

/// The `position:` line of `outbox-cdc status`, as a MariaDB GTID position.
fn status_position(binlog: &Connector) -> GtidPos {
    let (status, out, err) = binlog.command(&["status"], Duration::from_secs(30)).expect("outbox-cdc status");
    assert!(status.success(), "outbox-cdc status failed ({status}):\n{out}\n{err}");
    let line = out.lines().find_map(|l| l.strip_prefix("position:")).unwrap_or_else(|| panic!("no position:\n{out}"));
    let gtids = line.trim().strip_prefix("gtid ").and_then(|g| g.split(" (").next());
    let gtids = gtids.unwrap_or_else(|| panic!("a MariaDB GTID position in {line:?}"));
    gtids.parse().unwrap_or_else(|e| panic!("{gtids:?}: {e}"))
}

/// Whether `checkpoint` has reached `noted`: for each domain of `noted`, the same or a higher sequence number.
fn reached(checkpoint: &GtidPos, noted: &GtidPos) -> bool {
    noted.iter().all(|gtid| checkpoint.contains(&gtid))
}

/// Guards against issue 45, finding 6 (the RUNBOOK's binlog → relay switch loses the event of a transaction
/// that took a number below the last published row and committed after the binlog source stopped), with
/// per-row marking.
#[tokio::test(flavor = "multi_thread")]
async fn binlog_to_relay_marking() {
    binlog_to_relay(Mode::Marking).await;
}

/// [`binlog_to_relay_marking`] with a progress table: the number recorded instead of rows marked.
#[tokio::test(flavor = "multi_thread")]
async fn binlog_to_relay_progress_table() {
    binlog_to_relay(Mode::ProgressTable).await;
}

async fn binlog_to_relay(mode: Mode) {
    let started = Instant::now();
    let name = format!("binlog → relay switch, {}", mode.label());
    let procedure = Procedure::from_runbook();
    let db = MariaDb::start();
    prepare(&db, mode);
    let broker = Broker::start(Engine::Memory);
    let mut binlog = Connector::start(&db, &broker, "");
    binlog.wait_streaming(STEP_TIMEOUT);

    let cfg =
        PatternConfig { max_transactions: usize::MAX, pause: Duration::from_millis(10), ..PatternConfig::default() };
    let writer = PatternWriter::start(db.opts_root(), cfg).await;
    assert!(writer.wait_committed(300, STEP_TIMEOUT).await, "the writers did not start");

    // A transaction that takes a number before the note, and commits later than rows numbered above it.
    let below = Held::begin(&db, "switch-below").await;
    let mut op = db.conn().await;
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let max: Option<u64> = op.query_first("SELECT MAX(seq) FROM outbox_events").await.expect("MAX(seq)");
        if max.is_some_and(|m| m > below.seq) {
            break;
        }
        assert!(Instant::now() < deadline, "no row committed above the held one's number {}", below.seq);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Step 1.
    op.query_drop(&procedure.note).await.unwrap_or_else(|e| panic!("step 1: {e}\n{}", procedure.note));
    let n: u64 = op.query_first("SELECT @next_seq").await.expect("@next_seq").expect("step 1 noted N");
    assert!(below.seq < n, "the held transaction's number {} is below N = {n}", below.seq);

    // A transaction that takes a number after the note and stays open until the relay runs.
    let across = Held::begin(&db, "switch-across").await;
    assert!(across.seq >= n, "a number taken after the note ({}) is at or above N = {n}", across.seq);

    let below_id = below.id.clone();
    // Step 2: the held transaction ends once it is the only writer of step 1's listing still open.
    let mut below = Some(below);
    let mut checks = 0;
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let (noted, fresh, still_open): (Option<u64>, Option<u64>, u64) = op
            .query_first(&procedure.check)
            .await
            .unwrap_or_else(|e| panic!("step 2: {e}\n{}", procedure.check))
            .expect("one row");
        assert_eq!(noted, Some(n), "step 2 shows the N of step 1");
        assert_eq!(fresh, Some(1), "step 1's listing showed its own transaction (nothing else reads INNODB_TRX here)");
        checks += 1;
        if still_open == 0 {
            break;
        }
        if still_open == 1 && checks > 2 {
            if let Some(held) = below.take() {
                held.commit().await;
            }
        }
        assert!(Instant::now() < deadline, "step 2 still shows {still_open} open transaction(s)");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(below.is_none(), "step 2 showed nothing open while the held transaction was");

    // Step 3.
    let noted: String = op.query_first(&procedure.position).await.expect("step 3").expect("a position");
    let noted: GtidPos = noted.parse().expect("@@gtid_binlog_pos");
    let deadline = Instant::now() + STEP_TIMEOUT;
    while !reached(&status_position(&binlog), &noted) {
        assert!(
            Instant::now() < deadline,
            "the binlog source's checkpoint never reached {noted}\n{}",
            binlog.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Step 4.
    binlog.terminate();
    match mode {
        Mode::Marking => {
            op.query_drop(&procedure.mark).await.unwrap_or_else(|e| panic!("step 4: {e}\n{}", procedure.mark))
        }
        Mode::ProgressTable => {
            op.query_drop(&procedure.progress).await.unwrap_or_else(|e| panic!("step 4: {e}\n{}", procedure.progress))
        }
    }
    let marked = count(&db, &format!("seq < {n} AND published_at IS NOT NULL")).await;
    if mode == Mode::Marking {
        assert_eq!(
            count(&db, &format!("seq < {n} AND published_at IS NULL")).await,
            0,
            "step 4 marks every row below N"
        );
    }
    let relay = start_relay(&db, &broker, mode, POLL, "");
    assert!(wait_logged(&relay, "polling the outbox table", STEP_TIMEOUT), "{}", relay.logs());
    let across_id = across.id.clone();
    across.commit().await;
    let committed = writer.committed();
    assert!(writer.wait_committed(committed + 100, STEP_TIMEOUT).await, "the writers stopped");
    let written = writer.finish().await;

    let events = table_events(&db).await;
    assert_table_holds(&events, &written);
    let expected = expected_of(&events, &HashSet::new());
    let records = read_until_seen(&broker, TOPIC, &expected, CATCH_UP);
    let verdict = judge(&expected, &records);
    let below_n = events.iter().filter(|e| e.seq < n).count();
    let step_4 = match mode {
        Mode::Marking => format!("{marked} marked"),
        Mode::ProgressTable => format!("published_through = {}", n - 1),
    };
    let note = format!(
        "4 writers over 64 aggregates throughout; N = {n}: {below_n} rows below it ({step_4}), {} at or above; a \
         transaction below N ended during step 2 (run {checks} times), one above N committed after the relay \
         started",
        events.len() - below_n
    );
    eprintln!("[{name}] {note}");
    record(&name, written.events() + 2, events.len(), &verdict, started.elapsed(), &note);
    let context = match &verdict.first_bad {
        Some(aggregate) => format!("{}\n{}", trace(aggregate, &expected, &records, &events), logs(&[&relay])),
        None => logs(&[&relay]),
    };
    verdict.assert_replays_only(&name, &context);

    let seq_of: HashMap<&str, u64> = events.iter().map(|e| (e.id.as_str(), e.seq)).collect();
    let mut times: HashMap<&str, usize> = HashMap::new();
    for id in records.iter().filter_map(|r| r.header_str("id")) {
        *times.entry(id).or_default() += 1;
    }
    for id in [below_id.as_str(), across_id.as_str()] {
        assert!(times.contains_key(id), "{name}: the held transaction's event {id} was never published");
    }
    let twice_below: Vec<(&str, u64)> =
        times.iter().filter(|(_, &t)| t > 1).map(|(id, _)| (*id, seq_of[id])).filter(|(_, seq)| *seq < n).collect();
    assert!(twice_below.is_empty(), "{name}: rows below N = {n} published more than once: {twice_below:?}");
    assert!(verdict.duplicated_ids > 0, "{name}: no row published by both sources: the relay did not start at N");
}
