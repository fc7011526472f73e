//! Wiring: builds the pieces from the config and keeps the pipeline running across transient failures.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! Each piece has one owner: the [`Supervisor`] decides after each run whether and when the next one
//! starts, the [`Tenure`] holds the lease (only its holder runs), the [`State`] holds the state store and
//! lends each run the one it writes. `run` builds them and runs the loop; it decides nothing itself.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use crate::config::{Config, SourceKind, StateBackend};
use crate::error::Result;
use crate::pipeline::{Pipeline, Shutdown};
use crate::router::Router;
use crate::source::binlog::ReaderSettings;
use crate::source::SourceConn;

mod backoff;
mod purge;
mod state;
mod supervisor;
mod tenure;

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
            heartbeat: config.source.heartbeat_interval,
        }),
        accept_new_server: options.accept_new_server,
        config: config.clone(),
    };
    let state = State::open(&config)?;
    // The polling relay reads no binlog: there is nothing the server could purge from under it.
    let _purge_watch = (config.source.kind != SourceKind::Poll).then(|| {
        AbortOnDrop(tokio::spawn(purge::watch_purge_risk(
            pipeline.source.clone(),
            state.watch(),
            config.metrics.purge_check_interval,
            config.metrics.purge_warn_ratio,
        )))
    });
    // Only the holder of the lease runs (see `crate::lease`): the Kafka backend's active/standby, and the
    // polling relay's (one relay of a connector publishes; the others stand by).
    let leased = config.state.backend == StateBackend::Kafka || config.source.kind == SourceKind::Poll;
    let mut tenure =
        leased.then(|| Tenure::new(config.state.name.clone(), config.fingerprint(), config.delivery.failover_timeout));
    let mut supervisor = Supervisor::new(config.source.reconnect_initial_backoff, config.source.reconnect_max_backoff);
    let outcome = loop {
        let started = Instant::now();
        let lease = match &mut tenure {
            None => None,
            Some(tenure) => match tenure.hold(&pipeline.source, &shutdown).await {
                Ok(Some(lease)) => Some(lease),
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            },
        };
        let result = match state.for_run().await {
            Ok(store) => match lease {
                None => pipeline.run(&store, None, &shutdown).await,
                Some(lease) => tenure::while_held(lease, pipeline.run(&store, Some(lease), &shutdown)).await,
            },
            Err(error) => Err(error),
        };
        if let ControlFlow::Break(outcome) = supervisor.after(result, started, &shutdown).await {
            break outcome;
        }
    };
    if let Some(tenure) = tenure {
        tenure.release().await;
    }
    outcome
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
