//! Binlog events to [`Change`]s: the state machine that groups events into source transactions, decodes the
//! outbox rows in them and keeps the position after each transaction. It does not know where events come
//! from: the live replication stream ([`super::binlog`]) and binlog files ([`super::files`]) feed it alike.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! # What it owns, and what it may import
//! It owns what events mean (group boundaries, outbox rows, statements, compressed transactions), the state
//! of the group being read (`Tx`, replaced whole at each boundary, so nothing of one group outlives it),
//! and the reading of whole events from bytes ([`read_event_bytes`]: payloads here, files in
//! [`super::files`]). It may import the plain types (`crate::position`, `crate::config`, `crate::error`) and
//! the source's decoding of rows, statements and end events (`super::decode`, `super::statement`,
//! `super::history`, the table-name rule in `super`); never a reader: [`super::binlog`] and
//! [`super::files`] call it, not the other way round.
//!
//! # Transaction boundaries
//! A transaction starts at its GTID event (MySQL GTID/ANONYMOUS_GTID, MariaDB GTID) and ends at XID, at a
//! `COMMIT` query (non-transactional engines), or — for DDL and other single-statement groups — at the one
//! query that follows the GTID (MariaDB flags these "standalone"; MySQL sends no `BEGIN` for them).
//! [`Change::Commit`] carries the position right *after* the transaction: the only kind of position the
//! connector ever stores, so a resume never starts in the middle of a transaction.
//!
//! # What a group's end decides
//! The binlog also holds groups whose rows did not all commit. A group that changed a non-transactional
//! table is written even when it is rolled back, ending in `ROLLBACK`, and a `ROLLBACK TO SAVEPOINT` inside
//! it follows the rows it undid. So the rows of a group are held back until its end ([`HOLD_BACK_BYTES`]
//! at most; past that they stream, and a rollback that would undo rows already handed on is a definite
//! error): a commit hands them on, a rollback drops them, a rollback to a savepoint drops those since the
//! savepoint. An XA branch is one group from `XA START` (MySQL: a query after the GTID; MariaDB: a flag of
//! the GTID) to its XA_PREPARE event, and its outcome is another group later (`XA COMMIT` / `XA ROLLBACK`):
//! a branch that writes the outbox is refused at its first outbox row, before anything of it is handed on.
//!
//! # Writes logged as statements
//! A session with `binlog_format=STATEMENT` or `MIXED` logs its writes as QUERY events, which carry no
//! rows to decode. A statement that inserts into an outbox table (or that names one and cannot be placed,
//! see [`super::statement`]) is a definite error at its event; UPDATE and DELETE statements there follow
//! `outbox.on_update` like their row-format counterparts. DDL names tables without writing rows and passes.
//!
//! # Events we do not decode
//! Every event either means something for outbox rows and positions, or is known to mean nothing for them
//! (queries on other tables, group-replication context, heartbeats, MariaDB's checkpoints). MariaDB's GTID
//! events, which mysql_common does not parse, are read from their raw body. MySQL 8.0's
//! TRANSACTION_PAYLOAD (binlog_transaction_compression=ON) holds a whole transaction; its inner events go
//! through the same state machine, and the payload's end is their coordinate and the resume point. On the
//! live stream mysql_async already follows each payload event with its decompressed inner events, so the
//! decoder only counts their bytes; for binlog files it decompresses them itself
//! ([`ChangeDecoder::expand_payloads`]). Either way each row is decoded once. An INCIDENT event (the server lost
//! events) and an event type we do not know that is not flagged LOG_EVENT_IGNORABLE are definite errors
//! naming the type and position: skipping them could skip outbox rows.

use std::collections::{HashMap, VecDeque};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use mysql_common::binlog::events::{
    Event, EventData, FormatDescriptionEvent, RowsEventData, TableMapEvent, TransactionPayloadEvent,
};

use super::rows::RowLayout;
use super::statement::{self, Statement};
use super::{NameCase, OutboxTable, ResolvedTables};
use crate::config::{ColumnNames, OnUpdate};
use crate::error::{Error, Result};
use crate::outbox::{OutboxRow, TableName};
use crate::position::mariadb::MariaGtid;
use crate::position::mysql::{Gtid, Tag, Uuid};
use crate::position::{BinlogCoord, EndEvent, Gtids, Position, TxGtid, TxStart, EVENT_HEADER_LEN};

/// What the reader yields, in binlog order.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A source transaction began.
    Begin(TxStart),
    /// An outbox row inserted by the current transaction.
    Row(OutboxRow),
    /// An outbox row inserted by the current transaction that cannot be decoded (a poison row).
    Undecodable(Box<super::decode::Undecodable>),
    /// A row inserted into `[outbox] signal_table` by the current transaction (handed on only once its
    /// group committed, as rows are).
    Signal(Box<Signal>),
    /// The current transaction committed; `position` is right after it.
    Commit {
        /// Resume point after this transaction.
        position: Position,
        /// Commit time (server clock, seconds since the epoch).
        timestamp: u32,
        /// The event that ended it in the binlog, to recognise this history on resume; `None` for a group
        /// that ended without an end event of its own (the next group began).
        end_event: Option<EndEvent>,
    },
}

/// A row of the signal table, in Debezium's layout: its first three columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    /// `id`: unique per signal; a signal read again (after a restart) is recognised by it.
    pub id: String,
    /// `type`: `execute-snapshot`, `pause-snapshot`, …
    pub kind: String,
    /// `data`: JSON text, or `None` for NULL.
    pub data: Option<String>,
}

/// Reader settings that do not change across reconnects.
#[derive(Debug, Clone)]
pub struct ReaderSettings {
    /// Replication client id.
    pub server_id: u32,
    /// Outbox tables to decode.
    pub tables: Vec<TableName>,
    /// Column names of the outbox tables.
    pub columns: ColumnNames,
    /// UPDATE/DELETE behaviour on outbox tables.
    pub on_update: OnUpdate,
    /// Heartbeat period asked of the server.
    pub heartbeat: Duration,
    /// `[outbox] signal_table`: its inserts become [`Change::Signal`]s.
    pub signal_table: Option<TableName>,
}

