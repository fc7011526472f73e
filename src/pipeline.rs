//! One run of the streaming pipeline: from the last checkpoint until shutdown or the first error.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! ```text
//!  binlog ─► BinlogReader ─► ReadAhead ═batches═► Router ─► KafkaSink ─► librdkafka ─► broker
//!       (own task: read, decode)   │ Begin/Commit         │ register        │ ack
//!                                  └─────────────► Watermark ◄─┘◄── Delivered ─┘
//!                                                      │ every checkpoint_interval_ms
//!                                                      ▼
//!                                   Checkpointer (blocking pool) ─► Store (redb, fsync)
//! ```
//!
//! Two stages on two tasks: the reader decodes ahead into batches bounded in bytes
//! ([`read_ahead`]), the pipeline's task routes and produces. The sink's byte budget is the one place that
//! waits, and the read-ahead budget passes that back-pressure on to the binlog socket. Checkpoints are
//! written off both tasks ([`crate::checkpoint::checkpointer`]), so neither ever waits for an fsync. librdkafka's threads do
//! the network I/O and call back with acknowledgements. The reader is the critical stage of a catch-up, so
//! the pipeline's thread and librdkafka's do not preempt it when they wake ([`crate::scheduling`]).
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
use std::time::Duration;

use crate::checkpoint::checkpointer::Checkpointer;
use crate::checkpoint::Store;
use crate::config::{Config, SnapshotMode, SourceKind};
use crate::error::{Error, Result};
use crate::health::health;
use crate::router::Router;
use crate::source::binlog::{BinlogReader, ReaderSettings};
use crate::source::files::FilesReader;
use crate::source::overlap::Overlap;
use crate::source::{preflight, SourceConn, SourceReader};

mod commit;
mod plan;
mod poll;
mod read_ahead;
mod run;
mod shutdown;

use plan::{FilesPlan, First, ServerPlan};
use run::Run;
pub use shutdown::{Shutdown, ShutdownTrigger, SHUTDOWN_GRACE};

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
    /// The state store; `None` until the app opened it (the Kafka backend opens it before each run).
    pub store: Option<Arc<Store>>,
    /// Resume even when the checkpoint belongs to another server (`--accept-new-server`).
    pub accept_new_server: bool,
    /// The server this instance's lease is held on (Kafka backend): each run checks that its binlog
    /// connection reaches the same one.
    pub lease_server: Option<crate::lease::LeaseServer>,
    /// The lease this instance publishes under (Kafka backend): the sink hands no record to the producer
    /// once it is no longer provably held.
    pub lease: Option<crate::lease::Holding>,
}

impl Pipeline {
    /// Runs until shutdown (Ok) or the first error.
    ///
    /// # Errors
    /// Transient errors are worth a retry; definite ones are not.
    pub async fn run(&self, shutdown: &Shutdown) -> Result<()> {
        let store = self.store().clone();
        let result = self.run_once(shutdown).await;
        if let Err(error) = &result {
            health().pipeline_failed(error);
            if let Err(e) = store.set_last_error(error) {
                tracing::warn!(error = %e, "cannot record the last error in the state store");
            }
            if let Some(refused) = error.refused() {
                // Remembered durably: after the restart this event takes the dead-letter path.
                store.add_known_poison(refused)?;
            }
        }
        result
    }

    fn store(&self) -> &Arc<Store> {
        self.store.as_ref().expect("the app opens the store before a run")
    }

