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

use crate::checkpoint::checkpointer::Checkpointer;
use crate::checkpoint::Store;
use crate::config::{Config, FilesSource, SnapshotMode, Source};
use crate::error::{Error, Kind, Result};
use crate::health::health;
use crate::lease::Lease;
use crate::router::Router;
use crate::source::binlog::{BinlogReader, ReaderSettings};
use crate::source::files::FilesReader;
use crate::source::overlap::Overlap;
use crate::source::{preflight, SourceConn, SourceReader};

mod commit;
mod on_demand;
mod plan;
mod read_ahead;
mod run;
mod shutdown;
pub mod signals;

use on_demand::OnDemand;
use plan::{FilesPlan, First, ServerPlan};
use run::Run;
pub use shutdown::{Shutdown, ShutdownTrigger, KAFKA_STOP_LIMIT, SHUTDOWN_GRACE};
pub use signals::SignalledPause;

/// Everything a run needs that outlives it. The state store and the lease are not here: the app owns
/// them (the Kafka backend opens its store again before each run, the lease may be lost and taken again)
/// and lends them to each [`Pipeline::run`].
pub struct Pipeline {
    /// Validated configuration.
    pub config: Arc<Config>,
    /// How to reach the source server; `None` for binlog files, which have none.
    pub source: Option<SourceConn>,
    /// Row → record.
    pub router: Router,
    /// Reader settings.
    pub reader: Arc<ReaderSettings>,
    /// Resume even when the checkpoint belongs to another server (`--accept-new-server`).
    pub accept_new_server: bool,
    /// Woken when a snapshot on demand was asked, paused, resumed or cancelled in the state store.
    pub requests: Arc<tokio::sync::Notify>,
    /// Where a run carries out a `pause` signal, and the app learns it must stop the run.
    pub pause: SignalledPause,
}

impl Pipeline {
    /// Runs until shutdown (Ok) or the first error, writing `store`, and publishing only while `lease` is
    /// held when there is one (each run also checks that its binlog connection reaches the lease's server).
    ///
    /// # Errors
    /// Transient errors are worth a retry; definite ones are not.
    pub async fn run(&self, store: &Arc<Store>, lease: Option<&Lease>, shutdown: &Shutdown) -> Result<()> {
        let result = self.run_once(store, lease, shutdown).await;
        if let Err(error) = &result {
            health().pipeline_failed(error);
            // At a stop the error is the stop's (a Kafka wait given up): recording it in the Kafka state
            // would wait for the Kafka that did not answer.
            let recorded = match shutdown.is_requested() {
                true => Ok(()),
                false => store.set_last_error(error),
            };
            if let Err(e) = recorded {
                tracing::warn!(error = %e, "cannot record the last error in the state store");
            }
            if let Kind::RecordRefused(refused) = error.kind() {
                // Remembered durably: after the restart this event takes the dead-letter path.
                store.add_known_poison(refused)?;
            }
        }
        result
    }

    /// Waits while the connector is paused for a `resume` signal of `[outbox] signal_table`, and returns
    /// it ([`signals::watch_for_resume`]); never without a signal table.
    pub async fn resume_signal(&self, store: &Store) -> crate::source::binlog::Signal {
        signals::watch_for_resume(&self.config, self.source.as_ref(), &self.reader, store).await
    }

    /// Wiring only: plans where the run starts ([`plan`]), builds its moving parts ([`Run`]) and runs its
    /// phases in order.
    async fn run_once(&self, store: &Arc<Store>, lease: Option<&Lease>, shutdown: &Shutdown) -> Result<()> {
        let config = &self.config;
        let (source, server) = match (&config.source.kind, &self.source) {
            (Source::Files(files), _) => return self.run_files(files, store, shutdown).await,
            (Source::Server(server), Some(source)) => (source, server),
            (Source::Poll(_), Some(source)) => {
                return crate::relay::run::run(
                    config,
                    source,
                    self.router.clone(),
                    store.clone(),
                    lease.map(Lease::holding),
                    shutdown,
                    &self.pause,
                )
                .await
            }
            (Source::Server(_) | Source::Poll(_), None) => {
                return Err(Error::definite("the pipeline was built without the source server's connection"))
            }
        };
        let ServerPlan { info, plan } = plan::server(source, server, config, store, self.accept_new_server).await?;
        if let Some(lease) = lease {
            lease.server().check_same(info.identity.server_id, info.identity.server_uuid.as_deref())?;
        }
        let checkpointer = Checkpointer::new(store.clone(), info.identity.clone(), config.table_names());
        // The run's start first ([`Plan::first`]): with exactly_once it fences every older producer and
        // catches the state up, and only then may a fresh start point be written over the checkpoint.
        let mut run = Run::new(&self.config, self.router.clone(), checkpointer.clone(), shutdown).await?;
        let first = plan.first(&checkpointer)?;
        if let Some(lease) = lease {
            run.publish_while(lease.holding());
        }
        let start = match first {
            First::Stream(mark) => mark,
            First::Snapshot(snapshot) => {
                let result = run.snapshot(source, &info, *snapshot).await;
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
                Overlap::new(state.clone(), source, config.tables().to_vec(), &config.outbox.columns).await?
            }
            None => None,
        };
        let reader =
            SourceReader::Live(BinlogReader::start(source, &info, self.reader.clone(), start.position.clone()).await?);
        tracing::info!(
            position = %start.position,
            server = %preflight::describe_identity(&info.identity),
            version = %info.version,
            "streaming"
        );
        let on_demand =
            OnDemand::start(config, source.clone(), store.clone(), (self.requests.clone(), self.pause.clone()), &start)
                .await?;
        run.stream(&start, reader, overlap, on_demand).await
    }

    /// A run over binlog files (`source.kind = "files"`): the stream phase with a [`FilesReader`] instead of
    /// a replication connection, and an end: once the last file is consumed, the run waits for every
    /// acknowledgement, writes the checkpoint and returns `Ok`, so the process exits 0. No snapshot (there
    /// is no table), no server to ask (see [`crate::source::files`]).
    async fn run_files(&self, files: &FilesSource, store: &Arc<Store>, shutdown: &Shutdown) -> Result<()> {
        let FilesPlan { paths, first, identity, plan } = plan::files(files, store, self.accept_new_server)?;
        let checkpointer = Checkpointer::new(store.clone(), identity.clone(), self.config.table_names());
        let mut run = Run::new(&self.config, self.router.clone(), checkpointer.clone(), shutdown).await?;
        let start = match plan.first(&checkpointer)? {
            First::Stream(mark) => mark,
            First::Snapshot(_) => unreachable!("plan::files never plans a snapshot: there is no table"),
        };
        run.begin_stream(&start);
        tracing::info!(
            position = %start.position,
            files = paths.len(),
            source = %preflight::describe_identity(&identity),
            version = %first.header.server_version,
            "reading binlog files"
        );
        let reader = SourceReader::Files(FilesReader::start(paths, self.reader.clone(), start.position.clone())?);
        run.stream(&start, reader, None, OnDemand::none(&self.config, store.clone())).await?;
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
