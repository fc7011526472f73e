//! Column types the binlog gives differently than SQL, against a real MariaDB and a real broker: the
//! stream and the snapshot must write the same event for the same row, and preflight must refuse a type
//! the connector does not read, with the fix.

mod common;

use std::time::Duration;

use common::{Broker, Connector, Engine, MariaDb, Received};

const READ_TIMEOUT: Duration = Duration::from_secs(120);
const DEAD_LETTER: &str = "outbox-cdc.dead-letter";

/// The outbox table with `aggregate_type ENUM`, `event_type SET` and `occurred_at TIMESTAMP(6)`.
const ALTER_TO_ENUM_SET_TIMESTAMP: &str = "ALTER TABLE shop.outbox_events \
     MODIFY aggregate_type ENUM('order','payment') NOT NULL, \
     MODIFY event_type SET('Created','Paid','Shipped') NOT NULL, \
     MODIFY occurred_at TIMESTAMP(6) NOT NULL";

/// Rows as inserted in a `+05:30` session: (aggregate_type, aggregate_id, event_type, occurred_at), and
/// what every event of them must carry: the SET's labels in definition order, `occurred_at` in UTC with
/// the column's six digits.
const ROWS: &[(&str, &str, &str, &str, &str, &str)] = &[
    ("order", "o-1", "Created", "2026-03-01 12:34:56.789012", "Created", "2026-03-01T07:04:56.789012"),
    ("order", "o-1", "Paid,Created", "2026-03-01 12:34:57", "Created,Paid", "2026-03-01T07:04:57.000000"),
    ("payment", "p-1", "Paid", "2026-03-02 05:29:59.000001", "Paid", "2026-03-01T23:59:59.000001"),
    ("payment", "p-1", "Shipped,Created", "2026-03-02 05:30:00.5", "Created,Shipped", "2026-03-02T00:00:00.500000"),
];

/// Inserts [`ROWS`] with ids `<prefix>-<i>`, each in its own transaction, in the server's default zone.
fn insert_rows(db: &MariaDb, prefix: &str) {
    for (i, (aggregate_type, aggregate_id, event_type, occurred_at, ..)) in ROWS.iter().enumerate() {
        db.sql(&format!(
            "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, \
             payload, occurred_at, next_attempt_at) VALUES ('{prefix}-{i}', '{aggregate_type}', \
             '{aggregate_id}', '{event_type}', 1, '{{\"n\": {i}}}', '{occurred_at}', NOW(6))"
        ));
    }
}

fn envelope(r: &Received) -> serde_json::Value {
    serde_json::from_slice(r.value.as_deref().expect("a value")).expect("an envelope")
}

/// How long a test waits for the connector to stream.
const STREAMING_TIMEOUT: Duration = Duration::from_secs(120);

/// Regression: with `occurred_at TIMESTAMP(6)` every streamed row went to the dead-letter topic ("column
/// occurred_at has an unexpected type": the binlog carries seconds since the epoch), and with
/// `aggregate_type ENUM('order','payment')` the stream routed to `outbox.event.1`/`.2` (the binlog
/// carries the label's index) while the snapshot routed to `outbox.event.order`. A SET arrives as a
/// bitmask. On a server whose time zone is not UTC, the snapshot and the stream must now write the same
/// event for the same row: same topic, same labels, `occurred_at` in UTC with the column's digits.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_and_stream_read_timestamp_enum_and_set_alike() {
    let db = MariaDb::builder().arg("--default-time-zone=+05:30").start();
    db.sql(ALTER_TO_ENUM_SET_TIMESTAMP);
    let broker = Broker::start(Engine::Memory);
    insert_rows(&db, "snap");
    // One row per chunk: the first is read by a plain query (text), the others by a prepared one (binary).
    let mut connector = Connector::start(&db, &broker, "[snapshot]\nmode = \"initial\"\nchunk_rows = 1\n");
    connector.wait_streaming(STREAMING_TIMEOUT);
    insert_rows(&db, "stream");

    let mut records = Vec::new();
    for topic in ["outbox.event.order", "outbox.event.payment"] {
        let got = broker.read_all(topic, 4, READ_TIMEOUT);
        assert_eq!(got.len(), 4, "{topic}: {} records\n{}", got.len(), connector.logs());
        records.extend(got.into_iter().map(|r| (topic, r)));
    }
    for (i, (aggregate_type, aggregate_id, _, _, event_type, occurred_at)) in ROWS.iter().enumerate() {
        let topic = format!("outbox.event.{aggregate_type}");
        let mut seen = Vec::new();
        for source in ["snap", "stream"] {
            let id = format!("{source}-{i}");
            let (on, record) = records
                .iter()
                .find(|(_, r)| r.header_str("id") == Some(&id))
                .unwrap_or_else(|| panic!("{id} was not published on a routed topic\n{}", connector.logs()));
            assert_eq!(*on, topic, "{id}");
            assert_eq!(record.header_str("source") == Some("snapshot"), source == "snap", "{id}");
            let mut value = envelope(record);
            assert_eq!(
                (&value["aggregate_type"], &value["aggregate_id"], &value["type"], &value["occurred_at"]),
                (&(*aggregate_type).into(), &(*aggregate_id).into(), &(*event_type).into(), &(*occurred_at).into()),
                "{id}: {value}"
            );
            value["event_id"] = serde_json::Value::Null;
            seen.push(value);
        }
        assert_eq!(seen[0], seen[1], "row {i}: the snapshot's and the stream's events differ");
    }
    assert!(broker.read_all(DEAD_LETTER, 1, Duration::from_secs(3)).is_empty(), "{}", connector.logs());

    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("[ok  ] table shop.outbox_events column types"), "{out}");
    assert!(out.contains("[ok  ] table shop.outbox_events snapshot key order"), "{out}");
    connector.terminate();
}

