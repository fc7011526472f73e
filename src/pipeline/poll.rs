//! One run of the polling relay (`source.kind = "poll"`): claim a batch, publish it, wait for Kafka's
//! acknowledgements, mark it published; again, or wait `poll.poll_interval_ms` when nothing is due.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! The claim, the lease and the order rule are in [`crate::source::poll`]; rows become records through the
//! same [`Publisher`] (router, dead letters, holds) and [`KafkaSink`] as the binlog source's. There is no
//! checkpoint: `published_at` is the relay's progress, written only after every record of the batch was
//! acknowledged.
//!
//! # Error handling
//! - A failed delivery (or a record the sink refuses) fails the whole batch ([`Relay::fail`]: `attempts +
//!   1`, a later `next_attempt_at`) and ends the run: the sink stops at its first failure (gap-less
//!   idempotence), and [`crate::app`] restarts with a new one. A row that failed `poll.max_attempts` times
//!   is dead-lettered on its next claim.
//! - A lost connection ends the run; the batch stays leased until the lease expires, then any relay
//!   publishes it again (at-least-once, same `id` header).
//! - The lease is renewed every third of `poll.lease_ms` from the claim until the mark: while the sink waits
//!   for in-flight budget (a slow or absent broker) as well as while the acknowledgements are awaited. A
//!   lease that cannot be renewed, or that another relay took over, ends the run: the in-flight records are
//!   purged and the new holder publishes the rows again.
//!
//! # Load on the database
//! Idle: one statement per table per `poll.poll_interval_ms` (the heads read, which finds nothing due).
//! Busy: per batch of up to `poll.batch_rows` rows, six claim statements, one mark, and two per lease
//! renewal. Every [`BACKLOG_EVERY`], one bounded count per table. `outbox_cdc_poll_queries_total` counts
//! them by kind.
//!
//! # Graceful shutdown
//! The batch in flight is finished (up to [`SHUTDOWN_GRACE`]) and marked, then the run returns.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::{Conn, Value};

use super::shutdown::{Shutdown, SHUTDOWN_GRACE};
use crate::checkpoint::{Store, Watermark};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::health::health;
use crate::metrics::metrics;
use crate::poison::KnownPoison;
use crate::publish::{Publisher, SourceRow};
use crate::quarantine::headers;
use crate::router::Router;
use crate::sink::KafkaSink;
use crate::source::poll::{Claimed, Relay};
use crate::source::SourceConn;

/// How often the relay counts its backlog (`outbox_cdc_poll_backlog_rows`): one bounded count per table.
const BACKLOG_EVERY: Duration = Duration::from_secs(5);

/// The parts of a relay run.
struct PollRun<'a> {
    config: &'a Config,
    router: Router,
    store: Arc<Store>,
    relay: Relay,
    conn: Conn,
    sink: KafkaSink,
    publisher: Publisher,
    watermark: Arc<Watermark>,
    shutdown: &'a Shutdown,
}

/// Runs the relay until shutdown (Ok) or the first error.
///
/// # Errors
/// Transient errors are worth a retry; definite ones are not.
pub(super) async fn run(
    config: &Config,
    source: &SourceConn,
    router: Router,
    store: Arc<Store>,
    shutdown: &Shutdown,
) -> Result<()> {
    let mut conn = source.connect().await?;
    let relay = Relay::load(&mut conn, config).await?;
    let watermark = Arc::new(Watermark::new(None));
    let sink = KafkaSink::new(&config.kafka, watermark.clone())?;
    let publisher = Publisher::new(config, router.clone(), store.clone())?;
    health().set_source_connected(true);
    tracing::info!(relay = relay.id(), tables = relay.tables().len(), "polling the outbox table");
    let mut run = PollRun { config, router, store, relay, conn, sink, publisher, watermark, shutdown };
    let idle = Duration::from_millis(config.poll.poll_interval_ms);
    let requested = shutdown.requested();
    tokio::pin!(requested);
    let mut backlog_due = tokio::time::Instant::now();
    loop {
        if shutdown.is_requested() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= backlog_due {
            run.count_backlog().await?;
            backlog_due = tokio::time::Instant::now() + BACKLOG_EVERY;
        }
        let mut busy = false;
        for t in 0..run.relay.tables().len() {
            let claimed = run.relay.claim(&mut run.conn, t).await?;
            if claimed.is_empty() {
                continue;
            }
            busy = true;
            run.publish(t, claimed).await?;
        }
        if !busy {
            metrics().poll_idle();
            tokio::select! {
                _ = tokio::time::sleep(idle) => {}
                _ = &mut requested => return Ok(()),
            }
        }
    }
}

