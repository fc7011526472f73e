//! `outbox-cdc check`: everything `run` needs, checked before it runs (the source and Kafka), with the fix
//! for each problem.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.

use std::process::ExitCode;

use crate::checkpoint::{Checkpoint, Store};
use crate::config::{Config, FilesSource, Source, StateBackend};
use mysql_async::prelude::Queryable;

use crate::error::{classify_mysql, Result, EXIT_DEFINITE};
use crate::findings::{Finding, Report};
use crate::source::{self, preflight, SourceConn};

/// Checks the source (server settings, grants, the outbox tables, whether the checkpoint can be resumed) or
/// the binlog files, prints every finding, and returns the process's exit status: [`EXIT_DEFINITE`] when
/// one failed.
///
/// # Errors
/// Connection errors before the checks could run.
pub async fn run(config: &Config) -> Result<ExitCode> {
    let server = match &config.source.kind {
        Source::Files(files) => return check_files(config, files).await,
        Source::Poll(_) => return check_poll(config).await,
        Source::Server(server) => server,
    };
    let source = SourceConn::new(&server.connection)?;
    let mut conn = source.connect().await?;
    if let Some(who) = source.last_login() {
        println!("identity: {who}: accepted by the server");
    }
    let info = source::server_info(&mut conn).await?;
    let (checkpoint, unreadable) = read_checkpoint(config).await?;
    println!("server: {} ({})", preflight::describe_identity(&info.identity), info.version);
    let checked = match &checkpoint {
        Some(c) => {
            let resume = preflight::Resume { server: c.server(), position: c.position(), end_event: c.end_event() };
            Some(preflight::ResumeCheck::run(&source, &mut conn, &info, server.server_id, resume).await?)
        }
        None => None,
    };
    let mut report = preflight::check(&mut conn, &info, config, checked.as_ref()).await?;
    report.findings.extend(unreadable);
    if config.state.backend == StateBackend::Kafka {
        check_lease_server(&mut conn, &mut report).await?;
    }
    print!("{report}");
    let routed = super::audit::routed_topics(config, config.tables(), &mut conn).await;
    let registry = check_registry(config, &routed).await;
    let kafka = match crate::sink::check::check(config, routed).await {
        Ok(kafka) => kafka,
        Err(e) if report.failures().count() == 0 => return Err(e),
        // The source's failures need an operator whatever Kafka answered: exit 2.
        Err(e) => {
            println!("kafka: {e}\n{} check(s) failed", report.failures().count());
            return Ok(super::failed(EXIT_DEFINITE));
        }
    };
    Ok(summarize(&report, &kafka, registry.as_ref()))
}

/// The stored checkpoint. A definite refusal to read the Kafka backend's state topic (more than one
/// partition, a refused ACL) is a failed finding, so that the Kafka findings, which say why, are still
/// printed; the resume checks are then skipped.
///
/// # Errors
/// A transient error (the broker cannot be reached), or a definite one from the local store.
async fn read_checkpoint(config: &Config) -> Result<(Option<Checkpoint>, Option<Finding>)> {
    match Store::inspect_for(config).await {
        Ok(inspection) => Ok((inspection.and_then(|i| i.checkpoint), None)),
        Err(e) if e.is_definite() && config.state.backend == StateBackend::Kafka => {
            let mut report = Report::default();
            report.push(
                &format!("checkpoint in {}", config.state_location()),
                "readable",
                "cannot be read, so the resume checks were skipped",
                false,
                &e.to_string(),
            );
            Ok((None, report.findings.pop()))
        }
        Err(e) => Err(e),
    }
}

/// The Kafka backend's lease is a `GET_LOCK` on the source server: one lock for every instance, which a
/// Galera node does not give ([`crate::lease::LeaseServer::of`]).
async fn check_lease_server(conn: &mut mysql_async::Conn, report: &mut Report) -> Result<()> {
    let variables: Vec<(String, String)> =
        conn.query(crate::lease::SERVER_VARIABLES).await.map_err(|e| classify_mysql(&e))?;
    let wsrep = variables.iter().find(|(n, _)| n.eq_ignore_ascii_case("wsrep_on")).map_or("absent", |(_, v)| v);
    match crate::lease::LeaseServer::of(&variables) {
        Ok(_) => {
            report.push("lease server (GET_LOCK)", "one lock for all instances", &format!("wsrep_on {wsrep}"), true, "")
        }
        Err(e) => {
            report.push("lease server (GET_LOCK)", "one lock for all instances", "a Galera node", false, &e.to_string())
        }
    }
    Ok(())
}

