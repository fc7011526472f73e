//! Preflight: every server setting and privilege the connector depends on, checked before streaming and by
//! `outbox-cdc check`. Each finding says the setting, what is expected, what the server has, and the fix.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::column_types;
use super::grants::{Account, Grants, Scope};
use super::history::{self, Comparison};
use super::key_order::{index_columns, index_in_key_order, index_prefix, order_without_occurred_at, KeyType};
use super::{NameCase, ServerInfo};
use crate::config::{ColumnNames, Config, PayloadEncoding, PollOrder, ResumeBy, SnapshotLock};
use crate::error::{classify_mysql, Error, Result};
use crate::findings::{Finding, Report};
use crate::outbox::{quote_ident, TableName};
use crate::position::EndEvent;
use crate::position::ServerIdentity;
use crate::position::{Flavor, Position};

async fn variable(conn: &mut Conn, name: &str) -> Result<Option<String>> {
    let row: Option<(String, String)> = conn
        .exec_first("SHOW GLOBAL VARIABLES WHERE Variable_name = ?", (name,))
        .await
        .map_err(|e| classify_mysql(&e))?;
    Ok(row.map(|(_, v)| v))
}

fn on(value: &Option<String>) -> bool {
    matches!(value.as_deref().map(str::to_ascii_uppercase).as_deref(), Some("ON") | Some("1"))
}

fn shown(value: &Option<String>) -> String {
    value.clone().unwrap_or_else(|| "(not supported by this server)".into())
}

/// The checkpoint a run would resume from, as preflight checks it.
#[derive(Debug, Clone, Copy)]
pub struct Resume<'a> {
    /// The server it must belong to (the connected one, under `--accept-new-server`).
    pub server: &'a ServerIdentity,
    /// Where the stream resumes.
    pub position: &'a Position,
    /// The binlog event that ended the checkpoint's transaction, compared with the server's binlog when the
    /// checkpoint was written on this server.
    pub end_event: Option<EndEvent>,
}

/// Runs every check. Only connection-level problems are errors; findings go into the report.
///
/// The privileges come first: a later check's own statement may need one of them (`SHOW BINARY LOGS` needs
/// `BINLOG MONITOR`), and its refusal then ends the checks with the report so far, in which the missing
/// privilege is already a finding with its `GRANT`, instead of an error that names none.
///
/// # Errors
/// Classified query errors that prevent checking at all.
pub async fn check(
    conn: &mut Conn,
    info: &ServerInfo,
    config: &Config,
    checkpoint: Option<&ResumeCheck<'_>>,
) -> Result<Report> {
    let mut report = Report::default();
    let account = current_account(conn).await?;
    check_privileges(conn, info.identity.flavor, config, &account, &mut report).await?;
    check_signal_table(conn, config, false, &account, &mut report).await?;
    match check_server(conn, info, config, checkpoint, &account, &mut report).await {
        Err(e) if e.is_definite() && report.failures().next().is_some() => {
            report.push(
                "the remaining checks",
                "run",
                "stopped by a refused statement",
                false,
                &format!("{e}; fix the failures above, then run check again"),
            );
            Ok(report)
        }
        checked => checked.map(|()| report),
    }
}

/// Every check but the privileges ([`check`]).
async fn check_server(
    conn: &mut Conn,
    info: &ServerInfo,
    config: &Config,
    checkpoint: Option<&ResumeCheck<'_>>,
    account: &Account,
    report: &mut Report,
) -> Result<()> {
    let flavor = info.identity.flavor;
    let managed = super::purge::read_managed(conn).await?;
    let restart_note = super::managed::where_to_set(managed.provider);

    let log_bin = variable(conn, "log_bin").await?;
    report.push("log_bin", "ON", &shown(&log_bin), on(&log_bin), &format!("enable binary logging {restart_note}"));

    let format = variable(conn, "binlog_format").await?;
    report.push(
        "binlog_format",
        "ROW",
        &shown(&format),
        format.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("ROW")),
        &format!("SET GLOBAL binlog_format = 'ROW' and binlog_format=ROW {restart_note}"),
    );

    let image = variable(conn, "binlog_row_image").await?;
    report.push(
        "binlog_row_image",
        "FULL",
        &shown(&image),
        image.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("FULL")),
        &format!("SET GLOBAL binlog_row_image = 'FULL' and binlog_row_image=FULL {restart_note}"),
    );

    let metadata = variable(conn, "binlog_row_metadata").await?;
    report.push(
        "binlog_row_metadata",
        "FULL",
        &shown(&metadata),
        metadata.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("FULL")),
        &format!(
            "SET GLOBAL binlog_row_metadata = 'FULL' and binlog_row_metadata=FULL {restart_note}; column names \
             come from it (MySQL 8.0.1+, MariaDB 10.5+)"
        ),
    );

    if flavor == Flavor::MySql {
        let value_options = variable(conn, "binlog_row_value_options").await?;
        if let Some(v) = &value_options {
            report.push(
                "binlog_row_value_options",
                "'' (not PARTIAL_JSON)",
                if v.is_empty() { "''" } else { v },
                !v.to_ascii_uppercase().contains("PARTIAL_JSON"),
                "SET GLOBAL binlog_row_value_options = ''",
            );
        }
        if config.source.kind.resume_by() == Some(ResumeBy::Gtid) {
            let gtid_mode = variable(conn, "gtid_mode").await?;
            report.push(
                "gtid_mode",
                "ON",
                &shown(&gtid_mode),
                gtid_mode.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("ON")),
                "enable GTIDs (gtid_mode=ON, enforce_gtid_consistency=ON), or opt in to file positions with \
                 source.resume_by = \"file\"",
            );
            let enforce = variable(conn, "enforce_gtid_consistency").await?;
            report.push(
                "enforce_gtid_consistency",
                "ON",
                &shown(&enforce),
                on(&enforce),
                "SET GLOBAL enforce_gtid_consistency = ON (required with gtid_mode=ON)",
            );
        }
    } else {
        let compress = variable(conn, "log_bin_compress").await?;
        report.push(
            "log_bin_compress",
            "OFF",
            &shown(&compress),
            !on(&compress),
            "SET GLOBAL log_bin_compress = OFF (compressed events cannot be decoded)",
        );
    }

    let retention = super::managed::judge(managed.provider, &managed.retention);
    report.findings.push(Finding {
        setting: retention.setting,
        expected: retention.expected,
        actual: retention.actual,
        status: retention.status,
        fix: retention.fix,
    });
    if let Some(problem) = &managed.endpoint_problem {
        report.push("binlog source", "the writer (only it has binlogs)", "an Aurora reader", false, problem);
    }

    check_replica(conn, info, report).await?;
    let (case, tables) = check_table_names(conn, config.tables(), report).await?;
    check_binlog_filters(conn, info, case, &tables, report).await?;
    check_replica_filters(conn, info, case, &tables, report).await?;
    check_commit_order(conn, info, report).await?;
    for table in config.tables() {
        check_table(conn, table, &config.outbox.columns, account, report).await?;
        let snapshots = config.snapshot.mode != crate::config::SnapshotMode::Never;
        let uses_event_type = config.topic().uses_columns().1;
        check_column_types(conn, table, &config.outbox.columns, snapshots, uses_event_type, report).await?;
    }

    if let Some(checked) = checkpoint {
        checked.report(info, report);
    }
    Ok(())
}

