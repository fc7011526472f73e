//! The source side: connecting to MySQL/MariaDB, learning who the server is and where its binlog stands,
//! preflight checks, and the binlog reader.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).

pub mod binlog;
pub mod change;
pub mod charset;
pub mod column_types;
pub mod decode;
pub mod files;
pub mod grants;
pub mod history;
pub mod identity;
pub mod key_order;
pub mod managed;
pub mod overlap;
pub mod preflight;
pub mod purge;
pub mod rows;
pub mod signal;
pub mod snapshot;
pub mod statement;

use std::str::FromStr;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, SslOpts};

pub use decode::OutboxTable;

use crate::config::{AuthKind, Config, Connection, ResumeBy, ServerSource, StartFrom, TlsMode};
use crate::error::{classify_mysql, mysql_codes, Error, Result};
use crate::outbox::TableName;
use crate::position::{mariadb::GtidPos, mysql::GtidSet, BinlogCoord, Flavor, Gtids, Position, ServerIdentity};

/// A MySQL GTID set as messages show one (`@@gtid_executed`, a Debezium MySQL offset's `gtids`).
pub const MYSQL_GTID_EXAMPLE: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-1000";
/// A MariaDB GTID position as messages show one (`@@gtid_binlog_pos`, a Debezium MariaDB offset's `gtids`).
pub const MARIADB_GTID_EXAMPLE: &str = "0-1-1000";

/// How to reach the server, built once from the config; who to log in as is asked at every connect.
#[derive(Clone)]
pub struct SourceConn {
    /// Everything but the password.
    opts: Opts,
    /// The password of each connection attempt.
    identity: identity::Identity,
    connect_timeout: Duration,
}

