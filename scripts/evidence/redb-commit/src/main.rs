//! Opens a redb 4.6.0 database file (the version in the connector's Cargo.lock), writes one key in a
//! write transaction and commits it. Run under strace to see which sync calls the commit makes:
//! `scripts/evidence/run sled` (the comparison).
//!
//! Usage: `evidence-redb-commit FILE`

use redb::{Database, TableDefinition};

const TABLE: TableDefinition<&str, &str> = TableDefinition::new("checkpoint");

fn main() {
    let path = std::env::args().nth(1).expect("usage: evidence-redb-commit FILE");
    let db = Database::create(&path).expect("create redb file");
    let tx = db.begin_write().expect("begin write");
    tx.open_table(TABLE).expect("open table").insert("checkpoint", "0-1-42").expect("insert");
    eprintln!("--- commit() starts ---");
    tx.commit().expect("commit");
    eprintln!("--- commit() returned Ok ---");
}
