//! The live binlog reader: a replication connection whose events a [`ChangeDecoder`] turns into [`Change`]s
//! grouped by source transaction. What the events mean (transaction boundaries, what a group's end decides,
//! statement-format writes, compressed transactions) is the decoder's, in [`super::change`]; this module
//! owns the connection: where the stream starts, what the server is asked for, and when it is dead.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! # MariaDB
//! MariaDB needs what mysql_async does not do for it: announce capability 4 (else GTID events are replaced
//! by `BEGIN` queries), resume with `@slave_connect_state` and a plain COM_BINLOG_DUMP, and parse GTID events
//! from their raw body (the decoder does). ANNOTATE_ROWS events (the SQL text) are not requested: they are
//! half of the bytes.
//!
//! # Liveness
//! The server is asked for heartbeats; a connection silent for three heartbeat periods is dead, which is a
//! transient error (the pipeline reconnects from the acknowledged watermark).

use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest};
use mysql_common::packets::{GnoInterval, Sid};

use super::change::event_type;
pub(crate) use super::change::{parse_event, read_event_bytes, FORMAT_DESCRIPTION};
pub use super::change::{Change, ChangeDecoder, ReaderSettings, Signal};
use super::{ServerInfo, SourceConn};
use crate::error::{classify_mysql, Error, Result};
use crate::position::{Flavor, Gtids, Position};

/// A replication connection decoding outbox rows.
pub struct BinlogReader {
    stream: BinlogStream,
    decoder: ChangeDecoder,
    idle_timeout: Duration,
    /// When the reader last started waiting after receiving events (≈ when the last event arrived).
    last_event: std::time::Instant,
    /// An event arrived since `last_event` was taken.
    received: bool,
}

impl BinlogReader {
    /// Opens a replication stream that resumes right after `position`.
    ///
    /// # Errors
    /// Classified connection errors; 1236 (position not in the binlogs) is definite.
    pub async fn start(
        conn: &SourceConn,
        info: &ServerInfo,
        settings: Arc<ReaderSettings>,
        position: Position,
    ) -> Result<Self> {
        let mut c = conn.connect().await?;
        let heartbeat_ns = settings.heartbeat.as_nanos() as u64;
        let mut setup = vec![format!("SET @master_heartbeat_period = {heartbeat_ns}")];
        if info.identity.flavor == Flavor::MariaDb {
            // Capability 4 (MARIA_SLAVE_CAPABILITY_GTID): real GTID events instead of BEGIN queries.
            setup.push("SET @mariadb_slave_capability = 4".into());
            if let Gtids::MariaDb(pos) = &position.gtids {
                setup.push(format!("SET @slave_connect_state = '{pos}'"));
                setup.push("SET @slave_gtid_strict_mode = 1".into());
                setup.push("SET @slave_gtid_ignore_duplicates = 0".into());
            }
        }
        for sql in &setup {
            c.query_drop(sql).await.map_err(|e| classify_mysql(&e).context(format_args!("`{sql}`")))?;
        }
        let resolved = super::resolve_tables(&mut c, &settings.tables).await?;
        let mut request = BinlogStreamRequest::new(settings.server_id);
        let sids: Vec<Sid<'static>>;
        match &position.gtids {
            Gtids::MySql(set) => {
                sids = mysql_sids(set)?;
                request = request.with_gtid().with_gtid_set(sids.iter().cloned());
            }
            // MariaDB resumes from @slave_connect_state with an empty file name.
            Gtids::MariaDb(_) => {}
            Gtids::None => {
                request = request.with_filename(position.coord.file.as_bytes()).with_pos(position.coord.pos);
            }
        }
        let stream = c
            .get_binlog_stream(request)
            .await
            .map_err(|e| classify_mysql(&e).context(format_args!("starting the binlog stream at {position}")))?;
        let mut decoder = ChangeDecoder::new(settings.clone(), info.checksum, position);
        decoder.use_server_names(&resolved);
        Ok(BinlogReader {
            stream,
            idle_timeout: settings.heartbeat * 3 + Duration::from_secs(1),
            decoder,
            last_event: std::time::Instant::now(),
            received: false,
        })
    }

    /// The next change.
    ///
    /// # Errors
    /// Transient for connection problems (including a missing heartbeat); definite for undecodable outbox
    /// rows and unsupported constructs on the outbox table.
    pub async fn next(&mut self) -> Result<Change> {
        loop {
            if let Some(change) = self.decoder.pop() {
                return Ok(change);
            }
            // An event that is already there needs no timer: the clock is read only when the reader is
            // about to wait (reading it per event was measurable).
            let next = match self.stream.next().now_or_never() {
                Some(next) => next,
                None => {
                    if std::mem::take(&mut self.received) {
                        self.last_event = std::time::Instant::now();
                    }
                    // NOTE: the deadline counts from the last event received, not from this call: the
                    // pipeline may cancel and re-issue `next()`, which must not restart the silence timer.
                    let deadline = tokio::time::Instant::from_std(self.last_event + self.idle_timeout);
                    match tokio::time::timeout_at(deadline, self.stream.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            return Err(Error::transient(format!(
                                "no binlog event or heartbeat for {:?}: the replication connection is dead",
                                self.idle_timeout
                            )))
                        }
                    }
                }
            };
            let event = match next {
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    return Err(classify_mysql(&e)
                        .context(format_args!("reading the binlog after {}", self.decoder.position())))
                }
                None => return Err(Error::transient("the server closed the replication stream")),
            };
            self.received = true;
            if matches!(event.header().event_type_raw(), event_type::HEARTBEAT | event_type::HEARTBEAT_V2) {
                crate::metrics::metrics().heartbeat();
            }
            self.decoder.handle(&event)?;
        }
    }
}

/// A MySQL GTID set as COM_BINLOG_DUMP_GTID wants it.
fn mysql_sids(set: &crate::position::mysql::GtidSet) -> Result<Vec<Sid<'static>>> {
    let mut sids = Vec::new();
    for (uuid, tag, intervals) in set.iter() {
        let mut sid = Sid::new(*uuid.as_bytes());
        if let Some(tag) = tag {
            let tag = mysql_common::packets::Tag::new(tag.as_str().to_string())
                .map_err(|e| Error::definite(format!("GTID tag {tag}: {e:?}")))?;
            sid = sid.with_tag(tag);
        }
        for range in intervals {
            // Both sides use half-open [start, end) intervals.
            sid = sid.with_interval(GnoInterval::new(range.start, range.end));
        }
        sids.push(sid);
    }
    Ok(sids)
}