impl PollRun<'_> {
    /// Counts the due unpublished rows of every table and the wait of the oldest
    /// (`outbox_cdc_poll_backlog_rows`, `outbox_cdc_poll_oldest_due_seconds`).
    async fn count_backlog(&mut self) -> Result<()> {
        let (mut due, mut waited_s) = (0, 0.0f64);
        for t in 0..self.relay.tables().len() {
            let (rows, seconds) = self.relay.backlog(&mut self.conn, t).await?;
            due += rows;
            waited_s = waited_s.max(seconds);
        }
        metrics().poll_backlog(due, waited_s);
        Ok(())
    }

    /// Publishes one claimed batch in order, waits for every acknowledgement (renewing the lease), then
    /// marks the rows published, or parks the dead-lettered ones.
    async fn publish(&mut self, t: usize, claimed: Vec<Claimed>) -> Result<()> {
        self.dead_letter_exhausted(&claimed)?;
        let keys: Vec<Value> = claimed.iter().map(|c| c.key.clone()).collect();
        let tx = self.watermark.open();
        // The lease is renewed every third of it while the batch is produced (the sink waits for in-flight
        // budget while the broker is slow or away) and while its acknowledgements are awaited.
        let renew_every = Duration::from_millis(self.config.poll.lease_ms / 3);
        let mut renewal = tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
        // The rows that went to the dead-letter topic, with why: parked once acknowledged.
        let mut dead: Vec<(usize, String)> = Vec::new();
        let mut sent = Ok(());
        let mut lost: Option<Error> = None;
        for (i, c) in claimed.iter().enumerate() {
            let row = match &c.row {
                Ok(row) => SourceRow::Decoded(row),
                Err(bad) => SourceRow::Undecodable(bad),
            };
            let relay = &self.relay;
            let sink = &mut self.sink;
            let prepared = self.publisher.prepare(row, || relay.origin(t), |r| sink.fits(r))?;
            if prepared.record.topic == self.config.kafka.dead_letter_topic {
                let header = |name: &str| {
                    prepared.record.headers.iter().find(|(k, _)| k == name).map(|(_, v)| String::from_utf8_lossy(v))
                };
                let kind = header(headers::KIND).unwrap_or_default();
                dead.push((i, format!("{kind}: {}", header(headers::REASON).unwrap_or_default())));
            }
            let send = sink.send(tx, prepared.record, prepared.occurred_at_ms);
            tokio::pin!(send);
            let result = loop {
                tokio::select! {
                    result = &mut send => break result,
                    _ = renewal.tick() => {
                        if let Err(e) = keep_lease(relay, &mut self.conn, t, &keys).await {
                            lost = Some(e);
                            break Ok(());
                        }
                    }
                }
            };
            if lost.is_some() {
                break;
            }
            if let Err(e) = result {
                sent = Err(e);
                break;
            }
            crate::failpoint!("poll_row_produced");
        }
        if let Some(error) = lost {
            self.sink.abort();
            return Err(error);
        }
        if let Err(error) = sent {
            return self.failed(t, tx, &keys, error).await;
        }
        // Wait for the acknowledgements, renewing the lease.
        let mut waited = Duration::ZERO;
        loop {
            if self.sink.drain(renew_every).await && !self.watermark.failed() {
                break;
            }
            if let Some(error) = self.watermark.take_failure() {
                return self.failed(t, tx, &keys, error).await;
            }
            waited += renew_every;
            if self.shutdown.is_requested() && waited >= SHUTDOWN_GRACE {
                self.sink.abort();
                tracing::warn!("Kafka did not acknowledge the batch within the shutdown grace period; it stays leased and is published again once the lease expires");
                return Ok(());
            }
            if let Err(error) = keep_lease(&self.relay, &mut self.conn, t, &keys).await {
                self.sink.abort();
                return Err(error);
            }
        }
        crate::failpoint!("poll_batch_acked");
        self.watermark.abandon(tx);
        let published: Vec<Value> = keys
            .iter()
            .enumerate()
            .filter(|(i, _)| !dead.iter().any(|(d, _)| d == i))
            .map(|(_, k)| k.clone())
            .collect();
        let marked = self.relay.mark_published(&mut self.conn, t, &published).await?;
        if marked < published.len() as u64 {
            metrics().poll_lease_lost();
            tracing::warn!(
                marked,
                batch = published.len(),
                "rows of this batch were taken over by another relay before they were marked: they are published again"
            );
        }
        for (i, reason) in &dead {
            self.relay.park(&mut self.conn, t, &keys[*i], reason).await?;
        }
        Ok(())
    }

    /// A row that failed `poll.max_attempts` deliveries is poison: remembered in the store like a broker
    /// refusal, so that the publisher sends it to the dead-letter topic and holds its aggregate.
    fn dead_letter_exhausted(&mut self, claimed: &[Claimed]) -> Result<()> {
        let max = self.config.poll.max_attempts;
        let mut added = false;
        for c in claimed.iter().filter(|c| c.attempts >= max) {
            let Some(id) = c.id() else { continue };
            let message = format!(
                "delivery failed {} times (poll.max_attempts = {max}); last error: {}",
                c.attempts,
                c.last_error.as_deref().unwrap_or("unknown")
            );
            self.store.add_known_poison(&KnownPoison { id: id.to_string(), message })?;
            added = true;
        }
        if added {
            self.publisher = Publisher::new(self.config, self.router.clone(), self.store.clone())?;
        }
        Ok(())
    }

    /// A delivery of the batch failed: purge what is in flight, count the attempt on every row of the batch
    /// and end the run with the failure.
    async fn failed(&mut self, t: usize, tx: crate::checkpoint::TxId, keys: &[Value], error: Error) -> Result<()> {
        self.sink.abort();
        self.watermark.abandon(tx);
        if let Err(e) = self.relay.fail(&mut self.conn, t, keys, &error.to_string()).await {
            tracing::warn!(error = %e, "cannot record the failed delivery; the batch is retried once its lease expires");
        }
        Err(error)
    }
}

/// Renews the lease on a batch; an error when it cannot (the caller stops publishing the batch).
async fn keep_lease(relay: &Relay, conn: &mut Conn, t: usize, keys: &[Value]) -> Result<()> {
    let renewed = relay.renew(conn, t, keys).await;
    if !matches!(renewed, Ok(true)) {
        metrics().poll_lease_lost();
    }
    match renewed {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::transient(
            "another relay took over this relay's lease (it expired while Kafka did not acknowledge); the rows \
             are published again by that relay. Raise poll.lease_ms if Kafka is often this slow",
        )),
        Err(e) => Err(e.context("cannot renew the lease; the batch is published again once it expires")),
    }
}