/// Not derived: `mysql_async`'s `Opts` prints the password.
impl std::fmt::Debug for SourceConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceConn")
            .field("server", &self.describe())
            .field("user", &self.opts.user())
            .field("identity", &self.identity)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl SourceConn {
    /// Connection settings from the config (resolves the password).
    ///
    /// # Errors
    /// A definite error when the password variable is missing or the TLS CA file cannot be used.
    pub fn from_config(config: &Config) -> Result<Self> {
        Self::new(Self::settings(config)?)
    }

    /// The config's server connection settings: the live server's or the polling relay's.
    ///
    /// # Errors
    /// A definite error for binlog files, which have no server.
    pub fn settings(config: &Config) -> Result<&Connection> {
        config.source.kind.connection().ok_or_else(|| {
            Error::definite(
                "source.kind = \"files\" reads binlog files and has no server to connect to; this needs \
                 source.kind = \"server\" or \"poll\"",
            )
        })
    }

    /// Connection settings for `source` (resolves the password).
    ///
    /// # Errors
    /// A definite error when the password variable is missing or the TLS CA file cannot be used.
    pub fn new(source: &Connection) -> Result<Self> {
        let identity = identity::Identity::new(source)?;
        let mut builder = OptsBuilder::default()
            .ip_or_hostname(source.host.clone())
            .tcp_port(source.port)
            .user(Some(source.user.clone()))
            .prefer_socket(false)
            .stmt_cache_size(0)
            // TIMESTAMP columns read as UTC, as the binlog gives them (seconds since the epoch): the snapshot
            // and the stream then write the same `occurred_at`, and comparisons with UTC text (prune's
            // cutoff, the snapshot's keyset) mean what they say.
            // Text in every character set arrives as UTF-8 (`charset`: the stream decodes the binlog's bytes
            // to the same text), also on a server that ignores the handshake's character set
            // (`skip-character-set-client-handshake`).
            .init(vec!["SET time_zone = '+00:00'", "SET NAMES utf8mb4"])
            .max_allowed_packet(Some(1024 * 1024 * 1024));
        builder = match source.tls {
            TlsMode::Disabled => builder,
            TlsMode::Required => builder.ssl_opts(
                SslOpts::default().with_danger_accept_invalid_certs(true).with_danger_skip_domain_validation(true),
            ),
            TlsMode::VerifyIdentity => {
                let mut ssl = SslOpts::default();
                if let Some(ca) = &source.tls_ca_file {
                    // Read again at each connect (a renewed CA file is picked up); checked here so that a wrong
                    // path stops the connector instead of failing every connect as if the network were down.
                    std::fs::File::open(ca).map_err(|e| {
                        Error::definite(format!(
                            "source.tls_ca_file {}: {e}. Point it at the PEM file of the CA that signed the \
                             server's certificate",
                            ca.display()
                        ))
                    })?;
                    // The configured CA only, as a MySQL client's --ssl-ca: left beside the built-in public
                    // roots, any public CA could vouch for the server's name.
                    ssl = ssl.with_root_certs(vec![ca.clone().into()]).with_disable_built_in_roots(true);
                }
                builder.ssl_opts(ssl)
            }
        };
        Ok(SourceConn { opts: builder.into(), identity, connect_timeout: source.connect_timeout })
    }

    /// Opens a connection, bounded by the configured timeout, with a password asked of the identity for
    /// this attempt: every connection the connector opens comes through here.
    ///
    /// # Errors
    /// The identity's (a token that cannot be had); classified connection errors, an access denied to a
    /// token with what to check; a timeout is transient.
    pub async fn connect(&self) -> Result<Conn> {
        let attempt = async {
            let user = self.opts.user().unwrap_or_default();
            let login = self.identity.login(self.opts.ip_or_hostname(), self.opts.tcp_port(), user).await?;
            Conn::new(self.opts_for(&login)).await.map_err(|e| {
                let error = classify_mysql(&e);
                let denied = matches!(&e, mysql_async::Error::Server(s) if s.code == mysql_codes::ACCESS_DENIED);
                let error = match self.identity.denied_hint() {
                    Some(hint) if denied => Error::definite(format!("{error}. {hint}")),
                    _ => error,
                };
                match self.identity.kind() {
                    AuthKind::Password => error.context(format_args!("connecting to {}", self.describe())),
                    _ => error.context(format_args!("connecting to {} as {}", self.describe(), login.who)),
                }
            })
        };
        match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(Error::transient(format!(
                "connecting to {} timed out after {:?}",
                self.describe(),
                self.connect_timeout
            ))),
        }
    }

    /// The options of one attempt: the settings with the login's password, offered to the cleartext plugin
    /// when the login asks for it (a token; config validation allows one only over verified TLS).
    fn opts_for(&self, login: &identity::Login) -> Opts {
        OptsBuilder::from_opts(self.opts.clone())
            .pass(login.password.as_ref().map(|p| p.expose().to_string()))
            .enable_cleartext_plugin(login.cleartext)
            .into()
    }

    /// Who the last connection attempt logged in as (never the secret), if one was made: what
    /// `outbox-cdc check` reports.
    pub fn last_login(&self) -> Option<String> {
        self.identity.last_login()
    }

    /// `host:port` for messages.
    pub fn describe(&self) -> String {
        format!("{}:{}", self.opts.ip_or_hostname(), self.opts.tcp_port())
    }
}

/// How the server compares database and table names (`@@lower_case_table_names`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NameCase {
    /// Byte for byte (`lower_case_table_names=0`, the default on Linux): `Outbox` and `outbox` are two tables.
    Sensitive,
    /// Case-insensitively (`1`: stored and written to the binlog in lower case; `2`: stored as created,
    /// compared in lower case, only on case-insensitive file systems; MariaDB on Linux turns 2 into 0).
    Insensitive,
    /// Not known (binlog files read without their server): a name that differs from a configured one only
    /// in case is an error, never a silent miss.
    #[default]
    Unknown,
}

impl NameCase {
    /// The rule of a server's `@@lower_case_table_names`.
    pub fn of_lower_case_table_names(value: u32) -> Self {
        if value == 0 {
            NameCase::Sensitive
        } else {
            NameCase::Insensitive
        }
    }

