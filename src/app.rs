//! Wiring: builds the pieces from the config and keeps the pipeline running across transient failures.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::Store;
use crate::config::{Config, SourceKind, StateBackend};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::pipeline::{Pipeline, Shutdown};
use crate::router::Router;
use crate::source::binlog::ReaderSettings;
use crate::source::SourceConn;

mod backoff;

use backoff::Backoff;

/// A run that lasted this long was healthy: the next failure starts the back-off from the beginning.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Runs in a row (without a healthy one between) that may end with a fatal producer error before the
/// connector stops: one is a broker hiccup a new producer cures, several at once are a fault to look into.
pub const MAX_PRODUCER_FATAL_RUNS: u32 = 5;

/// Options of `outbox-cdc run` beyond the config file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Resume even if the checkpoint belongs to a different server.
    pub accept_new_server: bool,
}

/// Runs the connector until shutdown or a definite error.
///
/// # Errors
/// The first definite error; transient ones are retried with capped, jittered exponential back-off
/// ([`Backoff`]).
pub async fn run(config: Config, options: RunOptions, shutdown: Shutdown) -> Result<()> {
    let config = Arc::new(config);
    // Aborted when `run` returns (the handles' guards).
    let _endpoint = match config.metrics.enabled {
        true => {
            let listener = crate::http::bind(config.metrics.listen).await?;
            let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
            Some(AbortOnDrop(tokio::spawn(crate::http::serve(listener))))
        }
        false => None,
    };
    let pipeline = Pipeline {
        source: SourceConn::from_config(&config)?,
        router: Router::for_config(&config),
        reader: Arc::new(ReaderSettings {
            server_id: config.source.server_id,
            tables: config.tables().to_vec(),
            columns: config.outbox.columns.clone(),
            on_update: config.outbox.on_update,
            heartbeat: Duration::from_millis(config.source.heartbeat_interval_ms),
        }),
        // The local store is opened once, and refuses a second process; the Kafka one before each run
        // (below), after fencing any older writer.
        store: match config.state.backend {
            StateBackend::Local => Some(Arc::new(Store::open(&config.state.dir)?)),
            StateBackend::Kafka => None,
        },
        accept_new_server: options.accept_new_server,
        lease_server: None,
        lease: None,
        config: config.clone(),
    };
    let current_store = Arc::new(std::sync::RwLock::new(pipeline.store.clone()));
    // The polling relay reads no binlog: there is nothing the server could purge from under it.
    let _purge_watch = (config.source.kind != SourceKind::Poll).then(|| {
        AbortOnDrop(tokio::spawn(watch_purge_risk(
            pipeline.source.clone(),
            current_store.clone(),
            Duration::from_millis(config.metrics.purge_check_interval_ms),
            config.metrics.purge_warn_ratio,
        )))
    });
    let mut pipeline = pipeline;
    let mut backoff = Backoff::new(
        Duration::from_millis(config.source.reconnect_initial_backoff_ms),
        Duration::from_millis(config.source.reconnect_max_backoff_ms),
    );
    let mut producer_fatal_runs = 0;
    // The Kafka backend's active/standby: only the holder of the lease runs (see `crate::lease`).
    let mut lease: Option<Lease> = None;
    let outcome = loop {
        let started = Instant::now();
        // Only the holder of the lease runs (see `crate::lease`): the Kafka backend's active/standby, and
        // the polling relay's (one relay of a connector publishes; the others stand by).
        let leased = config.state.backend == StateBackend::Kafka || config.source.kind == SourceKind::Poll;
        let result = if !leased {
            pipeline.run(&shutdown).await
        } else {
            if let Some(lost) = lease.take_if(|l| !l.is_held()) {
                lost.release().await;
            }
            if lease.is_none() {
                let failover = Duration::from_millis(config.delivery.failover_timeout_ms);
                let name = &config.state.name;
                let fingerprint = Some(config.fingerprint());
                match Lease::acquire_as(&pipeline.source, name, fingerprint, failover, shutdown.requested()).await {
                    Ok(Some(acquired)) => {
                        pipeline.lease_server = Some(acquired.server().clone());
                        pipeline.lease = Some(acquired.holding());
                        lease = Some(acquired);
                    }
                    Ok(None) => break Ok(()),
                    Err(error) => break Err(error),
                }
            }
            let lost = lease.as_ref().expect("acquired above").lost();
            // The Kafka backend reads its state again before each run, after fencing older writers: what
            // is committed in Kafka is the truth, whatever the last run held in memory.
            let store = match config.state.backend {
                StateBackend::Local => Ok(pipeline.store.clone().expect("the local store is opened once")),
                StateBackend::Kafka => Store::open_for(&config).await.map(Arc::new),
            };
            match store {
                Ok(store) => {
                    pipeline.store = Some(store.clone());
                    *current_store.write().unwrap_or_else(|p| p.into_inner()) = Some(store);
                    tokio::select! {
                        result = pipeline.run(&shutdown) => result,
                        // Dropping the run drops its producer, which purges what it has not sent.
                        reason = lost => {
                            let error = Error::transient(format!(
                                "lease lost ({reason}): stopped publishing; waiting as a standby"
                            ));
                            // Not ready until it holds the lease and runs again.
                            crate::health::health().pipeline_failed(&error);
                            Err(error)
                        }
                    }
                }
                Err(error) => Err(error.context("opening the state in Kafka")),
            }
        };
        match result {
            Ok(()) => break Ok(()),
            Err(error) if error.is_definite() => break Err(error),
            Err(error) => {
                if started.elapsed() >= HEALTHY_RUN {
                    backoff.reset();
                    producer_fatal_runs = 0;
                }
                if error.is_producer_fatal() {
                    producer_fatal_runs += 1;
                    if producer_fatal_runs >= MAX_PRODUCER_FATAL_RUNS {
                        break Err(producer_fatal_again(&error));
                    }
                }
                if shutdown.requested_at().is_some() {
                    break Ok(());
                }
                crate::metrics::metrics().reconnect();
                let delay = backoff.next_delay();
                tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "transient failure; resuming from the last acknowledged position");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.requested() => break Ok(()),
                }
            }
        }
    };
    // A standby takes over at once instead of after the server noticed this process is gone.
    if let Some(lease) = lease {
        lease.release().await;
    }
    outcome
}