/// What the server says about resuming a checkpoint, asked once: preflight reports it, and
/// `snapshot.mode = "when_needed"` acts on it.
pub struct ResumeCheck<'a> {
    resume: Resume<'a>,
    /// The checkpoint's end event compared with the server's binlog; `None` when there was nothing to compare.
    history: Option<Result<Comparison>>,
    /// Why the server's binlogs no longer hold the checkpoint's position, if they do not.
    purged: Option<Error>,
}

impl<'a> ResumeCheck<'a> {
    /// Compares the checkpoint's end event with the server's binlog (when it was written on this server) and
    /// looks for a purge.
    ///
    /// # Errors
    /// Transient errors of the comparison, and classified query errors of the purge check.
    pub async fn run(
        source: &super::SourceConn,
        conn: &mut Conn,
        info: &ServerInfo,
        server_id: u32,
        resume: Resume<'a>,
    ) -> Result<Self> {
        let history = match resume.end_event {
            Some(end) if *resume.server == info.identity => {
                match history::compare(source, conn, info.identity.flavor, server_id, resume.position, end).await {
                    Err(e) if !e.is_definite() => return Err(e),
                    compared => Some(compared),
                }
            }
            _ => None,
        };
        let purged = super::position_purged(conn, resume.position).await?;
        Ok(ResumeCheck { resume, history, purged })
    }

    /// Why the checkpoint cannot be resumed on this server, if it cannot: the server's binlog is another
    /// history than the one it was read from, or no longer holds its position.
    ///
    /// # Errors
    /// The history could not be compared (a server error, such as a missing privilege): no reason to
    /// snapshot again.
    pub fn unresumable(&self) -> Result<Option<Error>> {
        match &self.history {
            Some(Err(e)) => Err(e.clone()),
            Some(Ok(Comparison::Diverged(detail))) => Ok(Some(history::diverged_error(self.resume.position, detail))),
            _ => Ok(self.purged.clone()),
        }
    }

    fn report(&self, info: &ServerInfo, report: &mut Report) {
        let Resume { server, position, .. } = self.resume;
        report.push(
            "checkpoint server",
            &describe_identity(server),
            &describe_identity(&info.identity),
            *server == info.identity,
            "the checkpoint belongs to another server; if this is a planned failover within the same GTID \
             topology, restart with --accept-new-server, otherwise move the state directory away",
        );
        const HISTORY: &str = "checkpoint history";
        let expected = format!("the transaction that ends at {}", position.coord);
        match &self.history {
            None => {}
            Some(Ok(Comparison::Same)) => report.push(HISTORY, &expected, "the same transaction", true, ""),
            Some(Ok(Comparison::FileGone)) => {
                report.push(HISTORY, &expected, "binlog file purged, not compared", true, "")
            }
            // A missing privilege, say, has its own finding; the comparison waits for it.
            Some(Err(e)) => report.warn(HISTORY, &expected, "not compared", &e.to_string()),
            Some(Ok(Comparison::Diverged(detail))) => report.push(
                HISTORY,
                &expected,
                "another transaction",
                false,
                &history::diverged_error(position, detail).to_string(),
            ),
        }
        match &self.purged {
            None => report.push("checkpoint position", "still in the server's binlogs", "available", true, ""),
            Some(purged) => report.push(
                "checkpoint position",
                "still in the server's binlogs",
                "purged",
                false,
                &purged.to_string(),
            ),
        }
    }
}

/// `flavor server_id=N uuid=…` for messages.
pub fn describe_identity(id: &ServerIdentity) -> String {
    let flavor = match id.flavor {
        Flavor::MySql => "MySQL",
        Flavor::MariaDb => "MariaDB",
    };
    let files = if id.binlog_files { " (binlog files)" } else { "" };
    match &id.server_uuid {
        Some(uuid) => format!("{flavor} server_id={} server_uuid={uuid}{files}", id.server_id),
        None => format!("{flavor} server_id={}{files}", id.server_id),
    }
}

async fn check_replica(conn: &mut Conn, info: &ServerInfo, report: &mut Report) -> Result<()> {
    let (status_sql, var) = match info.identity.flavor {
        Flavor::MariaDb => ("SHOW ALL SLAVES STATUS", "log_slave_updates"),
        Flavor::MySql if super::version_at_least(&info.version, 8, 0) && !info.version.starts_with("8.0.") => {
            ("SHOW REPLICA STATUS", "log_replica_updates")
        }
        Flavor::MySql => ("SHOW SLAVE STATUS", "log_slave_updates"),
    };
    let is_replica = match conn.query::<mysql_async::Row, _>(status_sql).await {
        Ok(rows) => !rows.is_empty(),
        Err(e) => {
            let err = classify_mysql(&e);
            if !err.is_definite() {
                return Err(err);
            }
            report.warn(
                "replica status",
                "readable",
                "not permitted",
                "grant REPLICATION CLIENT (MariaDB: SLAVE MONITOR) so the connector can tell whether the \
                 server is a replica",
            );
            return Ok(());
        }
    };
    if is_replica {
        let value = variable(conn, var).await?;
        report.push(
            var,
            "ON (the server is a replica)",
            &shown(&value),
            on(&value),
            &format!("set {var}=ON so the replica writes replicated transactions to its own binlog"),
        );
    }
    Ok(())
}

/// Resolves every configured outbox table to the server's spelling (see [`super::resolve_tables`]): one
/// finding per table. Returns the server's rule for names and the tables as it spells them (as configured
/// where they did not resolve; those have failed here already).
async fn check_table_names(
    conn: &mut Conn,
    configured: &[TableName],
    report: &mut Report,
) -> Result<(NameCase, Vec<TableName>)> {
    let mut case = NameCase::Unknown;
    let mut tables = Vec::new();
    for table in configured.iter().cloned() {
        let setting = format!("table {table} name");
        match super::resolve_tables(conn, std::slice::from_ref(&table)).await {
            Ok(resolved) => {
                case = resolved.case;
                let server = resolved.tables.into_iter().next().map(|t| t.server).unwrap_or(table);
                let rule = match case {
                    NameCase::Sensitive => "names compared case-sensitively",
                    _ => "names compared case-insensitively",
                };
                report.push(&setting, "a base table of the server", &format!("{server} ({rule})"), true, "");
                tables.push(server);
            }
            Err(e) if e.is_definite() => {
                report.push(&setting, "a base table of the server", "not resolved", false, &e.to_string());
                tables.push(table);
            }
            Err(e) => return Err(e),
        }
    }
    Ok((case, tables))
}

/// Whether `name` is in a comma-separated filter list, compared as the server compares names (`loose`:
/// case-insensitively whatever the server does, for lists that exclude).
fn listed(list: &str, name: &str, case: NameCase, loose: bool) -> bool {
    list.split(',').map(str::trim).filter(|s| !s.is_empty()).any(|item| match (case, loose) {
        (NameCase::Sensitive, false) => item == name,
        _ => item.to_lowercase() == name.to_lowercase(),
    })
}

