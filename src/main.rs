//! The `outbox-cdc` command line: thin on purpose.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use outbox_cdc::app::{self, RunOptions};
use outbox_cdc::config::{Config, StateBackend};
use outbox_cdc::error::Error;
use outbox_cdc::ops::prune::{self, PruneOptions};
use outbox_cdc::ops::replay::{self, ReplayOptions};
use outbox_cdc::ops::{self, audit::AuditOptions};
use outbox_cdc::pipeline::Shutdown;

/// mimalloc instead of glibc malloc, for Rust and (its `override` feature) librdkafka alike: the hot path
/// allocates per event on one thread and frees on another, which glibc serves from its arena under a lock
/// (see [`outbox_cdc::allocator`]).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
outbox_cdc::tune_allocator_before_main!();

#[derive(Debug, Parser)]
#[command(
    name = "outbox-cdc",
    version = env!("OUTBOX_CDC_VERSION"),
    about = "Transactional outbox CDC: MySQL/MariaDB binlog to Kafka"
)]
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
    /// Stop reading and publishing until `resume`, across restarts and failovers: through the running
    /// connector's control API, or in the state store of a stopped one (it then starts paused).
    Pause,
    /// End a pause.
    Resume,
    /// Snapshots on demand: publish the rows of an outbox table, or a slice of it, again into the live
    /// topics while the stream runs (records carry `source: snapshot` and `snapshot_id`).
    Snapshot {
        #[command(subcommand)]
        action: SnapshotAction,
        /// JSON output.
        #[arg(long, global = true)]
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
    /// Move the connector's state between the local store and the Kafka topic (see `[state] backend`).
    State {
        #[command(subcommand)]
        action: StateAction,
    },
}

#[derive(Debug, Subcommand)]
enum StateAction {
    /// Copy the checkpoint, holds and known poison from the other backend into this one (`kafka`: the topic
    /// `[state] topic`, records of `[state] name`; `local`: `[state] dir`). Refuses while a connector runs
    /// and when the target already holds a newer checkpoint. Then set `[state] backend` to it.
    Copy {
        /// The backend to copy into.
        #[arg(long, value_enum)]
        to: Backend,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backend {
    Local,
    Kafka,
}

#[derive(Debug, Subcommand)]
enum SnapshotAction {
    /// Ask for a snapshot of one outbox table, or of the rows every given condition selects.
    Start {
        /// `database.table`; may be left out when one table is configured.
        #[arg(long)]
        table: Option<String>,
        /// Only this aggregate type.
        #[arg(long)]
        aggregate_type: Option<String>,
        /// Only this aggregate id.
        #[arg(long)]
        aggregate_id: Option<String>,
        /// Only rows with occurred_at at or after this (e.g. "2026-11-30 12:00:00").
        #[arg(long)]
        occurred_from: Option<String>,
        /// Only rows with occurred_at before this.
        #[arg(long)]
        occurred_before: Option<String>,
        /// Only rows this SQL condition on the outbox table selects (e.g. "aggregate_type = 'order'").
        #[arg(long = "where")]
        condition: Option<String>,
    },
    /// List the snapshots asked, the one being read with its acknowledged rows.
    List,
    /// Show one.
    Show { id: String },
    /// Stop reading one, keeping its progress.
    Pause { id: String },
    /// Read a paused one on from where it stopped.
    Resume { id: String },
    /// Read nothing more of one.
    Cancel { id: String },
}

#[derive(Debug, Subcommand)]
enum QuarantineAction {
    /// List the holds (works while the connector runs).
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Republish a held aggregate's events, in order, to their normal topics and lift the hold: through
    /// the running connector's control API (it stops reading meanwhile), or with the connector stopped.
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
    // A command that judges what it checked (`check`, `audit`) returns its exit status; the others exit 0
    // when they succeed.
    let result = runtime.block_on(async {
        let config = Config::load(&cli.config)?;
        match cli.command {
            Command::Run { accept_new_server } => run(config, RunOptions { accept_new_server }).await?,
            Command::Check => return ops::check::run(&config).await,
            Command::Status { json } => ops::status::print(&config, json).await?,
            Command::Pause => ops::pause::set(&config, true).await?,
            Command::Resume => ops::pause::set(&config, false).await?,
            Command::Snapshot { action, json } => {
                use ops::snapshot::{Ask, Change, Command as Do};
                let command = match action {
                    SnapshotAction::Start {
                        table,
                        aggregate_type,
                        aggregate_id,
                        occurred_from,
                        occurred_before,
                        condition,
                    } => Do::Start(Ask {
                        table,
                        slice: outbox_cdc::position::on_demand::Slice {
                            aggregate_type,
                            aggregate_id,
                            occurred_from,
                            occurred_before,
                            condition,
                        },
                    }),
                    SnapshotAction::List => Do::List,
                    SnapshotAction::Show { id } => Do::Show(id),
                    SnapshotAction::Pause { id } => Do::Change(id, Change::Pause),
                    SnapshotAction::Resume { id } => Do::Change(id, Change::Resume),
                    SnapshotAction::Cancel { id } => Do::Change(id, Change::Cancel),
                };
                ops::snapshot::run(&config, command, json).await?
            }
            Command::Quarantine { action: QuarantineAction::List { json } } => {
                ops::quarantine::list(&config, json).await?
            }
            Command::Quarantine {
                action: QuarantineAction::Release { aggregate_type, aggregate_id, skip_poison, accept_missing },
            } => ops::quarantine::release(&config, &aggregate_type, &aggregate_id, skip_poison, accept_missing).await?,
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
                ops::run_replay(&config, &options).await?
            }
            Command::State { action: StateAction::Copy { to } } => {
                let to = match to {
                    Backend::Local => StateBackend::Local,
                    Backend::Kafka => StateBackend::Kafka,
                };
                let report = ops::state::copy(&config, to).await?;
                println!(
                    "copied the checkpoint ({}), {} hold(s) and {} known poison event(s) into {}; set [state] \
                     backend = \"{}\" and start the connector",
                    report.position.as_deref().unwrap_or("none"),
                    report.holds,
                    report.known_poison,
                    {
                        let mut c = config.clone();
                        c.state.backend = to;
                        c.state_location()
                    },
                    if to == StateBackend::Kafka { "kafka" } else { "local" },
                );
            }
            Command::Prune { older_than, wait, dry_run } => {
                ops::run_prune(&config, &PruneOptions { older_than, wait, dry_run }).await?
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
                return ops::run_audit(&config, &opts, json).await;
            }
        }
        Ok(ExitCode::SUCCESS)
    });
    match result {
        Ok(code) => code,
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
        // A read waiting for another producer's transaction gives up at once: nothing waits on it now.
        outbox_cdc::kafka::read::stop_waiting();
        trigger.trigger();
    });
    let config = std::sync::Arc::new(config);
    let (control, handle) = app::control::channel();
    let _api = ops::api::start(&config, handle).await?;
    app::run_controlled(config, options, shutdown, control).await
}
