//! Graceful shutdown: a signal the run polls ([`Shutdown`]), its trigger, and how long a stop may take.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::kafka::commit::Deadline;

/// How long a graceful stop waits for the current transaction to finish and for acknowledgements.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long after a stop was requested the waits for Kafka's outcomes give up (a transactional producer's
/// start, a commit, an abort): the grace for the current source transaction and the one for Kafka
/// together. With Kafka unreachable a commit's outcome never comes; the stop then leaves it unknown, and
/// the next start resolves it ([`crate::kafka::commit`]).
pub const KAFKA_STOP_LIMIT: Duration = Duration::from_secs(2 * SHUTDOWN_GRACE.as_secs());
/// How long a failed run waits for in-flight acknowledgements before giving up on them.
pub(super) const FAILURE_DRAIN: Duration = Duration::from_secs(5);

/// A shutdown signal: when it was requested, if it was.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<Option<Instant>>,
    /// Set with the watch value: polled per change without the watch's lock.
    requested: Arc<AtomicBool>,
    /// Set [`KAFKA_STOP_LIMIT`] after the request.
    kafka_deadline: Deadline,
}

/// Triggers a [`Shutdown`].
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<Option<Instant>>,
    requested: Arc<AtomicBool>,
    kafka_deadline: Deadline,
}

impl ShutdownTrigger {
    /// Requests shutdown (idempotent).
    pub fn trigger(&self) {
        self.kafka_deadline.set(Instant::now() + KAFKA_STOP_LIMIT);
        self.requested.store(true, Ordering::Release);
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
        let requested = Arc::new(AtomicBool::new(false));
        let kafka_deadline = Deadline::default();
        let trigger = ShutdownTrigger { tx, requested: requested.clone(), kafka_deadline: kafka_deadline.clone() };
        (trigger, Shutdown { rx, requested, kafka_deadline })
    }

    /// When the waits for Kafka's outcomes give up: [`KAFKA_STOP_LIMIT`] after the request, never before.
    pub fn kafka_deadline(&self) -> &Deadline {
        &self.kafka_deadline
    }

    /// Whether shutdown was requested (cheap).
    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
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
