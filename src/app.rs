//! Wiring: builds the pieces from the config and keeps the pipeline running across transient failures.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! Each piece has one owner: the [`Supervisor`] decides after each run whether and when the next one
//! starts, the [`Tenure`] holds the lease (only its holder runs), the [`State`] holds the state store and
//! lends each run the one it writes, the [`Control`] brings an operator's commands (pause, resume, a
//! release), carried out between runs ([`control`]). `run` builds them and runs the loop; it decides
//! nothing itself.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::Store;
use crate::config::{Config, Source, StateBackend};
use crate::error::Result;
use crate::pipeline::{Pipeline, Shutdown, SignalledPause};
use crate::router::Router;
use crate::source::binlog::ReaderSettings;
use crate::source::SourceConn;

mod backoff;
pub mod control;
mod purge;
mod state;
mod supervisor;
mod tenure;

use control::{Control, Role};
use state::State;
use supervisor::Supervisor;
pub use supervisor::MAX_PRODUCER_FATAL_RUNS;
use tenure::Tenure;

/// Options of `outbox-cdc run` beyond the config file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Resume even if the checkpoint belongs to a different server.
    pub accept_new_server: bool,
}

/// Runs the connector until shutdown or a definite error.
///
/// # Errors
/// The first definite error; transient ones are retried with capped, jittered exponential back-off.
pub async fn run(config: Config, options: RunOptions, shutdown: Shutdown) -> Result<()> {
    run_controlled(Arc::new(config), options, shutdown, control::channel().0).await
}

/// [`run`], answering an operator's commands from `control` (the control API's, `crate::ops::api`).
///
/// # Errors
/// As [`run`].
pub async fn run_controlled(
    config: Arc<Config>,
    options: RunOptions,
    shutdown: Shutdown,
    mut control: Control,
) -> Result<()> {
    // Aborted when `run` returns (the handles' guards).
    let _endpoint = match config.metrics.enabled {
        true => {
            let listener = crate::http::bind(
                config.metrics.listen,
                "/metrics",
                "set [metrics] listen to a free address or enabled = false",
            )
            .await?;
            let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
            Some(AbortOnDrop(tokio::spawn(crate::http::serve(listener, crate::http::ops()))))
        }
        false => None,
    };
    if config.opentelemetry.enabled && crate::telemetry::tracer().is_none() {
        crate::telemetry::start()?;
    }
    // The binlog connection's settings; the files and poll readers read no replication stream.
    let (server_id, heartbeat) = match &config.source.kind {
        Source::Server(server) => (server.server_id, server.heartbeat_interval),
        Source::Files(_) | Source::Poll(_) => (0, Duration::ZERO),
    };
    let pipeline = Pipeline {
        source: config.source.kind.connection().map(SourceConn::new).transpose()?,
        router: Router::for_config(&config),
        reader: Arc::new(ReaderSettings {
            server_id,
            tables: config.tables().to_vec(),
            columns: config.outbox.columns.clone(),
            on_update: config.outbox.on_update,
            heartbeat,
            signal_table: config.signal_table().cloned(),
        }),
        accept_new_server: options.accept_new_server,
        requests: control.snapshot_requests(),
        pause: SignalledPause::default(),
        config: config.clone(),
    };
    let state = State::open(&config)?;
    // Only a live server's binlogs can be purged from under the connector: the polling relay reads none,
    // and binlog files have no server.
    let purged_from = match (&config.source.kind, &pipeline.source) {
        (Source::Server(_), Some(source)) => Some(source.clone()),
        _ => None,
    };
    let _purge_watch = purged_from.map(|source| {
        AbortOnDrop(tokio::spawn(purge::watch_purge_risk(
            source,
            state.watch(),
            config.metrics.purge_check_interval,
            config.metrics.purge_warn_ratio,
        )))
    });
    // Only the holder of the lease runs (see `crate::lease`): the Kafka backend's active/standby, and the
    // polling relay's (one relay of a connector publishes; the others stand by).
    // Both have a server connection: validation refuses the Kafka backend with binlog files.
    let leased = config.state.backend == StateBackend::Kafka || matches!(config.source.kind, Source::Poll(_));
    let mut tenure = pipeline.source.as_ref().filter(|_| leased).map(|source| {
        (Tenure::new(config.state.name.clone(), config.fingerprint(), config.delivery.failover_timeout), source)
    });
    let mut supervisor = Supervisor::new(config.source.reconnect_initial_backoff, config.source.reconnect_max_backoff);
    // After a command the lease is still held: the instance keeps showing what the command made it.
    let mut again = false;
    let outcome = loop {
        let started = Instant::now();
        if !std::mem::take(&mut again) {
            control.show(Role::Waiting, None);
        }
        let lease = match &mut tenure {
            None => None,
            Some((tenure, source)) => match tenure.hold(source, &shutdown).await {
                Ok(Some(lease)) => Some(lease),
                Ok(None) => break Ok(()),
                // A lease released after a switchover, an unreachable server: retried like a run's error.
                Err(error) => match supervisor.after(Err(error), started, &shutdown).await {
                    ControlFlow::Break(outcome) => break outcome,
                    ControlFlow::Continue(()) => continue,
                },
            },
        };
        // Opening the Kafka state waits for Kafka (fencing, reading): a stop does not wait for it.
        let opened = tokio::select! {
            opened = state.for_run(shutdown.kafka_deadline()) => opened,
            _ = shutdown.requested() => break Ok(()),
        };
        let result = match opened {
            Ok(store) => {
                let turn = hold_turn(&pipeline, &store, lease, &shutdown, &mut control);
                match lease {
                    None => turn.await,
                    Some(lease) => tenure::while_held(lease, turn).await,
                }
            }
            Err(error) => Err(error),
        };
        let result = match result {
            // A command was carried out with the run stopped: the lease and the state are taken again.
            Ok(Turn::Again) => {
                again = true;
                continue;
            }
            Ok(Turn::Ended) => Ok(()),
            Err(error) => Err(error),
        };
        if let ControlFlow::Break(outcome) = supervisor.after(result, started, &shutdown).await {
            break outcome;
        }
    };
    if let Some((tenure, _)) = tenure {
        tenure.release().await;
    }
    // The spans not yet exported: the batch processor's thread sends them (blocking).
    let _ = tokio::task::spawn_blocking(crate::telemetry::shutdown).await;
    outcome
}

