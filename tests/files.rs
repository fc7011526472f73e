//! `source.kind = "files"` end to end: binlogs written by the harness's MariaDB, copied away and the server
//! stopped (the disaster-recovery case), published by the real binary into a real broker and audited.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::connector::{toml_str, EPHEMERAL_METRICS};
use common::{business_tx, Broker, Connector, Engine, Expected, MariaDb};
use mysql_async::prelude::Queryable;
use outbox_cdc::position::Gtids;
use outbox_cdc::source::binlog::{Change, ReaderSettings};
use outbox_cdc::source::files::{scan, start_position, FilesReader};

const TOPIC: &str = "outbox.event.order";
const READ_TIMEOUT: Duration = Duration::from_secs(120);
const EXIT_TIMEOUT: Duration = Duration::from_secs(120);

/// Writes outbox transactions in three binlog files (FLUSH BINARY LOGS between batches), stops the server
/// and copies its binlogs (with `mysql-bin.index` and `mysql-bin.state`, which must be ignored) into `dest`. Returns the expectation
/// and the server's final GTID position.
async fn binlogs_with_outbox_rows(dest: &Path) -> (Expected, String) {
    let mut db = MariaDb::start();
    let mut conn = db.conn().await;
    let mut orders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for batch in 0..3 {
        for i in 0..20 {
            let aggregate = format!("A-{}", (batch * 20 + i) % 4);
            let id = business_tx(&mut conn, &aggregate).await.expect("business transaction");
            orders.entry(aggregate).or_default().push(id);
        }
        conn.query_drop("FLUSH BINARY LOGS").await.unwrap();
    }
    let end = db.gtid_binlog_pos();
    drop(conn);
    db.stop();
    std::fs::create_dir_all(dest).unwrap();
    for entry in std::fs::read_dir(db.datadir()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with("mysql-bin.") {
            std::fs::copy(&path, dest.join(path.file_name().unwrap())).unwrap();
        }
    }
    (Expected::from_orders(orders), end)
}

fn files_config(connector: &Connector, broker: &Broker, binlogs: &Path) -> PathBuf {
    let text = format!(
        "[source]\nkind = \"files\"\nbinlog_dir = {dir}\n\n[outbox]\ntable = \"shop.outbox_events\"\n\n\
         [kafka]\nbootstrap_servers = {bootstrap}\ntopic = \"outbox.event.${{aggregate_type}}\"\n\n\
         [state]\ndir = {state}\n\n[snapshot]\nmode = \"never\"\n{EPHEMERAL_METRICS}",
        dir = toml_str(&binlogs.to_string_lossy()),
        bootstrap = toml_str(&broker.bootstrap()),
        state = toml_str(&connector.state_dir().to_string_lossy()),
    );
    let path = connector.config_path();
    std::fs::write(&path, text).unwrap();
    path
}

/// The replica is gone, its binlogs are kept: a files run publishes every outbox event in order, checkpoints
/// the server's last GTID and exits 0; a second run over the same files publishes nothing again.
#[tokio::test(flavor = "multi_thread")]
async fn files_run_publishes_everything_once_and_exits() {
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::new();
    let binlogs = connector.dir().join("binlogs");
    let (expected, end) = binlogs_with_outbox_rows(&binlogs).await;
    let config = files_config(&connector, &broker, &binlogs);

    connector.run(&config);
    let status = connector.wait_exit(EXIT_TIMEOUT).expect("a files run ends by itself");
    assert!(status.success(), "exit {status}\n{}", connector.logs());
    let (records, report) = common::read_and_audit(&broker, TOPIC, &expected, READ_TIMEOUT, &connector);
    assert_eq!(report.duplicates, 0, "{}", report.summary());
    assert_eq!(records.len(), expected.len());
    let checkpoint = connector.status_json().expect("checkpoint");
    assert_eq!(checkpoint["position"]["gtids"], end.as_str(), "{checkpoint}");
    assert_eq!(checkpoint["server"]["binlog_files"], true, "{checkpoint}");
    assert!(connector.logs().contains("end of the binlog files"), "{}", connector.logs());

    // Again, from the checkpoint: every transaction is already in it.
    connector.restart();
    let status = connector.wait_exit(EXIT_TIMEOUT).expect("a files run ends by itself");
    assert!(status.success(), "exit {status}\n{}", connector.logs());
    // The run has ended: what it published is in the topic, read to a quiet second however slow the machine.
    let again = broker.read_all(TOPIC, expected.len(), READ_TIMEOUT);
    assert_eq!(again.len(), expected.len(), "a resumed files run must not publish again");

    // The same position stored by a live run of that server: not silently resumed by files, unless asked.
    common::connector::rewrite_checkpoint(&connector.state_dir(), |cp| {
        cp["server"].as_object_mut().unwrap().remove("binlog_files");
    });
    connector.restart();
    let status = connector.wait_exit(EXIT_TIMEOUT).expect("exits");
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    assert!(connector.logs().contains("--accept-new-server"), "{}", connector.logs());
    connector.spawn(["run", "--accept-new-server", "--config"].map(Into::into).into_iter().chain([config.into()]));
    let status = connector.wait_exit(EXIT_TIMEOUT).expect("exits");
    assert!(status.success(), "exit {status}\n{}", connector.logs());
    assert_eq!(broker.read_all(TOPIC, expected.len(), READ_TIMEOUT).len(), expected.len());
}

