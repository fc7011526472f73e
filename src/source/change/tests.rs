//! Transaction grouping and positions on binlog files written by real MySQL and MariaDB servers
//! (`../shared/fixtures/binlog`, see its MANIFEST for provenance and expected values).

use std::io::BufReader;
use std::path::PathBuf;
use std::str::FromStr;

use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::BinlogFile;

use super::*;
use crate::position::mariadb::GtidPos;
use crate::position::mysql::GtidSet;

/// The fixtures live beside the repository (`../shared/`), on every developer and CI machine.
fn fixture(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/binlog").join(name);
    assert!(path.exists(), "binlog fixture {} is missing", path.display());
    path
}

fn settings(tables: &[&str]) -> Arc<ReaderSettings> {
    Arc::new(ReaderSettings {
        server_id: 1,
        tables: tables
            .iter()
            .map(|t| {
                let (d, t) = t.split_once('.').unwrap();
                TableName { database: d.into(), table: t.into() }
            })
            .collect(),
        columns: ColumnNames::default(),
        on_update: OnUpdate::Ignore,
        heartbeat: Duration::from_secs(5),
        signal_table: None,
    })
}

/// Feeds a whole file; returns the commits' positions, and the first error if any.
fn replay(name: &str, tables: &[&str], start: Gtids) -> (Vec<Position>, Option<Error>) {
    let file = std::fs::File::open(fixture(name)).unwrap();
    let events = BinlogFile::new(BinlogVersion::Version4, BufReader::new(file)).unwrap();
    let start = Position { gtids: start, coord: BinlogCoord { file: name.rsplit('/').next().unwrap().into(), pos: 4 } };
    let mut decoder = ChangeDecoder::new(settings(tables), true, start);
    // Files start with FORMAT_DESCRIPTION; there is no fake ROTATE to strip.
    decoder.seen_format_description = true;
    let mut commits = Vec::new();
    for event in events {
        if let Err(e) = decoder.handle(&event.unwrap()) {
            return (commits, Some(e));
        }
        while let Some(change) = decoder.pop() {
            if let Change::Commit { position, .. } = change {
                commits.push(position);
            }
        }
    }
    (commits, None)
}

fn mysql_set(s: &str) -> GtidSet {
    GtidSet::from_str(s).unwrap()
}

/// MySQL 9.6 tagged GTIDs (GTID_TAGGED_LOG_EVENT, type 42): the commit advances the tagged interval.
#[test]
fn mysql_96_tagged_gtid_advances_the_set() {
    let uuid = "55778904-0299-11f1-b1b8-4ef0c4956feb";
    let start = mysql_set(&format!("{uuid}:1-13:mytag:1-2"));
    let (commits, error) =
        replay("blackbeam-rust_mysql_common/binlog_transaction_with_GTID_TAG.000001", &[], Gtids::MySql(start));
    assert!(error.is_none(), "{error:?}");
    assert_eq!(commits.len(), 1);
    assert_eq!(commits[0].gtids, Gtids::MySql(mysql_set(&format!("{uuid}:1-13:mytag:1-3"))));
}

/// MySQL 5.7 GTID transactions: two DDL statements (GTID + query, no BEGIN) and one DML transaction
/// (GTID, BEGIN … XID) are three commits, each at its end position.
#[test]
fn mysql_57_gtid_groups_ddl_and_dml() {
    let (commits, error) =
        replay("rust-us-mysql-cdc-rs/5.7__33_35_gtid_prev_gtid.log.bin", &[], Gtids::MySql(GtidSet::new()));
    assert!(error.is_none(), "{error:?}");
    assert_eq!(commits.len(), 3);
    let Gtids::MySql(last) = &commits[2].gtids else { panic!("MySQL GTIDs") };
    assert_eq!(last.iter().map(|(_, _, r)| r.iter().map(|r| r.end - r.start).sum::<u64>()).sum::<u64>(), 3);
    assert!(commits.windows(2).all(|w| w[0].coord.pos < w[1].coord.pos), "{commits:?}");
}

/// MySQL 8.0 with anonymous GTIDs (gtid_mode=OFF): every group still ends at its own position.
#[test]
fn mysql_80_anonymous_gtids_group_by_transaction() {
    let (commits, error) = replay("rust-us-mysql-cdc-rs/8.0.31__02_query_bigger.binlog.000733", &[], Gtids::None);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(commits.len(), 11);
    assert!(commits.iter().all(|c| c.gtids == Gtids::None));
    assert!(commits.windows(2).all(|w| w[0].coord.pos < w[1].coord.pos), "{commits:?}");
}