/// How a turn under the lease ended.
enum Turn {
    /// The run ended by itself or by the stop: the supervisor decides what follows.
    Ended,
    /// An operator's command was carried out with no run reading, or a pause ended: the state is taken
    /// again before the next run, as before any run (the Kafka one read again after its fence: a commit
    /// whose outcome a stop left unknown is resolved there, never taken from this run's memory).
    Again,
}

/// One turn with the lease held (or none needed) and `store` open. Paused, it answers the operator's
/// commands and watches the signal table until a resume. Otherwise it runs the pipeline until it ends by
/// itself or by `shutdown`, or until a command or a `pause` signal needs it stopped: then it stops it as a
/// shutdown would and carries the command out with no run reading ([`control`]); the run stored the
/// signal's pause itself.
///
/// # Errors
/// The run's error, and the store's.
async fn hold_turn(
    pipeline: &Pipeline,
    store: &Arc<Store>,
    lease: Option<&crate::lease::Lease>,
    shutdown: &Shutdown,
    control: &mut Control,
) -> Result<Turn> {
    if store.paused()?.is_some() {
        control.show(Role::Paused, Some(store.clone()));
        let resume = pipeline.resume_signal(store);
        tokio::pin!(resume);
        loop {
            tokio::select! {
                command = control.next() => if !control.carry_out(command, store).await? {
                    return Ok(Turn::Again);
                },
                signal = &mut resume => {
                    control.resume_by_signal(store, &signal.id)?;
                    return Ok(Turn::Again);
                }
                _ = shutdown.requested() => return Ok(Turn::Ended),
            }
        }
    }
    pipeline.pause.take();
    control.show(Role::Running, Some(store.clone()));
    // The run stops on its own signal: the process's shutdown, or a command that needs it stopped.
    let (stop, run_shutdown) = Shutdown::new();
    let run = pipeline.run(store, lease, &run_shutdown);
    tokio::pin!(run);
    let mut command = None;
    let mut signalled = false;
    let result = loop {
        tokio::select! {
            result = &mut run => break result,
            _ = shutdown.requested(), if !run_shutdown.is_requested() => stop.trigger(),
            _ = pipeline.pause.asked(), if !signalled => {
                signalled = true;
                stop.trigger();
            }
            next = control.next(), if command.is_none() => match next.stops_a_run() {
                true => {
                    stop.trigger();
                    command = Some(next);
                }
                false => next.answer_running(),
            },
        }
    };
    // Paused by a signal (stored by the run): the next turn finds the pause, unless the process stops.
    if pipeline.pause.take().is_some() && command.is_none() && !shutdown.is_requested() {
        return result.map(|()| Turn::Again);
    }
    let Some(command) = command else { return result.map(|()| Turn::Ended) };
    if let Err(error) = result {
        command.fail(&error);
        return Err(error);
    }
    if shutdown.is_requested() {
        command.fail(&crate::error::Error::transient("the connector is stopping"));
        return Ok(Turn::Ended);
    }
    control.carry_out(command, store).await?;
    Ok(Turn::Again)
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
