//! Purge risk: how close the checkpointed position is to being purged from the server's binlogs.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! The server deletes binlog files older than its retention (`binlog_expire_logs_seconds`, or
//! `expire_logs_days` on older servers). A connector that stays down, or behind, for longer loses the
//! binlog it needs to resume, and then only a new snapshot recovers the events (see the runbook). We warn
//! before that happens.
//!
//! # The estimate
//! The file that holds the checkpointed transaction was last written no earlier than that transaction's
//! commit, so `now − commit time of the checkpointed transaction` is an upper bound of how long ago that
//! file was last written, which is what expiry compares with the retention. The ratio therefore errs on
//! the side of warning early, never late. `needed_bytes` sums the sizes of that file and every newer one: the backlog the
//! connector still has to read, and the disk the server must keep for it.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::binary_logs;
use super::managed::{self, Retention, RetentionQuery};
use crate::error::{classify_mysql, Result};
use crate::position::Position;

/// One reading of the purge risk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PurgeRisk {
    /// Seconds since the checkpointed transaction committed.
    pub needed_age_seconds: u64,
    /// Bytes of binlog files from the checkpoint's file to the newest.
    pub needed_bytes: u64,
    /// The server's retention in seconds; 0 when binlogs never expire.
    pub retention_seconds: u64,
    /// The checkpoint's binlog file is no longer listed by the server.
    pub file_gone: bool,
}

impl PurgeRisk {
    /// Needed age over retention: at 1.0 the server may purge the binlog the connector needs. 0 when
    /// binlogs never expire (only a manual `PURGE BINARY LOGS` can remove them).
    pub fn ratio(&self) -> f64 {
        if self.file_gone {
            return f64::INFINITY;
        }
        if self.retention_seconds == 0 {
            return 0.0;
        }
        self.needed_age_seconds as f64 / self.retention_seconds as f64
    }
}

impl std::fmt::Display for PurgeRisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.file_gone {
            return write!(f, "PURGED: the checkpoint's binlog file is no longer on the server");
        }
        let retention = if self.retention_seconds == 0 {
            "binlogs never expire".to_string()
        } else if self.retention_seconds == managed::AS_SOON_AS_POSSIBLE_SECONDS {
            "no retention: the server purges binlogs as soon as possible (see outbox-cdc check)".to_string()
        } else {
            format!("retention {}", human_seconds(self.retention_seconds))
        };
        write!(
            f,
            "{:.0}% (oldest needed binlog is at most {} old, {retention}; {} of binlog to read)",
            100.0 * self.ratio(),
            human_seconds(self.needed_age_seconds),
            human_bytes(self.needed_bytes)
        )
    }
}

/// The server's binlog retention in seconds as its provider applies it (0 = never expires,
/// [`managed::AS_SOON_AS_POSSIBLE_SECONDS`] = purged as soon as possible, also when a managed service's
/// setting could not be read: the estimate errs on the side of warning early).
///
/// # Errors
/// Classified query errors.
pub async fn retention_seconds(conn: &mut Conn) -> Result<u64> {
    let reading = read_managed(conn).await?;
    Ok(reading.retention.unwrap_or(Retention::AsSoonAsPossible).gauge_seconds())
}

/// Who runs the server and its binlog retention, read where that provider keeps it ([`managed`]).
///
/// # Errors
/// Classified query errors; a refused retention query is the reading's `Err` instead.
pub async fn read_managed(conn: &mut Conn) -> Result<managed::Reading> {
    let names: Vec<String> = managed::REPORTED_VARIABLES.iter().map(|n| format!("'{n}'")).collect();
    let sql = format!("SHOW GLOBAL VARIABLES WHERE Variable_name IN ({})", names.join(", "));
    let vars: std::collections::BTreeMap<String, String> =
        conn.query(sql).await.map_err(|e| classify_mysql(&e))?.into_iter().collect();
    let provider = managed::detect(&vars);
    let retention = match provider.retention_query() {
        RetentionQuery::Variables { zero } => Ok(managed::retention_from_variables(&vars, zero)),
        RetentionQuery::RdsConfiguration => rds_retention(conn).await?,
    };
    Ok(managed::Reading { provider, retention, endpoint_problem: managed::endpoint_problem(provider, &vars) })
}