/// Event type codes that mysql_common does not parse (MariaDB) or that we treat specially.
pub(super) mod event_type {
    pub const HEARTBEAT: u8 = 27;
    pub const XA_PREPARE: u8 = 38;
    /// MySQL 8.0.20+ binlog_transaction_compression: a whole transaction in one event.
    pub const TRANSACTION_PAYLOAD: u8 = 40;
    /// MySQL 8.0.26+ heartbeat with a 64-bit position; mysql_common 0.37 does not know it.
    pub const HEARTBEAT_V2: u8 = 41;
    pub const MARIADB_ANNOTATE_ROWS: u8 = 160;
    pub const MARIADB_BINLOG_CHECKPOINT: u8 = 161;
    pub const MARIADB_GTID: u8 = 162;
    pub const MARIADB_GTID_LIST: u8 = 163;
    /// Start of an encrypted binlog file. A server decrypts before sending; only files on disk show it,
    /// and the files reader refuses them.
    pub const MARIADB_START_ENCRYPTION: u8 = 164;
    /// MariaDB's compressed query/rows events (`log_bin_compress=ON`): 165..=171.
    pub const MARIADB_COMPRESSED_FIRST: u8 = 165;
    pub const MARIADB_COMPRESSED_LAST: u8 = 171;
}

/// Event header flag: a server that does not know the event type may skip it (`LOG_EVENT_IGNORABLE_F`).
const LOG_EVENT_IGNORABLE: u16 = 0x80;

/// MariaDB GTID event flags (`FL_*` in MariaDB's log_event.h).
mod mariadb_flags {
    pub const STANDALONE: u8 = 1;
    /// The group is an XA branch that ends at XA PREPARE (its outcome comes in a later group).
    pub const PREPARED_XA: u8 = 64;
}

/// Outbox rows of an open transaction that the decoder keeps back, up to this many bytes of rows events,
/// until the transaction's end says whether it committed: rows of a group that ends in `ROLLBACK`, or that a
/// `ROLLBACK TO SAVEPOINT` inside it undoes, are dropped instead of published. Past this size the rows
/// stream on (a 100k-row transaction is not buffered whole), and a rollback that would undo rows already
/// handed on is a definite error.
const HOLD_BACK_BYTES: u64 = 8 << 20;

/// Where the reader is relative to transaction boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum TxState {
    /// Between transactions.
    #[default]
    Idle,
    /// MySQL: after a GTID event; the next query is `BEGIN` or a single DDL statement.
    AfterGtid,
    /// MariaDB: a standalone group; the next query ends it.
    Standalone,
    /// Inside `BEGIN … COMMIT/XID`.
    Open,
}

/// The transaction-grouping and decoding state machine, independent of where events come from (the
/// replication stream, or binlog files).
pub struct ChangeDecoder {
    settings: Arc<ReaderSettings>,
    /// Strip the CRC32 trailer from the fake ROTATE that precedes FORMAT_DESCRIPTION.
    checksum: bool,
    seen_format_description: bool,
    /// Position after the last committed transaction read.
    position: Position,
    /// The current group; `Tx::default()` between groups.
    tx: Tx,
    /// Offline sources only: skip transactions the resume position already holds (see [`Self::skip_seen`]).
    skip_seen: Option<Position>,
    /// Inside a TRANSACTION_PAYLOAD: the payload event's end, which is the coordinate of every inner event.
    payload_end: Option<u32>,
    /// Decompress TRANSACTION_PAYLOADs here (binlog files). The live stream does not: mysql_async follows
    /// each payload event with its inner events itself.
    expand_payloads: bool,
    /// Live stream: bytes of inner events still to come after a TRANSACTION_PAYLOAD.
    payload_left: u64,
    /// Inside a TRANSACTION_PAYLOAD: the payload event's fingerprint, which ends every transaction in it.
    payload_event: Option<EndEvent>,
    /// table_id -> decoder and TABLE_MAP for outbox tables, `None` for other tables.
    tables: HashMap<u64, Option<(Arc<OutboxTable>, TableMapEvent<'static>)>>,
    /// table_id -> the signal table's layout (its first three columns).
    signal_tables: HashMap<u64, Arc<RowLayout>>,
    outbox_names: OutboxNames,
    pending: VecDeque<Change>,
}

/// The group (source transaction) being read: all the decoder knows about it, and nothing that outlives it.
/// It is replaced whole when a group begins and when it ends, so nothing of one group can leak into the
/// next; between groups it is `Tx::default()`, whose state is [`TxState::Idle`].
#[derive(Debug, Default)]
struct Tx {
    /// Where the reader is relative to the group's boundaries.
    state: TxState,
    /// The group's GTID, which its end adds to the position.
    gtid: Option<TxGtid>,
    /// The group wrote outbox rows.
    touches_outbox: bool,
    /// The group is an XA branch (`XA START`): its outcome is decided in a later group.
    xa: bool,
    /// The group's rows not yet handed on (see [`HOLD_BACK_BYTES`]), and their rows events' bytes.
    held: Vec<Change>,
    held_bytes: u64,
    /// How many of the group's rows were handed on before `held`.
    released: usize,
    /// Savepoints of the group: name and the number of the group's rows before it.
    savepoints: Vec<(String, usize)>,
    /// The group is already in the resume position: it is read but not emitted.
    skipped: bool,
}

impl Tx {
    /// A group that begins in `state`; `skipped` when the resume position already holds it.
    fn start(state: TxState, gtid: Option<TxGtid>, skipped: bool) -> Self {
        Tx { state, gtid, skipped, ..Tx::default() }
    }