/// `check` refuses each mapped column whose type the connector does not read, names the column, its
/// type and the types to use, and exits 2; the reference table passes. It also refuses a snapshot key
/// column whose order the snapshot cannot resume in (a SET sorts by its bitmask).
#[tokio::test(flavor = "multi_thread")]
async fn check_refuses_unreadable_column_types() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    // A snapshot: the key columns' order is checked only when the connector will scan them.
    connector.write_config(&db, &broker, "[snapshot]\nmode = \"initial\"\n");
    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("[ok  ] table shop.outbox_events column types"), "{out}");

    db.sql(
        "ALTER TABLE shop.outbox_events MODIFY id BINARY(8) NOT NULL, MODIFY schema_version DOUBLE NOT NULL, \
         MODIFY aggregate_id VARCHAR(128) CHARACTER SET swe7 NOT NULL, MODIFY occurred_at DATE NOT NULL, \
         MODIFY event_type VARBINARY(128) NOT NULL, MODIFY payload BLOB NOT NULL, \
         MODIFY aggregate_type SET('payment','order') NOT NULL",
    );
    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert!(out.contains("[FAIL] table shop.outbox_events column types"), "{out}");
    for expected in [
        "column `id` (id) of shop.outbox_events is binary(8) (a fixed-length binary string other than \
         BINARY(16) (a UUID): its bytes are not text); change it to CHAR/VARCHAR/TEXT in utf8mb4, BINARY(16) \
         (a UUID) or an integer type",
        // Issue 18: a text schema_version is read (an envelope string); a floating-point one is not.
        "column `schema_version` (schema_version) of shop.outbox_events is double",
        "an integer type (SMALLINT UNSIGNED) or CHAR/VARCHAR in utf8mb4",
        "column `aggregate_id` (aggregate_id) of shop.outbox_events is varchar(128) (character set swe7: the connector has no decoder for it",
        "column `occurred_at` (occurred_at) of shop.outbox_events is date",
        "DATETIME(6) or TIMESTAMP(6)",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in\n{out}");
    }
    // A SET in the snapshot key sorts by its bitmask: the snapshot cannot resume a scan in that order.
    assert!(out.contains("[FAIL] table shop.outbox_events snapshot key order"), "{out}");
    assert!(
        out.contains("column aggregate_type, whose type set('payment','order') it cannot order outside the server"),
        "{out}"
    );
    // The columns that are fine are not named: variable-length binary strings are read as UTF-8 text,
    // identically by the stream and the snapshot (a row whose bytes are not UTF-8 is undecodable).
    for fine in ["`aggregate_type`", "`event_type`", "`payload`", "`headers`"] {
        assert!(!out.contains(&format!("column {fine}")), "{fine} named in\n{out}");
    }
}

