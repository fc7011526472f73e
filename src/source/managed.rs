//! Managed MySQL services: which one the server is, and where its binlog retention really is.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! The purge-risk gauge ([`super::purge`]) compares the age of the oldest binlog the connector still needs
//! with the server's retention. On a self-managed server that is `binlog_expire_logs_seconds` (or
//! `expire_logs_days`), 0 meaning "never expire". Two managed services read those variables differently,
//! and reading them as MySQL does reports ample retention where there is almost none:
//!
//! | Provider | Told apart by | Retention | 0 / NULL means |
//! | --- | --- | --- | --- |
//! | Amazon Aurora MySQL | `@@aurora_version` exists | `binlog retention hours` of `CALL mysql.rds_show_configuration` | NULL (default): purged lazily, "usually not longer than a day" |
//! | Amazon RDS for MySQL/MariaDB | `@@basedir` under `/rdsdbbin/` | the same | NULL (default): not retained ("0 hours") |
//! | Google Cloud SQL for MySQL | `@@version` ends in `-google`, `@@version_comment` is `(Google)` | the `binlog_expire_logs_seconds` flag (`expire_logs_days` on 5.7) | as in MySQL |
//! | Azure Database for MySQL flexible server | the `aad_auth_only` server parameter exists | the `binlog_expire_logs_seconds` parameter | 0 (default): deleted as soon as nothing holds it |
//!
//! Sources, for whoever revisits the rules:
//! - Aurora's version variable: AWS, "Checking Aurora MySQL versions using SQL" (`SELECT @@aurora_version`,
//!   AuroraUserGuide/AuroraMySQL.Updates.Versions). Community MySQL has no such variable.
//! - RDS's base directory: RDS installs the server under `/rdsdbbin/` (`/rdsdbbin/mysql-8.0.x.R1/`, Aurora
//!   `/rdsdbbin/oscar-…`); phpMyAdmin's `isAmazonRds()` and dolphie (charles-001/dolphie, `db_connect`) detect
//!   RDS by `@@basedir`, and dolphie Aurora by `aurora_version` before it.
//! - `binlog retention hours`: AWS, "Setting and showing binary log configuration"
//!   (UserGuide/mysql-stored-proc-configuring and AuroraUserGuide/mysql-stored-proc-configuring): "The
//!   default value of binlog retention hours is NULL. For RDS for MySQL, NULL means binary logs aren't
//!   retained (0 hours)"; "For Aurora MySQL, NULL means binary logs are cleaned up lazily … usually not
//!   longer than a day"; set with `CALL mysql.rds_set_configuration('binlog retention hours', 24)`; the
//!   value 0 is refused; at most 168 hours on RDS for MySQL, 2160 (90 days) on Aurora MySQL 2.11+ and 3.
//! - Cloud SQL's version: Cloud SQL servers report `8.0.31-google` (mysqldump and client banners:
//!   `Server version: 8.0.31-google (Google)`); its retention is the `binlog_expire_logs_seconds` database
//!   flag (`expire_logs_days` for 5.7), set with `gcloud sql instances patch … --database-flags`.
//! - Azure's parameter: `aad_auth_only` (Microsoft Entra authentication) is a server parameter of the
//!   flexible server only (dolphie detects Azure by it); retention: Microsoft Learn, "Server parameters in
//!   Azure Database for MySQL - Flexible Server", `binlog_expire_logs_seconds`: "If
//!   binlog_expire_logs_seconds is set to the default value of 0, a binary log is deleted as soon as the
//!   handle to it's freed".
//! - Aurora readers: "Binary logs are accessible only from the primary DB instance, not from the replicas"
//!   (AWS, USER_LogAccess.MySQL.BinaryFormat); a reader reports `@@innodb_read_only = 1`.
//!
//! `@@hostname` is not used: RDS and Aurora report the EC2 host's `ip-10-…` name, Cloud SQL and Azure
//! their own host names; none of them is particular to the service.
//!
//! This module is pure: [`super::purge`] reads the variables and runs the retention query, and preflight
//! prints [`judge`]'s verdict.

use std::collections::BTreeMap;

use crate::findings::Status;

