//! One run of the streaming pipeline: from the last checkpoint until shutdown or the first error.
//!
//! ```text
//!  binlog ──► BinlogReader ──Change──► Router ──KafkaRecord──► KafkaSink ──► librdkafka ──► broker
//!                 │  Begin/Commit(position)                       │ register            │ ack
//!                 └──────────────────────────────► Watermark ◄────┘◄── Delivered ───────┘
//!                                                     │ every checkpoint_interval_ms
//!                                                     ▼
//!                                              Checkpointer ──► Store (redb, fsync)
//! ```
//!
//! The reader, router and sink run on one task: decoding and routing are cheap, and the sink's byte budget
//! is the one place that waits, so back-pressure reaches the binlog socket directly. librdkafka's threads
//! do the network I/O and call back with acknowledgements.
//!
//! # Error handling
//! Any error ends the run. The transaction being read is abandoned (it will be read again), in-flight
//! records get a short chance to be acknowledged, and the watermark is checkpointed: it never includes
//! anything unacknowledged, so restarting from it loses nothing. Transient errors are retried by
//! [`crate::app`]; definite ones stop the process.
//!
//! # Graceful shutdown
//! On SIGINT/SIGTERM the reader stops at the next transaction boundary (finishing the current transaction
//! for up to [`SHUTDOWN_GRACE`]), waits for every record to be acknowledged, writes a final checkpoint and
//! returns: a restart then neither loses nor repeats an event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::checkpoint::{now_ms, Checkpoint, Mark, Store, TxId, Watermark, CHECKPOINT_VERSION};
use crate::config::Config;
use crate::error::Result;
use crate::router::Router;
use crate::sink::KafkaSink;
use crate::source::binlog::{BinlogReader, Change, ReaderSettings};
use crate::source::{preflight, server_info, start_position, ServerIdentity, SourceConn};

/// How long a graceful stop waits for the current transaction to finish and for acknowledgements.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a failed run waits for in-flight acknowledgements before giving up on them.
const FAILURE_DRAIN: Duration = Duration::from_secs(5);

/// A shutdown signal: when it was requested, if it was.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<Option<Instant>>,
}

/// Triggers a [`Shutdown`].
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<Option<Instant>>,
}

impl ShutdownTrigger {
    /// Requests shutdown (idempotent).
    pub fn trigger(&self) {
        self.tx.send_if_modified(|at| {
            if at.is_none() {
                *at = Some(Instant::now());
                true
            } else {
                false
            }
        });
    }
}

impl Shutdown {
    /// A new signal and its trigger.
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(None);
        (ShutdownTrigger { tx }, Shutdown { rx })
    }

    /// When shutdown was requested.
    pub fn requested_at(&self) -> Option<Instant> {
        *self.rx.borrow()
    }

    /// Resolves once shutdown is requested.
    pub async fn requested(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Resolves [`SHUTDOWN_GRACE`] after shutdown was requested.
    pub async fn grace_expired(&self) {
        self.requested().await;
        let at = self.requested_at().expect("requested");
        tokio::time::sleep_until((at + SHUTDOWN_GRACE).into()).await;
    }
}

/// Everything a run needs that outlives it.
pub struct Pipeline {
    /// Validated configuration.
    pub config: Arc<Config>,
    /// How to reach the source.
    pub source: SourceConn,
    /// Row → record.
    pub router: Router,
    /// Reader settings.
    pub reader: Arc<ReaderSettings>,
    /// Checkpoint store.
    pub store: Arc<Store>,
    /// Resume even when the checkpoint belongs to another server (`--accept-new-server`).
    pub accept_new_server: bool,
}

/// Turns the watermark into stored checkpoints.
struct Checkpointer {
    store: Arc<Store>,
    watermark: Arc<Watermark>,
    server: ServerIdentity,
    saved: Option<Mark>,
}

impl Checkpointer {
    /// Writes the watermark if it moved.
    fn flush(&mut self) -> Result<()> {
        let Some(mark) = self.watermark.mark() else {
            return Ok(());
        };
        if self.saved.as_ref() == Some(&mark) {
            return Ok(());
        }
        self.store.save(&Checkpoint {
            version: CHECKPOINT_VERSION,
            position: mark.position.clone(),
            server: self.server.clone(),
            source_timestamp: mark.timestamp,
            written_at_ms: now_ms(),
        })?;
        tracing::debug!(position = %mark.position, "checkpoint written");
        self.saved = Some(mark);
        Ok(())
    }
}

