//! The `outbox-cdc` command line: thin on purpose.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use outbox_cdc::app::{self, RunOptions};
use outbox_cdc::checkpoint::Store;
use outbox_cdc::config::{Config, SourceKind};
use outbox_cdc::error::{Error, EXIT_DEFINITE};
use outbox_cdc::pipeline::Shutdown;
use outbox_cdc::source::{self, preflight, SourceConn};

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
    /// Check the server's settings, privileges and the outbox table; exit 0 when all is well, 2 for a
    /// configuration or server problem, 3 when the server cannot be reached.
    Check,
    /// Print the stored checkpoint (works while the connector runs).
    Status {
        /// Print the raw JSON record.
        #[arg(long)]
        json: bool,
    },
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
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        let config = Config::load(&cli.config)?;
        match cli.command {
            Command::Run { accept_new_server } => run(config, RunOptions { accept_new_server }).await,
            Command::Check => check(&config).await,
            Command::Status { json } => status(&config, json),
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
        return check_files(config);
    }
    let source = SourceConn::from_config(config)?;
    let mut conn = source.connect().await?;
    let info = source::server_info(&mut conn).await?;
    let checkpoint = Store::read_only(&config.state.dir)?;
    println!("server: {} ({})", preflight::describe_identity(&info.identity), info.version);
    let report =
        preflight::check(&mut conn, &info, config, checkpoint.as_ref().map(|c| (&c.server, &c.position))).await?;
    print!("{report}");
    let failed = report.failures().count();
    if failed > 0 {
        println!("{failed} check(s) failed");
        std::process::exit(EXIT_DEFINITE);
    }
    println!("all checks passed");
    Ok(())
}

/// `check` for `source.kind = "files"`: every file is a complete binlog (the last may end in an incomplete
/// transaction, which is reported), and where a run would start.
fn check_files(config: &Config) -> Result<(), Error> {
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
    if failed > 0 {
        println!("{failed} file(s) failed");
        std::process::exit(EXIT_DEFINITE);
    }
    println!("all files readable");
    Ok(())
}

fn status(config: &Config, json: bool) -> Result<(), Error> {
    let Some(cp) = Store::read_only(&config.state.dir)? else {
        println!("no checkpoint in {} (the connector has not started yet)", config.state.dir.display());
        return Ok(());
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&cp).expect("serializes"));
        return Ok(());
    }
    println!("position:        {}", cp.position);
    println!("server:          {}", preflight::describe_identity(&cp.server));
    match cp.source_timestamp {
        Some(ts) => {
            let age = (outbox_cdc::checkpoint::now_ms() / 1000).saturating_sub(u64::from(ts));
            println!("last committed:  unix {ts} ({age} s ago, source clock)");
        }
        None => println!("last committed:  (no transaction checkpointed yet)"),
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
        }
    }
    let age_ms = outbox_cdc::checkpoint::now_ms().saturating_sub(cp.written_at_ms);
    println!("written:         {:.1} s ago", age_ms as f64 / 1000.0);
    Ok(())
}
