//! The `outbox-cdc` command line: thin on purpose.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use outbox_cdc::app::{self, RunOptions};
use outbox_cdc::audit::{AuditOptions, EXIT_AUDIT_FAILED};
use outbox_cdc::checkpoint::Store;
use outbox_cdc::config::{Config, SourceKind};
use outbox_cdc::error::{Error, EXIT_DEFINITE};
use outbox_cdc::pipeline::Shutdown;
use outbox_cdc::prune::{self, PruneOptions};
use outbox_cdc::release;
use outbox_cdc::replay::{self, ReplayOptions};
use outbox_cdc::source::{self, preflight, SourceConn};

/// mimalloc instead of glibc malloc, for Rust and (its `override` feature) librdkafka alike: the hot path
/// allocates per event on one thread and frees on another, which glibc serves from its arena under a lock
/// (see [`outbox_cdc::allocator`]).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
outbox_cdc::tune_allocator_before_main!();

#[derive(Debug, Parser)]
#[command(name = "outbox-cdc", version, about = "Transactional outbox CDC: MySQL/MariaDB binlog to Kafka")]
struct Cli {
    /// Path of the configuration file.
    #[arg(long, short, global = true, default_value = "connector.toml", env = "OUTBOX_CDC_CONFIG")]
    config: PathBuf,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "OUTBOX_CDC_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Stream outbox events to Kafka until SIGINT/SIGTERM.
    Run {
        /// Resume even though the checkpoint was written against a different server (planned failover
        /// within one GTID topology).
        #[arg(long)]
        accept_new_server: bool,
    },
    /// Check the server's settings, privileges and the outbox table, and what Kafka must allow; exit 0 when
    /// all is well, 2 for a configuration or server problem, 3 when the server or Kafka cannot be reached.
    Check,
    /// Compare the outbox table with what Kafka holds: ids missing from Kafka, duplicated ids, per-aggregate
    /// order violations, records the table does not have. Exit 0 when nothing is missing or out of order,
    /// 1 when something is, 2/3 when the audit itself could not run. See docs/RUNBOOK.md.
    Audit {
        /// Only rows with occurred_at >= this DATETIME (e.g. "2026-11-30 10:00:00").
        #[arg(long)]
        since: Option<String>,
        /// Only rows with occurred_at < this DATETIME.
        #[arg(long)]
        until: Option<String>,
        /// Only rows matching this SQL condition on the outbox table.
        #[arg(long = "where")]
        condition: Option<String>,
        /// Read this topic instead of the routed ones (repeatable).
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// At most this many ids in each list of the report (counts are always complete).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Directory for the temporary spill file (about 150 bytes per row).
        #[arg(long)]
        work_dir: Option<PathBuf>,
    },
    /// Print position, lag, purge risk, snapshot progress, quarantined aggregates and the last error
    /// (works while the connector runs).
    Status {
        /// Print the stored checkpoint record as JSON, with `holds` and `last_error` beside it.
        #[arg(long)]
        json: bool,
    },
    /// Aggregates held after a poison row (see `outbox.on_poison`).
    Quarantine {
        #[command(subcommand)]
        action: QuarantineAction,
    },
    /// Re-publish outbox rows still in the table to separate replay topics, rate limited. Does not touch
    /// the connector's checkpoint; records carry the header `replay: true`.
    Replay {
        /// Only rows with occurred_at at or after this (e.g. "2026-11-30 12:00:00").
        #[arg(long)]
        since: Option<String>,
        /// Only rows with occurred_at before this.
        #[arg(long)]
        until: Option<String>,
        /// Only this aggregate type.
        #[arg(long)]
        aggregate_type: Option<String>,
        /// Only this aggregate id.
        #[arg(long)]
        aggregate_id: Option<String>,
        /// Appended to each row's routed topic.
        #[arg(long, default_value = replay::DEFAULT_TOPIC_SUFFIX)]
        topic_suffix: String,
        /// Send every replayed record to this one topic instead.
        #[arg(long)]
        topic: Option<String>,
        /// Records per second, at most.
        #[arg(long, default_value_t = 1000)]
        rate: u32,
        /// Read and count, produce nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete outbox rows older than the retention window whose events the connector's checkpoint proves
    /// delivered, in batches ([prune] batch_rows, pause_ms).
    Prune {
        /// Retention window, e.g. 7d, 36h, 90m (against the server's UTC_TIMESTAMP).
        #[arg(long, value_parser = parse_age)]
        older_than: Duration,
        /// How long to wait for a running connector's checkpoint to reach the server's position.
        #[arg(long, value_parser = parse_age, default_value = "30s")]
        wait: Duration,
        /// Count the rows that would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
enum QuarantineAction {
    /// List the holds (works while the connector runs).
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Republish a held aggregate's events, in order, to their normal topics and lift the hold. Run it
    /// with the connector stopped.
    Release {
        /// Aggregate type of the held aggregate.
        aggregate_type: String,
        /// Aggregate id of the held aggregate.
        aggregate_id: String,
        /// Drop held events that are still poison (they stay in the dead-letter topic) instead of failing.
        #[arg(long)]
        skip_poison: bool,
        /// Release even though the dead-letter topic no longer holds the hold's first event (records removed
        /// by retention or DeleteRecords): republish what it still holds and lift the hold.
        #[arg(long)]
        accept_missing: bool,
    },
}

fn parse_age(text: &str) -> Result<Duration, String> {
    prune::parse_age(text).map_err(|e| e.to_string())
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OUTBOX_CDC_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn main() -> ExitCode {
    outbox_cdc::allocator::tune();
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    // The pipeline runs on this thread (block_on); one worker runs the binlog reader task and the small
    // ones (HTTP, probes, timers). A second worker only spun looking for work to steal, on 2-core machines
    // shared with the database and the broker (docs/PERFORMANCE.md).
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    if let Command::Run { .. } = cli.command {
        // After the runtime started the worker that runs the binlog reader, before anything starts the
        // producer's threads (see `outbox_cdc::scheduling`).
        if let Err(e) = outbox_cdc::scheduling::yield_wakeups() {
            tracing::debug!(error = %e, "cannot make the pipeline's threads SCHED_BATCH; running without");
        }
    }
    let result = runtime.block_on(async {
        let config = Config::load(&cli.config)?;
        match cli.command {
            Command::Run { accept_new_server } => run(config, RunOptions { accept_new_server }).await,
            Command::Check => check(&config).await,
            Command::Status { json } => status(&config, json).await,
            Command::Quarantine { action: QuarantineAction::List { json } } => quarantine_list(&config, json),
            Command::Quarantine {
                action: QuarantineAction::Release { aggregate_type, aggregate_id, skip_poison, accept_missing },
            } => {
                let report =
                    release::release(&config, &aggregate_type, &aggregate_id, skip_poison, accept_missing).await?;
                println!(
                    "released {aggregate_type}/{aggregate_id}: {} event(s) republished{}",
                    report.republished,
                    match report.skipped.len() {
                        0 => String::new(),
                        n => format!(", {n} still-poison event(s) skipped: {}", report.skipped.join(", ")),
                    }
                );
                if let Some(first) = report.missing_first {
                    println!("the hold's first event {first} was not in the dead-letter topic (--accept-missing)");
                }
                Ok(())
            }
            Command::Replay { since, until, aggregate_type, aggregate_id, topic_suffix, topic, rate, dry_run } => {
                let options = ReplayOptions {
                    since,
                    until,
                    aggregate_type,
                    aggregate_id,
                    topic_suffix,
                    topic,
                    rate_per_sec: rate,
                    dry_run,
                };
                let report = replay::replay(&config, &options).await?;
                let verb = if dry_run { "would replay" } else { "replayed" };
                let topics: Vec<&str> = report.topics.iter().map(String::as_str).collect();
                println!("{verb} {} record(s), {} bytes, to {}", report.rows, report.bytes, topics.join(", "));
                Ok(())
            }
            Command::Prune { older_than, wait, dry_run } => {
                let report = prune::prune(&config, &PruneOptions { older_than, wait, dry_run }).await?;
                let verb = if dry_run { "would delete" } else { "deleted" };
                println!(
                    "{verb} {} row(s) with occurred_at < {} (UTC) in {} batch(es); the checkpoint {} covers the \
                     server's position {}",
                    report.rows_deleted, report.cutoff, report.batches, report.checkpoint, report.view
                );
                Ok(())
            }
            Command::Audit { since, until, condition, topics, json, limit, work_dir } => {
                let opts = AuditOptions {
                    since,
                    until,
                    r#where: condition,
                    topics,
                    list_limit: limit,
                    work_dir,
                    ..Default::default()
                };
                audit(&config, &opts, json).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error}");
            ExitCode::from(error.exit_code() as u8)
        }
    }
}

async fn run(config: Config, options: RunOptions) -> Result<(), Error> {
    let (trigger, shutdown) = Shutdown::new();
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        }
        trigger.trigger();
    });
    app::run(config, options, shutdown).await
}

async fn check(config: &Config) -> Result<(), Error> {
    if config.source.kind == SourceKind::Files {
        return check_files(config).await;
    }
    let source = SourceConn::from_config(config)?;
    let mut conn = source.connect().await?;
    let info = source::server_info(&mut conn).await?;
    let checkpoint = Store::read_only(&config.state.dir)?;
    println!("server: {} ({})", preflight::describe_identity(&info.identity), info.version);
    let checked = match &checkpoint {
        Some(c) => {
            let resume = preflight::Resume { server: &c.server, position: &c.position, end_event: c.end_event };
            Some(preflight::ResumeCheck::run(&mut conn, &info, config, resume).await?)
        }
        None => None,
    };
    let report = preflight::check(&mut conn, &info, config, checked.as_ref()).await?;
    print!("{report}");
    let routed = outbox_cdc::audit::routed_topics(config, &config.outbox_tables()?, &mut conn).await;
    let kafka = match outbox_cdc::sink::check::check(&config.kafka, routed).await {
        Ok(kafka) => kafka,
        Err(e) if report.failures().count() == 0 => return Err(e),
        // The source's failures need an operator whatever Kafka answered: exit 2.
        Err(e) => {
            println!("kafka: {e}\n{} check(s) failed", report.failures().count());
            std::process::exit(EXIT_DEFINITE);
        }
    };
    print!("{kafka}");
    let failed = report.failures().count() + kafka.report.failures().count();
    if failed > 0 {
        println!("{failed} check(s) failed");
        std::process::exit(EXIT_DEFINITE);
    }
    println!("all checks passed");
    Ok(())
}

/// `check` for `source.kind = "files"`: every file is a complete binlog (the last may end in an incomplete
/// transaction, which is reported), where a run would start, and Kafka.
async fn check_files(config: &Config) -> Result<(), Error> {
    let files = source::files::list_files(config)?;
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
                    let start =
                        source::files::start_position(path, &scan.header, config.source.start_after.as_deref())?;
                    println!("start without checkpoint: after {start}");
                }
            }
            Err(e) => {
                failed += 1;
                println!("{}: {e}", path.display());
            }
        }
    }
    if let Some(cp) = Store::read_only(&config.state.dir)? {
        println!("checkpoint: {} ({})", cp.position, preflight::describe_identity(&cp.server));
    }
    let routed = outbox_cdc::sink::check::topics_without_rows(config);
    let kafka = outbox_cdc::sink::check::check(&config.kafka, routed).await?;
    print!("{kafka}");
    failed += kafka.report.failures().count();
    if failed > 0 {
        println!("{failed} check(s) failed");
        std::process::exit(EXIT_DEFINITE);
    }
    println!("all files readable, all checks passed");
    Ok(())
}