/// Why a database filter of the binlog (`binlog-do-db` / `binlog-ignore-db`) keeps `table`'s rows out of
/// it, if it does. In ROW format both filter on the database of the changed table.
fn binlog_filter_hides(do_db: &str, ignore_db: &str, table: &TableName, case: NameCase) -> Option<String> {
    if !do_db.trim().is_empty() && !listed(do_db, &table.database, case, false) {
        return Some(format!("binlog-do-db = {do_db} does not name {}", table.database));
    }
    if listed(ignore_db, &table.database, case, true) {
        return Some(format!("binlog-ignore-db = {ignore_db} names {}", table.database));
    }
    None
}

/// The replica's `replicate-*` filters, as `SHOW REPLICA STATUS` reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ReplicaFilters {
    do_db: String,
    ignore_db: String,
    do_table: String,
    ignore_table: String,
    wild_do_table: String,
    wild_ignore_table: String,
}

impl ReplicaFilters {
    /// Why these filters keep `table`'s rows from the replica (and so from its binlog), if they do. A
    /// filter that could drop them counts, even where the server's precedence rules might let them through.
    fn hides(&self, table: &TableName, case: NameCase) -> Option<String> {
        let full = format!("{}.{}", table.database, table.table);
        if !self.do_db.trim().is_empty() && !listed(&self.do_db, &table.database, case, false) {
            return Some(format!("replicate-do-db = {} does not name {}", self.do_db, table.database));
        }
        if listed(&self.ignore_db, &table.database, case, true) {
            return Some(format!("replicate-ignore-db = {} names {}", self.ignore_db, table.database));
        }
        if listed(&self.ignore_table, &full, case, true) {
            return Some(format!("replicate-ignore-table = {} names {full}", self.ignore_table));
        }
        let patterns = |list: &str| {
            list.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_string).collect::<Vec<_>>()
        };
        if let Some(p) = patterns(&self.wild_ignore_table).iter().find(|p| NameCase::Insensitive.like(p, &full)) {
            return Some(format!("replicate-wild-ignore-table = {p} matches {full}"));
        }
        let do_tables = !self.do_table.trim().is_empty() || !self.wild_do_table.trim().is_empty();
        if do_tables
            && !listed(&self.do_table, &full, case, false)
            && !patterns(&self.wild_do_table).iter().any(|p| NameCase::Insensitive.like(p, &full))
        {
            return Some(format!(
                "replicate-do-table = {} / replicate-wild-do-table = {} do not name {full}",
                self.do_table, self.wild_do_table
            ));
        }
        None
    }
}

/// `binlog-do-db` / `binlog-ignore-db`: a server that filters the outbox's database out of its binlog has
/// the rows in the table (the snapshot reads them) but never streams them.
async fn check_binlog_filters(
    conn: &mut Conn,
    info: &ServerInfo,
    case: NameCase,
    tables: &[TableName],
    report: &mut Report,
) -> Result<()> {
    let row: Option<mysql_async::Row> =
        conn.query_first(super::binlog_status_sql(info)).await.map_err(|e| classify_mysql(&e))?;
    let Some(row) = row else { return Ok(()) }; // log_bin is OFF: its own finding.
    let do_db: String = row.get("Binlog_Do_DB").unwrap_or_default();
    let ignore_db: String = row.get("Binlog_Ignore_DB").unwrap_or_default();
    for table in tables {
        let hidden = binlog_filter_hides(&do_db, &ignore_db, table, case);
        report.push(
            &format!("binlog filters for {table}"),
            "the outbox's database is written to the binlog",
            hidden.as_deref().unwrap_or("not filtered"),
            hidden.is_none(),
            &format!(
                "remove binlog-do-db / binlog-ignore-db from the server's configuration, or make them keep \
                 database {} in the binlog, and restart the server; rows written while it was filtered are \
                 in the table only: take a new snapshot (see the runbook)",
                table.database
            ),
        );
    }
    Ok(())
}

/// A replica's `replicate-*` filters: what they drop never reaches the replica's table nor its binlog, while
/// the source has it.
async fn check_replica_filters(
    conn: &mut Conn,
    info: &ServerInfo,
    case: NameCase,
    tables: &[TableName],
    report: &mut Report,
) -> Result<()> {
    let rows = match replica_status(conn, info).await? {
        Some(rows) => rows,
        None => return Ok(()), // not permitted: check_replica warned already.
    };
    for row in &rows {
        let text = |name: &str| row.get_opt::<String, _>(name).and_then(|v| v.ok()).unwrap_or_default();
        let filters = ReplicaFilters {
            do_db: text("Replicate_Do_DB"),
            ignore_db: text("Replicate_Ignore_DB"),
            do_table: text("Replicate_Do_Table"),
            ignore_table: text("Replicate_Ignore_Table"),
            wild_do_table: text("Replicate_Wild_Do_Table"),
            wild_ignore_table: text("Replicate_Wild_Ignore_Table"),
        };
        let connection = text("Connection_name");
        let channel = text("Channel_Name");
        let source =
            [connection, channel].into_iter().find(|s| !s.is_empty()).map(|s| format!(" '{s}'")).unwrap_or_default();
        for table in tables {
            let hidden = filters.hides(table, case);
            report.push(
                &format!("replication filters{source} for {table}"),
                "the outbox table is replicated",
                hidden.as_deref().unwrap_or("not filtered"),
                hidden.is_none(),
                "remove the replicate-* filters that drop the outbox table (CHANGE REPLICATION FILTER on \
                 MySQL; the replicate_* variables or the server's configuration on MariaDB), or run the \
                 connector against the source; rows the replica dropped must be re-published from the \
                 source's table",
            );
        }
    }
    Ok(())
}

/// MySQL replicas applying with several workers commit in the source's order only with
/// `replica_preserve_commit_order=ON`; otherwise the replica's binlog may hold one aggregate's events out of
/// order. MariaDB's parallel replication (conservative, optimistic, aggressive) always commits in the
/// source's order within a replication domain, which is where the connector's positions keep order too.
async fn check_commit_order(conn: &mut Conn, info: &ServerInfo, report: &mut Report) -> Result<()> {
    if info.identity.flavor != Flavor::MySql || replica_status(conn, info).await?.is_none_or(|r| r.is_empty()) {
        return Ok(());
    }
    let (workers_var, preserve_var) = match variable(conn, "replica_parallel_workers").await? {
        Some(_) => ("replica_parallel_workers", "replica_preserve_commit_order"),
        None => ("slave_parallel_workers", "slave_preserve_commit_order"),
    };
    let workers: u64 = variable(conn, workers_var).await?.and_then(|v| v.parse().ok()).unwrap_or(0);
    let preserve = variable(conn, preserve_var).await?;
    let ok = workers <= 1 || on(&preserve);
    report.push(
        preserve_var,
        &format!("ON when {workers_var} > 1 (the replica commits in the source's order)"),
        &format!("{} with {workers_var} = {workers}", shown(&preserve)),
        ok,
        &format!(
            "STOP REPLICA SQL_THREAD; SET GLOBAL {preserve_var} = ON; START REPLICA SQL_THREAD (and set it in \
             the server's configuration), or {workers_var} = 1; otherwise the replica's binlog can hold an \
             aggregate's events in another order than the source committed them"
        ),
    );
    Ok(())
}