    /// Ends the group: returns it whole and leaves none open.
    fn end(&mut self) -> Tx {
        std::mem::take(self)
    }

    /// The group's rows so far, handed on or held.
    fn rows(&self) -> usize {
        self.released + self.held.len()
    }

    /// Keeps a row back until the group's end says whether it committed.
    fn hold(&mut self, row: Change) {
        self.held.push(row);
    }

    /// Counts a rows event's bytes: true when the held rows are past [`HOLD_BACK_BYTES`] and must stream on.
    fn past_hold_back(&mut self, event_bytes: u32) -> bool {
        self.held_bytes += u64::from(event_bytes);
        self.held_bytes > HOLD_BACK_BYTES
    }

    /// Hands the held rows on: from now on a rollback that undoes them is an error, not a drop.
    fn release(&mut self) -> std::vec::Drain<'_, Change> {
        self.released += self.held.len();
        self.held_bytes = 0;
        self.held.drain(..)
    }

    /// `SAVEPOINT name`.
    fn savepoint(&mut self, name: String) {
        self.savepoints.push((name, self.rows()));
    }

    /// `ROLLBACK TO SAVEPOINT name`: drops the rows the group wrote since the savepoint.
    ///
    /// # Errors
    /// When such rows were already handed on, or the savepoint is not known.
    fn rollback_to(&mut self, name: &str) -> Result<()> {
        let Some(i) = self.savepoints.iter().rposition(|(n, _)| n.eq_ignore_ascii_case(name)) else {
            // A savepoint set before the group's first logged event: everything so far may be undone.
            return match self.rows() {
                0 => Ok(()),
                n => Err(Error::definite(format!(
                    "ROLLBACK TO SAVEPOINT {name} undoes a savepoint the binlog does not show; {n} outbox row(s) \
                     of this transaction may or may not have been rolled back. Report this with the server \
                     version"
                ))),
            };
        };
        let rows_before = self.savepoints[i].1;
        self.savepoints.truncate(i + 1);
        if rows_before < self.released {
            return Err(rolled_back_error(self.released - rows_before, "ROLLBACK TO SAVEPOINT"));
        }
        self.held.truncate(rows_before - self.released);
        Ok(())
    }

    /// Ends the group with a `ROLLBACK`: its held rows go with it.
    ///
    /// # Errors
    /// When rows of the group were already handed on (a group over [`HOLD_BACK_BYTES`]); the group stays.
    fn rollback(&mut self) -> Result<Tx> {
        if self.released > 0 {
            return Err(rolled_back_error(self.released, "ROLLBACK"));
        }
        Ok(self.end())
    }
}

/// Which tables of the binlog are outbox tables, by the server's rule for names (`lower_case_table_names`).
#[derive(Debug, Clone, Default)]
struct OutboxNames {
    case: NameCase,
    /// The server's spelling (lower-cased when the server compares names case-insensitively) -> the
    /// configured name, which is the name rows carry.
    by_name: HashMap<(String, String), Arc<TableName>>,
    /// Lower-cased configured names, for near misses and for statements.
    by_lower: HashMap<(String, String), Arc<TableName>>,
}

impl OutboxNames {
    /// Names compared as the server compares them: `tables` are (configured, server spelling) pairs.
    fn new(case: NameCase, tables: impl IntoIterator<Item = (TableName, TableName)>) -> Self {
        let mut names = OutboxNames { case, ..Default::default() };
        for (configured, server) in tables {
            let configured = Arc::new(configured);
            let key = match case {
                NameCase::Insensitive => lower(&server.database, &server.table),
                NameCase::Sensitive | NameCase::Unknown => (server.database.clone(), server.table.clone()),
            };
            names.by_lower.insert(lower(&server.database, &server.table), configured.clone());
            names.by_name.insert(key, configured);
        }
        names
    }

    /// The configured outbox table that a TABLE_MAP's `database.table` is, if any.
    ///
    /// # Errors
    /// When the server's rule is unknown (binlog files) and the name differs from a configured one only in
    /// case: it may or may not be the same table, and guessing wrong loses its rows silently.
    fn table_map(&self, database: &str, table: &str) -> Result<Option<Arc<TableName>>> {
        let key = match self.case {
            NameCase::Insensitive => lower(database, table),
            NameCase::Sensitive | NameCase::Unknown => (database.to_string(), table.to_string()),
        };
        if let Some(name) = self.by_name.get(&key) {
            return Ok(Some(name.clone()));
        }
        match (self.case, self.by_lower.get(&lower(database, table))) {
            (NameCase::Unknown, Some(configured)) => Err(Error::definite(format!(
                "the binlog has rows of table {database}.{table}, and outbox table {configured} is configured: \
                 the names differ only in case, and without the server outbox-cdc cannot tell whether they are \
                 the same table. Write [outbox] table exactly as the binlog spells it"
            ))),
            _ => Ok(None),
        }
    }

    /// The configured outbox table a statement's target names (`database` `None`: the statement's default
    /// database), compared case-insensitively: a statement names a table as its author typed it.
    fn statement_target(&self, default_db: &str, database: Option<&str>, table: &str) -> Option<Arc<TableName>> {
        self.by_lower.get(&lower(database.unwrap_or(default_db), table)).cloned()
    }

    /// The configured outbox table whose name appears in `sql` (conservatively, any identifier equal to its
    /// table name).
    fn named_in(&self, sql: &[u8]) -> Option<Arc<TableName>> {
        self.by_lower.iter().find(|((_, table), _)| statement::names_table(sql, table)).map(|(_, t)| t.clone())
    }
}

fn lower(database: &str, table: &str) -> (String, String) {
    (database.to_lowercase(), table.to_lowercase())
}

