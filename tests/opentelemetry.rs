//! OpenTelemetry (`[opentelemetry] enabled`, README "Tracing") against a real MariaDB and broker, with the
//! spans received by an OTLP/HTTP receiver of the test's own (JSON, `OTEL_EXPORTER_OTLP_PROTOCOL =
//! http/json`, the encoding OTLP specifies; decoded here with serde_json, not by the SDK that wrote it).
//! Judged per event: the record's `traceparent` is the connector's `send` span, whose parent is the
//! backdated `outbox write` span, whose parent is the writer's span; from a `headers` JSON object and from
//! Debezium's `tracingspancontext` column; nothing for a row without a context; nothing exported for an
//! unsampled one, its context still passed on.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{free_port, insert_event, wait_until, Broker, Connector, Engine, MariaDb, OutboxRow};
use mysql_async::prelude::Queryable;
use serde_json::Value;

const TOPIC: &str = "outbox.event.order";
const TIMEOUT: Duration = Duration::from_secs(60);

/// Every OTLP/HTTP request body received (`POST /v1/traces`), as JSON.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Value>>>);

impl Receiver {
    /// Listens on `port` for the test's length, answering each request `200 {}`.
    fn start(port: u16) -> Receiver {
        let receiver = Receiver::default();
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let bodies = receiver.0.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let bodies = bodies.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut stream = stream;
                    // Keep-alive: one request after another on the connection.
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let path = line.split_whitespace().nth(1).unwrap_or_default().to_string();
                        let mut length = 0;
                        loop {
                            let mut header = String::new();
                            reader.read_line(&mut header).unwrap();
                            if header.trim().is_empty() {
                                break;
                            }
                            if let Some((name, value)) = header.split_once(':') {
                                if name.eq_ignore_ascii_case("content-length") {
                                    length = value.trim().parse().unwrap();
                                }
                            }
                        }
                        let mut body = vec![0; length];
                        reader.read_exact(&mut body).unwrap();
                        assert_eq!(path, "/v1/traces");
                        bodies.lock().unwrap().push(serde_json::from_slice(&body).expect("OTLP/JSON"));
                        let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
                        stream.write_all(answer.as_bytes()).unwrap();
                    }
                });
            }
        });
        receiver
    }

    /// Every span received, with its resource's `service.name`.
    fn spans(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for body in self.0.lock().unwrap().iter() {
            for resource in body["resourceSpans"].as_array().into_iter().flatten() {
                let service = attribute(&resource["resource"], "service.name").unwrap_or_default();
                for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                    for span in scope["spans"].as_array().into_iter().flatten() {
                        out.push((service.clone(), span.clone()));
                    }
                }
            }
        }
        out
    }
}

/// A string attribute of an OTLP/JSON span or resource.
fn attribute(of: &Value, key: &str) -> Option<String> {
    of["attributes"].as_array()?.iter().find(|a| a["key"] == key)?["value"]["stringValue"].as_str().map(str::to_string)
}

/// A 64-bit OTLP/JSON number, which the encoding writes as a string.
fn nanos(value: &Value) -> u128 {
    match value {
        Value::String(s) => s.parse().unwrap(),
        other => other.as_u64().unwrap().into(),
    }
}

/// A `traceparent`'s trace id, parent (span) id and flags.
fn parts(traceparent: &str) -> (String, String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!((fields.len(), fields[0]), (4, "00"), "{traceparent}");
    (fields[1].to_string(), fields[2].to_string(), fields[3].to_string())
}