/// The retention RDS and Aurora report (`CALL mysql.rds_show_configuration`); `Err` when the server
/// refused the call (the connector's user may lack EXECUTE on it) or answered something else.
///
/// # Errors
/// Classified errors other than the server's refusal (a cut connection).
pub async fn rds_retention(conn: &mut Conn) -> Result<std::result::Result<Retention, String>> {
    match conn.query::<mysql_async::Row, _>(managed::RDS_SHOW_CONFIGURATION).await {
        Ok(rows) => {
            let rows: Vec<(String, Option<String>)> = rows
                .iter()
                .map(|r| (r.get::<String, _>(0).unwrap_or_default(), r.get::<Option<String>, _>(1).flatten()))
                .collect();
            Ok(managed::retention_from_rds_configuration(&rows))
        }
        Err(mysql_async::Error::Server(e)) => {
            Ok(Err(format!("{} was refused: {}", managed::RDS_SHOW_CONFIGURATION, e.message)))
        }
        Err(e) => Err(classify_mysql(&e)),
    }
}

/// Measures the purge risk of `checkpoint`, committed at `commit_s` (Unix seconds, server clock; `None`
/// when no transaction was checkpointed yet, e.g. right after a snapshot: then its age counts as 0). A
/// checkpoint in the server's active binlog has no risk: that file is never purged.
///
/// # Errors
/// Classified query errors.
pub async fn measure(conn: &mut Conn, checkpoint: &Position, commit_s: Option<u32>, now_s: u64) -> Result<PurgeRisk> {
    let logs = binary_logs(conn).await?;
    let retention_seconds = retention_seconds(conn).await?;
    let from = logs.iter().position(|(name, _)| *name == checkpoint.coord.file);
    let needed_bytes = match from {
        Some(i) => logs[i..].iter().map(|(_, size)| size).sum::<u64>().saturating_sub(checkpoint.coord.pos),
        None => 0,
    };
    // The server never purges its active (newest) binlog: a checkpoint in it is safe however old.
    let in_active_file = from.is_some_and(|i| i + 1 == logs.len());
    let age = commit_s.map(|ts| now_s.saturating_sub(u64::from(ts))).unwrap_or(0);
    Ok(PurgeRisk {
        needed_age_seconds: if in_active_file { 0 } else { age },
        needed_bytes,
        retention_seconds,
        file_gone: from.is_none() && !checkpoint.coord.file.is_empty(),
    })
}

fn human_seconds(s: u64) -> String {
    match s {
        0..=119 => format!("{s} s"),
        120..=7_199 => format!("{} min", s / 60),
        7_200..=172_799 => format!("{:.1} h", s as f64 / 3600.0),
        _ => format!("{:.1} days", s as f64 / 86_400.0),
    }
}

fn human_bytes(b: u64) -> String {
    match b {
        0..=9_999 => format!("{b} B"),
        10_000..=999_999 => format!("{:.1} kB", b as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} MB", b as f64 / 1e6),
        _ => format!("{:.1} GB", b as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_and_display() {
        let risk = PurgeRisk {
            needed_age_seconds: 43_200,
            needed_bytes: 5_000_000,
            retention_seconds: 86_400,
            file_gone: false,
        };
        assert_eq!(risk.ratio(), 0.5);
        assert_eq!(
            risk.to_string(),
            "50% (oldest needed binlog is at most 12.0 h old, retention 24.0 h; 5.0 MB of binlog to read)"
        );
        let never = PurgeRisk { retention_seconds: 0, ..risk };
        assert_eq!(never.ratio(), 0.0);
        // A managed service that purges binlogs as soon as possible (RDS's default): never "ample".
        let none = PurgeRisk { retention_seconds: managed::AS_SOON_AS_POSSIBLE_SECONDS, ..risk };
        assert!(none.ratio() > 1.0);
        assert!(none.to_string().contains("no retention: the server purges binlogs as soon as possible"), "{none}");
        let gone = PurgeRisk { file_gone: true, ..risk };
        assert!(gone.ratio().is_infinite());
        assert!(gone.to_string().starts_with("PURGED"));
    }
}
