//! When the relay's records count as published, as one type ([`RelayCommit`]): once Kafka acknowledged
//! them, or (`poll.transactional`) once the Kafka transaction holding them committed. The transactions
//! commit back to back, each holding what was produced while the one before committed; they carry no
//! checkpoint (the relay's progress is in its tables): they fence a paused relay, and a batch is marked
//! only once the transaction holding it committed.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4, and the pipeline's shutdown grace.
//!
//! # Why not the pipeline's `Commit`
//! `pipeline::commit::Commit` is the binlog path's delivery guarantee, and its guarantee is a checkpoint:
//! each `exactly_once` commit carries the checkpoint record of the last closed source transaction (a
//! `Mark` the `Checkpointer` makes, needing the Kafka state backend), commits are due by
//! `checkpoint_interval_ms` or `transaction_max_bytes`, and `at_least_once` writes the watermark's mark
//! to the store. The relay has no position, mark or checkpointer (it abandons each batch's watermark
//! transaction), commits back to back whenever the last commit returned, and what a commit settles is the
//! batches before a transaction id, which only then go to the marker. Routed through `Commit`, its
//! commits would wait for the interval and need a checkpoint; so it keeps this room.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::{TxId, Watermark};
use crate::config::Config;
use crate::error::Result;
use crate::kafka::commit::Deadline;
use crate::pipeline::SHUTDOWN_GRACE;
use crate::sink::{KafkaSink, Transactional};

/// When a relay run's records count as published.
pub(super) enum RelayCommit {
    /// Once Kafka acknowledged them.
    Acknowledged,
    /// `poll.transactional`: once the Kafka transaction holding them committed. Batches before this
    /// transaction id are in committed transactions (set by each commit's callback).
    BackToBack(Arc<AtomicU64>),
}

impl RelayCommit {
    /// The commit `config` asks for, and the run's sink for it. With `poll.transactional` the producer is
    /// transactional: its start fences the producer of the relay before, and aborts what that one left
    /// open.
    ///
    /// # Errors
    /// As [`KafkaSink::new`] and [`KafkaSink::transactional`].
    pub(super) async fn start(
        config: &Config,
        watermark: &Arc<Watermark>,
        deadline: &Deadline,
    ) -> Result<(RelayCommit, KafkaSink)> {
        if config.poll.transactional {
            let settings = Transactional { id: config.transactional_id().to_string(), checkpoint: None };
            let sink = KafkaSink::transactional(&config.kafka, watermark.clone(), settings, deadline).await?;
            Ok((RelayCommit::BackToBack(Arc::new(AtomicU64::new(0))), sink))
        } else {
            Ok((RelayCommit::Acknowledged, KafkaSink::new(&config.kafka, watermark.clone())?))
        }
    }

    /// The first transaction id not yet published: the batches before it are acknowledged (and
    /// committed).
    pub(super) fn settled_before(&self, watermark: &Watermark) -> TxId {
        let settled = watermark.settled_before();
        match self {
            RelayCommit::Acknowledged => settled,
            RelayCommit::BackToBack(committed) => settled.min(TxId(committed.load(Ordering::Acquire))),
        }
    }

    /// `poll.transactional`: finishes a commit that returned, and starts the next one when records were
    /// produced since (`last`: the last batch produced). Commits follow each other back to back, each
    /// holding what was produced while the one before ran, so a record waits about one commit to become
    /// readable, and an idle relay commits nothing. Its callback moves the committed mark past `last`.
    ///
    /// # Errors
    /// A commit that failed, or a producer fenced by a newer relay's: the run ends, nothing of the
    /// transaction is marked.
    pub(super) async fn commit(&self, sink: &mut KafkaSink, last: Option<TxId>) -> Result<()> {
        let RelayCommit::BackToBack(committed) = self else { return Ok(()) };
        if sink.is_committing() {
            if !sink.commit_has_returned() {
                return Ok(());
            }
            sink.finish_commit().await?;
        }
        let (Some(last), Some(bytes)) = (last, sink.transaction_bytes()) else { return Ok(()) };
        if bytes == 0 {
            return Ok(());
        }
        let (committed, through) = (committed.clone(), last.0 + 1);
        let on_commit = Box::new(move |_| {
            committed.fetch_max(through, Ordering::AcqRel);
        });
        sink.start_commit(None, on_commit).await
    }

    /// `poll.transactional`, at shutdown: finishes the running commit and commits what is open.
    async fn commit_all(&self, sink: &mut KafkaSink, last: Option<TxId>) -> Result<()> {
        sink.finish_commit().await?;
        self.commit(sink, last).await?;
        sink.finish_commit().await
    }

    /// Waits up to `timeout` for what is in flight: for its acknowledgements, or with `poll.transactional`
    /// for the running commit to return.
    pub(super) async fn wait_in_flight(&self, sink: &mut KafkaSink, timeout: Duration) {
        match self {
            RelayCommit::BackToBack(_) if sink.is_committing() => {
                let _ = tokio::time::timeout(timeout, sink.commit_returned()).await;
            }
            _ => {
                sink.drain(timeout).await;
            }
        }
    }

    /// At shutdown: waits up to [`SHUTDOWN_GRACE`] for everything produced (`last`: the last batch) to be
    /// acknowledged, or committed; returns whether it was.
    pub(super) async fn finish(&self, sink: &mut KafkaSink, last: Option<TxId>) -> bool {
        match self {
            RelayCommit::Acknowledged => sink.drain(SHUTDOWN_GRACE).await,
            RelayCommit::BackToBack(_) => {
                tokio::time::timeout(SHUTDOWN_GRACE, self.commit_all(sink, last)).await.is_ok_and(|c| c.is_ok())
            }
        }
    }
}