impl ChangeDecoder {
    /// A decoder whose position starts at `position` (the resume point).
    pub fn new(settings: Arc<ReaderSettings>, checksum: bool, position: Position) -> Self {
        ChangeDecoder {
            // Until told the server's rule, names must match as configured (binlog files).
            outbox_names: OutboxNames::new(NameCase::Unknown, settings.tables.iter().map(|t| (t.clone(), t.clone()))),
            settings,
            checksum,
            seen_format_description: false,
            position,
            tx: Tx::default(),
            skip_seen: None,
            payload_end: None,
            expand_payloads: false,
            payload_left: 0,
            payload_event: None,
            tables: HashMap::new(),
            signal_tables: HashMap::new(),
            pending: VecDeque::new(),
        }
    }

    /// Matches TABLE_MAP names as the server does, to the configured tables resolved against it.
    pub fn use_server_names(&mut self, resolved: &ResolvedTables) {
        self.outbox_names =
            OutboxNames::new(resolved.case, resolved.tables.iter().map(|t| (t.configured.clone(), t.server.clone())));
        self.tables.clear();
        self.signal_tables.clear();
    }

    /// Position after the last transaction read.
    pub fn position(&self) -> &Position {
        &self.position
    }

    /// Skips every transaction the current (resume) position already holds, the rule a server applies to
    /// COM_BINLOG_DUMP_GTID and `@slave_connect_state`: MySQL GTIDs contained in the set, MariaDB GTIDs at or
    /// below their domain's sequence number, and without GTIDs transactions that begin before the resume
    /// coordinate in its file. Skipped transactions produce no changes and never move the GTID position
    /// backwards. For sources that do not start at the resume point themselves (binlog files).
    pub fn skip_seen(&mut self) {
        self.skip_seen = Some(self.position.clone());
    }

    /// Decompresses TRANSACTION_PAYLOAD events and decodes their inner events here, for sources that do not
    /// (binlog files). Without it the inner events must follow the payload event, as mysql_async sends them.
    pub fn expand_payloads(&mut self) {
        self.expand_payloads = true;
    }

    /// True between transactions: a stop here loses nothing and repeats nothing.
    pub fn between_transactions(&self) -> bool {
        self.tx.state == TxState::Idle && self.pending.is_empty()
    }

    /// The next events come from the start of binlog file `name` (offline sources open files themselves).
    pub fn rotate_to(&mut self, name: &str) {
        if self.position.coord.file != name {
            self.position.coord = BinlogCoord { file: name.to_string(), pos: 4 };
        }
    }

    /// Whether the source sends CRC32 trailers (false after a FORMAT_DESCRIPTION without checksum).
    pub fn set_checksum(&mut self, checksum: bool) {
        self.checksum = checksum;
    }

    /// The next decoded change, if any.
    pub fn pop(&mut self) -> Option<Change> {
        self.pending.pop_front()
    }

    /// Feeds one binlog event.
    ///
    /// # Errors
    /// Definite errors for undecodable outbox rows and unsupported constructs on the outbox table, with
    /// the binlog coordinate.
    pub fn handle(&mut self, event: &Event) -> Result<()> {
        let inner = self.payload_left > 0;
        let result = if inner && event.header().log_pos() != 0 {
            Err(Error::definite(format!(
                "the TRANSACTION_PAYLOAD ending at {} was not followed by its {} remaining bytes of events: its \
                 rows cannot be read. Set binlog_transaction_compression=OFF on the server and report this",
                self.payload_end.unwrap_or(0),
                self.payload_left
            )))
        } else {
            self.handle_inner(event)
        };
        if inner {
            self.payload_left = self.payload_left.saturating_sub(u64::from(event.header().event_size()));
            if self.payload_left == 0 {
                self.payload_end = None;
            }
        }
        result.map_err(|e| e.context(format_args!("binlog {}:{}", self.position.coord.file, event.header().log_pos())))
    }

    /// Coordinate of an event: its own end, or the enclosing TRANSACTION_PAYLOAD's.
    fn log_pos(&self, event: &Event) -> u32 {
        self.payload_end.unwrap_or(event.header().log_pos())
    }

