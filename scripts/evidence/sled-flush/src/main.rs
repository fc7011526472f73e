//! Opens a sled 0.34.7 database in DIR, inserts one key, and calls `Db::flush()`, which sled
//! documents as "flushes all dirty IO buffers and calls fsync". `scripts/evidence/run sled` runs
//! this under strace to show which sync calls `flush()` makes.
//!
//! sled's background flusher (an fsync every 500 ms by default) is turned off, so that every sync
//! call between the two stderr markers is one that `flush()` made. That does not change what
//! `flush()` does; with the default config the trace also shows the background thread's fsync.
//!
//! Usage: `evidence-sled-flush DIR`

fn main() {
    let dir = std::env::args().nth(1).expect("usage: evidence-sled-flush DIR");
    let db = sled::Config::new().path(&dir).flush_every_ms(None).open().expect("open sled db");
    db.insert(b"checkpoint", b"0-1-42".as_slice()).expect("insert");
    eprintln!("--- flush() starts ---");
    let bytes = db.flush().expect("flush");
    eprintln!("--- flush() returned Ok({bytes}) ---");
}