/// The rows of `SHOW REPLICA STATUS` (every connection on MariaDB); `None` when not permitted.
async fn replica_status(conn: &mut Conn, info: &ServerInfo) -> Result<Option<Vec<mysql_async::Row>>> {
    match conn.query::<mysql_async::Row, _>(replica_status_sql(info)).await {
        Ok(rows) => Ok(Some(rows)),
        Err(e) => {
            let err = classify_mysql(&e);
            if err.is_definite() {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}

fn replica_status_sql(info: &ServerInfo) -> &'static str {
    match info.identity.flavor {
        Flavor::MariaDb => "SHOW ALL SLAVES STATUS",
        Flavor::MySql if super::version_at_least(&info.version, 8, 0) && !info.version.starts_with("8.0.") => {
            "SHOW REPLICA STATUS"
        }
        Flavor::MySql => "SHOW SLAVE STATUS",
    }
}

/// The connection's account (`CURRENT_USER()`), which every fix's `GRANT … TO` names.
///
/// # Errors
/// Classified query errors.
pub async fn current_account(conn: &mut Conn) -> Result<Account> {
    let user: Option<String> = conn.query_first("SELECT CURRENT_USER()").await.map_err(|e| classify_mysql(&e))?;
    Ok(Account::from_current_user(user.as_deref().unwrap_or_default()))
}

/// The grants of the session: the account's, and those of its active roles ([`super::grants`]).
async fn session_grants(conn: &mut Conn, flavor: Flavor) -> Result<Grants> {
    let q = |e: mysql_async::Error| classify_mysql(&e).context("reading the connector's grants (SHOW GRANTS)");
    let sql = match flavor {
        // MariaDB's SHOW GRANTS lists the current role's grants, of the roles granted to it, and of PUBLIC too
        // (SHOW GRANTS FOR a nested role would need SELECT on `mysql`).
        Flavor::MariaDb => "SHOW GRANTS".to_string(),
        // MySQL's lists the account's own; `USING` adds the active roles' (CURRENT_ROLE() names them quoted,
        // or says NONE; MySQL 5.7 has no roles and no CURRENT_ROLE()).
        Flavor::MySql => {
            let active: Option<Option<String>> = conn.query_first("SELECT CURRENT_ROLE()").await.ok().flatten();
            match active.flatten().filter(|r| !r.is_empty() && !r.eq_ignore_ascii_case("NONE")) {
                Some(roles) => format!("SHOW GRANTS FOR CURRENT_USER() USING {roles}"),
                None => "SHOW GRANTS".to_string(),
            }
        }
    };
    let lines: Vec<String> = match conn.query(&sql).await {
        Ok(lines) => lines,
        // A role MySQL will not expand (one that is active but not granted to the account, such as a
        // mandatory role): the account's own grants, which may then lack what only that role holds.
        Err(e) if sql != "SHOW GRANTS" && classify_mysql(&e).is_definite() => {
            tracing::warn!(statement = %sql, error = %e, "refused: reading the account's own grants, without its roles");
            conn.query("SHOW GRANTS").await.map_err(q)?
        }
        Err(e) => return Err(q(e)),
    };
    Ok(Grants::parse(lines.iter().map(String::as_str)))
}

/// The binlog source's privileges that no harmless statement can prove: the binlog dump's, the binlog
/// listing's and, on MySQL when a snapshot may run, its lock's (`snapshot.lock`). Each missing one is a
/// failure whose fix is the `GRANT` for this account.
async fn check_privileges(
    conn: &mut Conn,
    flavor: Flavor,
    config: &Config,
    account: &Account,
    report: &mut Report,
) -> Result<()> {
    let grants = session_grants(conn, flavor).await?;
    let lctn: Option<u32> =
        conn.query_first("SELECT @@lower_case_table_names").await.map_err(|e| classify_mysql(&e))?;
    let case = NameCase::of_lower_case_table_names(lctn.unwrap_or(0));
    judge_privileges(flavor, config, &grants, case, account, report);
    Ok(())
}

/// [`check_privileges`]'s verdict on the grants it read.
fn judge_privileges(
    flavor: Flavor,
    config: &Config,
    grants: &Grants,
    case: NameCase,
    account: &Account,
    report: &mut Report,
) {
    let global = |privilege: &str| grants.holds(privilege, &Scope::Global, case);
    report.push(
        "privilege REPLICATION SLAVE",
        "granted on *.*",
        if global("REPLICATION SLAVE") { "granted" } else { "missing" },
        global("REPLICATION SLAVE"),
        &format!("GRANT REPLICATION SLAVE ON *.* TO {account}"),
    );
    let (name, ok) = match flavor {
        Flavor::MariaDb => ("BINLOG MONITOR", global("BINLOG MONITOR") || global("REPLICATION CLIENT")),
        Flavor::MySql => ("REPLICATION CLIENT", global("REPLICATION CLIENT")),
    };
    report.push(
        &format!("privilege {name}"),
        "granted on *.*",
        if ok { "granted" } else { "missing" },
        ok,
        &format!("GRANT {name} ON *.* TO {account}"),
    );
    // MariaDB's snapshot reads its binlog position without a lock (src/source/snapshot.rs).
    if flavor == Flavor::MySql && config.snapshot.mode != crate::config::SnapshotMode::Never {
        match config.snapshot.lock {
            SnapshotLock::Tables => {
                let mut databases: Vec<&str> = config.tables().iter().map(|t| t.database.as_str()).collect();
                databases.sort_unstable();
                databases.dedup();
                for database in databases {
                    let scope = Scope::Database(database.to_string());
                    let ok = grants.holds("LOCK TABLES", &scope, case);
                    report.push(
                        &format!("privilege LOCK TABLES on {scope}"),
                        "granted (the snapshot's brief LOCK TABLES … READ on the outbox table, snapshot.lock = \"tables\")",
                        if ok { "granted" } else { "missing" },
                        ok,
                        &format!(
                            "GRANT LOCK TABLES ON {scope} TO {account} (a database privilege: it cannot be granted \
                             on a table)"
                        ),
                    );
                }
            }
            SnapshotLock::Global => {
                let ok = global("RELOAD");
                report.push(
                    "privilege RELOAD",
                    "granted on *.* (the snapshot's brief FLUSH TABLES WITH READ LOCK, snapshot.lock = \"global\")",
                    if ok { "granted" } else { "missing" },
                    ok,
                    &format!(
                        "GRANT RELOAD ON *.* TO {account}, or set snapshot.lock = \"tables\" (managed MySQL \
                         services do not grant RELOAD)"
                    ),
                );
            }
        }
    }
}

async fn check_table(
    conn: &mut Conn,
    table: &TableName,
    columns: &ColumnNames,
    account: &Account,
    report: &mut Report,
) -> Result<()> {
    let present: Vec<(String, String)> = conn
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| classify_mysql(&e))?;
    if present.is_empty() {
        report.push(
            &format!("table {table}"),
            "exists and is readable",
            "not found (or no privilege on it)",
            false,
            &format!("create the outbox table, or GRANT SELECT ON {table} TO {account}"),
        );
        return Ok(());
    }
    let has = |name: &str| present.iter().any(|(c, _)| c.eq_ignore_ascii_case(name));
    let missing: Vec<String> = (columns.required().iter().zip(crate::outbox::SLOT_NAMES))
        .filter(|((name, required), _)| *required && !has(name))
        .map(|((name, _), role)| if *name == role { format!("`{name}`") } else { format!("`{name}` ({role})") })
        .chain(
            (columns.additional().iter())
                .filter(|name| !has(name))
                .map(|name| format!("`{name}` (outbox.additional_placement)")),
        )
        .collect();
    report.push(
        &format!("table {table} columns"),
        "id, aggregate_type, aggregate_id, payload, each optional column (event_type, schema_version, \
         headers, occurred_at) named in [outbox.columns], and each outbox.additional_placement column (as \
         configured)",
        &if missing.is_empty() { "present".to_string() } else { format!("missing {}", missing.join(", ")) },
        missing.is_empty(),
        "fix the table or [outbox.columns] (an optional column left at its default name may be absent)",
    );
    let select = format!("SELECT 1 FROM {} LIMIT 0", table.quoted());
    let readable = conn.query_drop(select).await;
    match readable {
        Ok(()) => report.push(&format!("privilege SELECT on {table}"), "granted", "granted", true, ""),
        Err(e) => {
            let err = classify_mysql(&e);
            if !err.is_definite() {
                return Err(err);
            }
            report.push(
                &format!("privilege SELECT on {table}"),
                "granted",
                "missing",
                false,
                &format!("GRANT SELECT ON {table} TO {account}"),
            );
        }
    }
    Ok(())
}

/// Every mapped column's type is one the stream and the snapshot read alike ([`column_types::TypeFamily`]).
/// Missing columns are [`check_table`]'s finding; here they are skipped.
async fn check_column_types(
    conn: &mut Conn,
    table: &TableName,
    columns: &ColumnNames,
    snapshot: bool,
    topic_uses_event_type: bool,
    report: &mut Report,
) -> Result<()> {
    type ColumnRow = (String, String, String, Option<String>, Option<String>);
    let present: Vec<ColumnRow> = conn
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME \
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| classify_mysql(&e))?;
    if present.is_empty() {
        return Ok(());
    }
    let mapped: Vec<(&str, &str, &ColumnRow)> = crate::outbox::SLOT_NAMES
        .iter()
        .zip(columns.required())
        .filter_map(|(role, (name, _))| Some((*role, name, present.iter().find(|c| c.0.eq_ignore_ascii_case(name))?)))
        .collect();
    let problems: Vec<String> = mapped
        .iter()
        .filter_map(|(role, name, (_, data_type, shown, charset, _))| {
            let family = column_types::TypeFamily::of_sql(data_type, shown, charset.as_deref());
            match *role {
                "payload" if columns.payload_encoding() == PayloadEncoding::Bytes => {
                    column_types::bytes_payload_problem(table, name, shown, &family)
                }
                _ => column_types::column_type_problem(table, role, name, shown, family),
            }
        })
        .chain(columns.additional().iter().filter_map(|name| {
            let (_, data_type, shown, charset, _) = present.iter().find(|c| c.0.eq_ignore_ascii_case(name))?;
            let family = column_types::TypeFamily::of_sql(data_type, shown, charset.as_deref()).err()?;
            Some(format!(
                "column `{name}` (outbox.additional_placement) of {table} is {shown} ({family}); change its type \
                 or take it out of outbox.additional_placement"
            ))
        }))
        .collect();
    // One line per role: the column's type and what becomes of it in the record (problems are the
    // summary's, below).
    for (slot, role) in crate::outbox::SLOT_NAMES.iter().enumerate() {
        let column = mapped.iter().find(|(r, _, _)| r == role);
        let actual = match column {
            Some((_, name, (_, data_type, shown, charset, _))) => {
                let bytes = *role == "payload" && columns.payload_encoding() == PayloadEncoding::Bytes;
                match column_types::TypeFamily::of_sql(data_type, shown, charset.as_deref()) {
                    Ok(column_types::TypeFamily::Text) if bytes => format!(
                        "`{name}` {shown}: its bytes unchanged (payload_encoding = \"bytes\"), published as the \
                         whole record value"
                    ),
                    Ok(family) if !bytes && column_types::accepted_families(role).contains(&family) => format!(
                        "`{name}` {shown}: {}, published as {}",
                        column_types::rendering(family),
                        column_types::published_as(slot)
                    ),
                    _ => continue,
                }
            }
            None if !columns.must_exist(slot) => format!("absent: {}", column_types::published_without(slot)),
            None => continue,
        };
        report.push(&format!("table {table} {role}"), "a mapped column, or absent if optional", &actual, true, "");
    }
    for name in columns.additional() {
        let Some((_, data_type, shown, charset, _)) = present.iter().find(|c| c.0.eq_ignore_ascii_case(name)) else {
            continue;
        };
        if let Ok(family) = column_types::TypeFamily::of_sql(data_type, shown, charset.as_deref()) {
            let actual = format!(
                "`{name}` {shown}: {}, published as outbox.additional_placement says",
                column_types::rendering(family)
            );
            report.push(&format!("table {table} {name}"), "a listed column", &actual, true, "");
        }
    }
    report.push(
        &format!("table {table} column types"),
        "types the connector reads (text in a character set it decodes, integers, BINARY(16) ids, ENUM/SET, JSON, DATETIME/TIMESTAMP, \
         by column)",
        &if problems.is_empty() { "as expected".to_string() } else { format!("{} unreadable", problems.len()) },
        problems.is_empty(),
        &problems.join("; "),
    );
    let has = |slot: usize| mapped.iter().any(|(role, _, _)| *role == crate::outbox::SLOT_NAMES[slot]);
    if topic_uses_event_type && !has(3) {
        report.push(
            &format!("table {table} event_type for kafka.topic"),
            "an event_type column (kafka.topic uses ${event_type})",
            "absent",
            false,
            &format!(
                "map the column that holds the event type as event_type in [outbox.columns], or take \
                 ${{event_type}} out of kafka.topic (table {table} has no `{}` column)",
                columns.event_type
            ),
        );
    }

    // The snapshot scans in keyset chunks, ORDER BY the key columns, then `key > last key` with each value
    // typed as its column (key_order). A type whose order cannot be reproduced from its text is refused
    // there; say so here first, with the fix.
    if snapshot {
        // A table without occurred_at orders each aggregate by its id, which must be an integer
        // (key_order::order_without_occurred_at says why, and the fix).
        let third = if has(7) { &columns.occurred_at } else { &columns.id };
        let key_columns = [&columns.aggregate_type, &columns.aggregate_id, third, &columns.id];
        let mut unordered: Vec<String> = Vec::new();
        for (i, name) in key_columns.iter().enumerate() {
            let Some((name, data_type, shown, charset, collation)) =
                present.iter().find(|c| c.0.eq_ignore_ascii_case(name))
            else {
                continue;
            };
            match KeyType::from_schema(name, data_type, shown, charset.as_deref(), collation.as_deref()) {
                Err(e) => unordered.push(e.to_string()),
                Ok(key) if i == 2 && !has(7) => {
                    if let Err(e) = order_without_occurred_at(table, &(name.clone(), key)) {
                        unordered.push(e.to_string());
                    }
                }
                Ok(_) => {}
            }
        }
        report.push(
            &format!("table {table} snapshot key order"),
            "key columns of a type the snapshot can resume in order",
            &if unordered.is_empty() {
                "as expected".to_string()
            } else {
                format!("{} column(s) cannot", unordered.len())
            },
            unordered.is_empty(),
            &unordered.join("; "),
        );
        check_snapshot_index(conn, table, key_columns, report).await?;
    }
    Ok(())
}