/// A column altered to a type the connector does not read while it runs: preflight passed, so the
/// TABLE_MAP says it. Each row of such a table map is undecodable with the reason and the fix
/// (dead-lettered by default), never published with a guessed value: before, a DATE `occurred_at`
/// was published as `…T00:00:00` (a snapshot prints `2026-03-01`), and a BINARY(n) aggregate id
/// without the zero bytes a snapshot reads (BINARY(16) is read, as a UUID: tests/table_shapes.rs).
#[tokio::test(flavor = "multi_thread")]
async fn type_altered_while_streaming_is_undecodable_with_the_fix() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "");
    connector.wait_streaming(STREAMING_TIMEOUT);
    let insert = |id: &str, aggregate_id: &str| {
        db.sql(&format!(
            "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, \
             payload, occurred_at, next_attempt_at) VALUES ('{id}', 'order', '{aggregate_id}', 'Created', 1, \
             '{{}}', '2026-03-01', NOW(6))"
        ))
    };
    insert("fine-1", "a-1");
    assert_eq!(broker.read_all("outbox.event.order", 1, READ_TIMEOUT).len(), 1, "{}", connector.logs());

    db.sql("ALTER TABLE shop.outbox_events MODIFY occurred_at DATE NOT NULL");
    insert("date-1", "a-2");
    db.sql("ALTER TABLE shop.outbox_events MODIFY occurred_at DATETIME(6) NOT NULL, MODIFY aggregate_id BINARY(8) NOT NULL");
    insert("binary-1", "a-3");

    let letters = broker.read_all(DEAD_LETTER, 2, READ_TIMEOUT);
    let reason = |id: &str| {
        letters
            .iter()
            .find(|r| r.header_str("id") == Some(id))
            .and_then(|r| r.header_str("dead_letter_reason"))
            .unwrap_or_else(|| panic!("{id} was not dead-lettered\n{}", connector.logs()))
            .to_string()
    };
    let date = reason("date-1");
    assert!(
        date.contains("column `occurred_at` (occurred_at)") && date.contains("DATETIME(6) or TIMESTAMP(6)"),
        "{date}"
    );
    let binary = reason("binary-1");
    assert!(
        binary.contains("column `aggregate_id` (aggregate_id)") && binary.contains("fixed-length binary string"),
        "{binary}"
    );
    let published = broker.read_all_quiet("outbox.event.order", 1, Duration::from_secs(3), READ_TIMEOUT);
    assert_eq!(published.len(), 1, "only the row before the ALTER is published: {published:?}");
    assert!(connector.is_running(), "{}", connector.logs());
    connector.terminate();
}

/// Rows whose text columns are in legacy character sets: an id in big5, an aggregate id in latin1
/// (`€` is 0x80: MySQL's latin1 is Windows-1252), the event type and the payload in gbk. The snapshot reads
/// them through its utf8mb4 session (the server converts), the stream from the binlog (the columns' own
/// bytes, decoded by their TABLE_MAP character set): the same events, in UTF-8, on the same topic and key.
/// Before, `check` and `run` refused every character set but UTF-8 and ascii.
#[tokio::test(flavor = "multi_thread")]
async fn legacy_charsets_snapshot_and_stream_alike() {
    use mysql_async::prelude::Queryable;
    const TOPIC: &str = "outbox.event.order";
    /// (id suffix, aggregate id, event type, payload).
    const ROWS: &[(&str, &str, &str, &str)] = &[
        ("訂單-1", "Zürich-€", "订单已创建", r#"{"城市": "北京", "n": 1}"#),
        ("訂單-2", "Ærøskøbing", "订单已支付", r#"{"城市": "上海"}"#),
    ];
    let db = MariaDb::start();
    db.sql(
        "ALTER TABLE shop.outbox_events MODIFY id VARCHAR(64) CHARACTER SET big5 NOT NULL, \
         MODIFY aggregate_id VARCHAR(128) CHARACTER SET latin1 NOT NULL, \
         MODIFY event_type VARCHAR(128) CHARACTER SET gbk NOT NULL, \
         MODIFY payload LONGTEXT CHARACTER SET gbk NOT NULL",
    );
    let mut conn = db.conn().await;
    let insert = async |conn: &mut mysql_async::Conn, prefix: &str| {
        for (id, aggregate_id, event_type, payload) in ROWS {
            conn.exec_drop(
                "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, \
                 payload, occurred_at, next_attempt_at) VALUES (?, 'order', ?, ?, 1, ?, '2026-03-01', NOW(6))",
                (format!("{prefix}-{id}"), aggregate_id, event_type, payload),
            )
            .await
            .unwrap();
        }
    };
    insert(&mut conn, "snap").await;
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "[snapshot]\nmode = \"initial\"\n");
    connector.wait_streaming(STREAMING_TIMEOUT);
    insert(&mut conn, "stream").await;

    let records = broker.read_all(TOPIC, 2 * ROWS.len(), READ_TIMEOUT);
    assert_eq!(records.len(), 2 * ROWS.len(), "{records:?}\n{}", connector.logs());
    for (id, aggregate_id, event_type, payload) in ROWS {
        let mut seen = Vec::new();
        for source in ["snap", "stream"] {
            let id = format!("{source}-{id}");
            let record = records
                .iter()
                .find(|r| r.header_str("id") == Some(&id))
                .unwrap_or_else(|| panic!("{id} was not published\n{records:?}\n{}", connector.logs()));
            assert_eq!(record.header_str("source") == Some("snapshot"), source == "snap", "{id}");
            assert_eq!(record.key.as_deref(), Some(aggregate_id.as_bytes()), "{id}");
            let mut value = envelope(record);
            let data: serde_json::Value = serde_json::from_str(payload).unwrap();
            assert_eq!(
                (&value["aggregate_id"], &value["type"], &value["data"]),
                (&(*aggregate_id).into(), &(*event_type).into(), &data),
                "{id}: {value}"
            );
            value["event_id"] = serde_json::Value::Null;
            seen.push(value);
        }
        assert_eq!(seen[0], seen[1], "{id}: the snapshot's and the stream's events differ");
    }
    assert!(broker.read_all(DEAD_LETTER, 1, Duration::from_secs(3)).is_empty(), "{}", connector.logs());
    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("[ok  ] table shop.outbox_events column types"), "{out}");
    connector.terminate();
}

