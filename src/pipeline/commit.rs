//! The delivery guarantee as one type: [`Commit`] decides how a checkpoint is made durable, and what happens
//! when a source transaction closes, a commit returns or a run settles. The run's phases call it and never
//! ask which guarantee they run under.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! - [`Commit::Acknowledged`] (`at_least_once`): a checkpoint is the watermark's acknowledged mark, written
//!   by the periodic writer every `checkpoint_interval_ms` and once more when a phase settles. Records of a
//!   source transaction cut off are produced and stay produced; the transaction is read again whole.
//! - [`Commit::Transactional`] (`exactly_once`): records go into a Kafka transaction, and a checkpoint is
//!   written into it and commits with the records before it ([`Transactions`]). Acknowledged is not
//!   committed: the periodic writer writes nothing.
//!
//! # Invariants
//! - `exactly_once` commits at the end of a source transaction or snapshot chunk, and inside a source
//!   transaction only when its Kafka transaction has been open for half of `transaction.timeout.ms`
//!   ([`Commit::due_inside`], [`Commit::inside`]); from then on it commits every `checkpoint_interval_ms`
//!   (at most half of `transaction.timeout.ms`, which validation enforces). A source transaction that fits
//!   stays whole in one Kafka transaction; one of any size still commits before the broker's timeout would
//!   abort it. Every record in the Kafka transaction belongs to a transaction whose mark
//!   the commit carries, or to the first rows of the one inside which it commits, which the mark counts
//!   ([`crate::position::TxProgress`]). A phase that ends inside one ([`Commit::cut_off`]) aborts the Kafka
//!   transaction instead, and so does a source transaction that begins again before it closed
//!   ([`Commit::restarted`]): what was committed inside it stays, and is skipped when it is read again.
//! - The first commit after a start is due at once ([`Schedule::due_at`]): a connector that dies within an
//!   interval of every start would otherwise never move its checkpoint.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::shutdown::{FAILURE_DRAIN, SHUTDOWN_GRACE};
use crate::checkpoint::checkpointer::Checkpointer;
use crate::checkpoint::{Mark, TxId, Watermark};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kafka::commit::Deadline;
use crate::position::TxProgress;
use crate::sink::{CheckpointRecord, KafkaSink, Transactional};

/// How a run makes its checkpoints durable: the delivery guarantee.
pub(super) enum Commit {
    /// `at_least_once`: the acknowledged mark is written to the store every `interval`.
    Acknowledged { interval: Duration },
    /// `exactly_once`: the checkpoint commits with the records in Kafka transactions.
    Transactional(Box<Transactions>),
}

/// The commits of an `exactly_once` run.
pub(super) struct Transactions {
    /// A transaction is due by time this long after the last commit started ([`Schedule::due_at`]).
    interval: Duration,
    /// A transaction is due once it holds this many bytes of records (`delivery.transaction_max_bytes`).
    max_bytes: usize,
    /// A source transaction whose Kafka transaction has been open this long (half of
    /// `transaction.timeout.ms`) commits inside itself ([`Commit::due_inside`]).
    split_after: Duration,
    schedule: Arc<Mutex<Schedule>>,
    /// What the open Kafka transaction holds beyond the last commit.
    pending: Pending,
    /// Where the source transaction being read starts: the stream's start, then the last one closed. A
    /// commit inside it carries this mark and the rows it produced ([`Commit::inside`]).
    boundary: Option<Mark>,
    /// Makes the checkpoint record and records it as saved once committed.
    checkpointer: Arc<Checkpointer>,
}

/// What the open Kafka transaction holds beyond what the last commit started carries.
enum Pending {
    /// No source transaction closed since.
    Nothing,
    /// Records up to the end of the source transaction (or snapshot chunk) that closed at this mark: the
    /// next commit carries it.
    Closed(Mark),
    /// Records of a source transaction or chunk that did not close: the Kafka transaction must be aborted,
    /// not committed.
    Partial,
}

/// Commits whose durations set how early the next one starts ([`Schedule::lead`]).
const RECENT_COMMITS: usize = 16;

/// When the next commit is due by time.
struct Schedule {
    /// When the last commit started (or the run started).
    cycle_start: Instant,
    /// Whether a commit of this run succeeded: the first is due as soon as there is something to commit.
    committed_once: bool,
    /// How long the last [`RECENT_COMMITS`] commits took. Commits start `interval` less the longest of them
    /// apart: a record read just after a commit started is held until that one returns, goes into the
    /// next, and is readable when the next returns, about `checkpoint_interval_ms` after it was read, not
    /// that plus a commit.
    recent: VecDeque<Duration>,
}