    /// Whether `name` matches a name pattern as the server matches one (a database in a `GRANT`, a
    /// `replicate-wild-*-table` filter): `%` any run, `_` one character, `\` escapes either; characters
    /// compared by this rule (`Unknown` case-insensitively).
    pub fn like(self, pattern: &str, name: &str) -> bool {
        let same = |a: char, b: char| match self {
            NameCase::Sensitive => a == b,
            NameCase::Insensitive | NameCase::Unknown => a.to_lowercase().eq(b.to_lowercase()),
        };
        fn go(p: &[char], n: &[char], same: &dyn Fn(char, char) -> bool) -> bool {
            match p.split_first() {
                None => n.is_empty(),
                Some(('%', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..], same)),
                Some(('_', rest)) => !n.is_empty() && go(rest, &n[1..], same),
                Some(('\\', rest)) if !rest.is_empty() => {
                    n.first().is_some_and(|&c| same(rest[0], c)) && go(&rest[1..], &n[1..], same)
                }
                Some((&c, rest)) => n.first().is_some_and(|&d| same(c, d)) && go(rest, &n[1..], same),
            }
        }
        let p: Vec<char> = pattern.chars().collect();
        let n: Vec<char> = name.chars().collect();
        go(&p, &n, &same)
    }
}

/// A configured outbox table and the name the server knows it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedTable {
    /// As configured: the name rows carry, so that the snapshot, the stream and the topics agree.
    pub configured: TableName,
    /// As the server spells it (`information_schema`), which is what its binlog's TABLE_MAP events carry.
    pub server: TableName,
}

/// The configured outbox tables resolved against the server: the one place that decides which server table
/// a configured name means. Preflight, the binlog reader and (through SQL, by the same server rule) the
/// snapshot all go through it, so none of them can match a table the others miss.
#[derive(Debug, Clone)]
pub struct ResolvedTables {
    /// How the server compares names.
    pub case: NameCase,
    /// One per configured table, in configuration order.
    pub tables: Vec<ResolvedTable>,
}

/// Resolves each configured outbox table to the server's spelling.
///
/// # Errors
/// A definite error naming the table and the fix when a configured table does not exist as written (with
/// `lower_case_table_names=0`, a name that differs only in case is another table, and the error names the
/// candidates), or is a view (views have no rows in the binlog); classified query errors otherwise.
pub async fn resolve_tables(conn: &mut Conn, configured: &[TableName]) -> Result<ResolvedTables> {
    let lctn: Option<u32> =
        conn.query_first("SELECT @@lower_case_table_names").await.map_err(|e| classify_mysql(&e))?;
    let lctn = lctn.unwrap_or(0);
    let case = NameCase::of_lower_case_table_names(lctn);
    let mut tables = Vec::with_capacity(configured.len());
    for table in configured {
        // The server's own lookup: exact with lower_case_table_names=0, lower-cased with 1 (and 2).
        let found: Vec<(String, String, String)> = conn
            .exec(
                "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (&table.database, &table.table),
            )
            .await
            .map_err(|e| classify_mysql(&e))?;
        match found.as_slice() {
            [(database, name, kind)]
                if kind.eq_ignore_ascii_case("BASE TABLE") || kind.eq_ignore_ascii_case("SYSTEM VERSIONED") =>
            {
                tables.push(ResolvedTable {
                    configured: table.clone(),
                    server: TableName { database: database.clone(), table: name.clone() },
                })
            }
            [(_, _, kind)] => {
                return Err(Error::definite(format!(
                    "outbox table {table} is a {kind}, not a base table: the binlog carries rows of base \
                     tables only. Configure the table the application inserts into"
                )))
            }
            [] => return Err(not_found(conn, table, lctn).await?),
            _ => {
                return Err(Error::definite(format!(
                    "outbox table {table} names {} tables on this server (lower_case_table_names={lctn}): \
                     configure it exactly as the server spells it",
                    found.len()
                )))
            }
        }
    }
    Ok(ResolvedTables { case, tables })
}