/// The server variables [`detect`] and [`retention_from_variables`] read (`SHOW GLOBAL VARIABLES WHERE
/// Variable_name IN …`: a variable the server does not have is simply absent, never an error).
pub const REPORTED_VARIABLES: [&str; 8] = [
    "version",
    "version_comment",
    "basedir",
    "aurora_version",
    "aad_auth_only",
    "innodb_read_only",
    "binlog_expire_logs_seconds",
    "expire_logs_days",
];

/// What RDS and Aurora report their retention with: rows of `name`, `value`, `description`.
pub const RDS_SHOW_CONFIGURATION: &str = "CALL mysql.rds_show_configuration";

/// The retention the purge-risk gauge uses for a server that purges binlogs as soon as nothing needs
/// them: one second, so that any checkpoint outside the active binlog file reads as at risk (the active
/// file is never purged, and a checkpoint in it has no risk).
pub const AS_SOON_AS_POSSIBLE_SECONDS: u64 = 1;

/// Retention below which `check` warns: a connector down over a weekend must still find its binlog.
const WARN_BELOW_SECONDS: u64 = 24 * 3600;

/// The retention `check` proposes: 7 days, within every provider's maximum (RDS for MySQL: 168 hours).
const PROPOSED_HOURS: u64 = 168;

/// What [`super::purge::read_managed`] learned from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// Who runs it.
    pub provider: Provider,
    /// Its binlog retention as the provider applies it; `Err` says why the provider's setting could not be
    /// read.
    pub retention: Result<Retention, String>,
    /// Why it cannot serve the binlog at all ([`endpoint_problem`]).
    pub endpoint_problem: Option<String>,
}

/// Who runs the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// Not a managed service this module knows: MySQL's and MariaDB's own rules.
    SelfManaged,
    /// Amazon RDS for MySQL or MariaDB.
    Rds,
    /// Amazon Aurora MySQL.
    Aurora,
    /// Google Cloud SQL for MySQL.
    CloudSql,
    /// Azure Database for MySQL flexible server.
    Azure,
}

impl Provider {
    /// The service's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Provider::SelfManaged => "self-managed",
            Provider::Rds => "Amazon RDS",
            Provider::Aurora => "Amazon Aurora MySQL",
            Provider::CloudSql => "Google Cloud SQL",
            Provider::Azure => "Azure Database for MySQL",
        }
    }

    /// Where the service keeps its binlog retention.
    pub fn retention_query(self) -> RetentionQuery {
        match self {
            Provider::Rds | Provider::Aurora => RetentionQuery::RdsConfiguration,
            Provider::Azure => RetentionQuery::Variables { zero: Retention::AsSoonAsPossible },
            Provider::SelfManaged | Provider::CloudSql => RetentionQuery::Variables { zero: Retention::Never },
        }
    }
}

/// How to read a provider's retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionQuery {
    /// From [`REPORTED_VARIABLES`] ([`retention_from_variables`]); a retention of 0 means `zero`.
    Variables {
        /// What 0 means on this service.
        zero: Retention,
    },
    /// The row `binlog retention hours` of [`RDS_SHOW_CONFIGURATION`] ([`retention_from_rds_configuration`]).
    RdsConfiguration,
}

/// How long the server keeps a binlog file after it stopped writing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// This many seconds.
    Seconds(u64),
    /// Never purged automatically (only `PURGE BINARY LOGS` removes them).
    Never,
    /// Purged as soon as nothing the service knows of needs it (the connector is not such a thing).
    AsSoonAsPossible,
}

impl Retention {
    /// The retention in seconds as the purge-risk gauge counts it: 0 for never,
    /// [`AS_SOON_AS_POSSIBLE_SECONDS`] for as soon as possible.
    pub fn gauge_seconds(self) -> u64 {
        match self {
            Retention::Seconds(s) => s.max(AS_SOON_AS_POSSIBLE_SECONDS),
            Retention::Never => 0,
            Retention::AsSoonAsPossible => AS_SOON_AS_POSSIBLE_SECONDS,
        }
    }
}