/// Four events under one connector with tracing on: a writer's `traceparent` in the `headers` column, one
/// in Debezium's `tracingspancontext` column (placed as a header, Java `Properties` text), one without a
/// context, one whose writer did not sample it.
#[tokio::test(flavor = "multi_thread")]
async fn the_writers_trace_continues_through_the_connector_into_the_record() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let otlp = free_port();
    let receiver = Receiver::start(otlp);
    let mut conn = db.conn().await;
    conn.query_drop("ALTER TABLE shop.outbox_events ADD COLUMN tracingspancontext TEXT NULL").await.unwrap();

    let writer = |trace: &str, span: &str, flags: &str| format!("00-{trace}-{span}-{flags}");
    let (t1, p1) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let (t2, p2) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let (t4, p4) = ("11111111111111111111111111111111", "2222222222222222");
    let mut from_headers = OutboxRow::new("A-1");
    from_headers.headers = Some(serde_json::json!({ "traceparent": writer(t1, p1, "01"), "tracestate": "shop=1" }));
    insert_event(&mut conn, &from_headers).await.unwrap();
    let debezium = OutboxRow::new("A-2");
    let properties = format!("#\n#Mon Dec 07 00:00:00 UTC 2026\ntraceparent={}\n", writer(t2, p2, "01"));
    conn.exec_drop(
        "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at, tracingspancontext) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            &debezium.id,
            &debezium.aggregate_type,
            &debezium.aggregate_id,
            &debezium.event_type,
            debezium.schema_version,
            debezium.payload.to_string(),
            &debezium.occurred_at,
            &debezium.next_attempt_at,
            properties,
        ),
    )
    .await
    .unwrap();
    let without = OutboxRow::new("A-3");
    insert_event(&mut conn, &without).await.unwrap();
    let mut unsampled = OutboxRow::new("A-4");
    unsampled.headers = Some(serde_json::json!({ "traceparent": writer(t4, p4, "00") }));
    insert_event(&mut conn, &unsampled).await.unwrap();

    let mut connector = Connector::new();
    connector.write_config(&db, &broker, "[opentelemetry]\nenabled = true\n");
    connector.outbox_setting("additional_placement = [\"tracingspancontext:header\"]");
    connector
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{otlp}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    connector.run(&connector.config_path());
    let records = broker.read_all(TOPIC, 4, TIMEOUT);
    assert_eq!(records.len(), 4, "{}", connector.logs());
    let record = |id: &str| records.iter().find(|r| r.header_str("id") == Some(id)).expect("its record");
    assert!(
        wait_until(TIMEOUT, || receiver.spans().len() >= 4),
        "{} spans\n{}",
        receiver.spans().len(),
        connector.logs()
    );
    std::thread::sleep(Duration::from_millis(500));
    let spans = receiver.spans();
    let span =
        |id: &str| spans.iter().find(|(_, s)| s["spanId"] == id).unwrap_or_else(|| panic!("no span {id}: {spans:?}"));

    for (row, trace, writer_span) in [(&from_headers, t1, p1), (&debezium, t2, p2)] {
        let header = record(&row.id).header_str("traceparent").expect("a traceparent on the record");
        let (trace_id, send_id, flags) = parts(header);
        assert_eq!((trace_id.as_str(), flags.as_str()), (trace, "01"), "the writer's trace, sampled: {header}");
        assert_ne!(send_id, writer_span, "the record carries the connector's span, not the writer's");
        let (service, send) = span(&send_id);
        assert_eq!(service, "outbox-cdc");
        assert_eq!(send["name"], format!("send {TOPIC}"), "{send}");
        assert_eq!(send["kind"], 4, "SPAN_KIND_PRODUCER: {send}");
        assert_eq!(send["traceId"], trace, "{send}");
        for (key, value) in [
            ("messaging.system", "kafka"),
            ("messaging.operation.type", "send"),
            ("messaging.destination.name", TOPIC),
            ("messaging.message.id", row.id.as_str()),
            ("messaging.kafka.message.key", row.aggregate_id.as_str()),
        ] {
            assert_eq!(attribute(send, key).as_deref(), Some(value), "{key}: {send}");
        }
        let (_, write) = span(send["parentSpanId"].as_str().expect("the send span has a parent"));
        assert_eq!(write["name"], "outbox write shop.outbox_events", "{write}");
        assert_eq!(write["kind"], 1, "SPAN_KIND_INTERNAL: {write}");
        assert_eq!(write["parentSpanId"], writer_span, "a child of the writer's span: {write}");
        // Backdated to the row's occurred_at (written in UTC, to the microsecond; the span keeps the ms).
        let occurred = chrono_ms(&row.occurred_at);
        assert_eq!(nanos(&write["startTimeUnixNano"]) / 1_000_000, occurred, "{write}");
        assert!(nanos(&write["endTimeUnixNano"]) <= nanos(&send["startTimeUnixNano"]), "{write}\n{send}");
    }
    assert_eq!(record(&from_headers.id).header_str("tracestate"), Some("shop=1"), "tracestate passed on");
    assert!(record(&without.id).header("traceparent").is_none(), "no context, no traceparent added");
    let header = record(&unsampled.id).header_str("traceparent").expect("an unsampled context is passed on");
    assert_eq!(parts(header).0, t4);
    assert_eq!(parts(header).2, "00", "still unsampled: {header}");
    assert_eq!(spans.len(), 4, "two spans for each sampled event, none else: {spans:?}");
    assert!(spans.iter().all(|(_, s)| s["traceId"] == t1 || s["traceId"] == t2), "{spans:?}");
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// `YYYY-MM-DD HH:MM:SS.ffffff` (UTC) as ms since the epoch.
fn chrono_ms(text: &str) -> u128 {
    let (date, time) = text.split_once([' ', 'T']).unwrap();
    let d: Vec<i64> = date.split('-').map(|p| p.parse().unwrap()).collect();
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(|p| p.parse().unwrap()).collect();
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if d[1] <= 2 { (d[0] - 1, d[1] + 9) } else { (d[0], d[1] - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let ms: i64 = format!("{frac:0<3}")[..3].parse().unwrap();
    ((days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2]) * 1000 + ms) as u128
}

/// A collector that cannot be reached is said in the log, as the SDK reports it (an export error, by
/// name), and the events flow as without tracing: the record still gets the connector's `traceparent`.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_collector_is_logged_and_the_events_still_flow() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut row = OutboxRow::new("A-1");
    row.headers = Some(serde_json::json!({ "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" }));
    insert_event(&mut conn, &row).await.unwrap();
    let mut connector = Connector::new();
    connector.write_config(&db, &broker, "[opentelemetry]\nenabled = true\n");
    // Nothing listens on this port.
    connector
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{}", free_port()))
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    connector.run(&connector.config_path());
    let records = broker.read_all(TOPIC, 1, TIMEOUT);
    assert_eq!(records.len(), 1, "{}", connector.logs());
    let (_, span, _) = parts(records[0].header_str("traceparent").unwrap());
    assert_ne!(span, "00f067aa0ba902b7");
    assert!(
        wait_until(TIMEOUT, || connector.logs().contains("BatchSpanProcessor.ExportError")),
        "the export error is not in the log:\n{}",
        connector.logs()
    );
    assert!(connector.terminate().success(), "{}", connector.logs());
}