/// The snapshot reads each table in one query ordered by `(aggregate_type, aggregate_id, occurred_at)`, the
/// id last: with an index that starts with those columns the server walks it, without one it sorts the
/// whole table first (correct, and memory-bounded on our side, but a sort of every row on the server, and
/// no row arrives before it ends). A warning with the `ALTER TABLE` that adds it.
async fn check_snapshot_index(
    conn: &mut Conn,
    table: &TableName,
    key: [&String; 4],
    report: &mut Report,
) -> Result<()> {
    let wanted = index_prefix(key.map(String::as_str));
    let setting = format!("table {table} snapshot index");
    let listed = wanted.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
    let expected = format!("an index on ({listed})");
    if index_in_key_order(conn, table, &wanted).await?.is_some() {
        report.push(&setting, &expected, "present", true, "");
    } else {
        report.warn(
            &setting,
            &expected,
            "none: the snapshot still runs in order, but the server sorts the whole table before the first row",
            &format!(
                "ALTER TABLE {} ADD INDEX idx_outbox_cdc_snapshot ({listed}), ALGORITHM=INPLACE, LOCK=NONE",
                table.quoted()
            ),
        );
    }
    Ok(())
}

/// `check` for the polling relay (`source.kind = "poll"`): per outbox table, the columns (the outbox roles
/// and the relay's, [`crate::relay::POLL_COLUMNS`]), how an aggregate's events are ordered, the index the
/// claim query reads (`published_at, next_attempt_at`: refused without it, with the `ALTER TABLE` that adds
/// it), the index of the order rule's look-up (a warning), and the privileges: `SELECT` and `UPDATE` on
/// the table, `PROCESS` (to list the open transactions), nothing on the binlog.
///
/// # Errors
/// Classified query errors that prevent checking at all.
pub async fn check_poll(conn: &mut Conn, config: &Config) -> Result<Report> {
    let mut report = Report::default();
    let account = current_account(conn).await?;
    check_signal_table(conn, config, true, &account, &mut report).await?;
    let mut sequences: Vec<(&TableName, String)> = Vec::new();
    let read_only = check_relay_server(conn, config.poll.progress.table(), &mut report).await?;
    for table in config.tables() {
        check_table(conn, table, &config.outbox.columns, &account, &mut report).await?;
        let found = crate::relay::columns_of(conn, table).await?;
        if found.is_empty() {
            continue;
        }
        let progress = &config.poll.progress;
        let problems = crate::relay::poll_column_problems(table, &found, progress);
        report.push(
            &format!("table {table} relay columns"),
            &crate::relay::POLL_COLUMNS
                .iter()
                .zip(crate::relay::POLL_COLUMN_DEFINITIONS)
                .map(|(name, definition)| format!("{name} {definition}"))
                .collect::<Vec<_>>()
                .join(", "),
            &if problems.is_empty() { "present".to_string() } else { problems.join("; ") },
            problems.is_empty(),
            &crate::relay::poll_columns_ddl(table, &found, progress).unwrap_or_default(),
        );
        let order = crate::relay::order_key(&found, &config.outbox.columns, config.poll.order);
        report.push(
            &format!("table {table} event order"),
            match config.poll.order {
                PollOrder::Sequence => "an AUTO_INCREMENT column (insertion order)",
                PollOrder::OccurredAt => "occurred_at, then id ([poll] order = \"occurred_at\")",
            },
            &match &order {
                Some(crate::relay::OrderKey::Sequence(c)) => format!("by {}", quote_ident(c)),
                Some(crate::relay::OrderKey::OccurredAtThenId) => format!(
                    "by {}, then {}",
                    quote_ident(&config.outbox.columns.occurred_at),
                    quote_ident(&config.outbox.columns.id)
                ),
                None => "none".to_string(),
            },
            order.is_some(),
            &crate::relay::no_order_key(table, &config.outbox.columns, config.poll.order),
        );
        if let Some(crate::relay::OrderKey::Sequence(seq)) = &order {
            sequences.push((table, seq.clone()));
        }
        let indexes = index_columns(conn, table).await?;
        let starts_with = |wanted: &[&str]| {
            indexes.iter().any(|(_, cols)| {
                cols.len() >= wanted.len() && cols.iter().zip(wanted).all(|(c, w)| c.eq_ignore_ascii_case(w))
            })
        };
        let order_or_default = order.clone().unwrap_or(crate::relay::OrderKey::OccurredAtThenId);
        let wanted = crate::relay::read_index_columns(&order_or_default, &config.outbox.columns);
        let ddl = crate::relay::read_index_ddl(table, &order_or_default, &config.outbox.columns);
        let ready = starts_with(&wanted);
        report.push(
            &format!("table {table} read index"),
            &format!("an index on ({}, ...) such as idx_unpublished", wanted.join(", ")),
            if ready { "present" } else { "none: every read would scan the table" },
            ready,
            &ddl,
        );
        let (at, ai) = (&config.outbox.columns.aggregate_type, &config.outbox.columns.aggregate_id);
        // Lifting a hold reads the held aggregate's unpublished rows: along an index that starts with the
        // aggregate, else a scan of the table for every hold released.
        let wanted = format!("an index on ({at}, {ai}, ...)");
        let found = starts_with(&[at.as_str(), ai.as_str()]);
        let finding = format!("table {table} aggregate index");
        if found {
            report.push(&finding, &wanted, "present", true, "");
        } else {
            report.warn(
                &finding,
                &wanted,
                "none: releasing a held aggregate scans the table to find the rows it held",
                &format!(
                    "ALTER TABLE {} ADD INDEX idx_aggregate ({}, {}), ALGORITHM=INPLACE, LOCK=NONE",
                    table.quoted(),
                    quote_ident(at),
                    quote_ident(ai)
                ),
            );
        }
        // Privileges are checked at prepare time: an UPDATE that matches nothing tells without changing a row.
        // A read-only server refuses it whatever the grants (its own finding says so).
        if read_only {
            report.warn(&format!("privilege UPDATE on {table}"), "granted", "not probed: the server is read-only", "");
            continue;
        }
        let probe = format!("UPDATE {} SET `attempts` = `attempts` WHERE 1 = 0", table.quoted());
        let update = match conn.query_drop(probe).await {
            Ok(()) => true,
            Err(e) => {
                let err = classify_mysql(&e);
                if !err.is_definite() {
                    return Err(err);
                }
                false
            }
        };
        report.push(
            &format!("privilege UPDATE on {table}"),
            "granted (the relay marks rows published, refused, parked)",
            if update { "granted" } else { "missing" },
            update,
            &format!("GRANT SELECT, UPDATE ON {table} TO {account} (no REPLICATION privilege is needed)"),
        );
    }
    check_process(conn, &account, &mut report).await?;
    if let Some(progress) = config.poll.progress.table() {
        if check_progress_table(conn, progress, &account, read_only, &mut report).await? {
            crate::relay::fresh_counters(conn).await?;
            for (table, seq) in sequences {
                check_counter(conn, progress, table, &seq, &mut report).await?;
            }
        }
    }
    Ok(report)
}