    fn handle_inner(&mut self, event: &Event) -> Result<()> {
        let header = event.header();
        let type_code = header.event_type_raw();
        let log_pos = self.log_pos(event);
        match type_code {
            event_type::MARIADB_GTID => return self.on_mariadb_gtid(event),
            event_type::MARIADB_GTID_LIST
            | event_type::MARIADB_ANNOTATE_ROWS
            | event_type::MARIADB_BINLOG_CHECKPOINT
            | event_type::MARIADB_START_ENCRYPTION
            | event_type::HEARTBEAT_V2 => return Ok(()),
            event_type::MARIADB_COMPRESSED_FIRST..=event_type::MARIADB_COMPRESSED_LAST => {
                return Err(Error::definite(
                    "the server writes compressed binlog events (log_bin_compress=ON), which outbox-cdc \
                     cannot decode; set log_bin_compress=OFF",
                ))
            }
            event_type::XA_PREPARE => {
                if self.tx.touches_outbox {
                    return Err(xa_outbox_error());
                }
                // The prepared branch is a complete group of the binlog (its GTID is executed); its outcome
                // is a later group of its own (`XA COMMIT` / `XA ROLLBACK`), read like any other.
                self.commit(event, log_pos);
                return Ok(());
            }
            event_type::TRANSACTION_PAYLOAD => check_payload_header(event.data())?,
            _ => {}
        }
        let data = event
            .read_data()
            .map_err(|e| Error::definite(format!("cannot parse binlog event of type {type_code}: {e}")))?;
        let Some(data) = data else {
            if header.flags_raw() & LOG_EVENT_IGNORABLE != 0 {
                return Ok(());
            }
            return Err(Error::definite(format!(
                "unsupported binlog event type {type_code} (not flagged ignorable): outbox-cdc cannot tell \
                 whether it holds outbox rows, so it stops instead of skipping it. Report the server version \
                 and this event type"
            )));
        };
        match data {
            EventData::FormatDescriptionEvent(_) => self.seen_format_description = true,
            EventData::RotateEvent(rotate) => {
                let mut name = rotate.name_raw().to_vec();
                if !self.seen_format_description && self.checksum && name.len() > 4 {
                    // NOTE: the first (fake) ROTATE arrives before FORMAT_DESCRIPTION, so the parser cannot
                    // know that the last 4 bytes are the CRC32 trailer, not part of the name.
                    name.truncate(name.len() - 4);
                }
                let name = String::from_utf8_lossy(&name).into_owned();
                if log_pos == 0 || self.tx.state == TxState::Idle {
                    self.position.coord = BinlogCoord { file: name, pos: rotate.position() };
                } else {
                    self.position.coord.file = name;
                }
            }
            EventData::GtidEvent(gtid) => {
                let uuid = Uuid::from_bytes(gtid.sid());
                let tag = match gtid.tag() {
                    Some(t) => Some(Tag::from_str(t).map_err(|e| Error::definite(format!("GTID tag {t:?}: {e}")))?),
                    None => None,
                };
                self.begin(TxState::AfterGtid, Some(TxGtid::MySql(Gtid { uuid, tag, gno: gtid.gno() })), log_pos);
            }
            EventData::AnonymousGtidEvent(_) => self.begin(TxState::AfterGtid, None, log_pos),
            EventData::QueryEvent(query) => self.on_query(event, query.query_raw(), &query.schema(), log_pos)?,
            // LOAD DATA logged as a statement (its file travels in BEGIN_LOAD_QUERY/APPEND_BLOCK events).
            EventData::ExecuteLoadQueryEvent(load) => {
                self.on_query(event, load.query_raw(), &load.schema(), log_pos)?
            }
            EventData::XidEvent(_) => self.commit(event, log_pos),
            EventData::TableMapEvent(tme) => {
                let table_id = tme.table_id();
                self.signal_tables.remove(&table_id);
                if self.is_signal_table(&tme.database_name(), &tme.table_name()) {
                    let layout = RowLayout::new(&tme, &[0, 1, 2]).map_err(|e| {
                        Error::definite(format!("cannot read the signal table's columns from the binlog: {e}"))
                    })?;
                    self.signal_tables.insert(table_id, Arc::new(layout));
                    self.tables.insert(table_id, None);
                    return Ok(());
                }
                match self.outbox_names.table_map(&tme.database_name(), &tme.table_name())? {
                    Some(name) => {
                        let reuse = matches!(self.tables.get(&table_id), Some(Some((_, known))) if *known == tme);
                        if !reuse {
                            let decoder = OutboxTable::from_table_map(name, &tme, &self.settings.columns)?;
                            self.tables.insert(table_id, Some((Arc::new(decoder), tme.into_owned())));
                        }
                    }
                    None => {
                        self.tables.insert(table_id, None);
                    }
                }
            }
            EventData::RowsEvent(rows) => self.on_rows(rows, log_pos, header.event_size())?,
            EventData::TransactionPayloadEvent(payload) => self.on_payload(event, &payload)?,
            EventData::IncidentEvent(incident) => {
                return Err(Error::definite(format!(
                    "the server wrote an INCIDENT event ({:?}: {}): it may have lost changes from its binlog, \
                     so the binlog cannot prove that no outbox row is missing. Check the server's error log, \
                     re-snapshot the outbox if rows may be missing, then restart from after this position",
                    incident.incident_type(),
                    incident.message()
                )))
            }
            // Statement-format and group-replication events, PREVIOUS_GTIDS, STOP, ROWS_QUERY, heartbeats,
            // ignorable events: nothing for outbox rows or positions.
            _ => {}
        }
        Ok(())
    }

    /// MySQL 8.0 transaction compression: one event holding a whole transaction's events, without checksums.
    fn on_payload(&mut self, event: &Event, payload: &TransactionPayloadEvent<'_>) -> Result<()> {
        if !self.expand_payloads {
            // The inner events follow, each with log_pos 0; until their bytes are through, they sit at the
            // payload's end.
            if payload.uncompressed_size() == 0 {
                return Err(Error::definite(
                    "a TRANSACTION_PAYLOAD without its uncompressed size: cannot tell where its events end",
                ));
            }
            self.payload_end = Some(event.header().log_pos());
            self.payload_event = Some(EndEvent::of(event));
            self.payload_left = payload.uncompressed_size();
            return Ok(());
        }
        let mut footer = event.fde().footer();
        footer.set_checksum_enabled(false);
        let fde = event.fde().clone().with_footer(footer);
        let mut inner = payload.decompressed().map_err(|e| {
            Error::definite(format!("cannot decompress a TRANSACTION_PAYLOAD ({:?}): {e}", payload.algorithm()))
        })?;
        self.payload_end = Some(event.header().log_pos());
        self.payload_event = Some(EndEvent::of(event));
        let result = (|| {
            while let Some(bytes) = read_event_bytes(&mut inner, false)
                .map_err(|e| Error::definite(format!("inside a TRANSACTION_PAYLOAD: {e}")))?
            {
                let event = parse_event(&fde, &bytes)
                    .map_err(|e| Error::definite(format!("inside a TRANSACTION_PAYLOAD: {e}")))?;
                self.handle_inner(&event)?;
            }
            Ok(())
        })();
        self.payload_end = None;
        result
    }

    fn on_mariadb_gtid(&mut self, event: &Event) -> Result<()> {
        let body = event.data();
        if body.len() < 13 {
            return Err(Error::definite(format!("MariaDB GTID event too short ({} bytes)", body.len())));
        }
        let seq_no = u64::from_le_bytes(body[0..8].try_into().expect("8 bytes"));
        let domain_id = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
        let flags = body[12];
        let gtid = MariaGtid { domain_id, server_id: event.header().server_id(), seq_no };
        let state = if flags & mariadb_flags::STANDALONE != 0 { TxState::Standalone } else { TxState::Open };
        self.begin(state, Some(TxGtid::MariaDb(gtid)), self.log_pos(event));
        self.tx.xa = flags & mariadb_flags::PREPARED_XA != 0;
        Ok(())
    }