fn quarantine_list(config: &Config, json: bool) -> Result<(), Error> {
    let holds = Store::inspect(&config.state.dir)?.map(|i| i.holds).unwrap_or_default();
    if json {
        println!("{}", serde_json::to_string_pretty(&holds).expect("serializes"));
    } else {
        print!("{}", release::describe(&holds));
    }
    Ok(())
}

async fn audit(config: &Config, opts: &AuditOptions, json: bool) -> Result<(), Error> {
    let report = outbox_cdc::audit::run(config, opts).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report).expect("serializes"));
    } else {
        println!("{report}");
    }
    if !report.passed() {
        std::process::exit(EXIT_AUDIT_FAILED);
    }
    Ok(())
}

async fn status(config: &Config, json: bool) -> Result<(), Error> {
    let Some(inspection) = Store::inspect(&config.state.dir)? else {
        println!("no checkpoint in {} (the connector has not started yet)", config.state.dir.display());
        return Ok(());
    };
    // Messages are redacted when an error is built; a record written by an older version may not be.
    let last_error = inspection.last_error.map(|mut e| {
        e.message = outbox_cdc::secret::redact(&e.message).into_owned();
        e
    });
    let Some(cp) = &inspection.checkpoint else {
        println!("no checkpoint in {} (the connector has not started yet)", config.state.dir.display());
        if let (false, Some(e)) = (json, &last_error) {
            println!("last error ({}): {}", e.class, e.message);
        }
        return Ok(());
    };
    if json {
        let mut value = serde_json::to_value(cp).expect("serializes");
        value["holds"] = serde_json::to_value(&inspection.holds).expect("serializes");
        value["last_error"] = serde_json::to_value(&last_error).expect("serializes");
        println!("{}", serde_json::to_string_pretty(&value).expect("serializes"));
        return Ok(());
    }
    let now_s = outbox_cdc::checkpoint::now_ms() / 1000;
    println!("position:        {}", cp.position);
    println!("server:          {}", preflight::describe_identity(&cp.server));
    match cp.source_timestamp {
        Some(ts) => {
            let age = now_s.saturating_sub(u64::from(ts));
            println!("last committed:  unix {ts} ({age} s ago, source clock)");
        }
        None => println!("last committed:  (no transaction checkpointed yet)"),
    }
    if let Some(end) = cp.end_event {
        let start = cp.position.coord.pos.saturating_sub(u64::from(end.len));
        println!(
            "end event:       {} B at {}:{start}, CRC-32 {:08x} (compared with the server's binlog before a resume)",
            end.len, cp.position.coord.file, end.crc32
        );
    }
    if config.source.kind == SourceKind::Server {
        println!("purge risk:      {}", purge_risk(config, cp, now_s).await);
    }
    if let Some(snapshot) = &cp.snapshot {
        if snapshot.done && snapshot.segments.len() == 1 {
            println!("snapshot:        done ({} rows)", snapshot.rows_done);
        } else if snapshot.done {
            println!(
                "snapshot:        done ({} rows); the stream still skips rows published by {} resumed segment(s)",
                snapshot.rows_done,
                snapshot.segments.len() - 1
            );
        } else {
            let pct = if snapshot.rows_estimate > 0 {
                format!(
                    " ({:.1}%)",
                    100.0 * snapshot.rows_done as f64 / snapshot.rows_estimate.max(snapshot.rows_done) as f64
                )
            } else {
                String::new()
            };
            println!(
                "snapshot:        in progress: {} of ~{} rows{pct}, {} read view(s), cut at {}",
                snapshot.rows_done,
                snapshot.rows_estimate,
                snapshot.segments.len(),
                snapshot.cut()
            );
            if !snapshot.tables.is_empty() {
                println!("snapshot tables: {} (a resume needs this [outbox] list)", snapshot.tables.join(", "));
            }
        }
    }
    let age_ms = outbox_cdc::checkpoint::now_ms().saturating_sub(cp.written_at_ms);
    println!("written:         {:.1} s ago", age_ms as f64 / 1000.0);
    match inspection.holds.len() {
        0 => println!("quarantine:      none"),
        n => println!("quarantine:      {n} aggregate(s) held (outbox-cdc quarantine list)"),
    }
    match &last_error {
        Some(e) => {
            let ago = outbox_cdc::checkpoint::now_ms().saturating_sub(e.at_ms) / 1000;
            println!("last error:      {ago} s ago ({}): {}", e.class, e.message);
        }
        None => println!("last error:      none"),
    }
    Ok(())
}

/// The purge risk of the checkpoint, or why it cannot be measured now.
async fn purge_risk(config: &Config, cp: &outbox_cdc::checkpoint::Checkpoint, now_s: u64) -> String {
    let measure = async {
        let source = SourceConn::from_config(config)?;
        let mut conn = source.connect().await?;
        source::purge::measure(&mut conn, &cp.position, cp.source_timestamp, now_s).await
    };
    match tokio::time::timeout(std::time::Duration::from_secs(10), measure).await {
        Ok(Ok(risk)) => risk.to_string(),
        Ok(Err(e)) => format!("unknown (cannot ask the server: {e})"),
        Err(_) => "unknown (the server did not answer within 10 s)".to_string(),
    }
}