/// MariaDB 11.8 GTID events (parsed from the raw body) advance the position per domain.
#[test]
fn mariadb_gtids_advance_per_domain() {
    let (commits, error) =
        replay("mariadb-operator-mariadb-poc/domain_id_1.mariadb-repl-bin.000002", &[], Gtids::MariaDb(GtidPos::new()));
    assert!(error.is_none(), "{error:?}");
    assert!(!commits.is_empty());
    let Gtids::MariaDb(last) = &commits.last().unwrap().gtids else { panic!("MariaDB GTIDs") };
    assert!(last.get(1).is_some(), "domain 1 advanced: {last}");
    assert!(commits.windows(2).all(|w| w[0].coord.pos < w[1].coord.pos), "{commits:?}");
}

/// Which TABLE_MAP names are the outbox table, by the server's `lower_case_table_names` (issue 16 item 7:
/// with `lower_case_table_names=1` the binlog spells `Shop.Outbox_Events` as `shop.outbox_events`, and
/// an exact comparison with the configured spelling lost every streamed event silently).
#[test]
fn table_map_names_follow_the_server_rule() {
    let name = |d: &str, t: &str| TableName { database: d.into(), table: t.into() };
    // (rule, configured, server spelling, TABLE_MAP name, outcome: Some(true) match, Some(false) no match, None error)
    let cases = [
        (NameCase::Insensitive, "Shop.Outbox_Events", "shop.outbox_events", "shop.outbox_events", Some(true)),
        (NameCase::Insensitive, "Shop.Outbox_Events", "shop.outbox_events", "SHOP.OUTBOX_EVENTS", Some(true)),
        (NameCase::Insensitive, "shop.outbox", "shop.outbox", "shop.outbox_2", Some(false)),
        (NameCase::Sensitive, "shop.outbox", "shop.outbox", "shop.outbox", Some(true)),
        // Another table on this server: `Outbox` and `outbox` can both exist.
        (NameCase::Sensitive, "shop.outbox", "shop.outbox", "shop.Outbox", Some(false)),
        (NameCase::Unknown, "shop.outbox", "shop.outbox", "shop.outbox", Some(true)),
        (NameCase::Unknown, "shop.Outbox", "shop.Outbox", "shop.outbox", None),
        (NameCase::Unknown, "shop.outbox", "shop.outbox", "other.outbox", Some(false)),
    ];
    for (case, configured, server, seen, outcome) in cases {
        let split = |s: &str| {
            let (d, t) = s.split_once('.').unwrap();
            name(d, t)
        };
        let names = OutboxNames::new(case, [(split(configured), split(server))]);
        let seen = split(seen);
        let got = names.table_map(&seen.database, &seen.table);
        match (outcome, got) {
            (Some(true), Ok(Some(t))) => assert_eq!(*t, split(configured), "rows carry the configured name"),
            (Some(false), Ok(None)) => {}
            (None, Err(e)) => assert!(e.is_definite() && e.to_string().contains("differ only in case"), "{e}"),
            (want, got) => panic!("{case:?} {configured} vs {seen}: expected {want:?}, got {got:?}"),
        }
    }
}

/// Without FULL row metadata there are no column names: an outbox table there is a definite error
/// that names the fix — never a guess by column position.
#[test]
fn minimal_row_metadata_on_an_outbox_table_is_definite() {
    let path = fixture("blackbeam-rust_mysql_common/minimal_row_metadata.000001");
    let file = std::fs::File::open(&path).unwrap();
    let mut table = None;
    for event in BinlogFile::new(BinlogVersion::Version4, BufReader::new(file)).unwrap() {
        if let Ok(Some(EventData::TableMapEvent(tme))) = event.unwrap().read_data() {
            table = Some(format!("{}.{}", tme.database_name(), tme.table_name()));
        }
    }
    let table = table.expect("fixture has a TABLE_MAP");
    let (_, error) = replay("blackbeam-rust_mysql_common/minimal_row_metadata.000001", &[&table], Gtids::None);
    let error = error.expect("must fail");
    assert!(error.is_definite());
    assert!(error.to_string().contains("binlog_row_metadata"), "{error}");
}

/// An outbox row with this id; the rest does not matter to a group's rules.
fn row(id: &str) -> Change {
    Change::Row(OutboxRow {
        table: Arc::new(TableName { database: "shop".into(), table: "outbox".into() }),
        id: id.into(),
        aggregate_type: "order".into(),
        aggregate_id: "A-1".into(),
        event_type: Some("OrderCreated".into()),
        schema_version: Some(crate::outbox::SchemaVersion::Integer(1)),
        payload: "{}".into(),
        headers: None,
        occurred_at: Some("2026-12-01T00:00:00".into()),
        additional: Vec::new(),
        from_snapshot: false,
        snapshot_id: None,
    })
}

