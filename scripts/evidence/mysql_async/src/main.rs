//! Reads a MariaDB binlog from its first event to its end through `mysql_async 0.37.1` (feature
//! `binlog`, events parsed by `mysql_common`), the client the connector uses, and prints the same
//! lines as `../mysql_cdc/`: one per table map, inserted row, commit and error.
//!
//! Usage: `evidence-mysql-async PORT USER PASSWORD` (host 127.0.0.1). `scripts/evidence/run mysql_cdc`
//! runs it on the same binlog as mysql_cdc.

use futures_util::StreamExt;
use mysql_async::binlog::events::EventData;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStreamRequest, Conn, OptsBuilder, Value};
use std::collections::BTreeMap;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), mysql_async::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, user, password] = &args[..3] else { panic!("usage: PORT USER PASSWORD") };
    let opts = OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(port.parse().expect("PORT is a number"))
        .user(Some(user))
        .pass(Some(password))
        .prefer_socket(false);
    let mut conn = match Conn::new(opts).await {
        Ok(conn) => conn,
        Err(e) => {
            println!("CONNECT FAILED: {e}");
            std::process::exit(1);
        }
    };
    let first: (String, u64) = conn.query_first("SHOW BINARY LOGS").await?.expect("a binlog");
    let request = BinlogStreamRequest::new(4242).with_filename(first.0.as_bytes()).with_pos(4).with_non_blocking();
    let mut stream = conn.get_binlog_stream(request).await?;

    let mut rows_received: BTreeMap<String, usize> = BTreeMap::new();
    let mut errors = 0;
    while let Some(event) = stream.next().await {
        let data = match event.map(|e| e.read_data().map(|d| d.map(EventData::into_owned))) {
            Ok(Ok(Some(data))) => data,
            Ok(Ok(None)) => continue, // an event type mysql_common leaves unparsed (MariaDB GTID, ...)
            Ok(Err(e)) => {
                println!("ERROR      {e}");
                errors += 1;
                continue;
            }
            Err(e) => {
                println!("ERROR      {e}");
                errors += 1;
                break; // the stream itself failed
            }
        };
        match data {
            EventData::TableMapEvent(t) => println!("TABLE_MAP  {}.{}", t.database_name(), t.table_name()),
            EventData::RowsEvent(rows) => {
                let tme = stream.get_tme(rows.table_id()).expect("table map before rows");
                let table = format!("{}.{}", tme.database_name(), tme.table_name());
                for row in rows.rows(tme) {
                    let (_, after) = row?;
                    let cells: Vec<String> = after.expect("an insert").unwrap().iter().map(show).collect();
                    println!("ROW        {table} ({})", cells.join(", "));
                    *rows_received.entry(table.clone()).or_default() += 1;
                }
            }
            EventData::XidEvent(_) => println!("COMMIT"),
            _ => {}
        }
    }
    println!("SUMMARY    rows received per table: {rows_received:?}; errors: {errors}");
    Ok(())
}

/// One cell: text as a string when it is short UTF-8, other bytes by length or as hex.
fn show(cell: &BinlogValue<'_>) -> String {
    match cell {
        BinlogValue::Value(Value::Bytes(b)) if b.len() > 32 => format!("Bytes({} bytes)", b.len()),
        BinlogValue::Value(Value::Bytes(b)) => match std::str::from_utf8(b) {
            Ok(s) => format!("{s:?}"),
            Err(_) => format!("0x{}", b.iter().map(|x| format!("{x:02X}")).collect::<String>()),
        },
        BinlogValue::Value(v) => format!("{v:?}"),
        other => format!("{other:?}"),
    }
}