/// The stream's decoders against the server's own conversion (`CONVERT(bytes USING cs)`, returned in the
/// utf8mb4 session as the snapshot reads text): every character set the server has is decoded to the same
/// text or refused with the fix; every byte of each single-byte one, and text the server writes in each
/// multi-byte one. What the decoder gives must be what the server gives; where it would differ (or the
/// server has no character, `?`) the decoder refuses: the row is undecodable, never published as other
/// text than the snapshot's. Every collation id the server lists names its character set.
#[tokio::test(flavor = "multi_thread")]
async fn charsets_decode_as_the_server_converts() {
    use mysql_async::prelude::Queryable;
    use outbox_cdc::source::charset::{collation_charset, Charset};
    let db = MariaDb::start();
    let mut conn = db.conn().await;
    let ids: Vec<(u64, String)> = conn
        .query("SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATION_CHARACTER_SET_APPLICABILITY")
        .await
        .unwrap();
    assert!(ids.len() > 200, "{} collations", ids.len());
    let wrong: Vec<_> = ids
        .iter()
        .filter(|(id, charset)| collation_charset(u16::try_from(*id).unwrap()).as_deref() != Some(charset.as_str()))
        .collect();
    assert!(wrong.is_empty(), "collation ids naming another character set: {wrong:?}");

    let charsets: Vec<(String, u32)> =
        conn.query("SELECT CHARACTER_SET_NAME, MAXLEN FROM information_schema.CHARACTER_SETS").await.unwrap();
    let (mut decoded, mut refused, mut mismatches) = (Vec::new(), Vec::new(), Vec::new());
    // Characters the server has that the decoder reads alike, by character set; and those it refuses.
    let (mut read, mut refused_characters) = (std::collections::BTreeMap::<String, usize>::new(), Vec::new());
    // `binary` is no text: a binary string's bytes are published as they are, and must be UTF-8.
    for (name, max_len) in charsets.into_iter().filter(|(name, _)| name != "binary") {
        let charset = match Charset::by_name(&name) {
            Ok(charset) => charset,
            Err(why) => {
                assert!(why.contains("utf8mb4"), "{why}");
                refused.push(name);
                continue;
            }
        };
        for row in characters(&mut conn, &name, max_len).await {
            // One query per row of characters, each converted on its own.
            let columns = vec![format!("CONVERT(UNHEX(?) USING {name})"); row.len()].join(", ");
            let hexes: Vec<String> = row.iter().map(|c| c.iter().map(|b| format!("{b:02X}")).collect()).collect();
            let server: mysql_async::Row =
                conn.exec_first(format!("SELECT {columns}"), hexes.clone()).await.unwrap().unwrap();
            for (i, bytes) in row.iter().enumerate() {
                let server: Option<String> = server.get(i).unwrap();
                let server = server.unwrap_or_default();
                let has_character = !server.contains('?') && !server.contains('\u{fffd}');
                match charset.decode(bytes) {
                    Ok(text) if text == server => *read.entry(name.clone()).or_default() += 1,
                    Ok(text) => mismatches.push(format!("{name} {}: server {server:?}, ours {text:?}", hexes[i])),
                    Err(_) if has_character => refused_characters.push(format!("{name} {}", hexes[i])),
                    Err(_) => {}
                }
            }
        }
        decoded.push(name);
    }
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
    // The refused characters are the server's own extensions (big5's ETEN rows, EUC-JP's user-defined
    // rows, the single-byte sets' odd bytes): the common text of each set decodes.
    for (name, at_least) in [("latin1", 256), ("gbk", 21_000), ("big5", 13_000), ("sjis", 7_000), ("ujis", 12_000)] {
        let got = read.get(name).copied().unwrap_or(0);
        assert!(got >= at_least, "{name}: {got} characters read alike, expected {at_least}+");
    }
    for name in ["latin1", "gbk", "big5", "sjis", "cp932", "ujis", "euckr", "koi8r", "cp1250", "utf16", "utf32"] {
        assert!(decoded.iter().any(|d| d == name), "{name} not decoded; decoded {decoded:?}, refused {refused:?}");
    }
    eprintln!("decoded: {decoded:?}\nrefused: {refused:?}\nread alike: {read:?}");
    eprintln!("characters the server has that the decoder refuses: {}", refused_characters.len());
}