/// The rules of a group's rows, one case each: what a commit hands on, what ROLLBACK and ROLLBACK TO drop,
/// where the hold-back lets rows stream, which rollbacks are definite errors because they would undo rows
/// already handed on, and that an ended group leaves nothing behind. Guards the per-transaction state
/// that was nine loose fields reset by hand in four places (issue 17), where one forgotten reset
/// carries a savepoint, held rows or the XA flag into the next transaction.
#[test]
fn a_group_holds_releases_and_rolls_back_its_rows_by_the_rules() {
    enum Op {
        /// A rows event of this many bytes with one row of this id.
        Row(&'static str, u32),
        Savepoint(&'static str),
        RollbackTo(&'static str),
        Rollback,
        Commit,
    }
    use Op::*;
    let limit = u32::try_from(HOLD_BACK_BYTES).unwrap();
    // (rule, ops, rows handed on in order; a last entry `error: X` means the last op failed with X)
    let cases: &[(&str, &[Op], &[&str])] = &[
        ("a commit hands the held rows on", &[Row("e-1", 10), Row("e-2", 10), Commit], &["e-1", "e-2"]),
        ("a ROLLBACK drops them", &[Row("e-1", 10), Rollback], &[]),
        (
            "ROLLBACK TO drops the rows since the savepoint",
            &[Row("e-1", 10), Savepoint("s"), Row("e-2", 10), RollbackTo("s"), Row("e-3", 10), Commit],
            &["e-1", "e-3"],
        ),
        ("savepoint names compare case-insensitively", &[Savepoint("S"), Row("e-1", 10), RollbackTo("s"), Commit], &[]),
        (
            "rolling back to an outer savepoint forgets the inner one",
            &[Savepoint("a"), Row("e-1", 10), Savepoint("b"), RollbackTo("a"), Row("e-2", 10), RollbackTo("b")],
            &["error: does not show"],
        ),
        ("an unknown savepoint before any row undoes nothing", &[RollbackTo("x"), Row("e-1", 10), Commit], &["e-1"]),
        ("an unknown savepoint after rows is definite", &[Row("e-1", 10), RollbackTo("x")], &["error: does not show"]),
        (
            "rows stream on past the hold-back, not at it, and the count starts over",
            &[Row("e-1", limit), Row("e-2", 1), Row("e-3", limit), Rollback],
            &["e-1", "e-2", "error: ROLLBACK in the binlog undoes 2 outbox row(s)"],
        ),
        (
            "ROLLBACK TO a savepoint set after the streamed rows keeps them",
            &[Row("e-1", limit + 1), Savepoint("s"), Row("e-2", 10), RollbackTo("s"), Commit],
            &["e-1"],
        ),
        (
            "ROLLBACK TO a savepoint set before streamed rows is definite",
            &[Savepoint("s"), Row("e-1", limit + 1), RollbackTo("s")],
            &["e-1", "error: ROLLBACK TO SAVEPOINT in the binlog undoes 1 outbox row(s)"],
        ),
    ];
    let id = |change: Change| match change {
        Change::Row(row) => row.id,
        other => panic!("not a row: {other:?}"),
    };
    for (rule, ops, expect) in cases {
        let gtid = TxGtid::MariaDb(MariaGtid { domain_id: 0, server_id: 1, seq_no: 7 });
        let mut tx = Tx::start(TxState::Open, Some(gtid), false);
        tx.touches_outbox = true;
        tx.xa = true;
        let mut out = Vec::new();
        let mut ended = false;
        for op in *ops {
            let step = match op {
                Row(row_id, bytes) => {
                    tx.hold(row(row_id));
                    if tx.past_hold_back(*bytes) {
                        out.extend(tx.release().map(id));
                    }
                    Ok(())
                }
                Savepoint(name) => {
                    tx.savepoint(name.to_string());
                    Ok(())
                }
                RollbackTo(name) => tx.rollback_to(name),
                Rollback => tx.rollback().map(|_| ended = true),
                Commit => {
                    out.extend(tx.end().release().map(id));
                    ended = true;
                    Ok(())
                }
            };
            if let Err(e) = step {
                assert!(e.is_definite(), "{rule}: {e}");
                out.push(format!("error: {e}"));
                break;
            }
        }
        let matches = out.len() == expect.len()
            && out.iter().zip(expect.iter()).all(|(got, want)| match want.strip_prefix("error: ") {
                Some(what) => got.starts_with("error: ") && got.contains(what),
                None => got == want,
            });
        assert!(matches, "{rule}: expected {expect:?}, got {out:?}");
        if ended {
            assert_eq!(format!("{tx:?}"), format!("{:?}", Tx::default()), "{rule}: the ended group left state");
        }
    }
}
