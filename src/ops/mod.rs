//! Operator commands, run beside the pipeline or instead of it: [`check`] before a first run, [`status`]
//! while it runs, [`audit`] to prove the promise held, [`quarantine`] and [`release`] for held aggregates,
//! [`replay`] to publish again what a consumer lost, [`prune`] to delete what Kafka has, [`state`] to move
//! the state between backends, [`pause`] to hold a connector still. [`api`] is the control API a running
//! connector serves, which `status`, `pause`/`resume` and `quarantine release` reach first ([`client`]). Each reads the
//! same configuration and state directory as `run`; the functions here print what a command reports.
//! [`ids`] compares an id column with an id as published, for all of them.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.

pub mod api;
pub mod audit;
pub mod check;
pub mod client;
pub mod ids;
pub mod pause;
pub mod prune;
pub mod quarantine;
pub mod release;
pub mod replay;
pub mod snapshot;
pub mod state;
pub mod status;

use std::process::ExitCode;

use crate::checkpoint::Store;
use crate::config::{Config, StateBackend};
use crate::error::{Error, Result};
use audit::{AuditOptions, EXIT_AUDIT_FAILED};
use prune::PruneOptions;
use replay::ReplayOptions;

/// `outbox-cdc audit`: the report as text or JSON, and the process's exit status: [`EXIT_AUDIT_FAILED`] when
/// it found a problem.
///
/// # Errors
/// When the audit could not run (connection, topic metadata, spill file).
pub async fn run_audit(config: &Config, opts: &AuditOptions, json: bool) -> Result<ExitCode> {
    let report = audit::run(config, opts).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report).expect("serializes"));
    } else {
        println!("{report}");
    }
    Ok(match report.passed() {
        true => ExitCode::SUCCESS,
        false => failed(EXIT_AUDIT_FAILED),
    })
}

/// The exit status of a command that ran to its end and found a problem: `code` is one of the `EXIT_*`
/// constants, each below 256.
fn failed(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// `outbox-cdc replay`: what was (or, with `dry_run`, would be) published again.
///
/// # Errors
/// What [`replay::replay`] refuses.
pub async fn run_replay(config: &Config, options: &ReplayOptions) -> Result<()> {
    let report = replay::replay(config, options).await?;
    let verb = if options.dry_run { "would replay" } else { "replayed" };
    let topics: Vec<&str> = report.topics.iter().map(String::as_str).collect();
    println!("{verb} {} record(s), {} bytes, to {}", report.rows, report.bytes, topics.join(", "));
    Ok(())
}

/// `outbox-cdc prune`: what was (or would be) deleted, and the proof that Kafka has it.
///
/// # Errors
/// What [`prune::prune`] refuses.
pub async fn run_prune(config: &Config, options: &PruneOptions) -> Result<()> {
    let verb = if options.dry_run { "would delete" } else { "deleted" };
    if matches!(config.source.kind, crate::config::Source::Poll(_)) {
        let report = prune::prune_published(config, options).await?;
        let by_number = match config.poll.progress.table() {
            Some(_) => ", or up to the progress table's sequence number and with occurred_at,",
            None => "",
        };
        println!(
            "{verb} {} row(s) with published_at{by_number} < {} (UTC) in {} batch(es); both are set only after \
             Kafka acknowledged the event",
            report.rows_deleted, report.cutoff, report.batches
        );
        return Ok(());
    }
    let report = prune::prune(config, options).await?;
    println!(
        "{verb} {} row(s) with occurred_at < {} (UTC) in {} batch(es); the checkpoint {} covers the \
         server's position {}",
        report.rows_deleted, report.cutoff, report.batches, report.checkpoint, report.view
    );
    Ok(())
}

/// Runs `work` with the state store taken as its one writer, which only a stopped connector allows: the
/// local store opened (a running connector holds it), or with the Kafka backend the lease of a stopped
/// connector taken first (released after). `why` says why the command needs the connector stopped.
///
/// # Errors
/// Definite when a connector runs; `work`'s error.
pub(crate) async fn with_stopped_store<T>(
    config: &Config,
    why: &str,
    work: impl AsyncFnOnce(&Store) -> Result<T>,
) -> Result<T> {
    let stopped = |e: Error| e.context(why);
    match config.state.backend {
        StateBackend::Local => {
            let store = Store::open(&config.state.dir).map_err(stopped)?;
            work(&store).await
        }
        // The Kafka backend: a stopped connector is one that holds no lease.
        StateBackend::Kafka => {
            let lease = crate::lease::Lease::of_stopped_connector(config).await.map_err(stopped)?;
            let result = async {
                let store = Store::open_for(config, &crate::kafka::commit::Deadline::default()).await?;
                work(&store).await
            }
            .await;
            lease.release().await;
            result
        }
    }
}