    /// Wiring only: plans where the run starts ([`plan`]), builds its moving parts ([`Run`]) and runs its
    /// phases in order.
    async fn run_once(&self, shutdown: &Shutdown) -> Result<()> {
        let config = &self.config;
        if config.source.kind == SourceKind::Files {
            return self.run_files(shutdown).await;
        }
        if config.source.kind == SourceKind::Poll {
            return poll::run(
                config,
                &self.source,
                self.router.clone(),
                self.store().clone(),
                self.lease.clone(),
                shutdown,
            )
            .await;
        }
        let ServerPlan { info, plan } =
            plan::server(&self.source, config, self.store(), self.accept_new_server).await?;
        if let Some(lease) = &self.lease_server {
            lease.check_same(info.identity.server_id, info.identity.server_uuid.as_deref())?;
        }
        let checkpointer = Checkpointer::new(self.store().clone(), info.identity.clone());
        let first = plan.first(&checkpointer)?;
        let mut run = Run::new(&self.config, &self.source, self.router.clone(), checkpointer, shutdown).await?;
        if let Some(lease) = &self.lease {
            run.publish_while(lease.clone());
        }
        let start = match first {
            First::Stream(mark) => mark,
            First::Snapshot(progress) => {
                let result = run.snapshot(&info, progress).await;
                match run.settle(result).await? {
                    Some(mark) if config.snapshot.mode != SnapshotMode::InitialOnly => mark,
                    Some(_) => {
                        tracing::info!("snapshot complete (snapshot.mode = \"initial_only\"): exiting");
                        return Ok(());
                    }
                    None if shutdown.requested_at().is_some() => return Ok(()),
                    None => {
                        return Err(Error::transient(
                            "the snapshot's last records were not acknowledged in time; resuming it",
                        ))
                    }
                }
            }
        };
        if config.snapshot.mode == SnapshotMode::InitialOnly && start.snapshot.as_ref().is_none_or(|s| s.done) {
            tracing::info!("snapshot already complete (snapshot.mode = \"initial_only\"): nothing to do");
            return Ok(());
        }

        run.begin_stream(&start);
        let overlap = match &start.snapshot {
            Some(state) => {
                Overlap::new(state.clone(), &self.source, config.tables().to_vec(), &config.outbox.columns).await?
            }
            None => None,
        };
        let reader = SourceReader::Live(
            BinlogReader::start(&self.source, &info, self.reader.clone(), start.position.clone()).await?,
        );
        tracing::info!(
            position = %start.position,
            server = %preflight::describe_identity(&info.identity),
            version = %info.version,
            "streaming"
        );
        run.stream(&start, reader, overlap).await
    }

    /// A run over binlog files (`source.kind = "files"`): the stream phase with a [`FilesReader`] instead of
    /// a replication connection, and an end: once the last file is consumed, the run waits for every
    /// acknowledgement, writes the checkpoint and returns `Ok`, so the process exits 0. No snapshot (there
    /// is no table), no server to ask (see [`crate::source::files`]).
    async fn run_files(&self, shutdown: &Shutdown) -> Result<()> {
        let FilesPlan { paths, first, identity, plan } =
            plan::files(&self.config, self.store(), self.accept_new_server)?;
        let checkpointer = Checkpointer::new(self.store().clone(), identity.clone());
        let start = match plan.first(&checkpointer)? {
            First::Stream(mark) => mark,
            First::Snapshot(_) => unreachable!("plan::files never plans a snapshot: there is no table"),
        };
        let mut run = Run::new(&self.config, &self.source, self.router.clone(), checkpointer, shutdown).await?;
        run.begin_stream(&start);
        tracing::info!(
            position = %start.position,
            files = paths.len(),
            source = %preflight::describe_identity(&identity),
            version = %first.header.server_version,
            "reading binlog files"
        );
        let reader = SourceReader::Files(FilesReader::start(paths, self.reader.clone(), start.position.clone())?);
        run.stream(&start, reader, None).await?;
        if run.unsettled() > 0 {
            // Exit 0 must mean "everything in the files is in Kafka": resume from the checkpoint instead.
            return Err(Error::transient("records of the binlog files were not acknowledged in time; resuming"));
        }
        if shutdown.requested_at().is_none() {
            tracing::info!("binlog files published and checkpointed: done");
        }
        Ok(())
    }
}

/// Exponential back-off between transient failures, capped, with "equal jitter", reset after a healthy run.
///
/// The ceiling starts at `initial` and doubles up to `max`; each delay is drawn uniformly from
/// `[ceiling / 2, ceiling]`.
///
/// # Why jitter
/// Connectors that share a database or a broker fail together when it goes away, and without jitter
/// they would retry in lockstep: every attempt a burst of reconnects (and binlog dumps) against a server that
/// is just coming back, for as long as the outage lasts. Each back-off draws from its own random source
/// (seeded per process), so the bursts spread out within a few attempts.
///
/// # Why equal jitter, not full jitter
/// Full jitter (uniform in `[0, ceiling]`) spreads retries best, but draws delays near zero at any ceiling:
/// a connector would now and then retry at once however long the outage has lasted, and its log and the
/// server would see it. Equal jitter keeps half the ceiling as a floor that still doubles, so back-off
/// still backs off, and spreads the other half.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    /// The ceiling of the next delay.
    ceiling: Duration,
    /// SplitMix64 state: the jitter's random source.
    rng: u64,
}