/// `check` of the server the relay reaches ([`crate::relay::server`]): writable (a replica is read-only),
/// and with `[poll] progress_table` (`progress`) numbering rows one by one. The relay also proves at run
/// time that each of its connections reaches the server its lease is on, which a check without the lease
/// cannot: the line names the server this connection reached. Returns whether the server is read-only.
/// `[outbox] signal_table`, when set: in Debezium's layout (three columns at least, the first two texts) and,
/// for the polling relay (`by_sql`), readable by the connector's user. The binlog source needs no grant on
/// it, so a table its user cannot see is only a warning there.
async fn check_signal_table(
    conn: &mut Conn,
    config: &Config,
    by_sql: bool,
    account: &Account,
    report: &mut Report,
) -> Result<()> {
    let Some(table) = config.signal_table() else { return Ok(()) };
    let setting = format!("signal table {table}");
    let expected = "id, type, data: texts, in Debezium's layout";
    let create = format!(
        "CREATE TABLE {} (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL, data VARCHAR(2048) NULL) \
         (README, Signals)",
        table.quoted()
    );
    if by_sql {
        match conn.query_drop(format!("SELECT * FROM {} LIMIT 0", table.quoted())).await {
            Ok(()) => {}
            Err(mysql_async::Error::Server(e)) if e.code == 1146 => {
                report.push(&setting, expected, "does not exist", false, &create);
                return Ok(());
            }
            Err(mysql_async::Error::Server(e)) if e.code == 1142 => {
                let fix = format!("GRANT SELECT ON {table} TO {account} (the relay reads it every second)");
                report.push(&setting, expected, "not readable by the relay's user", false, &fix);
                return Ok(());
            }
            Err(e) => return Err(classify_mysql(&e)),
        }
    }
    let columns: Vec<(String, String)> = conn
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
             ORDER BY ORDINAL_POSITION LIMIT 3",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| classify_mysql(&e))?;
    if columns.is_empty() {
        let fix = format!("none needed if it exists (read from the binlog, no grant needed); else {create}");
        report.warn(&setting, expected, "not visible to the connector's user: its layout is not checked", &fix);
        return Ok(());
    }
    let text = |t: &str| matches!(t, "varchar" | "char" | "text" | "tinytext" | "mediumtext" | "longtext" | "json");
    let fits = columns.len() == 3 && columns[..2].iter().all(|(_, t)| text(&t.to_ascii_lowercase()));
    let actual = columns.iter().map(|(name, t)| format!("{name} {t}")).collect::<Vec<_>>().join(", ");
    report.push(&setting, expected, &actual, fits, &format!("make its first three columns texts: {create}"));
    Ok(())
}