/// The provider the variables `vars` (name to value, as [`REPORTED_VARIABLES`] returned them) belong to.
/// Aurora is asked before RDS: Aurora's base directory is under `/rdsdbbin/` too.
pub fn detect(vars: &BTreeMap<String, String>) -> Provider {
    let var = |name: &str| vars.get(name).map(String::as_str).unwrap_or("");
    if vars.get("aurora_version").is_some_and(|v| !v.trim().is_empty()) {
        Provider::Aurora
    } else if var("basedir").starts_with("/rdsdbbin/") {
        Provider::Rds
    } else if var("version").to_ascii_lowercase().contains("-google")
        || var("version_comment").eq_ignore_ascii_case("(Google)")
    {
        Provider::CloudSql
    } else if vars.contains_key("aad_auth_only") {
        Provider::Azure
    } else {
        Provider::SelfManaged
    }
}

/// The retention in `binlog_expire_logs_seconds`, else `expire_logs_days` (MySQL before 8.0 has only the
/// latter, 8.4 only the former; MariaDB 10.6+ keeps both in step), with 0 meaning `zero`.
pub fn retention_from_variables(vars: &BTreeMap<String, String>, zero: Retention) -> Retention {
    let seconds = vars.get("binlog_expire_logs_seconds").and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    let days = vars.get("expire_logs_days").and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0);
    match (seconds, (days * 86_400.0) as u64) {
        (0, 0) => zero,
        (0, from_days) => Retention::Seconds(from_days),
        (s, _) => Retention::Seconds(s),
    }
}

/// The retention in the rows of [`RDS_SHOW_CONFIGURATION`] (`name`, `value`): `binlog retention hours`,
/// NULL meaning as soon as possible (on Aurora "lazily, usually not longer than a day": nothing to count
/// on either).
///
/// # Errors
/// The rows have no `binlog retention hours`, or its value is not a number of hours.
pub fn retention_from_rds_configuration(rows: &[(String, Option<String>)]) -> Result<Retention, String> {
    let (_, value) = rows
        .iter()
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("binlog retention hours"))
        .ok_or_else(|| "its answer has no 'binlog retention hours'".to_string())?;
    match value.as_deref().map(str::trim) {
        None | Some("") | Some("NULL") => Ok(Retention::AsSoonAsPossible),
        Some(hours) => match hours.parse::<u64>() {
            Ok(0) => Ok(Retention::AsSoonAsPossible),
            Ok(h) => Ok(Retention::Seconds(h * 3600)),
            Err(_) => Err(format!("'binlog retention hours' is {hours:?}, not a number of hours")),
        },
    }
}

/// What `check` prints about the retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The finding's name.
    pub setting: String,
    /// What is expected.
    pub expected: String,
    /// What the server has.
    pub actual: String,
    /// Ok, Warn or Fail.
    pub status: Status,
    /// The provider's own way to set it (empty when OK).
    pub fix: String,
}

/// Judges `retention` (`Err`: why it could not be read) on `provider`'s server.
pub fn judge(provider: Provider, retention: &Result<Retention, String>) -> Verdict {
    let setting = match provider.retention_query() {
        RetentionQuery::RdsConfiguration => format!("binlog retention ({}: binlog retention hours)", provider.name()),
        RetentionQuery::Variables { .. } if provider == Provider::SelfManaged => "binlog retention".to_string(),
        RetentionQuery::Variables { .. } => {
            format!("binlog retention ({}: binlog_expire_logs_seconds)", provider.name())
        }
    };
    let expected = format!(
        "at least {} h (a connector stopped for longer cannot resume); {PROPOSED_HOURS} h proposed",
        WARN_BELOW_SECONDS / 3600
    );
    let (status, actual) = match retention {
        Err(why) => (Status::Warn, format!("unknown: {why}")),
        Ok(Retention::Never) => (Status::Ok, "binlogs never expire".to_string()),
        Ok(Retention::AsSoonAsPossible) => (Status::Fail, as_soon_as_possible(provider).to_string()),
        Ok(Retention::Seconds(s)) if *s < WARN_BELOW_SECONDS => (Status::Warn, describe_seconds(*s)),
        Ok(Retention::Seconds(s)) => (Status::Ok, describe_seconds(*s)),
    };
    let fix = match (status, retention) {
        (Status::Ok, _) => String::new(),
        (_, Err(_)) if provider.retention_query() == RetentionQuery::RdsConfiguration => format!(
            "run {RDS_SHOW_CONFIGURATION} as the master user to see it, and let the connector's user read it \
             (GRANT EXECUTE ON PROCEDURE mysql.rds_show_configuration TO the connector's user); until then the \
             purge-risk gauge assumes no retention. To set it, {}",
            set_retention(provider)
        ),
        _ => set_retention(provider),
    };
    Verdict { setting, expected, actual, status, fix }
}

