//! Graceful shutdown: a signal the run polls ([`Shutdown`]), its trigger, and how long a stop may take.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How long a graceful stop waits for the current transaction to finish and for acknowledgements.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a failed run waits for in-flight acknowledgements before giving up on them.
pub(super) const FAILURE_DRAIN: Duration = Duration::from_secs(5);

/// A shutdown signal: when it was requested, if it was.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<Option<Instant>>,
    /// Set with the watch value: polled per change without the watch's lock.
    requested: Arc<AtomicBool>,
}

/// Triggers a [`Shutdown`].
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<Option<Instant>>,
    requested: Arc<AtomicBool>,
}

impl ShutdownTrigger {
    /// Requests shutdown (idempotent).
    pub fn trigger(&self) {
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
        (ShutdownTrigger { tx, requested: requested.clone() }, Shutdown { rx, requested })
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