async fn check_relay_server(conn: &mut Conn, progress: Option<&TableName>, report: &mut Report) -> Result<bool> {
    use crate::relay::server::{Refusal, Seen};
    let seen = Seen::read(conn).await?;
    let server = match &seen.server_uuid {
        Some(uuid) => format!("server_id {} ({uuid})", seen.server_id),
        None => format!("server_id {}", seen.server_id),
    };
    report.push(
        "server read_only",
        "OFF (the writable primary, not a replica or a read/write-splitting proxy's reader)",
        &format!("{} on {server}", if seen.read_only { "ON" } else { "OFF" }),
        !seen.read_only,
        &if seen.read_only { Refusal::ReadOnly { server_id: seen.server_id }.to_string() } else { String::new() },
    );
    if let Some(progress) = progress {
        let fine = seen.increment == 1;
        report.push(
            "auto_increment_increment",
            "1 (GLOBAL; [poll] progress_table)",
            &seen.increment.to_string(),
            fine,
            &match fine {
                true => String::new(),
                false => Refusal::Increment { progress: progress.clone(), increment: seen.increment }.to_string(),
            },
        );
    }
    Ok(seen.read_only)
}

/// `check` of a table's sequence counter against `[poll] progress_table`'s number: a counter at or below
/// it (the table was truncated, re-created or restored) is refused by the relay and `prune`
/// ([`crate::relay::CounterReset`]), with the statement that resets the number.
async fn check_counter(
    conn: &mut Conn,
    progress: &TableName,
    table: &TableName,
    seq: &str,
    report: &mut Report,
) -> Result<()> {
    // Unreadable: the privileges' finding above says why.
    let number = match crate::relay::read_frontier(conn, progress, table).await {
        Ok(number) => number,
        Err(e) if e.is_definite() => return Ok(()),
        Err(e) => return Err(e),
    };
    let counter = crate::relay::Counter::read(conn, table, seq).await?;
    let shown = counter.next.map_or("not reported".to_string(), |n| n.to_string());
    let reset = crate::relay::CounterReset::judge(table, seq, progress, number, counter);
    report.push(
        &format!("table {table} sequence counter"),
        &format!("above {progress}'s published_through ({number})"),
        &format!("AUTO_INCREMENT {shown}"),
        reset.is_none(),
        &reset.map(|r| r.to_string()).unwrap_or_default(),
    );
    Ok(())
}

/// `check` of the relay's `PROCESS`, in either mode: a sequence number a read passed without a row is proven
/// free by listing the open transactions (`information_schema.INNODB_TRX`, which the server refuses
/// without it). Probed by that listing itself, which writes nothing.
async fn check_process(conn: &mut Conn, account: &Account, report: &mut Report) -> Result<()> {
    let process = match crate::relay::open_transactions(conn, &crate::relay::fence::Fence::Unleased).await {
        Ok(_) => true,
        Err(e) if e.is_definite() => false,
        Err(e) => return Err(e),
    };
    report.push(
        "privilege PROCESS",
        "granted (the relay reads information_schema.INNODB_TRX to know when a skipped sequence number can no \
         longer be committed)",
        if process { "granted" } else { "missing" },
        process,
        &format!("GRANT PROCESS ON *.* TO {account}"),
    );
    Ok(())
}