/// `check` for the polling relay (`source.kind = "poll"`): the outbox tables as the relay uses them
/// ([`preflight::check_poll`]), and Kafka. Nothing about the binlog: the relay reads none.
async fn check_poll(config: &Config) -> Result<ExitCode> {
    let source = SourceConn::from_config(config)?;
    let mut conn = source.connect().await?;
    if let Some(who) = source.last_login() {
        println!("identity: {who}: accepted by the server");
    }
    let version: Option<String> = conn.query_first("SELECT VERSION()").await.map_err(|e| classify_mysql(&e))?;
    println!(
        "server: {} ({}), polling relay {}",
        source.describe(),
        version.unwrap_or_default(),
        config.poll.relay_id()
    );
    let report = preflight::check_poll(&mut conn, config).await?;
    print!("{report}");
    let routed = super::audit::routed_topics(config, config.tables(), &mut conn).await;
    let registry = check_registry(config, &routed).await;
    let kafka = crate::sink::check::check(config, routed).await?;
    Ok(summarize(&report, &kafka, registry.as_ref()))
}

/// `check` for `source.kind = "files"`: every file is a complete binlog (the last may end in an incomplete
/// transaction, which is reported), where a run would start, and Kafka.
async fn check_files(config: &Config, source: &FilesSource) -> Result<ExitCode> {
    let files = source::files::list_files(source)?;
    let mut failed = 0;
    for (i, path) in files.iter().enumerate() {
        match source::files::scan(path) {
            Ok(scan) => {
                let state = match &scan.tail {
                    None => "complete".to_string(),
                    Some(tail) if i + 1 == files.len() => {
                        format!(
                            "last complete transaction ends at {} of {} bytes ({tail})",
                            scan.complete_end, scan.len
                        )
                    }
                    Some(tail) => {
                        failed += 1;
                        format!("DAMAGED: {tail} after offset {} (later files follow)", scan.complete_end)
                    }
                };
                println!(
                    "{}: {} server_id={}: {state}",
                    path.display(),
                    scan.header.server_version,
                    scan.header.server_id
                );
                if i == 0 {
                    let start = source::files::start_position(path, &scan.header, source.start_after.as_deref())?;
                    println!("start without checkpoint: after {start}");
                }
            }
            Err(e) => {
                failed += 1;
                println!("{}: {e}", path.display());
            }
        }
    }
    let (checkpoint, unreadable) = read_checkpoint(config).await?;
    if let Some(cp) = checkpoint {
        println!("checkpoint: {} ({})", cp.position(), preflight::describe_identity(cp.server()));
    }
    if let Some(finding) = &unreadable {
        failed += 1;
        println!("checkpoint: {}: {}", finding.actual, finding.fix);
    }
    let routed = crate::sink::check::topics_without_rows(config);
    let kafka = crate::sink::check::check(config, routed).await?;
    print!("{kafka}");
    failed += kafka.report.failures().count();
    if failed > 0 {
        println!("{failed} check(s) failed");
        return Ok(super::failed(EXIT_DEFINITE));
    }
    println!("all files readable, all checks passed");
    Ok(ExitCode::SUCCESS)
}

/// The Schema Registry's findings (`crate::schema::check`), for the routed topics found.
async fn check_registry(config: &Config, routed: &Result<Vec<String>>) -> Option<Report> {
    config.schema_registry.as_ref()?;
    let topics = routed.as_ref().ok().cloned().unwrap_or_default();
    let config = config.clone();
    tokio::task::spawn_blocking(move || crate::schema::check::check(&config, &topics)).await.ok().flatten()
}

/// Prints the Kafka findings and the verdict over the reports; [`EXIT_DEFINITE`] when any check failed.
fn summarize(report: &Report, kafka: &crate::sink::check::KafkaCheck, registry: Option<&Report>) -> ExitCode {
    print!("{kafka}");
    if let Some(registry) = registry {
        print!("{registry}");
    }
    let registry_failed = registry.map_or(0, |r| r.failures().count());
    let failed = report.failures().count() + kafka.report.failures().count() + registry_failed;
    if failed > 0 {
        println!("{failed} check(s) failed");
        return super::failed(EXIT_DEFINITE);
    }
    println!("all checks passed");
    ExitCode::SUCCESS
}
