//! Preflight: every server setting and privilege the connector depends on, checked before streaming and by
//! `outbox-cdc check`. Each finding says the setting, what is expected, what the server has, and the fix.

use std::fmt;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::history::{self, Comparison, EndEvent};
use super::{column_types, decode};
use super::{ServerIdentity, ServerInfo};
use crate::config::{ColumnNames, Config, ResumeBy, TableName};
use crate::error::{classify_mysql, Error, Result};
use crate::position::{Flavor, Position};

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// As required.
    Ok,
    /// Works, but worth attention.
    Warn,
    /// The connector cannot run correctly like this.
    Fail,
}

/// One checked setting.
#[derive(Debug, Clone)]
pub struct Finding {
    /// What was checked.
    pub setting: String,
    /// The required value.
    pub expected: String,
    /// What the server has.
    pub actual: String,
    /// Outcome.
    pub status: Status,
    /// How to fix it (empty when OK).
    pub fix: String,
}

/// All findings for one server.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Findings in check order.
    pub findings: Vec<Finding>,
}

impl Report {
    fn push(&mut self, setting: &str, expected: &str, actual: &str, ok: bool, fix: &str) {
        self.findings.push(Finding {
            setting: setting.into(),
            expected: expected.into(),
            actual: actual.into(),
            status: if ok { Status::Ok } else { Status::Fail },
            fix: if ok { String::new() } else { fix.into() },
        });
    }

    fn warn(&mut self, setting: &str, expected: &str, actual: &str, fix: &str) {
        self.findings.push(Finding {
            setting: setting.into(),
            expected: expected.into(),
            actual: actual.into(),
            status: Status::Warn,
            fix: fix.into(),
        });
    }