/// What "as soon as possible" means on `provider`, in its own words.
fn as_soon_as_possible(provider: Provider) -> &'static str {
    match provider {
        Provider::Rds => "NULL (the default): binlogs are not retained; RDS purges them as soon as possible",
        Provider::Aurora => "NULL (the default): binlogs are purged lazily, usually within a day, with no promise",
        Provider::Azure => "0 (the default): a binlog is deleted as soon as nothing of the service needs it",
        Provider::SelfManaged | Provider::CloudSql => "none",
    }
}

/// The provider's way to keep binlogs for [`PROPOSED_HOURS`].
fn set_retention(provider: Provider) -> String {
    let seconds = PROPOSED_HOURS * 3600;
    match provider {
        Provider::Rds => format!(
            "as the master user: CALL mysql.rds_set_configuration('binlog retention hours', {PROPOSED_HOURS}); \
             (at most 168 on RDS for MySQL; binlog_expire_logs_seconds does not apply on RDS); mind the \
             instance's storage"
        ),
        Provider::Aurora => format!(
            "as the master user, on the writer: CALL mysql.rds_set_configuration('binlog retention hours', \
             {PROPOSED_HOURS}); (at most 2160 on Aurora MySQL 2.11+ and 3); mind the cluster's storage"
        ),
        Provider::CloudSql => format!(
            "set the database flag binlog_expire_logs_seconds={seconds} (expire_logs_days=7 on MySQL 5.7): gcloud \
             sql instances patch <instance> --database-flags=binlog_expire_logs_seconds={seconds},<every flag \
             already set> (the option replaces the instance's whole flag list)"
        ),
        Provider::Azure => format!(
            "set the server parameter: az mysql flexible-server parameter set --resource-group <group> \
             --server-name <server> --name binlog_expire_logs_seconds --value {seconds}"
        ),
        Provider::SelfManaged => format!(
            "SET PERSIST binlog_expire_logs_seconds = {seconds} (MySQL 8+); MariaDB: SET GLOBAL \
             binlog_expire_logs_seconds = {seconds} (expire_logs_days = 7 before 10.6) and the same in the \
             server's configuration file"
        ),
    }
}

fn describe_seconds(s: u64) -> String {
    match s {
        0..=7_199 => format!("{s} s"),
        _ if s % 86_400 == 0 => format!("{} days ({s} s)", s / 86_400),
        _ => format!("{:.1} h ({s} s)", s as f64 / 3600.0),
    }
}

/// Where a server setting (`binlog_format`, `binlog_row_image`, `binlog_row_metadata`, GTIDs) is set on
/// `provider`'s servers, for the fixes of preflight's findings.
pub fn where_to_set(provider: Provider) -> &'static str {
    match provider {
        Provider::SelfManaged => "(set it in the server's configuration file and restart it; replicas need it too)",
        Provider::Rds => {
            "(on Amazon RDS: set it in the instance's DB parameter group, a custom one since the default group \
             cannot be changed, and reboot the instance; read replicas need it too)"
        }
        Provider::Aurora => {
            "(on Aurora: set it in the DB cluster parameter group, or the DB parameter group where the setting is \
             per instance, and reboot the writer)"
        }
        Provider::CloudSql => {
            "(on Cloud SQL: set it as a database flag, gcloud sql instances patch <instance> \
             --database-flags=<name>=<value>,<every flag already set>; the instance may restart)"
        }
        Provider::Azure => {
            "(on Azure: set the server parameter, az mysql flexible-server parameter set --resource-group \
             <group> --server-name <server> --name <name> --value <value>)"
        }
    }
}