/// The error for a configured table that the server does not have, naming the tables it has under a name
/// that differs only in case.
async fn not_found(conn: &mut Conn, table: &TableName, lctn: u32) -> Result<Error> {
    let similar: Vec<(String, String)> = conn
        .exec(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
             WHERE LOWER(TABLE_SCHEMA) = LOWER(?) AND LOWER(TABLE_NAME) = LOWER(?)",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| classify_mysql(&e))?;
    if similar.is_empty() {
        return Ok(Error::definite(format!(
            "outbox table {table} not found (or the connector's user may not see it): create it, or GRANT \
             SELECT ON {table} TO the connector's user"
        )));
    }
    let names: Vec<String> = similar.iter().map(|(d, t)| format!("{d}.{t}")).collect();
    Ok(Error::definite(format!(
        "outbox table {table} not found; this server compares table names case-sensitively \
         (lower_case_table_names={lctn}) and has {}. Write [outbox] table exactly as the server spells it",
        names.join(", ")
    )))
}

/// Where a stream reads changes from: the live replication stream or binlog files.
pub enum SourceReader {
    /// A replication connection.
    Live(binlog::BinlogReader),
    /// Binlog files on disk.
    Files(files::FilesReader),
}

impl SourceReader {
    /// The next change; `None` when the source is exhausted (binlog files only; a server never is).
    ///
    /// # Errors
    /// As [`binlog::BinlogReader::next`] and [`files::FilesReader::next`].
    pub async fn next(&mut self) -> Result<Option<binlog::Change>> {
        match self {
            SourceReader::Live(reader) => reader.next().await.map(Some),
            SourceReader::Files(reader) => reader.next(),
        }
    }
}

/// What the connector learns about the server when it connects.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// Identity (flavor, ids).
    pub identity: ServerIdentity,
    /// `@@version`.
    pub version: String,
    /// `@@binlog_checksum` is not NONE: events carry a 4-byte CRC32 trailer.
    pub checksum: bool,
}

/// Asks the server who it is.
///
/// # Errors
/// Classified query errors.
pub async fn server_info(conn: &mut Conn) -> Result<ServerInfo> {
    let (version, server_id, checksum): (String, u32, String) = conn
        .query_first("SELECT @@version, @@server_id, @@global.binlog_checksum")
        .await
        .map_err(|e| classify_mysql(&e))?
        .ok_or_else(|| Error::transient("server returned no version"))?;
    let flavor = if version.to_ascii_lowercase().contains("mariadb") { Flavor::MariaDb } else { Flavor::MySql };
    let server_uuid = match flavor {
        Flavor::MySql => conn.query_first::<String, _>("SELECT @@server_uuid").await.map_err(|e| classify_mysql(&e))?,
        Flavor::MariaDb => None,
    };
    Ok(ServerInfo {
        identity: ServerIdentity { flavor, server_id, server_uuid, binlog_files: false },
        version,
        checksum: !checksum.eq_ignore_ascii_case("NONE"),
    })
}

/// Statement that reports the current binlog file, position and (MySQL) executed GTIDs.
pub(crate) fn binlog_status_sql(info: &ServerInfo) -> &'static str {
    let modern_mysql = info.identity.flavor == Flavor::MySql && version_at_least(&info.version, 8, 4);
    if modern_mysql {
        "SHOW BINARY LOG STATUS"
    } else {
        "SHOW MASTER STATUS"
    }
}

/// `major.minor` comparison of a server version string such as `8.4.2` or `10.11.6-MariaDB-log`.
pub fn version_at_least(version: &str, major: u32, minor: u32) -> bool {
    let mut parts = version.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
    let ma: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let mi: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (ma, mi) >= (major, minor)
}

/// The server's current end of binlog, as a position of the requested kind.
///
/// # Errors
/// A definite error when binary logging is off; classified query errors otherwise.
pub async fn current_position(conn: &mut Conn, info: &ServerInfo, resume_by: ResumeBy) -> Result<Position> {
    let row: mysql_async::Row = conn
        .query_first(binlog_status_sql(info))
        .await
        .map_err(|e| classify_mysql(&e))?
        .ok_or_else(|| Error::definite("the server reports no binlog status: binary logging (log_bin) is OFF"))?;
    let file: String = row.get(0).ok_or_else(|| Error::transient("binlog status without a file"))?;
    let pos: u64 = row.get(1).ok_or_else(|| Error::transient("binlog status without a position"))?;
    let coord = BinlogCoord { file, pos };
    let gtids = match (info.identity.flavor, resume_by) {
        (_, ResumeBy::File) => Gtids::None,
        (Flavor::MySql, ResumeBy::Gtid) => {
            // Executed_Gtid_Set is the fifth column, read atomically with file/position.
            let executed: String = row.get(4).unwrap_or_default();
            Gtids::MySql(parse_gtid_set(&executed)?)
        }
        (Flavor::MariaDb, ResumeBy::Gtid) => Gtids::MariaDb(mariadb_gtid_at(conn, &coord).await?),
    };
    Ok(Position { gtids, coord })
}

