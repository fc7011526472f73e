//! `poll.transactional`: the relay's Kafka transactions, committed back to back, each holding what was
//! produced while the one before committed. They carry no checkpoint (the relay's progress is in its
//! tables): they fence a paused relay, and a batch is marked only once the transaction holding it
//! committed.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4 (its methods are the run's, [`PollRun`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::run::PollRun;
use crate::error::Result;

impl PollRun<'_> {
    /// `poll.transactional`: finishes a commit that returned, and starts the next one when records were
    /// produced since. Commits follow each other back to back, each holding what was produced while the
    /// one before ran, so a record waits about one commit to become readable, and an idle relay commits
    /// nothing. Its callback moves `committed` past the last batch produced before it started.
    ///
    /// # Errors
    /// A commit that failed, or a producer fenced by a newer relay's: the run ends, nothing of the
    /// transaction is marked.
    pub(super) async fn commit(&mut self) -> Result<()> {
        let Some(committed) = &self.committed else { return Ok(()) };
        if self.sink.is_committing() {
            if !self.sink.commit_has_returned() {
                return Ok(());
            }
            self.sink.finish_commit().await?;
        }
        let (Some(last), Some(bytes)) = (self.pending.back(), self.sink.transaction_bytes()) else { return Ok(()) };
        if bytes == 0 {
            return Ok(());
        }
        let (committed, through) = (committed.clone(), last.tx.0 + 1);
        let on_commit = Box::new(move |_| {
            committed.fetch_max(through, Ordering::AcqRel);
        });
        self.sink.start_commit(None, on_commit).await
    }

    /// `poll.transactional`, at shutdown: finishes the running commit and commits what is open.
    pub(super) async fn commit_all(&mut self) -> Result<()> {
        self.sink.finish_commit().await?;
        self.commit().await?;
        self.sink.finish_commit().await
    }

    /// Waits up to `timeout` for what is in flight: for its acknowledgements, or with `poll.transactional`
    /// for the running commit to return.
    pub(super) async fn wait_in_flight(&mut self, timeout: Duration) {
        if self.committed.is_none() || !self.sink.is_committing() {
            self.sink.drain(timeout).await;
            return;
        }
        let _ = tokio::time::timeout(timeout, self.sink.commit_returned()).await;
    }
}