/// The GTID position the connector checkpoints after the last transaction of each file equals the GTID_LIST
/// that MariaDB wrote at the start of the next file; and `start_after` skips what it names.
#[tokio::test(flavor = "multi_thread")]
async fn positions_match_the_next_files_gtid_list() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, end) = binlogs_with_outbox_rows(dir.path()).await;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e.to_string_lossy().bytes().all(|b| b.is_ascii_digit())))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    let settings = std::sync::Arc::new(ReaderSettings {
        server_id: 1,
        tables: vec![outbox_cdc::outbox::TableName { database: "shop".into(), table: "outbox_events".into() }],
        columns: Default::default(),
        on_update: Default::default(),
        heartbeat: Duration::from_secs(1),
        signal_table: None,
    });
    let first = scan(&files[0]).unwrap();
    let start = start_position(&files[0], &first.header, None).unwrap();
    let mut rows = 0;
    for i in 0..files.len() - 1 {
        let mut reader = FilesReader::start(files[..=i].to_vec(), settings.clone(), start.clone()).unwrap();
        let mut last = start.clone();
        rows = 0;
        while let Some(change) = reader.next().unwrap() {
            match change {
                Change::Commit { position, .. } => last = position,
                Change::Row(_) => rows += 1,
                Change::Undecodable(bad) => panic!("undecodable row: {}", bad.message),
                Change::Signal(signal) => panic!("no signal table is configured: {signal:?}"),
                Change::Begin(_) => {}
            }
        }
        let next = scan(&files[i + 1]).unwrap().header.previous;
        assert_eq!(last.gtids, next, "after {} vs GTID_LIST of {}", files[i].display(), files[i + 1].display());
    }
    assert_eq!(rows, expected.len());
    let Gtids::MariaDb(final_pos) = &scan(files.last().unwrap()).unwrap().header.previous else { panic!("MariaDB") };
    assert_eq!(final_pos.to_string(), end);

    // Without the second file: a definite error at the third, nothing silently skipped.
    let mut gap = files.clone();
    gap.remove(1);
    let mut reader = FilesReader::start(gap, settings.clone(), start.clone()).unwrap();
    let error = loop {
        match reader.next() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("a missing file must not go unnoticed"),
            Err(e) => break e,
        }
    };
    assert!(error.is_definite() && error.to_string().contains("missing"), "{error}");

    // start_after = the position after the 10th row's transaction: 50 rows remain.
    let mut reader = FilesReader::start(files.clone(), settings.clone(), start.clone()).unwrap();
    let mut seen = 0;
    let mut cut = None;
    while let Some(change) = reader.next().unwrap() {
        match change {
            Change::Row(_) => seen += 1,
            Change::Commit { position, .. } if seen == 10 && cut.is_none() => cut = Some(position),
            _ => {}
        }
    }
    let Gtids::MariaDb(cut) = cut.unwrap().gtids else { panic!("MariaDB") };
    let after = start_position(&files[0], &first.header, Some(&cut.to_string())).unwrap();
    let mut reader = FilesReader::start(files, settings, after).unwrap();
    let mut rest = 0;
    while let Some(change) = reader.next().unwrap() {
        rest += matches!(change, Change::Row(_)) as usize;
    }
    assert_eq!(rest, expected.len() - 10);
}

fn fixture_config(connector: &Connector, broker: &Broker, file: &Path, table: &str) -> PathBuf {
    let text = format!(
        "[source]\nkind = \"files\"\nbinlog_files = [{file}]\n\n[outbox]\ntable = {table}\n\n\
         [kafka]\nbootstrap_servers = {bootstrap}\n\n[state]\ndir = {state}\n\n[snapshot]\nmode = \"never\"\n\
         {EPHEMERAL_METRICS}",
        file = toml_str(&file.to_string_lossy()),
        table = toml_str(table),
        bootstrap = toml_str(&broker.bootstrap()),
        state = toml_str(&connector.state_dir().to_string_lossy()),
    );
    let path = connector.config_path();
    std::fs::write(&path, text).unwrap();
    path
}