/// The oldest position the server's binlogs still hold.
///
/// # Errors
/// Classified query errors.
pub async fn earliest_position(conn: &mut Conn, info: &ServerInfo, resume_by: ResumeBy) -> Result<Position> {
    let files: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await.map_err(|e| classify_mysql(&e))?;
    let first: String = files
        .first()
        .and_then(|r| r.get(0))
        .ok_or_else(|| Error::definite("the server has no binary logs: binary logging (log_bin) is OFF"))?;
    let coord = BinlogCoord { file: first, pos: 4 };
    let gtids = match (info.identity.flavor, resume_by) {
        (_, ResumeBy::File) => Gtids::None,
        (Flavor::MySql, ResumeBy::Gtid) => {
            let purged: String = conn
                .query_first("SELECT @@global.gtid_purged")
                .await
                .map_err(|e| classify_mysql(&e))?
                .unwrap_or_default();
            Gtids::MySql(parse_gtid_set(&purged)?)
        }
        (Flavor::MariaDb, ResumeBy::Gtid) => Gtids::MariaDb(mariadb_gtid_at(conn, &coord).await?),
    };
    Ok(Position { gtids, coord })
}

/// The start position for a connector without checkpoint.
///
/// # Errors
/// Classified query errors.
pub async fn start_position(conn: &mut Conn, info: &ServerInfo, server: &ServerSource) -> Result<Position> {
    if let Some(after) = &server.start_after {
        return start_after_position(conn, info, after).await;
    }
    match server.start_from {
        StartFrom::Current => current_position(conn, info, server.resume_by).await,
        StartFrom::Earliest => earliest_position(conn, info, server.resume_by).await,
    }
}

/// `source.start_after` on a live server: right after those GTIDs. Refused, with what to do, when they are
/// of the other GTID kind, when the server has not executed them all (another server, or a typo), or when
/// its binlogs no longer hold what follows them (purged: a snapshot is then the only way to be complete).
///
/// The coordinate is nominal (the oldest binlog's start): a GTID position is resumed by its GTIDs.
///
/// # Errors
/// Definite errors as above; classified query errors.
async fn start_after_position(conn: &mut Conn, info: &ServerInfo, after: &str) -> Result<Position> {
    let earliest = earliest_position(conn, info, ResumeBy::File).await?;
    let refuse = |what: String| Error::definite(format!("source.start_after = {after:?}: {what}"));
    let gtids = match info.identity.flavor {
        Flavor::MySql => {
            let set = GtidSet::from_str(after).map_err(|e| {
                refuse(format!(
                    "not a MySQL GTID set ({e}). This server is MySQL: give a GTID set as its @@gtid_executed \
                     reads, e.g. \"{MYSQL_GTID_EXAMPLE}\" (\"{MARIADB_GTID_EXAMPLE}\" is a MariaDB GTID position)"
                ))
            })?;
            let executed = parse_gtid_set(&global_text(conn, "gtid_executed").await?)?;
            if !set.is_subset(&executed) {
                return Err(refuse(format!(
                    "the server has not executed all of these GTIDs (its gtid_executed is {executed}): is this \
                     the server the previous connector read?"
                )));
            }
            Gtids::MySql(set)
        }
        Flavor::MariaDb => {
            let pos = GtidPos::from_str(after).map_err(|e| {
                refuse(format!(
                    "not a MariaDB GTID position ({e}). This server is MariaDB: give a GTID position as its \
                     @@gtid_binlog_pos reads, e.g. \"{MARIADB_GTID_EXAMPLE}\" (domain-server-sequence, one per \
                     domain; \"{MYSQL_GTID_EXAMPLE}\" is a MySQL GTID set)"
                ))
            })?;
            let binlog = global_text(conn, "gtid_binlog_pos").await?;
            let binlog = GtidPos::from_str(&binlog)
                .map_err(|e| Error::definite(format!("server returned GTID position {binlog:?}: {e}")))?;
            if let Some(gtid) = pos.iter().find(|gtid| !binlog.contains(gtid)) {
                return Err(refuse(format!(
                    "the server's binlogs have not reached GTID {gtid} (its gtid_binlog_pos is {binlog}): is this \
                     the server the previous connector read?"
                )));
            }
            Gtids::MariaDb(pos)
        }
    };
    let position = Position { gtids, coord: earliest.coord };
    if let Some(purged) = position_purged(conn, &position).await? {
        return Err(purged);
    }
    Ok(position)
}