/// The characters of a character set to compare, in rows: every byte of a single-byte one; every lead and
/// trail byte pair of a double-byte one (and EUC-JP's three-byte JIS X 0212 rows); text the server writes
/// in a Unicode one.
async fn characters(conn: &mut mysql_async::Conn, name: &str, max_len: u32) -> Vec<Vec<Vec<u8>>> {
    use mysql_async::prelude::Queryable;
    const SAMPLE: &str = "Zürich Ærø € 中文訂單 日本語テキスト 한국어 Привет Ελλάδα שלום 🚀 ~\\";
    let pairs = |lead: &[u8]| -> Vec<Vec<u8>> {
        (0x40..=0xfeu8).filter(|t| *t != 0x7f).map(|t| [lead, &[t]].concat()).collect()
    };
    match (max_len, name) {
        (1, _) => vec![(0..=255u8).map(|b| vec![b]).collect()],
        (_, "big5" | "gbk" | "gb2312" | "sjis" | "cp932" | "euckr" | "ujis" | "eucjpms") => {
            let mut rows: Vec<Vec<Vec<u8>>> = (0x81..=0xfeu8).map(|lead| pairs(&[lead])).collect();
            if name == "ujis" || name == "eucjpms" {
                rows.extend((0xa1..=0xfeu8).map(|lead| pairs(&[0x8f, lead])));
            }
            rows
        }
        _ => {
            let hex: String =
                conn.exec_first(format!("SELECT HEX(CONVERT(? USING {name}))"), (SAMPLE,)).await.unwrap().unwrap();
            let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            vec![vec![bytes]]
        }
    }
}

/// An ENUM in latin1 with labels outside ASCII: the TABLE_MAP carries the labels in the column's
/// character set (`ENUM_AND_SET_*_CHARSET`), and the stream publishes them as the snapshot does. Before,
/// a label that was not UTF-8 made the table map unreadable and stopped the connector.
#[tokio::test(flavor = "multi_thread")]
async fn latin1_enum_labels_snapshot_and_stream_alike() {
    const TOPIC: &str = "outbox.event.order";
    let db = MariaDb::start();
    db.sql(
        "ALTER TABLE shop.outbox_events MODIFY event_type ENUM('Créé','Payé','Expédié') CHARACTER SET latin1 NOT NULL",
    );
    let insert = |id: &str, event_type: &str| {
        db.sql(&format!(
            "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, \
             payload, occurred_at, next_attempt_at) VALUES ('{id}', 'order', 'o-1', '{event_type}', 1, '{{}}', \
             '2026-03-01', NOW(6))"
        ))
    };
    insert("snap-1", "Payé");
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "[snapshot]\nmode = \"initial\"\n");
    connector.wait_streaming(STREAMING_TIMEOUT);
    insert("stream-1", "Payé");
    insert("stream-2", "Expédié");
    let records = broker.read_all(TOPIC, 3, READ_TIMEOUT);
    let types: Vec<(Option<&str>, serde_json::Value)> =
        records.iter().map(|r| (r.header_str("id"), envelope(r)["type"].clone())).collect();
    assert_eq!(
        types,
        [(Some("snap-1"), "Payé".into()), (Some("stream-1"), "Payé".into()), (Some("stream-2"), "Expédié".into())],
        "{}",
        connector.logs()
    );
    assert!(connector.is_running(), "{}", connector.logs());
    connector.terminate();
}