impl Pipeline {
    /// Runs until shutdown (Ok) or the first error.
    ///
    /// # Errors
    /// Transient errors are worth a retry; definite ones are not.
    pub async fn run(&self, shutdown: &Shutdown) -> Result<()> {
        let config = &self.config;
        let mut conn = self.source.connect().await?;
        let info = server_info(&mut conn).await?;
        let stored = self.store.load()?;
        if let Some(cp) = &stored {
            if cp.server != info.identity && self.accept_new_server {
                tracing::warn!(
                    checkpoint_server = %preflight::describe_identity(&cp.server),
                    server = %preflight::describe_identity(&info.identity),
                    "resuming a checkpoint of another server (--accept-new-server)"
                );
            }
        }
        let identity_for_check = |cp: &Checkpoint| {
            if self.accept_new_server {
                info.identity.clone()
            } else {
                cp.server.clone()
            }
        };
        let checked = stored
            .as_ref()
            .map(|cp| (identity_for_check(cp), cp.position.clone()));
        let report = preflight::check(
            &mut conn,
            &info,
            config,
            checked.as_ref().map(|(s, p)| (s, p)),
        )
        .await?;
        for finding in report
            .findings
            .iter()
            .filter(|f| f.status == preflight::Status::Warn)
        {
            tracing::warn!(setting = %finding.setting, actual = %finding.actual, fix = %finding.fix, "preflight warning");
        }
        report.into_result()?;

        let mut checkpointer = Checkpointer {
            store: self.store.clone(),
            watermark: Arc::new(Watermark::new(None)),
            server: info.identity.clone(),
            saved: None,
        };
        let start = match stored {
            Some(cp) => Mark {
                position: cp.position,
                timestamp: cp.source_timestamp,
            },
            None => {
                let position = start_position(&mut conn, &info, config).await?;
                tracing::info!(%position, start_from = ?config.source.start_from, "no checkpoint: starting fresh");
                // Store the start point at once: a crash before the first acknowledgement must resume
                // here, not at a later "current" position that would skip what was committed meanwhile.
                checkpointer.watermark = Arc::new(Watermark::new(Some(Mark {
                    position,
                    timestamp: None,
                })));
                checkpointer.flush()?;
                checkpointer.saved.clone().expect("just saved")
            }
        };
        drop(conn);

        let watermark = Arc::new(Watermark::new(Some(start.clone())));
        checkpointer.watermark = watermark.clone();
        checkpointer.saved = Some(start.clone());
        let mut sink = KafkaSink::new(&config.kafka, watermark.clone())?;
        let mut reader = BinlogReader::start(
            &self.source,
            &info,
            self.reader.clone(),
            start.position.clone(),
        )
        .await?;
        tracing::info!(
            position = %start.position,
            server = %preflight::describe_identity(&info.identity),
            version = %info.version,
            "streaming"
        );

        let mut current: Option<TxId> = None;
        let result = self
            .stream(
                &mut reader,
                &mut sink,
                &watermark,
                &mut checkpointer,
                &mut current,
                shutdown,
            )
            .await;

        if let Some(tx) = current.take() {
            watermark.abandon(tx);
        }
        let drain = if result.is_ok() {
            SHUTDOWN_GRACE
        } else {
            FAILURE_DRAIN
        };
        if !sink.drain(drain).await {
            tracing::warn!(
                unsettled = watermark.unsettled(),
                "records not acknowledged in time; they will be produced again after restart"
            );
            sink.abort();
        }
        let flushed = checkpointer.flush();
        if let Some(mark) = watermark.mark() {
            tracing::info!(position = %mark.position, "checkpoint at stop");
        }
        result.and(flushed)
    }

    async fn stream(
        &self,
        reader: &mut BinlogReader,
        sink: &mut KafkaSink,
        watermark: &Watermark,
        checkpointer: &mut Checkpointer,
        current: &mut Option<TxId>,
        shutdown: &Shutdown,
    ) -> Result<()> {
        let mut tick = tokio::time::interval(Duration::from_millis(
            self.config.state.checkpoint_interval_ms,
        ));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Some(error) = watermark.take_failure() {
                return Err(error);
            }
            let stopping = shutdown.requested_at().is_some();
            tokio::select! {
                biased;
                _ = shutdown.requested(), if !stopping => {
                    if current.is_none() {
                        return Ok(());
                    }
                    tracing::info!("stopping after the current source transaction");
                }
                _ = shutdown.grace_expired(), if stopping => {
                    tracing::warn!("the current source transaction did not finish within the shutdown grace period; it will be read again after restart");
                    return Ok(());
                }
                _ = tick.tick() => checkpointer.flush()?,
                change = reader.next() => match change? {
                    Change::Begin => {
                        if let Some(tx) = current.replace(watermark.open()) {
                            watermark.abandon(tx);
                        }
                    }
                    Change::Row(row) => {
                        let tx = *current.get_or_insert_with(|| watermark.open());
                        let record = self.router.route(&row)?;
                        tokio::select! {
                            sent = sink.send(tx, &record) => sent?,
                            _ = shutdown.grace_expired() => {
                                tracing::warn!("Kafka did not accept records within the shutdown grace period");
                                return Ok(());
                            }
                        }
                    }
                    Change::Commit { position, timestamp } => {
                        let tx = current.take().unwrap_or_else(|| watermark.open());
                        watermark.close(tx, Mark { position, timestamp: (timestamp != 0).then_some(timestamp) });
                        if stopping {
                            return Ok(());
                        }
                    }
                },
            }
        }
    }
}

/// Exponential back-off between transient failures, capped, reset after a healthy run.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A back-off starting at `initial` and doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            current: initial,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.current;
        self.current = (self.current * 2).min(self.max);
        delay
    }

    /// Back to the initial delay.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let seq: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(seq, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }
}