/// The text of the global system variable `name` (empty when NULL).
async fn global_text(conn: &mut Conn, name: &str) -> Result<String> {
    let value: Option<Option<String>> =
        conn.query_first(format!("SELECT @@global.{name}")).await.map_err(|e| classify_mysql(&e))?;
    Ok(value.flatten().unwrap_or_default())
}

/// MariaDB's GTID position at a binlog coordinate (`BINLOG_GTID_POS`), exact even under concurrent commits.
pub(crate) async fn mariadb_gtid_at(conn: &mut Conn, coord: &BinlogCoord) -> Result<GtidPos> {
    let text: Option<String> = conn
        .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (coord.file.as_str(), coord.pos))
        .await
        .map_err(|e| classify_mysql(&e))?
        .flatten();
    let text = text.ok_or_else(|| {
        Error::definite(format!("the server cannot map binlog coordinate {coord} to a GTID position"))
    })?;
    GtidPos::from_str(&text).map_err(|e| Error::definite(format!("server returned GTID position {text:?}: {e}")))
}

fn parse_gtid_set(text: &str) -> Result<GtidSet> {
    GtidSet::from_str(text).map_err(|e| Error::definite(format!("server returned GTID set {text:?}: {e}")))
}

/// The binlog files the server still has, oldest first, with their sizes in bytes.
///
/// # Errors
/// Classified query errors.
pub async fn binary_logs(conn: &mut Conn) -> Result<Vec<(String, u64)>> {
    let rows: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await.map_err(|e| classify_mysql(&e))?;
    Ok(rows.into_iter().filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?))).collect())
}