impl Commit {
    /// The guarantee `config` asks for, and the run's sink for it. With `exactly_once` the producer is
    /// transactional: its start fences any older one, and the state read before that is caught up.
    ///
    /// # Errors
    /// A definite error when the producer cannot be configured, or `exactly_once` lacks the Kafka state
    /// backend; transient when the transactional producer cannot start.
    pub(super) async fn start(
        config: &Config,
        checkpointer: &Arc<Checkpointer>,
        watermark: Arc<Watermark>,
        deadline: &Deadline,
    ) -> Result<(Commit, KafkaSink)> {
        let interval = config.state.checkpoint_interval;
        if !config.exactly_once() {
            return Ok((Commit::Acknowledged { interval }, KafkaSink::new(&config.kafka, watermark)?));
        }
        let Some(state) = checkpointer.store().kafka() else {
            return Err(Error::definite("delivery.guarantee = \"exactly_once\" needs [state] backend = \"kafka\""));
        };
        let target = Transactional {
            id: config.transactional_id().to_string(),
            checkpoint: Some(CheckpointRecord { topic: state.topic().to_string(), key: state.checkpoint_key() }),
        };
        checkpointer.write_in_transactions();
        let sink = KafkaSink::transactional(&config.kafka, watermark, target, deadline).await?;
        // The producer that commits has fenced now: what was read before it did may be stale.
        state.catch_up(config).await?;
        let schedule = Schedule { cycle_start: Instant::now(), committed_once: false, recent: VecDeque::new() };
        let commits = Transactions {
            interval,
            max_bytes: config.delivery.transaction_max_bytes,
            split_after: Duration::from_millis(config.kafka.transaction_timeout_ms()?) / 2,
            schedule: Arc::new(Mutex::new(schedule)),
            pending: Pending::Nothing,
            boundary: None,
            checkpointer: checkpointer.clone(),
        };
        Ok((Commit::Transactional(Box::new(commits)), sink))
    }

    /// `checkpoint_interval_ms`: how often the acknowledged mark is written, or a Kafka transaction commits.
    pub(super) fn interval(&self) -> Duration {
        match self {
            Commit::Acknowledged { interval } => *interval,
            Commit::Transactional(commits) => commits.interval,
        }
    }

    /// Source transaction (or snapshot chunk) `tx` closed at `mark`: every record of it is produced.
    /// `exactly_once` starts a commit carrying `mark` once one is due, else remembers it for the next.
    ///
    /// # Errors
    /// As [`KafkaSink::start_commit`]; definite for a mark behind the last checkpoint.
    pub(super) async fn closed(
        &mut self,
        sink: &mut KafkaSink,
        watermark: &Watermark,
        tx: TxId,
        mark: Mark,
    ) -> Result<()> {
        match self {
            Commit::Acknowledged { .. } => {
                watermark.close(tx, mark);
                Ok(())
            }
            Commit::Transactional(commits) => {
                watermark.close(tx, mark.clone());
                commits.boundary = Some(mark.clone());
                if commits.due(sink) {
                    commits.pending = Pending::Nothing;
                    commits.start(sink, &mark).await
                } else {
                    commits.pending = Pending::Closed(mark);
                    Ok(())
                }
            }
        }
    }

    /// Whether `exactly_once` should commit inside the current source transaction now: a commit is due
    /// ([`Transactions::due`]), and the open Kafka transaction has been open for half of
    /// `transaction.timeout.ms`, or the source transaction is `split` already (it committed inside itself,
    /// here or before a restart). A source transaction that fits in a Kafka transaction stays whole in one.
    /// Always false for `at_least_once`, whose checkpoints wait for the transaction's end without holding
    /// anything open in Kafka.
    pub(super) fn due_inside(&self, sink: &KafkaSink, split: bool) -> bool {
        match self {
            Commit::Acknowledged { .. } => false,
            Commit::Transactional(commits) => {
                sink.transaction_open_for().is_some_and(|open| split || open >= commits.split_after)
                    && commits.due(sink)
            }
        }
    }

    /// How long a Kafka transaction stays open before the source transaction filling it commits inside
    /// itself (`exactly_once`); `None` for `at_least_once`.
    pub(super) fn split_after(&self) -> Option<Duration> {
        match self {
            Commit::Acknowledged { .. } => None,
            Commit::Transactional(commits) => Some(commits.split_after),
        }
    }