/// The definite error after [`MAX_PRODUCER_FATAL_RUNS`] runs in a row ended with a fatal producer error.
fn producer_fatal_again(last: &crate::error::Error) -> crate::error::Error {
    crate::error::Error::definite(format!(
        "the Kafka producer failed fatally in {MAX_PRODUCER_FATAL_RUNS} runs in a row, each with a new producer \
         from the checkpoint (last: {last}). The broker keeps refusing this producer's sequence numbers: look for \
         lost or truncated partitions (unclean leader election, a topic deleted and re-created, DeleteRecords) \
         in the broker's logs. Nothing unacknowledged was checkpointed; start the connector again once the \
         broker is healthy"
    ))
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Measures the purge risk of the stored checkpoint every `interval` on a connection of its own, exports
/// it, and warns once per crossing of `warn_ratio` (and at every reading while above it, at most hourly).
async fn watch_purge_risk(
    source: SourceConn,
    store: Arc<std::sync::RwLock<Option<Arc<Store>>>>,
    interval: Duration,
    warn_ratio: f64,
) {
    const REMIND_EVERY: Duration = Duration::from_secs(3600);
    let mut conn = None;
    let mut warned_at: Option<Instant> = None;
    // The first reading comes soon after start: a connector restarted after a long outage is the case
    // that matters most.
    let mut delay = Duration::from_secs(5).min(interval);
    loop {
        tokio::time::sleep(delay).await;
        delay = interval;
        let current = store.read().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(Ok(Some(checkpoint))) = current.map(|s| s.load()) else { continue };
        if conn.is_none() {
            match source.connect().await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "purge-risk check: cannot connect");
                    continue;
                }
            }
        }
        let now_s = crate::time::now_ms() / 1000;
        let c = conn.as_mut().expect("connected above");
        match crate::source::purge::measure(c, checkpoint.position(), checkpoint.source_timestamp(), now_s).await {
            Ok(risk) => {
                crate::metrics::metrics().purge_risk(
                    risk.needed_age_seconds,
                    risk.needed_bytes,
                    risk.retention_seconds,
                    risk.ratio(),
                );
                if risk.ratio() >= warn_ratio {
                    if warned_at.is_none_or(|at| at.elapsed() >= REMIND_EVERY) {
                        tracing::warn!(
                            position = %checkpoint.position(),
                            "purge risk {risk}: the server may soon delete binlogs the connector still needs. \
                             Let the connector catch up (see the lag metrics), or raise the server's binlog retention \
                             (`outbox-cdc check` prints how on this server)"
                        );
                        warned_at = Some(Instant::now());
                    }
                } else {
                    warned_at = None;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "purge-risk check failed");
                conn = None;
            }
        }
    }
}