    fn begin(&mut self, state: TxState, gtid: Option<TxGtid>, log_pos: u32) {
        if self.tx.state != TxState::Idle {
            // A new group without the previous one's end: only happens for groups that end without a
            // commit event we recognise (e.g. an XA prepare). Close the previous one first.
            self.end_group();
        }
        let start = TxStart {
            gtid: gtid.clone(),
            coord: BinlogCoord { file: self.position.coord.file.clone(), pos: u64::from(log_pos) },
        };
        let skipped = self.skip_seen.as_ref().is_some_and(|resume| resume.holds(&start));
        if !skipped {
            self.pending.push_back(Change::Begin(start));
        }
        self.tx = Tx::start(state, gtid, skipped);
    }

    /// Ends the current transaction with `event`, its commit event (XID, or COMMIT or a standalone statement).
    fn commit(&mut self, event: &Event, log_pos: u32) {
        let mut tx = self.tx.end();
        self.pending.extend(tx.release());
        self.advance(tx, event, log_pos);
    }

    /// Ends the current transaction with `event`, a `ROLLBACK` (or `XA ROLLBACK`): the binlog holds the
    /// group because it changed a non-transactional table, and its transactional rows were undone. Its rows
    /// are dropped; its position is passed like any other.
    ///
    /// # Errors
    /// When rows of the group were already handed on (a group over [`HOLD_BACK_BYTES`]).
    fn rollback(&mut self, event: &Event, log_pos: u32) -> Result<()> {
        let tx = self.tx.rollback()?;
        self.advance(tx, event, log_pos);
        Ok(())
    }

    /// What every end of a group with an end event does: the GTID and coordinate advance past it, and a
    /// commit is emitted.
    fn advance(&mut self, tx: Tx, event: &Event, log_pos: u32) {
        if log_pos != 0 {
            self.position.coord.pos = u64::from(log_pos);
        }
        if tx.skipped {
            // Already in the resume position: advancing a MariaDB domain to it would move it backwards.
            return;
        }
        if let Some(gtid) = tx.gtid {
            match (&mut self.position.gtids, gtid) {
                (Gtids::MySql(set), TxGtid::MySql(g)) => {
                    set.insert(&g);
                }
                (Gtids::MariaDb(pos), TxGtid::MariaDb(g)) => pos.advance(g),
                _ => {}
            }
        }
        // The top-level event that ends the transaction: the commit event, or the payload it is inside.
        let end_event = if self.payload_end.is_some() { self.payload_event } else { Some(EndEvent::of(event)) };
        let timestamp = event.header().timestamp();
        self.pending.push_back(Change::Commit { position: self.position.clone(), timestamp, end_event });
    }

    /// Ends a group that has no end event we recognise: it moves nothing.
    fn end_group(&mut self) {
        let mut tx = self.tx.end();
        self.pending.extend(tx.release());
        if !tx.skipped {
            self.pending.push_back(Change::Commit { position: self.position.clone(), timestamp: 0, end_event: None });
        }
    }

    /// Whether `database.table` is `[outbox] signal_table` (compared as the server compares names, and
    /// case-insensitively where that is not known).
    fn is_signal_table(&self, database: &str, table: &str) -> bool {
        let Some(signal) = &self.settings.signal_table else { return false };
        match self.outbox_names.case {
            NameCase::Sensitive => signal.database == database && signal.table == table,
            NameCase::Insensitive | NameCase::Unknown => {
                signal.database.eq_ignore_ascii_case(database) && signal.table.eq_ignore_ascii_case(table)
            }
        }
    }