    /// Failed findings.
    pub fn failures(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.status == Status::Fail)
    }

    /// A definite error listing every failure, or `Ok` when nothing failed.
    ///
    /// # Errors
    /// A definite error when any check failed.
    pub fn into_result(self) -> Result<()> {
        let failures: Vec<String> = self
            .failures()
            .map(|f| format!("{}: expected {}, found {} — {}", f.setting, f.expected, f.actual, f.fix))
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::definite(format!("preflight failed:\n  {}", failures.join("\n  "))))
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for finding in &self.findings {
            let mark = match finding.status {
                Status::Ok => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            writeln!(f, "[{mark}] {}: expected {}, actual {}", finding.setting, finding.expected, finding.actual)?;
            if !finding.fix.is_empty() {
                writeln!(f, "       fix: {}", finding.fix)?;
            }
        }
        Ok(())
    }
}

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
/// # Errors
/// Classified query errors that prevent checking at all.
pub async fn check(
    conn: &mut Conn,
    info: &ServerInfo,
    config: &Config,
    checkpoint: Option<&ResumeCheck<'_>>,
) -> Result<Report> {
    let mut report = Report::default();
    let flavor = info.identity.flavor;
    let restart_note = "(set it in the server's configuration file and restart it; replicas need it too)";

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
        if config.source.resume_by == ResumeBy::Gtid {
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

    check_replica(conn, info, &mut report).await?;
    check_privileges(conn, flavor, &mut report).await?;
    for table in config.outbox_tables()? {
        check_table(conn, &table, &config.outbox.columns, &mut report).await?;
        check_column_types(conn, &table, &config.outbox.columns, &mut report).await?;
    }

    if let Some(checked) = checkpoint {
        checked.report(info, &mut report);
    }
    Ok(report)
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
    pub async fn run(conn: &mut Conn, info: &ServerInfo, config: &Config, resume: Resume<'a>) -> Result<Self> {
        let history = match resume.end_event {
            Some(end) if *resume.server == info.identity => {
                match history::compare(conn, info.identity.flavor, config.source.server_id, resume.position, end).await
                {
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

async fn check_privileges(conn: &mut Conn, flavor: Flavor, report: &mut Report) -> Result<()> {
    let grants: Vec<String> = conn.query("SHOW GRANTS").await.map_err(|e| classify_mysql(&e))?;
    let global: Vec<String> =
        grants.iter().map(|g| g.to_ascii_uppercase()).filter(|g| g.contains(" ON *.* ")).collect();
    let has = |privilege: &str| global.iter().any(|g| g.contains("ALL PRIVILEGES") || g.contains(privilege));
    report.push(
        "privilege REPLICATION SLAVE",
        "granted on *.*",
        if has("REPLICATION SLAVE") { "granted" } else { "missing" },
        has("REPLICATION SLAVE"),
        "GRANT REPLICATION SLAVE ON *.* TO the connector's user",
    );
    let (name, ok) = match flavor {
        Flavor::MariaDb => ("BINLOG MONITOR", has("BINLOG MONITOR") || has("REPLICATION CLIENT")),
        Flavor::MySql => ("REPLICATION CLIENT", has("REPLICATION CLIENT")),
    };
    report.push(
        &format!("privilege {name}"),
        "granted on *.*",
        if ok { "granted" } else { "missing" },
        ok,
        &format!("GRANT {name} ON *.* TO the connector's user"),
    );
    Ok(())
}

async fn check_table(conn: &mut Conn, table: &TableName, columns: &ColumnNames, report: &mut Report) -> Result<()> {
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
            &format!("create the outbox table, or GRANT SELECT ON {table} TO the connector's user"),
        );
        return Ok(());
    }
    let missing: Vec<&str> = columns
        .required()
        .iter()
        .filter(|(name, required)| *required && !present.iter().any(|(c, _)| c.eq_ignore_ascii_case(name)))
        .map(|(name, _)| *name)
        .collect();
    report.push(
        &format!("table {table} columns"),
        "id, aggregate_type, aggregate_id, event_type, schema_version, payload, occurred_at (as configured)",
        &if missing.is_empty() { "present".to_string() } else { format!("missing {}", missing.join(", ")) },
        missing.is_empty(),
        "fix the table or [outbox.columns]",
    );
    let select =
        format!("SELECT 1 FROM `{}`.`{}` LIMIT 0", table.database.replace('`', "``"), table.table.replace('`', "``"));
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
                &format!("GRANT SELECT ON {table} TO the connector's user"),
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
    let mapped: Vec<(&str, &str, &ColumnRow)> = decode::SLOT_NAMES
        .iter()
        .zip(columns.required())
        .filter_map(|(role, (name, _))| Some((*role, name, present.iter().find(|c| c.0.eq_ignore_ascii_case(name))?)))
        .collect();
    let problems: Vec<String> = mapped
        .iter()
        .filter_map(|(role, name, (_, data_type, shown, charset, _))| {
            let family = column_types::TypeFamily::of_sql(data_type, charset.as_deref());
            column_types::column_type_problem(table, role, name, shown, family)
        })
        .collect();
    report.push(
        &format!("table {table} column types"),
        "types the connector reads (text in utf8mb4, integers, ENUM/SET, JSON, DATETIME/TIMESTAMP, by column)",
        &if problems.is_empty() { "as expected".to_string() } else { format!("{} unreadable", problems.len()) },
        problems.is_empty(),
        &problems.join("; "),
    );

    // The snapshot scans in keyset chunks: ORDER BY the key columns, then `column > last value`. An ENUM
    // sorts by its labels' positions but compares with a string as text, a SET sorts by its bitmask: unless
    // the two orders agree, the scan skips rows without a trace.
    let mut misordered = Vec::new();
    for (role, name, (_, data_type, shown, _, collation)) in &mapped {
        if !["id", "aggregate_type", "aggregate_id"].contains(role) {
            continue;
        }
        let fix = format!(
            "change `{name}` to VARCHAR, or list the ENUM's labels in ascending order (ALTER TABLE {table} MODIFY \
             `{name}` ENUM(…) with the same labels, sorted)"
        );
        if data_type.eq_ignore_ascii_case("set") {
            misordered.push(format!("`{name}` is {shown}: a SET sorts by its bitmask, not as text; {fix}"));
        } else if data_type.eq_ignore_ascii_case("enum") {
            let labels = enum_labels(shown);
            let collation = collation.as_deref().unwrap_or("utf8mb4_bin");
            if let Some((a, b)) = first_descent(conn, &labels, collation).await? {
                misordered.push(format!(
                    "`{name}` is {shown}: an ENUM sorts by its labels' positions, and '{b}' comes after '{a}' \
                     although it is smaller as text ({collation}); {fix}"
                ));
            }
        }
    }
    report.push(
        &format!("table {table} snapshot key order"),
        "id, aggregate_type and aggregate_id sort as they compare",
        &if misordered.is_empty() {
            "as expected".to_string()
        } else {
            format!("{} column(s) do not", misordered.len())
        },
        misordered.is_empty(),
        &format!("the snapshot's keyset scan would skip rows: {}", misordered.join("; ")),
    );
    Ok(())
}

/// The labels of an ENUM or SET as `information_schema.COLUMNS.COLUMN_TYPE` spells them:
/// `enum('a','it''s','back\\slash')`.
fn enum_labels(column_type: &str) -> Vec<String> {
    let inner = column_type.find('(').map_or("", |open| &column_type[open + 1..]);
    let mut labels = Vec::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut label = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\'' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    label.push('\'');
                }
                '\'' => break,
                '\\' => label.extend(chars.next()),
                c => label.push(c),
            }
        }
        labels.push(label);
    }
    labels
}

/// The first two neighbouring labels that are not in ascending order under `collation`, asked of the server.
async fn first_descent(conn: &mut Conn, labels: &[String], collation: &str) -> Result<Option<(String, String)>> {
    let charset = collation.split('_').next().unwrap_or("utf8mb4");
    let text = format!("CONVERT(? USING {charset}) COLLATE {collation}");
    for pair in labels.windows(2) {
        let ascending: Option<Option<i64>> = conn
            .exec_first(format!("SELECT {text} < {text}"), (&pair[0], &pair[1]))
            .await
            .map_err(|e| classify_mysql(&e))?;
        if ascending.flatten() != Some(1) {
            return Ok(Some((pair[0].clone(), pair[1].clone())));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod column_type_tests {
    use super::enum_labels;

    #[test]
    fn enum_labels_as_information_schema_spells_them() {
        let cases: &[(&str, &[&str])] = &[
            ("enum('order','payment')", &["order", "payment"]),
            ("set('a','b,c')", &["a", "b,c"]),
            (r"enum('it''s','back\\slash','')", &["it's", r"back\slash", ""]),
            ("enum('x')", &["x"]),
        ];
        for (column_type, expected) in cases {
            assert_eq!(enum_labels(column_type), *expected, "{column_type}");
        }
    }
}