/// `check` of `[poll] progress_table`: the table with its columns, and the relay's `INSERT` and `UPDATE` on
/// it (probed without writing, unless the server is `read_only`). Returns whether the table is there with
/// its columns.
async fn check_progress_table(
    conn: &mut Conn,
    progress: &TableName,
    account: &Account,
    read_only: bool,
    report: &mut Report,
) -> Result<bool> {
    let found = crate::relay::columns_of(conn, progress).await?;
    let columns = ["outbox_table", "published_through", "updated_at"];
    let ready = columns.iter().all(|c| found.iter().any(|f| f.0.eq_ignore_ascii_case(c)));
    report.push(
        &format!("progress table {progress}"),
        &format!("a table with the columns {}", columns.join(", ")),
        match (ready, found.is_empty()) {
            (true, _) => "present",
            (false, true) => "none (or not visible to this user)",
            (false, false) => "lacks some of them",
        },
        ready,
        &crate::relay::progress_table_ddl(progress),
    );
    if ready && !read_only {
        // Privileges are checked at prepare time: statements that match nothing tell without writing.
        let probes = [
            format!("UPDATE {t} SET published_through = published_through WHERE 1 = 0", t = progress.quoted()),
            format!("INSERT INTO {t} SELECT * FROM {t} WHERE 1 = 0", t = progress.quoted()),
        ];
        let mut granted = true;
        for probe in probes {
            if let Err(e) = conn.query_drop(probe).await {
                let err = classify_mysql(&e);
                if !err.is_definite() {
                    return Err(err);
                }
                granted = false;
            }
        }
        report.push(
            &format!("privileges on {progress}"),
            "SELECT, INSERT, UPDATE (the relay records how far each table is published)",
            if granted { "granted" } else { "missing" },
            granted,
            &format!("GRANT SELECT, INSERT, UPDATE ON {progress} TO {account}"),
        );
    }
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binlog source's config for `shop.outbox_events`, with `extra` lines in `[snapshot]`.
    fn config_with_snapshot(extra: &str) -> Config {
        Config::parse(&format!(
            "[source]\nhost = \"db\"\nuser = \"cdc\"\npassword = \"pw\"\nserver_id = 5401\n\
             [outbox]\ntable = \"shop.outbox_events\"\n[kafka]\nbootstrap_servers = \"k:9092\"\n\
             [snapshot]\n{extra}\n"
        ))
        .expect("a valid config")
    }

    /// The findings of [`judge_privileges`] as `check` prints them, for `SHOW GRANTS` lines.
    fn judged(flavor: Flavor, config: &Config, lines: &[&str]) -> String {
        let mut report = Report::default();
        let account = Account::from_current_user("cdc@%");
        judge_privileges(
            flavor,
            config,
            &Grants::parse(lines.iter().copied()),
            NameCase::Sensitive,
            &account,
            &mut report,
        );
        report.to_string()
    }

    /// Guards against the README's old advice, `GRANT SELECT, LOCK TABLES ON shop.outbox_events`, which both
    /// servers refuse (LOCK TABLES is a database privilege): a MySQL user learned of the missing lock
    /// privilege only when `run` started its snapshot.
    #[test]
    fn mysql_snapshot_lock_privileges_are_named_with_their_grant() {
        let replication = "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `cdc`@`%`";
        let tables = config_with_snapshot("lock = \"tables\"");
        let out = judged(Flavor::MySql, &tables, &[replication, "GRANT SELECT ON `shop`.`outbox_events` TO `cdc`@`%`"]);
        assert!(
            out.contains(
                "[FAIL] privilege LOCK TABLES on shop.*: expected granted (the snapshot's brief LOCK TABLES … READ on \
                 the outbox table, snapshot.lock = \"tables\"), actual missing\n       fix: GRANT LOCK TABLES ON \
                 shop.* TO 'cdc'@'%' (a database privilege: it cannot be granted on a table)\n"
            ),
            "{out}"
        );
        let out = judged(Flavor::MySql, &tables, &[replication, "GRANT SELECT, LOCK TABLES ON `shop`.* TO `cdc`@`%`"]);
        assert!(out.contains("[ok  ] privilege LOCK TABLES on shop.*"), "{out}");
        assert!(!out.contains("FAIL"), "{out}");

        let global = config_with_snapshot("lock = \"global\"");
        let out = judged(Flavor::MySql, &global, &[replication]);
        assert!(
            out.contains(
                "[FAIL] privilege RELOAD: expected granted on *.* (the snapshot's brief FLUSH TABLES WITH READ LOCK, \
                 snapshot.lock = \"global\"), actual missing\n       fix: GRANT RELOAD ON *.* TO 'cdc'@'%', or set \
                 snapshot.lock = \"tables\" (managed MySQL services do not grant RELOAD)\n"
            ),
            "{out}"
        );

        // No lock where no snapshot runs, nor on MariaDB, whose snapshot takes none.
        let never = config_with_snapshot("mode = \"never\"");
        assert!(!judged(Flavor::MySql, &never, &[replication]).contains("LOCK TABLES"));
        assert!(!judged(Flavor::MariaDb, &tables, &[replication]).contains("LOCK TABLES"));
    }

    #[test]
    fn replication_privileges_are_named_with_their_grant() {
        let config = config_with_snapshot("mode = \"never\"");
        let out = judged(Flavor::MySql, &config, &["GRANT USAGE ON *.* TO `cdc`@`%`"]);
        for line in [
            "[FAIL] privilege REPLICATION SLAVE: expected granted on *.*, actual missing\n       fix: GRANT \
             REPLICATION SLAVE ON *.* TO 'cdc'@'%'\n",
            "[FAIL] privilege REPLICATION CLIENT: expected granted on *.*, actual missing\n       fix: GRANT \
             REPLICATION CLIENT ON *.* TO 'cdc'@'%'\n",
        ] {
            assert!(out.contains(line), "{line}\nin\n{out}");
        }
        // MariaDB shows REPLICATION CLIENT as BINLOG MONITOR, its 10.5 name; either holds it.
        let out = judged(Flavor::MariaDb, &config, &["GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cdc`@`%`"]);
        assert!(!out.contains("FAIL"), "{out}");
    }

    fn table(d: &str, t: &str) -> TableName {
        TableName { database: d.into(), table: t.into() }
    }

    /// `binlog-do-db` / `binlog-ignore-db` that keep the outbox's database out of the binlog are found (issue
    /// 16 item 8: the snapshot saw the rows, the stream never did).
    #[test]
    fn binlog_filters_that_hide_the_outbox() {
        let t = table("shop", "outbox_events");
        let cases = [
            ("", "", NameCase::Sensitive, false),
            ("shop", "", NameCase::Sensitive, false),
            ("billing, shop", "", NameCase::Sensitive, false),
            ("billing", "", NameCase::Sensitive, true),
            ("Shop", "", NameCase::Sensitive, true),
            ("Shop", "", NameCase::Insensitive, false),
            ("", "shop", NameCase::Sensitive, true),
            ("", "SHOP", NameCase::Sensitive, true),
            ("", "billing", NameCase::Sensitive, false),
        ];
        for (do_db, ignore_db, case, hidden) in cases {
            assert_eq!(
                binlog_filter_hides(do_db, ignore_db, &t, case).is_some(),
                hidden,
                "{do_db:?} {ignore_db:?} {case:?}"
            );
        }
    }

    /// A replica's `replicate-*` filters that could drop the outbox table are found.
    #[test]
    fn replica_filters_that_hide_the_outbox() {
        let t = table("shop", "outbox_events");
        let f = |field: &str, value: &str| {
            let mut filters = ReplicaFilters::default();
            let slot = match field {
                "do_db" => &mut filters.do_db,
                "ignore_db" => &mut filters.ignore_db,
                "do_table" => &mut filters.do_table,
                "ignore_table" => &mut filters.ignore_table,
                "wild_do_table" => &mut filters.wild_do_table,
                "wild_ignore_table" => &mut filters.wild_ignore_table,
                _ => unreachable!(),
            };
            *slot = value.into();
            filters
        };
        let cases = [
            (ReplicaFilters::default(), false),
            (f("do_db", "shop"), false),
            (f("do_db", "billing"), true),
            (f("ignore_db", "shop"), true),
            (f("ignore_db", "billing"), false),
            (f("do_table", "shop.outbox_events"), false),
            (f("do_table", "shop.orders"), true),
            (f("ignore_table", "shop.outbox_events"), true),
            (f("wild_do_table", "shop.%"), false),
            (f("wild_do_table", "sh_p.outbox\\_events"), false),
            (f("wild_do_table", "billing.%"), true),
            (f("wild_ignore_table", "%.outbox%"), true),
            (f("wild_ignore_table", "shop.orders%"), false),
        ];
        for (filters, hidden) in cases {
            assert_eq!(filters.hides(&t, NameCase::Sensitive).is_some(), hidden, "{filters:?}");
        }
    }
}