    /// Inserts into the signal table: held as the group's rows are, handed on as [`Change::Signal`]s.
    /// Updates and deletes of signals mean nothing.
    fn on_signal_rows(&mut self, layout: &RowLayout, rows: &RowsEventData<'_>, log_pos: u32, size: u32) -> Result<()> {
        if !matches!(rows, RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_)) {
            return Ok(());
        }
        if self.tx.state == TxState::Idle {
            self.begin(TxState::Open, None, log_pos);
        }
        if self.tx.skipped {
            return Ok(());
        }
        for slots in layout.after_images(rows) {
            let slots = slots.map_err(|e| Error::definite(format!("cannot decode a row of the signal table: {e}")))?;
            let text = |slot: Option<&Option<mysql_common::binlog::value::BinlogValue<'static>>>| match slot {
                Some(Some(mysql_common::binlog::value::BinlogValue::Value(mysql_common::Value::Bytes(b)))) => {
                    Ok(Some(String::from_utf8_lossy(b).into_owned()))
                }
                Some(Some(mysql_common::binlog::value::BinlogValue::Value(mysql_common::Value::NULL)))
                | Some(None)
                | None => Ok(None),
                Some(Some(other)) => Err(Error::definite(format!(
                    "the signal table's columns must be texts in Debezium's layout (id, type, data); read {other:?}"
                ))),
            };
            let (id, kind, data) = (text(slots.first())?, text(slots.get(1))?, text(slots.get(2))?);
            let (Some(id), Some(kind)) = (id, kind) else {
                return Err(Error::definite(
                    "a signal without an id or a type: the signal table's first two columns are NOT NULL in \
                     Debezium's layout",
                ));
            };
            self.tx.hold(Change::Signal(Box::new(Signal { id, kind, data })));
        }
        if self.tx.past_hold_back(size) {
            self.pending.extend(self.tx.release());
        }
        Ok(())
    }

    fn on_rows(&mut self, rows: RowsEventData<'_>, log_pos: u32, event_size: u32) -> Result<()> {
        let table_id = rows.table_id();
        if let Some(layout) = self.signal_tables.get(&table_id).cloned() {
            return self.on_signal_rows(&layout, &rows, log_pos, event_size);
        }
        let Some(Some((decoder, _))) = self.tables.get(&table_id) else {
            return Ok(());
        };
        let decoder = decoder.clone();
        if self.tx.state == TxState::Idle {
            // Rows outside any group (very old servers without GTID or BEGIN): treat as an implicit group.
            self.begin(TxState::Open, None, log_pos);
        }
        if self.tx.skipped {
            return Ok(());
        }
        if self.tx.xa {
            return Err(xa_outbox_error().context(format_args!("outbox table {}", decoder.name)));
        }
        self.tx.touches_outbox = true;
        let op = match &rows {
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_) => None,
            RowsEventData::UpdateRowsEvent(_) | RowsEventData::UpdateRowsEventV1(_) => Some("UPDATE"),
            RowsEventData::DeleteRowsEvent(_) | RowsEventData::DeleteRowsEventV1(_) => Some("DELETE"),
            RowsEventData::PartialUpdateRowsEvent(_) => {
                return Err(Error::definite(format!(
                    "a partial JSON update (PARTIAL_UPDATE_ROWS) changed outbox table {}; outbox rows must \
                     not be updated in place, and the server must not use binlog_row_value_options=PARTIAL_JSON",
                    decoder.name
                )))
            }
        };
        if let Some(op) = op {
            return self.on_change(op, &decoder.name);
        }
        for slots in decoder.after_images(&rows) {
            let slots = slots
                .map_err(|e| Error::definite(format!("cannot decode a row of outbox table {}: {e}", decoder.name)))?;
            self.tx.hold(match decoder.decode(slots) {
                Ok(row) => Change::Row(row),
                Err(undecodable) => Change::Undecodable(undecodable),
            });
        }
        if self.tx.past_hold_back(event_size) {
            self.pending.extend(self.tx.release());
        }
        Ok(())
    }

    /// An UPDATE or DELETE of outbox rows, by `outbox.on_update`.
    fn on_change(&self, op: &str, table: &TableName) -> Result<()> {
        match self.settings.on_update {
            OnUpdate::Ignore => Ok(()),
            OnUpdate::Warn => {
                tracing::warn!(%table, op, "ignoring {op} on outbox table (outbox.on_update = \"warn\")");
                Ok(())
            }
            OnUpdate::Fail => Err(Error::definite(format!(
                "{op} on outbox table {table} (outbox.on_update = \"fail\"); outbox rows are insert-only"
            ))),
        }
    }

    /// A QUERY event: transaction boundaries, savepoints, XA, and writes logged as statements.
    fn on_query(&mut self, event: &Event, sql: &[u8], schema: &str, log_pos: u32) -> Result<()> {
        // The statements of every transaction, without the lexer.
        let kind = if sql.eq_ignore_ascii_case(b"BEGIN") {
            Statement::Begin
        } else if sql.eq_ignore_ascii_case(b"COMMIT") {
            Statement::Commit
        } else {
            statement::classify(sql)
        };
        if !self.tx.skipped {
            self.check_statement(&kind, sql, schema)?;
        }
        match (kind, self.tx.state) {
            (Statement::Begin, TxState::Idle) => self.begin(TxState::Open, None, log_pos),
            (Statement::Begin, _) => self.tx.state = TxState::Open,
            // NOTE: MySQL sends no BEGIN for an XA branch: `XA START` opens the group, which ends at
            // XA_PREPARE (or at `XA COMMIT … ONE PHASE`), not at the first statement after the GTID.
            (Statement::XaStart, state) => {
                if state == TxState::Idle {
                    self.begin(TxState::Open, None, log_pos);
                }
                self.tx.state = TxState::Open;
                self.tx.xa = true;
            }
            (Statement::Commit | Statement::XaCommit, TxState::Open | TxState::AfterGtid | TxState::Standalone) => {
                self.commit(event, log_pos)
            }
            (Statement::Rollback | Statement::XaRollback, TxState::Open | TxState::AfterGtid | TxState::Standalone) => {
                self.rollback(event, log_pos)?
            }
            (Statement::Savepoint(name), TxState::Open) => self.tx.savepoint(name),
            (Statement::RollbackTo(name), TxState::Open) => self.tx.rollback_to(&name)?,
            (_, TxState::Idle | TxState::Open) => {}
            // MySQL's single-statement groups (DDL) have no BEGIN; MariaDB flags them standalone.
            (_, TxState::AfterGtid | TxState::Standalone) => self.commit(event, log_pos),
        }
        Ok(())
    }

    /// Refuses a statement that wrote outbox rows without logging them as rows.
    fn check_statement(&self, kind: &Statement, sql: &[u8], schema: &str) -> Result<()> {
        let table = match kind {
            Statement::Insert { target: Some((database, table)) } => {
                self.outbox_names.statement_target(schema, database.as_deref(), table)
            }
            Statement::Insert { target: None } | Statement::Other => self.outbox_names.named_in(sql),
            Statement::UpdateOrDelete => {
                return match self.outbox_names.named_in(sql) {
                    Some(table) => self.on_change("UPDATE/DELETE statement", &table),
                    None => Ok(()),
                }
            }
            _ => None,
        };
        let Some(table) = table else { return Ok(()) };
        const SHOWN: usize = 200;
        let text = String::from_utf8_lossy(&sql[..sql.len().min(SHOWN)]);
        let more = if sql.len() > SHOWN { "…" } else { "" };
        Err(Error::definite(format!(
            "outbox table {table} was written by a statement logged in statement format, not as rows \
             (the writing session ran with binlog_format=STATEMENT or MIXED): `{text}{more}`. The binlog does not \
             carry the rows it inserted, so outbox-cdc cannot publish them. Fix: make every session that writes \
             the outbox log rows (binlog_format=ROW: remove any SET [SESSION] binlog_format from the application \
             and its connection settings, and keep binlog_format=ROW in the server's configuration); then take \
             a new snapshot to publish the rows written so (move the state directory away and start with \
             snapshot.mode = \"initial\"; see the runbook)"
        )))
    }
}