    /// The stream phase begins at `start`: the first source transaction read starts there.
    pub(super) fn begin_at(&mut self, start: &Mark) {
        if let Commit::Transactional(commits) = self {
            commits.boundary = Some(start.clone());
        }
    }

    /// Starts a commit inside the current source transaction ([`Commit::due_inside`]), at its start with the
    /// rows of it produced so far (`progress`): they become visible with a checkpoint that counts them, and
    /// a resume skips them. It carries every transaction closed before.
    ///
    /// # Errors
    /// As [`KafkaSink::start_commit`]; definite for a mark behind the last checkpoint, and without a
    /// stream start ([`Commit::begin_at`]).
    pub(super) async fn inside(&mut self, sink: &mut KafkaSink, progress: TxProgress) -> Result<()> {
        match self {
            Commit::Acknowledged { .. } => Ok(()),
            Commit::Transactional(commits) => {
                let Some(boundary) = &commits.boundary else {
                    return Err(Error::definite("a commit inside a source transaction before the stream began"));
                };
                let mark = Mark { inside: Some(progress), ..boundary.clone() };
                commits.pending = Pending::Nothing;
                commits.start(sink, &mark).await
            }
        }
    }

    /// Source transaction `tx` begins again before it closed (the reader resumed inside it).
    ///
    /// # Errors
    /// Transient with `exactly_once`: its first records are in the open Kafka transaction, which is
    /// aborted; the run restarts from the last commit. `at_least_once` abandons `tx` instead (its records
    /// stay produced; it is read again whole).
    pub(super) fn restarted(&self, watermark: &Watermark, tx: TxId) -> Result<()> {
        match self {
            Commit::Acknowledged { .. } => {
                watermark.abandon(tx);
                Ok(())
            }
            Commit::Transactional(_) => Err(Error::transient(
                "a source transaction was cut off and begins again: the Kafka transaction holding its first \
                 records is aborted and the run restarts from the last commit",
            )),
        }
    }

    /// A phase ends inside a source transaction or snapshot chunk: `exactly_once` aborts the Kafka
    /// transaction holding its first records when the run settles.
    pub(super) fn cut_off(&mut self) {
        if let Commit::Transactional(commits) = self {
            commits.pending = Pending::Partial;
        }
    }

    /// When the open Kafka transaction is due by time, while records wait in it; `None` with nothing
    /// waiting, while a commit runs, and for `at_least_once`. Asked between source transactions only.
    pub(super) fn due_at(&self, sink: &KafkaSink) -> Option<Instant> {
        match self {
            Commit::Acknowledged { .. } => None,
            Commit::Transactional(commits) => {
                sink.transaction_bytes().map(|_| commits.schedule().due_at(commits.interval))
            }
        }
    }

    /// Waits until the commit due at `at` is due, or the running commit returned; never returns without
    /// either (for `at_least_once` neither comes).
    pub(super) async fn wait(sink: &mut KafkaSink, at: Option<Instant>) -> Wake {
        let committing = sink.is_committing();
        tokio::select! {
            biased;
            _ = sleep_until(at), if at.is_some() => Wake::Due,
            _ = sink.commit_returned(), if committing => Wake::Returned,
            else => std::future::pending().await,
        }
    }

    /// Carries out what [`Commit::wait`] woke for: starts the commit that is due, with the last closed
    /// mark, or finishes the one that returned (its checkpoint is saved, and records held meanwhile go
    /// into the next transaction).
    ///
    /// # Errors
    /// As [`KafkaSink::start_commit`] and [`KafkaSink::finish_commit`].
    pub(super) async fn woke(&mut self, sink: &mut KafkaSink, wake: Wake) -> Result<()> {
        match (self, wake) {
            (Commit::Transactional(commits), Wake::Due) => {
                match std::mem::replace(&mut commits.pending, Pending::Nothing) {
                    Pending::Closed(mark) => commits.start(sink, &mark).await,
                    other => {
                        commits.pending = other;
                        Ok(())
                    }
                }
            }
            (_, Wake::Returned) => sink.finish_commit().await,
            (Commit::Acknowledged { .. }, Wake::Due) => Ok(()),
        }
    }

    /// Finishes a commit that returned while the run was busy: while changes flow, the biased `select!` may
    /// not poll [`Commit::wait`] (a stream of transactions without outbox rows sends nothing).
    ///
    /// # Errors
    /// As [`KafkaSink::finish_commit`].
    pub(super) async fn finish_returned(sink: &mut KafkaSink) -> Result<()> {
        match sink.commit_has_returned() {
            true => sink.finish_commit().await,
            false => Ok(()),
        }
    }