/// The binary over files written by MySQL 9.6 (tagged GTIDs) checkpoints the server's GTID set after the
/// file and exits 0; over MySQL 8.0 files without FULL row metadata, an outbox table there is a definite
/// error (exit 2) that names the fix.
#[tokio::test(flavor = "multi_thread")]
async fn mysql_files_checkpoint_and_fail_loud() {
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::new();
    let file = common::binlog_fixture("blackbeam-rust_mysql_common/binlog_transaction_with_GTID_TAG.000001");
    let config = fixture_config(&connector, &broker, &file, "shop.outbox_events");
    connector.run(&config);
    let status = connector.wait_exit(EXIT_TIMEOUT).expect("a files run ends by itself");
    assert!(status.success(), "exit {status}\n{}", connector.logs());
    let checkpoint = connector.status_json().expect("checkpoint");
    assert_eq!(checkpoint["position"]["gtids"], "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-3", "{checkpoint}");
    assert_eq!(checkpoint["server"]["flavor"], "mysql", "{checkpoint}");

    let mut connector = Connector::new();
    let file = common::binlog_fixture("blackbeam-rust_mysql_common/minimal_row_metadata.000001");
    let config = fixture_config(&connector, &broker, &file, "noria.t1");
    connector.run(&config);
    let status = connector.wait_exit(EXIT_TIMEOUT).expect("a definite error ends the run");
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    assert!(connector.logs().contains("binlog_row_metadata"), "{}", connector.logs());
}

/// The end event a commit records from a binlog file is the event the live server sends back for that file
/// and offset (`source::history::compare`, the check before every resume): each compares `Same`; another
/// CRC-32 at the same place, or a length that puts the start where no event begins, `Diverged`; a file the
/// server no longer has, `FileGone`.
#[tokio::test(flavor = "multi_thread")]
async fn end_events_compare_with_the_live_binlog() {
    use outbox_cdc::position::EndEvent;
    use outbox_cdc::position::{BinlogCoord, Flavor, Position};
    use outbox_cdc::source::history::{compare, Comparison};

    let db = MariaDb::start();
    let mut conn = db.conn().await;
    for i in 0..5 {
        business_tx(&mut conn, &format!("A-{i}")).await.expect("business transaction");
    }
    let (file, _): (String, u64) = conn.query_first("SHOW BINARY LOGS").await.unwrap().unwrap();
    // The file is complete once the server writes the next one.
    conn.query_drop("FLUSH BINARY LOGS").await.unwrap();
    let path = db.datadir().join(&file);
    let start = start_position(&path, &scan(&path).unwrap().header, None).unwrap();
    let settings = std::sync::Arc::new(ReaderSettings {
        server_id: 1,
        tables: Vec::new(),
        columns: Default::default(),
        on_update: Default::default(),
        heartbeat: Duration::from_secs(1),
        signal_table: None,
    });
    let mut reader = FilesReader::start(vec![path], settings, start).unwrap();
    let mut ends: Vec<(Position, EndEvent)> = Vec::new();
    while let Some(change) = reader.next().unwrap() {
        if let Change::Commit { position, end_event, .. } = change {
            ends.push((position.clone(), end_event.unwrap_or_else(|| panic!("no end event at {position}"))));
        }
    }
    assert!(ends.len() >= 5, "{ends:?}");
    // The dump connection is opened as the connector opens its connections; root, as `conn` is.
    let source = outbox_cdc::source::SourceConn::new(&outbox_cdc::config::Connection {
        host: "127.0.0.1".into(),
        port: db.port(),
        user: "root".into(),
        password: None,
        password_env: None,
        password_file: None,
        tls: Default::default(),
        tls_ca_file: None,
        connect_timeout: Duration::from_secs(10),
        auth: outbox_cdc::config::Auth::Password,
    })
    .unwrap();
    async fn compared(
        source: &outbox_cdc::source::SourceConn,
        conn: &mut mysql_async::Conn,
        position: &Position,
        end: EndEvent,
    ) -> Comparison {
        compare(source, conn, Flavor::MariaDb, 4242, position, end).await.unwrap()
    }
    for (position, end) in &ends {
        assert_eq!(compared(&source, &mut conn, position, *end).await, Comparison::Same, "{position}");
    }
    let (position, end) = ends.last().unwrap().clone();
    match compared(&source, &mut conn, &position, EndEvent { crc32: end.crc32 ^ 1, ..end }).await {
        Comparison::Diverged(detail) => assert!(detail.contains("has an event of type 16"), "{detail}"),
        other => panic!("another CRC-32 compared {other:?}"),
    }
    match compared(&source, &mut conn, &position, EndEvent { len: end.len + 3, ..end }).await {
        Comparison::Diverged(detail) => eprintln!("[history] a start inside an event: {detail}"),
        other => panic!("a start inside an event compared {other:?}"),
    }
    let purged =
        Position { coord: BinlogCoord { file: "mysql-bin.999999".into(), ..position.coord.clone() }, ..position };
    assert_eq!(compared(&source, &mut conn, &purged, end).await, Comparison::FileGone);
}