/// The refusal of an XA branch that writes outbox rows.
fn xa_outbox_error() -> Error {
    Error::definite(
        "an XA transaction (XA START … XA PREPARE) wrote to the outbox table; XA transactions are not \
         supported on outbox tables: the binlog records the branch's rows at XA PREPARE, before its outcome, \
         and the XA COMMIT or XA ROLLBACK that decides it comes later in another group. Write outbox rows \
         in ordinary transactions (BEGIN … COMMIT)",
    )
}

/// The refusal of a rollback that undoes outbox rows already handed on for publishing.
fn rolled_back_error(rows: usize, how: &str) -> Error {
    Error::definite(format!(
        "{how} in the binlog undoes {rows} outbox row(s) of a transaction larger than {} MiB of row events, \
         which outbox-cdc had already handed on for publishing: they may be in Kafka although the transaction \
         rolled them back. The binlog holds such a transaction only when it also changed a non-transactional \
         table: keep non-transactional tables out of transactions that write the outbox. Consumers must \
         ignore these events (their ids are not in the outbox table)",
        HOLD_BACK_BYTES >> 20
    ))
}

/// Rejects a TRANSACTION_PAYLOAD header that mysql_common 0.37 would panic on: it unwraps the compression
/// type, so an unknown algorithm (a newer server, a damaged file) must be caught before it parses.
fn check_payload_header(mut data: &[u8]) -> Result<()> {
    fn lenenc(data: &mut &[u8]) -> Option<u64> {
        let (&first, rest) = data.split_first()?;
        let (value, used) = match first {
            0..=250 => (u64::from(first), 0),
            0xfc => (u64::from(u16::from_le_bytes(rest.get(..2)?.try_into().ok()?)), 2),
            0xfd => (u64::from_le_bytes([rest.get(..3)?, &[0; 5][..]].concat().try_into().ok()?), 3),
            0xfe => (u64::from_le_bytes(rest.get(..8)?.try_into().ok()?), 8),
            _ => return None,
        };
        *data = rest.get(used..)?;
        Some(value)
    }
    let bad = |what: &str| Error::definite(format!("malformed TRANSACTION_PAYLOAD header: {what}"));
    loop {
        let field = lenenc(&mut data).ok_or_else(|| bad("truncated"))?;
        if field == 0 {
            return Ok(());
        }
        let length = lenenc(&mut data).ok_or_else(|| bad("truncated"))?;
        if field == 2 {
            let algorithm = lenenc(&mut data).ok_or_else(|| bad("truncated"))?;
            if algorithm != 0 && algorithm != 255 {
                return Err(Error::definite(format!(
                    "TRANSACTION_PAYLOAD compressed with algorithm {algorithm}, which outbox-cdc cannot \
                     decompress (it reads zstd and uncompressed payloads)"
                )));
            }
        } else {
            data = data.get(length as usize..).ok_or_else(|| bad("truncated"))?;
        }
    }
}

/// Reads the bytes of one whole event (header included) from `input`; `None` at a clean end of input.
///
/// # Errors
/// `UnexpectedEof` when the input ends inside an event, `InvalidData` for an impossible event size. We read
/// whole events ourselves because mysql_common 0.37's `Event::read` panics on a short read and underflows on
/// a size below its header and checksum.
pub(crate) fn read_event_bytes<R: std::io::Read>(mut input: R, checksum: bool) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::{Error as IoError, ErrorKind};
    let mut header = [0u8; EVENT_HEADER_LEN];
    let mut got = 0;
    while got < header.len() {
        match input.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(IoError::new(
                    ErrorKind::UnexpectedEof,
                    format!("the input ends {got} bytes into an event header"),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let size = u32::from_le_bytes(header[9..13].try_into().expect("4 bytes")) as usize;
    let type_code = header[4];
    let min = if type_code == FORMAT_DESCRIPTION {
        EVENT_HEADER_LEN + FDE_MIN_BODY
    } else {
        EVENT_HEADER_LEN + if checksum { 4 } else { 0 }
    };
    if size < min || size > MAX_EVENT_BYTES {
        return Err(IoError::new(ErrorKind::InvalidData, format!("event of type {type_code} claims {size} bytes")));
    }
    // Grow with what is actually there: a damaged size field must not allocate a gigabyte up front.
    let mut bytes = Vec::with_capacity(size.min(1 << 20));
    bytes.extend_from_slice(&header);
    std::io::Read::read_to_end(&mut input.take((size - EVENT_HEADER_LEN) as u64), &mut bytes)?;
    if bytes.len() < size {
        return Err(IoError::new(
            ErrorKind::UnexpectedEof,
            format!("the input ends {} bytes into an event of type {type_code} that claims {size} bytes", bytes.len()),
        ));
    }
    Ok(Some(bytes))
}

/// FORMAT_DESCRIPTION's type code.
pub(crate) const FORMAT_DESCRIPTION: u8 = 15;
/// Binlog version (2) + server version (50) + create timestamp (4) + header length (1).
const FDE_MIN_BODY: usize = 57;
/// Largest event we accept: MySQL's and MariaDB's `max_allowed_packet` ceiling (1 GiB).
const MAX_EVENT_BYTES: usize = 1 << 30;

/// Parses one whole event read by [`read_event_bytes`].
pub(crate) fn parse_event(fde: &FormatDescriptionEvent<'_>, bytes: &[u8]) -> std::io::Result<Event> {
    Event::read(fde, bytes)
}

#[cfg(test)]
mod tests;