    /// Ends a phase: waits for acknowledgements (briefly after a failure) and makes the last checkpoint
    /// durable, then returns the checkpointed mark, `None` for a snapshot that did not finish.
    ///
    /// # Errors
    /// The phase's `result`, else the failure that froze the watermark, else a failed last checkpoint.
    pub(super) async fn settle(
        &mut self,
        sink: &mut KafkaSink,
        watermark: &Watermark,
        checkpointer: &Checkpointer,
        result: Result<()>,
    ) -> Result<Option<Mark>> {
        let (mark, saved) = match self {
            Commit::Acknowledged { interval } => {
                settle_acknowledged(sink, watermark, checkpointer, *interval, &result).await?
            }
            Commit::Transactional(commits) => commits.settle(sink, watermark, &result).await,
        };
        result.and(saved)?;
        if let Some(error) = watermark.take_failure() {
            return Err(error);
        }
        // A snapshot stopped early (shutdown) is not done: report it as not finished.
        Ok(mark.filter(|m| m.snapshot.as_ref().is_none_or(|s| s.done)))
    }
}

/// What [`Commit::wait`] woke for.
pub(super) enum Wake {
    /// A commit is due by time.
    Due,
    /// The running commit returned.
    Returned,
}

/// [`Commit::settle`] for `at_least_once`: keeps checkpointing while acknowledgements arrive (a crash
/// during a long drain keeps its progress), purges what is not acknowledged in time, and writes the
/// watermark's mark, with the outcome of that last write.
///
/// # Errors
/// A failed write while acknowledgements still arrive.
async fn settle_acknowledged(
    sink: &KafkaSink,
    watermark: &Watermark,
    checkpointer: &Checkpointer,
    interval: Duration,
    result: &Result<()>,
) -> Result<(Option<Mark>, Result<()>)> {
    let limit = if result.is_ok() { SHUTDOWN_GRACE } else { FAILURE_DRAIN };
    let deadline = Instant::now() + limit;
    let drained = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if sink.drain(interval.min(remaining)).await {
            break true;
        }
        checkpointer.flush(watermark)?;
        if remaining.is_zero() || watermark.failed() {
            break false;
        }
    };
    if !drained {
        tracing::warn!(
            unsettled = watermark.unsettled(),
            "records not acknowledged in time; they will be produced again after restart"
        );
        sink.abort();
    }
    crate::failpoint!("shutdown_drained");
    let flushed = checkpointer.flush(watermark);
    let mark = watermark.mark();
    if let Some(mark) = &mark {
        tracing::info!(position = %mark.position, "checkpoint");
    }
    Ok((mark, flushed))
}

impl Transactions {
    /// Whether the transaction should commit now: it holds `max_bytes`, or it is due by time (also with no
    /// records: the checkpoint still moves). Never while a commit runs.
    fn due(&self, sink: &KafkaSink) -> bool {
        !sink.is_committing()
            && (sink.transaction_bytes().is_some_and(|bytes| bytes >= self.max_bytes)
                || Instant::now() >= self.schedule().due_at(self.interval))
    }

    /// Writes the checkpoint at `mark` into the open Kafka transaction and starts its commit, so that the
    /// records before `mark` and the checkpoint that passes them become visible together. The run reads on
    /// while Kafka commits; the checkpoint counts as saved once the commit returns
    /// ([`KafkaSink::finish_commit`]).
    ///
    /// # Errors
    /// A definite error for a mark behind the last checkpoint; as [`KafkaSink::start_commit`].
    async fn start(&mut self, sink: &mut KafkaSink, mark: &Mark) -> Result<()> {
        let checkpoint = self.checkpointer.record(mark)?;
        let record = serde_json::to_vec(&checkpoint).map_err(|e| Error::definite(format!("checkpoint record: {e}")))?;
        let (checkpointer, mark, schedule) = (self.checkpointer.clone(), mark.clone(), self.schedule.clone());
        let on_commit = Box::new(move |took| {
            checkpointer.committed(mark, &checkpoint);
            lock(&schedule).committed(took);
        });
        sink.start_commit(Some(record), on_commit).await?;
        self.schedule().cycle_start = Instant::now();
        Ok(())
    }

