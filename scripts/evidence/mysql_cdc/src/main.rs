//! Reads a MariaDB binlog from its first event to its end through `mysql_cdc 0.2.1` and prints what
//! the crate hands to its caller: one line per table map, row event, commit and error.
//!
//! Usage: `evidence-mysql-cdc PORT USER PASSWORD [--tls]` (host 127.0.0.1). `--tls` asks for
//! `SslMode::Require`. `scripts/evidence/run mysql_cdc` starts the server, writes the rows and runs this.

use mysql_cdc::binlog_client::BinlogClient;
use mysql_cdc::binlog_options::BinlogOptions;
use mysql_cdc::events::binlog_event::BinlogEvent;
use mysql_cdc::events::row_events::mysql_value::MySqlValue;
use mysql_cdc::replica_options::ReplicaOptions;
use mysql_cdc::ssl_mode::SslMode;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Errors in a row before we stop reading (the crate's iterator never ends on its own after a
/// broken connection: every further `next()` is another error).
const MAX_ERRORS_IN_A_ROW: usize = 3;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, user, password] = &args[..3] else { panic!("usage: PORT USER PASSWORD [--tls]") };
    let options = ReplicaOptions {
        hostname: "127.0.0.1".to_owned(),
        port: port.parse().expect("PORT is a number"),
        username: user.clone(),
        password: password.clone(),
        ssl_mode: if args.get(3).is_some_and(|a| a == "--tls") { SslMode::Require } else { SslMode::Disabled },
        // Read up to the end of the binlog, then the server sends EOF and the iterator ends.
        blocking: false,
        heartbeat_interval: Duration::from_secs(1),
        binlog: BinlogOptions::from_start(),
        ..Default::default()
    };
    let mut client = BinlogClient::new(options);
    let events = match client.replicate() {
        Ok(events) => events,
        Err(e) => {
            println!("CONNECT FAILED: {e:?}");
            std::process::exit(1);
        }
    };

    let mut tables: HashMap<u64, String> = HashMap::new();
    let mut rows_received: BTreeMap<String, usize> = BTreeMap::new();
    let (mut errors, mut errors_in_a_row) = (0, 0);
    for item in events {
        match item {
            Ok((_header, event)) => {
                errors_in_a_row = 0;
                match event {
                    BinlogEvent::TableMapEvent(t) => {
                        let name = format!("{}.{}", t.database_name, t.table_name);
                        println!("TABLE_MAP  {name}");
                        tables.insert(t.table_id, name);
                    }
                    BinlogEvent::WriteRowsEvent(w) => {
                        let table = tables.get(&w.table_id).cloned().unwrap_or_default();
                        for row in &w.rows {
                            let cells: Vec<String> = row.cells.iter().map(show).collect();
                            println!("ROW        {table} ({})", cells.join(", "));
                        }
                        *rows_received.entry(table).or_default() += w.rows.len();
                    }
                    BinlogEvent::XidEvent(_) => println!("COMMIT"),
                    _ => {}
                }
            }
            Err(e) => {
                // What the crate gives the caller for a failed event: the error alone, no event
                // header (so no table, no binlog position).
                println!("ERROR      {}", short(&format!("{e:?}")));
                errors += 1;
                errors_in_a_row += 1;
                if errors_in_a_row == MAX_ERRORS_IN_A_ROW {
                    println!("(stopping: {MAX_ERRORS_IN_A_ROW} errors in a row)");
                    break;
                }
            }
        }
    }
    println!("SUMMARY    rows received per table: {rows_received:?}; errors: {errors}");
}

/// One cell, with long strings and blobs shown by length.
fn show(cell: &Option<MySqlValue>) -> String {
    match cell {
        None => "NULL".to_owned(),
        Some(MySqlValue::Blob(b)) if b.len() > 32 => format!("Blob({} bytes)", b.len()),
        Some(MySqlValue::String(s)) if s.len() > 32 => format!("String({} bytes)", s.len()),
        Some(v) => format!("{v:?}"),
    }
}

fn short(s: &str) -> String {
    if s.chars().count() <= 200 {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(200).collect::<String>())
    }
}