/// Why this server cannot serve the binlog although the service has one: an Aurora reader.
pub fn endpoint_problem(provider: Provider, vars: &BTreeMap<String, String>) -> Option<String> {
    let read_only = vars.get("innodb_read_only").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("ON"));
    (provider == Provider::Aurora && read_only).then(|| {
        "this is an Aurora reader (innodb_read_only = ON): only the writer has binlogs. Connect to the \
         cluster's writer endpoint (<cluster>.cluster-<id>.<region>.rds.amazonaws.com), not the reader \
         endpoint (cluster-ro-) nor an instance endpoint"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Variables as the server reported them: name, value.
    type Reported<'a> = &'a [(&'a str, &'a str)];

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// Each provider from what its servers report. The values are ones those services were seen to report
    /// (the sources in the module doc: phpMyAdmin's RDS test data, Aurora's `character_sets_dir` under
    /// `/rdsdbbin/oscar-5.7.mysql_aurora.2.10.2.0.4.0/`, Cloud SQL's `8.0.31-google (Google)` banners);
    /// the self-managed ones are this suite's MariaDB and a stock MySQL.
    #[test]
    fn providers_from_their_variables() {
        let cases: &[(Reported, Provider)] = &[
            (
                &[("version", "8.0.39"), ("version_comment", "MySQL Community Server - GPL"), ("basedir", "/usr/")],
                Provider::SelfManaged,
            ),
            (
                &[("version", "10.11.14-MariaDB-0+deb12u2-log"), ("version_comment", "Debian 12"), ("basedir", "/usr")],
                Provider::SelfManaged,
            ),
            (&[("version", "5.7.18-log"), ("basedir", "/rdsdbbin/mysql-5.7.18/")], Provider::Rds),
            (&[("version", "5.6.21-log"), ("basedir", "/rdsdbbin/mysql/")], Provider::Rds),
            (
                &[
                    ("version", "5.7.12-log"),
                    ("aurora_version", "2.10.2"),
                    ("basedir", "/rdsdbbin/oscar-5.7.mysql_aurora.2.10.2.0.4.0/"),
                ],
                Provider::Aurora,
            ),
            (&[("version", "8.0.32"), ("aurora_version", "3.04.0")], Provider::Aurora),
            (
                &[("version", "8.0.31-google"), ("version_comment", "(Google)"), ("basedir", "/usr/")],
                Provider::CloudSql,
            ),
            (&[("version", "8.0.31-google")], Provider::CloudSql),
            (&[("version", "8.0.21"), ("aad_auth_only", "OFF")], Provider::Azure),
            (&[("version", "8.0.21"), ("aad_auth_only", "ON"), ("basedir", "/usr/")], Provider::Azure),
            // An empty aurora_version (a proxy that lists every name) is not Aurora.
            (&[("version", "8.0.39"), ("aurora_version", ""), ("basedir", "/usr/")], Provider::SelfManaged),
        ];
        for (reported, provider) in cases {
            assert_eq!(detect(&vars(reported)), *provider, "{reported:?}");
        }
    }

    /// Retention from the variables: which one wins, and what 0 means per provider (Azure: as soon as
    /// possible, where MySQL means never).
    #[test]
    fn retention_from_the_variables() {
        let never = Retention::Never;
        let asap = Retention::AsSoonAsPossible;
        let cases: &[(Reported, Retention, Retention)] = &[
            (
                &[("binlog_expire_logs_seconds", "2592000"), ("expire_logs_days", "0")],
                never,
                Retention::Seconds(2_592_000),
            ),
            (&[("binlog_expire_logs_seconds", "0"), ("expire_logs_days", "0")], never, never),
            (&[("binlog_expire_logs_seconds", "0"), ("expire_logs_days", "0")], asap, asap),
            (&[("binlog_expire_logs_seconds", "0"), ("expire_logs_days", "7")], never, Retention::Seconds(604_800)),
            (&[("expire_logs_days", "0.500000")], never, Retention::Seconds(43_200)),
            (&[("expire_logs_days", "3")], never, Retention::Seconds(259_200)),
            (&[("binlog_expire_logs_seconds", "86400")], asap, Retention::Seconds(86_400)),
            (&[], never, never),
        ];
        for (reported, zero, retention) in cases {
            assert_eq!(retention_from_variables(&vars(reported), *zero), *retention, "{reported:?} zero={zero:?}");
        }
        assert_eq!(Provider::Azure.retention_query(), RetentionQuery::Variables { zero: asap });
        assert_eq!(Provider::CloudSql.retention_query(), RetentionQuery::Variables { zero: never });
        assert_eq!(Provider::Rds.retention_query(), RetentionQuery::RdsConfiguration);
        assert_eq!(Provider::Aurora.retention_query(), RetentionQuery::RdsConfiguration);
    }

    /// `CALL mysql.rds_show_configuration` as RDS answers it: NULL by default.
    #[test]
    fn retention_from_rds_show_configuration() {
        let row = |name: &str, value: Option<&str>| (name.to_string(), value.map(str::to_string));
        let others = [row("source delay", Some("0")), row("target delay", Some("0"))];
        let with = |value: Option<&str>| {
            let mut rows = vec![row("binlog retention hours", value)];
            rows.extend(others.iter().cloned());
            rows
        };
        assert_eq!(retention_from_rds_configuration(&with(None)), Ok(Retention::AsSoonAsPossible));
        assert_eq!(retention_from_rds_configuration(&with(Some("24"))), Ok(Retention::Seconds(86_400)));
        assert_eq!(retention_from_rds_configuration(&with(Some("168"))), Ok(Retention::Seconds(604_800)));
        assert!(retention_from_rds_configuration(&with(Some("a week"))).is_err());
        assert!(retention_from_rds_configuration(&others).is_err());
    }

    /// Regression (issue 20): RDS's default retention (NULL) is a failed check naming the RDS call, not
    /// "binlogs never expire"; each provider's fix is its own; a retention under a day warns.
    #[test]
    fn verdicts_and_fixes_per_provider() {
        let asap = Ok(Retention::AsSoonAsPossible);
        let cases: &[(Provider, Result<Retention, String>, Status, &str)] = &[
            (
                Provider::Rds,
                asap.clone(),
                Status::Fail,
                "CALL mysql.rds_set_configuration('binlog retention hours', 168)",
            ),
            (Provider::Aurora, asap.clone(), Status::Fail, "on the writer: CALL mysql.rds_set_configuration"),
            (Provider::Azure, asap.clone(), Status::Fail, "--name binlog_expire_logs_seconds --value 604800"),
            (Provider::Rds, Ok(Retention::Seconds(3 * 3600)), Status::Warn, "rds_set_configuration"),
            (Provider::Rds, Ok(Retention::Seconds(168 * 3600)), Status::Ok, ""),
            (Provider::Rds, Err("execute command denied".into()), Status::Warn, "GRANT EXECUTE ON PROCEDURE"),
            (
                Provider::CloudSql,
                Ok(Retention::Seconds(3600)),
                Status::Warn,
                "--database-flags=binlog_expire_logs_seconds=604800",
            ),
            (
                Provider::SelfManaged,
                Ok(Retention::Seconds(3600)),
                Status::Warn,
                "SET PERSIST binlog_expire_logs_seconds",
            ),
            (Provider::SelfManaged, Ok(Retention::Never), Status::Ok, ""),
            (Provider::CloudSql, Ok(Retention::Seconds(86_400)), Status::Ok, ""),
        ];
        for (provider, retention, status, fix) in cases {
            let verdict = judge(*provider, retention);
            assert_eq!(verdict.status, *status, "{provider:?} {retention:?}: {verdict:?}");
            assert!(verdict.fix.contains(fix), "{provider:?} {retention:?}: {}", verdict.fix);
        }
        let rds = judge(Provider::Rds, &asap);
        assert_eq!(rds.setting, "binlog retention (Amazon RDS: binlog retention hours)");
        assert!(rds.actual.starts_with("NULL (the default)"), "{rds:?}");
    }

    /// The gauge's seconds: never stays 0, as soon as possible is the smallest non-zero retention.
    #[test]
    fn gauge_seconds() {
        assert_eq!(Retention::Never.gauge_seconds(), 0);
        assert_eq!(Retention::AsSoonAsPossible.gauge_seconds(), AS_SOON_AS_POSSIBLE_SECONDS);
        assert_eq!(Retention::Seconds(86_400).gauge_seconds(), 86_400);
    }

    /// Only an Aurora reader is refused as an endpoint.
    #[test]
    fn aurora_reader_endpoint() {
        let reader = vars(&[("aurora_version", "3.05.2"), ("innodb_read_only", "1")]);
        let writer = vars(&[("aurora_version", "3.05.2"), ("innodb_read_only", "0")]);
        assert!(endpoint_problem(Provider::Aurora, &reader).is_some_and(|p| p.contains("writer endpoint")));
        assert!(endpoint_problem(Provider::Aurora, &writer).is_none());
        assert!(endpoint_problem(Provider::Rds, &vars(&[("innodb_read_only", "ON")])).is_none());
    }
}