impl Backoff {
    /// A back-off starting at `initial` and doubling up to `max`, its jitter seeded from the process's
    /// randomness (see [`Backoff::seeded`]).
    pub fn new(initial: Duration, max: Duration) -> Self {
        // The standard library's hash keys are drawn from the OS's random source once per thread, then
        // stepped: a random seed per back-off without a dependency.
        use std::hash::{BuildHasher, Hasher};
        let seed = std::collections::hash_map::RandomState::new().build_hasher().finish();
        Backoff::seeded(initial, max, seed)
    }

    /// Like [`Backoff::new`] with the jitter drawn from `seed`: the same seed gives the same delays.
    pub fn seeded(initial: Duration, max: Duration, seed: u64) -> Self {
        Backoff { initial, max, ceiling: initial, rng: seed }
    }

    /// The next delay: uniform in `[ceiling / 2, ceiling]`; the ceiling then doubles, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = (self.ceiling * 2).min(self.max);
        let floor = ceiling / 2;
        let span = (ceiling - floor).as_nanos() as u64;
        floor + Duration::from_nanos(self.random() % (span + 1))
    }

    /// Back to the initial ceiling.
    pub fn reset(&mut self) {
        self.ceiling = self.initial;
    }

    /// SplitMix64 (Steele, Lea, Flood 2014): a few arithmetic steps, full period, every seed usable.
    fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delays_ms(b: &mut Backoff, n: usize) -> Vec<u128> {
        (0..n).map(|_| b.next_delay().as_millis()).collect()
    }

    /// Each delay lies in the upper half of a ceiling that doubles to the cap, and `reset` starts over.
    #[test]
    fn backoff_doubles_caps_and_resets() {
        let ceilings = [100, 200, 350, 350, 350];
        for seed in 0..200 {
            let mut b = Backoff::seeded(Duration::from_millis(100), Duration::from_millis(350), seed);
            for (delay, ceiling) in delays_ms(&mut b, ceilings.len()).into_iter().zip(ceilings) {
                assert!((ceiling / 2..=ceiling).contains(&delay), "seed {seed}: {delay} ms for ceiling {ceiling}");
            }
            b.reset();
            let first = b.next_delay().as_millis();
            assert!((50..=100).contains(&first), "seed {seed}: {first} ms after reset");
        }
    }

    /// The same seed gives the same delays (tests and reproductions can pin them).
    #[test]
    fn a_seed_fixes_the_delays() {
        let mut a = Backoff::seeded(Duration::from_millis(100), Duration::from_secs(30), 42);
        let mut b = Backoff::seeded(Duration::from_millis(100), Duration::from_secs(30), 42);
        assert_eq!(delays_ms(&mut a, 12), delays_ms(&mut b, 12));
    }

    /// Regression guard for connectors that lost the same server retrying in lockstep: a hundred back-offs
    /// (seeds as different processes would draw them) spread their retries over the whole upper half of the
    /// ceiling instead of landing on one instant.
    #[test]
    fn connectors_failing_together_do_not_retry_together() {
        let ceiling = Duration::from_secs(8);
        let delays: Vec<Duration> = (0..100).map(|_| Backoff::new(ceiling, ceiling).next_delay()).collect();
        let (min, max) = (delays.iter().min().unwrap(), delays.iter().max().unwrap());
        assert!(*min >= ceiling / 2 && *max <= ceiling, "{min:?}..{max:?}");
        // 100 uniform draws over 4 s leave a gap above 2 s at either end with probability ~2^-100.
        assert!(*max - *min >= Duration::from_secs(2), "{min:?}..{max:?}: the retries stay bunched");
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() >= 95, "{} distinct delays of 100", distinct.len());
    }
}
