//! The restart supervisor: after each run, whether the connector runs again, and when.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::backoff::Backoff;
use crate::error::{Error, Kind, Result};
use crate::pipeline::Shutdown;

/// A run that lasted this long was healthy: the next failure starts the back-off from the beginning.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Runs in a row (without a healthy one between) that may end with a fatal producer error before the
/// connector stops: one is a broker hiccup a new producer cures, several at once are a fault to look into.
pub const MAX_PRODUCER_FATAL_RUNS: u32 = 5;

/// Restarts a run after a transient error, with capped, jittered exponential back-off ([`Backoff`]); stops
/// at a definite error, at shutdown, and after [`MAX_PRODUCER_FATAL_RUNS`] fatal producer errors in a row.
pub(super) struct Supervisor {
    backoff: Backoff,
    /// Runs in a row that ended with a fatal producer error, since the last healthy one.
    producer_fatal_runs: u32,
}

impl Supervisor {
    /// A supervisor whose back-off starts at `initial` and doubles up to `max`.
    pub(super) fn new(initial: Duration, max: Duration) -> Supervisor {
        Supervisor { backoff: Backoff::new(initial, max), producer_fatal_runs: 0 }
    }

    /// After a run that began at `started` ended with `result`: `Break` with the connector's outcome, or
    /// `Continue` once the back-off has passed (`Break(Ok)` if shutdown comes first).
    pub(super) async fn after(
        &mut self,
        result: Result<()>,
        started: Instant,
        shutdown: &Shutdown,
    ) -> ControlFlow<Result<()>> {
        let error = match result {
            Ok(()) => return ControlFlow::Break(Ok(())),
            Err(error) if error.is_definite() => return ControlFlow::Break(Err(error)),
            Err(error) => error,
        };
        if started.elapsed() >= HEALTHY_RUN {
            self.backoff.reset();
            self.producer_fatal_runs = 0;
        }
        if *error.kind() == Kind::ProducerFatal {
            self.producer_fatal_runs += 1;
            if self.producer_fatal_runs >= MAX_PRODUCER_FATAL_RUNS {
                return ControlFlow::Break(Err(producer_fatal_again(&error)));
            }
        }
        if shutdown.requested_at().is_some() {
            return ControlFlow::Break(Ok(()));
        }
        crate::metrics::metrics().reconnect();
        let delay = self.backoff.next_delay();
        tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "transient failure; resuming from the last acknowledged position");
        tokio::select! {
            _ = tokio::time::sleep(delay) => ControlFlow::Continue(()),
            _ = shutdown.requested() => ControlFlow::Break(Ok(())),
        }
    }
}

/// The definite error after [`MAX_PRODUCER_FATAL_RUNS`] runs in a row ended with a fatal producer error.
fn producer_fatal_again(last: &Error) -> Error {
    Error::definite(format!(
        "the Kafka producer failed fatally in {MAX_PRODUCER_FATAL_RUNS} runs in a row, each with a new producer \
         from the checkpoint (last: {last}). The broker keeps refusing this producer's sequence numbers: look for \
         lost or truncated partitions (unclean leader election, a topic deleted and re-created, DeleteRecords) \
         in the broker's logs. Nothing unacknowledged was checkpointed; start the connector again once the \
         broker is healthy"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supervisor() -> Supervisor {
        Supervisor::new(Duration::from_millis(1), Duration::from_millis(2))
    }

    fn stops_with_definite(flow: &ControlFlow<Result<()>>) -> bool {
        matches!(flow, ControlFlow::Break(Err(e)) if e.is_definite())
    }

    /// A run that ended cleanly or definitely ends the connector; a transient failure restarts it.
    #[tokio::test]
    async fn ends_on_success_or_a_definite_error_and_restarts_after_a_transient_one() {
        let (_trigger, shutdown) = Shutdown::new();
        let mut s = supervisor();
        let now = Instant::now();
        assert!(matches!(s.after(Ok(()), now, &shutdown).await, ControlFlow::Break(Ok(()))));
        assert!(stops_with_definite(&s.after(Err(Error::definite("bad config")), now, &shutdown).await));
        assert!(matches!(s.after(Err(Error::transient("gone")), now, &shutdown).await, ControlFlow::Continue(())));
    }

    /// Regression guard for a broker that keeps refusing the producer's sequence numbers: the
    /// [`MAX_PRODUCER_FATAL_RUNS`]th fatal producer error in a row stops the connector with a definite
    /// error instead of restarting it for ever; a healthy run between starts the count again.
    #[tokio::test]
    async fn stops_after_max_producer_fatal_runs_in_a_row_unless_one_was_healthy() {
        let (_trigger, shutdown) = Shutdown::new();
        let mut s = supervisor();
        let now = Instant::now();
        let fatal = || Err(Error::producer_fatal("fenced"));
        for _ in 1..MAX_PRODUCER_FATAL_RUNS {
            assert!(matches!(s.after(fatal(), now, &shutdown).await, ControlFlow::Continue(())));
        }
        let Some(long_ago) = now.checked_sub(HEALTHY_RUN) else { return };
        assert!(matches!(s.after(fatal(), long_ago, &shutdown).await, ControlFlow::Continue(())));
        for _ in 2..MAX_PRODUCER_FATAL_RUNS {
            assert!(matches!(s.after(fatal(), now, &shutdown).await, ControlFlow::Continue(())));
        }
        assert!(stops_with_definite(&s.after(fatal(), now, &shutdown).await));
    }

    /// Once shutdown is requested a transient failure ends the connector instead of restarting it.
    #[tokio::test]
    async fn shutdown_ends_instead_of_restarting() {
        let (trigger, shutdown) = Shutdown::new();
        trigger.trigger();
        let flow = supervisor().after(Err(Error::transient("gone")), Instant::now(), &shutdown).await;
        assert!(matches!(flow, ControlFlow::Break(Ok(()))));
    }
}