    /// [`Commit::settle`] for `exactly_once`: commits the open Kafka transaction with the last closed mark
    /// after a phase that ended well; aborts it after a failure, or when it holds records of a source
    /// transaction that did not close (none of them becomes visible; they are read again after the
    /// restart). Returns the committed mark.
    async fn settle(
        &mut self,
        sink: &mut KafkaSink,
        watermark: &Watermark,
        result: &Result<()>,
    ) -> (Option<Mark>, Result<()>) {
        let pending = std::mem::replace(&mut self.pending, Pending::Nothing);
        let partial = matches!(pending, Pending::Partial);
        let committed = match (result.is_ok() && !watermark.failed(), pending) {
            (true, Pending::Closed(mark)) => match self.start(sink, &mark).await {
                Ok(()) => sink.finish_commit().await,
                Err(error) => Err(error),
            },
            (true, Pending::Nothing) => sink.finish_commit().await,
            (_, _) => {
                if partial && result.is_ok() {
                    tracing::info!("aborting the Kafka transaction: it holds part of a source transaction; both are read again after restart");
                }
                sink.abort_transaction().await;
                Ok(())
            }
        };
        crate::failpoint!("shutdown_drained");
        // A failed commit aborted its transaction already (`KafkaSink::finish_commit`).
        let mark = self.checkpointer.saved();
        if let Some(mark) = &mark {
            tracing::info!(position = %mark.position, "checkpoint (committed with its events)");
        }
        (mark, committed)
    }

    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        lock(&self.schedule)
    }
}

/// The schedule, whoever held it last: a panic mid-update leaves at worst a commit early or late.
fn lock(schedule: &Mutex<Schedule>) -> MutexGuard<'_, Schedule> {
    schedule.lock().unwrap_or_else(|p| p.into_inner())
}

impl Schedule {
    /// How much earlier than `interval` after the last commit's start the next one starts: the longest of
    /// the recent commits, at most half the interval.
    fn lead(&self, interval: Duration) -> Duration {
        self.recent.iter().max().copied().unwrap_or_default().min(interval / 2)
    }

    /// When the next commit is due by time: `interval` less [`Schedule::lead`] after the last one started;
    /// at once until this run committed once. A connector that dies within an interval of every start
    /// (OOM-killed, a liveness probe too tight) would otherwise never move its checkpoint, and every
    /// restart would publish everything since the last one again.
    fn due_at(&self, interval: Duration) -> Instant {
        match self.committed_once {
            true => self.cycle_start + interval - self.lead(interval),
            false => self.cycle_start,
        }
    }

    /// A commit returned committed after `took`.
    fn committed(&mut self, took: Duration) {
        self.committed_once = true;
        if self.recent.len() == RECENT_COMMITS {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
    }
}

/// Sleeps until `at`; never returns for `None` (a disabled `select!` branch still builds its future).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit starts early by the longest recent commit, never by more than half the interval: the
    /// record that waits longest is readable about one interval after it was read.
    #[test]
    fn a_commit_starts_early_by_the_longest_recent_commit() {
        let mut schedule = Schedule { cycle_start: Instant::now(), committed_once: false, recent: VecDeque::new() };
        let interval = Duration::from_millis(1000);
        // Guards against a crash loop that never moves the checkpoint: the first commit is due at once.
        assert!(schedule.due_at(interval) <= Instant::now(), "the first commit after a start comes at once");
        schedule.committed_once = true;
        assert_eq!(schedule.lead(interval), Duration::ZERO, "no commit yet");
        schedule.recent.extend([80, 120, 95].map(Duration::from_millis));
        assert_eq!(schedule.lead(interval), Duration::from_millis(120));
        schedule.recent.push_back(Duration::from_millis(900));
        assert_eq!(schedule.lead(interval), Duration::from_millis(500), "at most half the interval");
    }

    /// The schedule keeps the last [`RECENT_COMMITS`] commits: an old slow commit stops setting the lead.
    #[test]
    fn the_schedule_forgets_commits_older_than_the_recent_ones() {
        let mut schedule = Schedule { cycle_start: Instant::now(), committed_once: false, recent: VecDeque::new() };
        let interval = Duration::from_secs(10);
        schedule.committed(Duration::from_millis(900));
        assert!(schedule.committed_once);
        for _ in 0..RECENT_COMMITS {
            schedule.committed(Duration::from_millis(100));
        }
        assert_eq!(schedule.recent.len(), RECENT_COMMITS);
        assert_eq!(schedule.lead(interval), Duration::from_millis(100));
    }
}
