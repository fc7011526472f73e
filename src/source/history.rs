//! Is the server's binlog still the history the checkpoint was read from?
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! A GTID names a transaction only within one history. After `RESET MASTER` (binlogs and GTIDs start over
//! on the same server), or on a server restored from an older backup under the same `server_id`, the
//! checkpoint's GTID can name *another* transaction once the new history has written that many. The server
//! then resumes after it without complaint, and every outbox row the new history wrote up to there is
//! skipped. A file name and offset are no better: the new history reuses the file names.
//!
//! So the checkpoint keeps the transaction's last event as it was written ([`EndEvent`]: its length and a
//! CRC-32 of its bytes). Its header holds the commit time and the server id, its body the xid (or the
//! statement), so another transaction that happens to end at the same offset has other bytes. Before a
//! resume, [`compare`] reads the event at that file and offset back from the server with a short
//! file-position binlog dump, and a difference is a definite error.
//!
//! It cannot compare when the file is gone (purged; whether the position is still resumable is then
//! [`super::position_purged`]'s question), nor on another server (`--accept-new-server`: its files
//! are its own), nor for checkpoints written before this record existed, or at a snapshot's start point,
//! which no transaction ends.

use std::time::Duration;

use futures_util::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStreamRequest, Conn};

use crate::error::mysql_codes::FATAL_READING_BINLOG;
use crate::error::{classify_mysql, Error, Result};
use crate::position::{EndEvent, EVENT_HEADER_LEN};
use crate::position::{Flavor, Position};

/// What [`compare`] could establish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Comparison {
    /// The server's binlog has the checkpoint's last event where the checkpoint says.
    Same,
    /// The checkpoint's binlog file is no longer on the server; nothing to compare with.
    FileGone,
    /// The server's binlog has something else there: the history diverged. The text says what was found.
    Diverged(String),
}

/// How long reading one event back may take before the comparison counts as a transient failure.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Event flag of events a server makes up for a dump (fake ROTATE, …), never written to a file.
const LOG_EVENT_ARTIFICIAL: u16 = 0x20;

/// Compares the checkpoint's last event, `end` ending at `position`, with what the server's binlog has
/// there. `conn` is an ordinary connection (it lists the binlogs), `source` opens the dump;
/// `replica_server_id` is the connector's replication id.
///
/// # Errors
/// Transient for connection problems and a server that does not answer in time; definite for other server
/// errors, such as a missing privilege. A different history is not an error: it is [`Comparison::Diverged`].
pub async fn compare(
    source: &super::SourceConn,
    conn: &mut Conn,
    flavor: Flavor,
    replica_server_id: u32,
    position: &Position,
    end: EndEvent,
) -> Result<Comparison> {
    let coord = &position.coord;
    let start = match coord.pos.checked_sub(u64::from(end.len)) {
        Some(start) if start >= 4 && end.len as usize >= EVENT_HEADER_LEN => start,
        _ => {
            return Err(Error::definite(format!(
                "the checkpoint's last event ({} bytes ending at {coord}) cannot be in a binlog file: the \
                 checkpoint record is damaged; move the state directory away and snapshot again",
                end.len
            )))
        }
    };
    let logs = super::binary_logs(conn).await?;
    let Some((_, size)) = logs.iter().find(|(name, _)| *name == coord.file) else {
        return Ok(Comparison::FileGone);
    };
    if *size < coord.pos {
        return Ok(Comparison::Diverged(format!(
            "binlog {} now ends at byte {size}, before {}",
            coord.file, coord.pos
        )));
    }
    let read = async {
        let mut dump = source.connect().await?;
        if flavor == Flavor::MariaDb {
            // As the stream asks, so that MariaDB sends its events unchanged.
            dump.query_drop("SET @mariadb_slave_capability = 4").await.map_err(|e| classify_mysql(&e))?;
        }
        let request = BinlogStreamRequest::new(replica_server_id).with_filename(coord.file.as_bytes()).with_pos(start);
        // NOTE: the file is listed and long enough, so a server that cannot read an event at `start` (1236)
        // is telling us that no event starts there in this history.
        let no_event = |e: &mysql_async::Error| match e {
            mysql_async::Error::Server(server) if server.code == FATAL_READING_BINLOG => Some(Comparison::Diverged(
                format!("no event starts at {}:{start} (the server says: {})", coord.file, server.message),
            )),
            _ => None,
        };
        let mut stream = match dump.get_binlog_stream(request).await {
            Ok(stream) => stream,
            Err(e) => return no_event(&e).ok_or_else(|| classify_mysql(&e)),
        };
        let found = loop {
            let event = match stream.next().await {
                Some(Ok(event)) => event,
                Some(Err(e)) => match no_event(&e) {
                    Some(diverged) => break diverged,
                    None => return Err(classify_mysql(&e)),
                },
                None => return Err(Error::transient("the server closed the binlog dump before sending an event")),
            };
            let header = event.header();
            // The dump opens with a made-up ROTATE and the file's FORMAT_DESCRIPTION, both with log_pos 0.
            if header.log_pos() == 0 || header.flags_raw() & LOG_EVENT_ARTIFICIAL != 0 {
                continue;
            }
            let found = EndEvent::of(&event);
            break if found == end && u64::from(header.log_pos()) == coord.pos {
                Comparison::Same
            } else {
                Comparison::Diverged(format!(
                    "at {}:{start} the server has an event of type {} and {} bytes, written at {} by server {}, \
                     ending at {}, not the checkpoint's transaction end ({} bytes, CRC-32 {:08x}; found {:08x})",
                    coord.file,
                    header.event_type_raw(),
                    header.event_size(),
                    header.timestamp(),
                    header.server_id(),
                    header.log_pos(),
                    end.len,
                    end.crc32,
                    found.crc32
                ))
            };
        };
        // A dump connection cannot be reset for reuse; closing it is best effort.
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.close()).await;
        Ok(found)
    };
    tokio::time::timeout(READ_TIMEOUT, read).await.unwrap_or_else(|_| {
        Err(Error::transient(format!(
            "reading the checkpoint's last event back from {} timed out after {READ_TIMEOUT:?}",
            coord.file
        )))
    })
}

/// The definite error for a diverged history.
pub fn diverged_error(position: &Position, detail: &str) -> Error {
    Error::definite(format!(
        "the server's binlog history diverged from the checkpoint ({position}): {detail}. The checkpoint was \
         read from another history of this server (RESET MASTER, a restored backup, or a server rebuilt under \
         the same server_id); resuming at its GTID or offset would skip or repeat transactions of the new \
         history. Its events are still in the outbox table: move the state directory away and start with \
         snapshot.mode = \"initial\" (or restart with snapshot.mode = \"when_needed\"), then check with \
         `outbox-cdc audit`"
    ))
}