/// Whether the server's binlogs still hold `position`, so that resuming from it cannot silently skip
/// transactions: `Some` definite error naming the way out when they do not.
///
/// # Errors
/// Classified query errors: the server could not be asked, which says nothing about a purge.
pub async fn position_purged(conn: &mut Conn, position: &Position) -> Result<Option<Error>> {
    let purged_error = |detail: String| {
        Error::definite(format!(
            "the checkpointed position {position} is no longer in the server's binlogs ({detail}). Events \
             committed after the checkpoint may be lost from the binlog; only the outbox table still has \
             them. Way out: re-snapshot the table into Kafka (restart with snapshot.mode = \"when_needed\", \
             or move the state directory away and start with snapshot.mode = \"initial\"), check the result \
             with `outbox-cdc audit`, and raise binlog retention (binlog_expire_logs_seconds / \
             expire_logs_days) so the connector's downtime fits in it"
        ))
    };
    match &position.gtids {
        Gtids::MySql(set) => {
            let purged: String = conn
                .query_first("SELECT @@global.gtid_purged")
                .await
                .map_err(|e| classify_mysql(&e))?
                .unwrap_or_default();
            let purged = parse_gtid_set(&purged)?;
            if !purged.is_subset(set) {
                return Ok(Some(purged_error(format!("the server purged GTIDs {purged}"))));
            }
        }
        Gtids::MariaDb(pos) => {
            let logs = binary_logs(conn).await?;
            let first = logs.first().ok_or_else(|| Error::definite("the server has no binary logs"))?;
            let oldest = mariadb_gtid_at(conn, &BinlogCoord { file: first.0.clone(), pos: 4 }).await?;
            // Every domain the oldest binlog starts after must be covered by our position: otherwise the
            // transactions between our position and the oldest binlog's start are gone.
            for gtid in oldest.iter() {
                if !pos.contains(&gtid) {
                    return Ok(Some(purged_error(format!("the oldest binlog {} starts after GTID {gtid}", first.0))));
                }
            }
        }
        Gtids::None => {
            let logs = binary_logs(conn).await?;
            if !logs.iter().any(|(name, _)| *name == position.coord.file) {
                let oldest = logs.first().map(|l| l.0.as_str()).unwrap_or("none");
                return Ok(Some(purged_error(format!(
                    "binlog file {} is gone; the oldest is {oldest}",
                    position.coord.file
                ))));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (accept any certificate, skip the host name check, trust the configured CA alone)
    type Checks = (bool, bool, bool);

    /// What each `source.tls` setting asks of the TLS client. Guards against `tls_ca_file` being trusted *beside* the public
    /// roots, which let any public CA vouch for the server.
    #[test]
    fn tls_settings_become_ssl_opts() {
        let ca = tempfile::NamedTempFile::new().unwrap();
        let ca_line = format!("tls_ca_file = {:?}", ca.path().to_str().unwrap());
        let cases: [(&str, &str, Option<Checks>); 4] = [
            ("disabled", "", None),
            ("required", "", Some((true, true, false))),
            ("verify_identity", "", Some((false, false, false))),
            ("verify_identity", &ca_line, Some((false, false, true))),
        ];
        for (mode, extra, expected) in cases {
            let text = format!(
                "[source]\nhost = \"db\"\nuser = \"cdc\"\nserver_id = 7\ntls = \"{mode}\"\n{extra}\n\
                 [outbox]\ntable = \"shop.outbox_events\"\n[kafka]\nbootstrap_servers = \"k:9092\"\n"
            );
            let conn = SourceConn::from_config(&Config::parse(&text).unwrap()).unwrap();
            let actual = conn
                .opts
                .ssl_opts()
                .map(|ssl| (ssl.accept_invalid_certs(), ssl.skip_domain_validation(), ssl.disable_built_in_roots()));
            assert_eq!(actual, expected, "tls = {mode:?} {extra}");
        }
    }

    /// Each attempt's options carry the password its login made, and a token is offered to the cleartext
    /// plugin (as RDS, Cloud SQL and Azure ask) only under `auth` other than "password", over verified TLS.
    /// Guards against a password built into the shared options once (a token would outlive its attempt),
    /// and against the cleartext plugin enabled for a plain password.
    #[tokio::test]
    async fn each_attempt_gets_its_logins_password_and_plugin() {
        let token = tempfile::NamedTempFile::new().unwrap();
        let base = "[source]\nhost = \"db\"\nuser = \"cdc\"\nserver_id = 7\n\
                    [outbox]\ntable = \"shop.outbox_events\"\n[kafka]\nbootstrap_servers = \"k:9092\"\n";
        let with = |lines: &str| base.replace("server_id = 7\n", &format!("server_id = 7\n{lines}\n"));
        let token_lines =
            format!("auth = \"gcp_iam\"\ntls = \"verify_identity\"\ntoken_file = {:?}", token.path().to_str().unwrap());
        let cases = [
            (with("password = \"pw\""), None, "pw", false),
            (with(&token_lines), Some("first-token"), "first-token", true),
            (with(&token_lines), Some("second-token"), "second-token", true),
        ];
        for (text, file, password, cleartext) in cases {
            if let Some(content) = file {
                std::fs::write(token.path(), content).unwrap();
            }
            let conn = SourceConn::from_config(&Config::parse(&text).unwrap()).unwrap();
            assert_eq!(conn.opts.pass(), None, "the shared options hold no password");
            let login = conn.identity.login("db", 3306, "cdc").await.unwrap();
            let opts = conn.opts_for(&login);
            assert_eq!((opts.pass(), opts.enable_cleartext_plugin()), (Some(password), cleartext), "{text}");
        }
    }
}
