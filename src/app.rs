//! Wiring: builds the pieces from the config and keeps the pipeline running across transient failures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::Store;
use crate::config::Config;
use crate::error::Result;
use crate::pipeline::{Backoff, Pipeline, Shutdown};
use crate::router::{Router, TopicTemplate};
use crate::source::binlog::ReaderSettings;
use crate::source::SourceConn;

/// A run that lasted this long was healthy: the next failure starts the back-off from the beginning.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Options of `outbox-cdc run` beyond the config file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Resume even if the checkpoint belongs to a different server.
    pub accept_new_server: bool,
}

/// Runs the connector until shutdown or a definite error.
///
/// # Errors
/// The first definite error; transient ones are retried with capped exponential back-off.
pub async fn run(config: Config, options: RunOptions, shutdown: Shutdown) -> Result<()> {
    let config = Arc::new(config);
    let pipeline = Pipeline {
        source: SourceConn::from_config(&config)?,
        router: Router::new(TopicTemplate::parse(&config.kafka.topic)?, config.kafka.value_format),
        reader: Arc::new(ReaderSettings {
            server_id: config.source.server_id,
            tables: config.outbox_tables()?,
            columns: config.outbox.columns.clone(),
            on_update: config.outbox.on_update,
            heartbeat: Duration::from_millis(config.source.heartbeat_interval_ms),
        }),
        store: Arc::new(Store::open(&config.state.dir)?),
        accept_new_server: options.accept_new_server,
        config: config.clone(),
    };
    let mut backoff = Backoff::new(
        Duration::from_millis(config.source.reconnect_initial_backoff_ms),
        Duration::from_millis(config.source.reconnect_max_backoff_ms),
    );
    loop {
        let started = Instant::now();
        match pipeline.run(&shutdown).await {
            Ok(()) => return Ok(()),
            Err(error) if error.is_definite() => return Err(error),
            Err(error) => {
                if started.elapsed() >= HEALTHY_RUN {
                    backoff.reset();
                }
                if shutdown.requested_at().is_some() {
                    return Ok(());
                }
                let delay = backoff.next_delay();
                tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "transient failure; resuming from the last acknowledged position");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.requested() => return Ok(()),
                }
            }
        }
    }
}
