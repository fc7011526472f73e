//! Whether the connector is ready: connected to the source and a broker, and its pipeline not failed.
//! Updated where connections come and go, read by `/readyz` and the `outbox_cdc_ready` gauge.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// The process's readiness state.
#[derive(Debug, Default)]
pub struct Health {
    source_connected: AtomicBool,
    broker_connected: AtomicBool,
    failed: AtomicBool,
    /// An operator paused the connector: ready by design, with nothing connected.
    paused: AtomicBool,
    /// The last error that stopped or restarted the pipeline, for `/readyz`.
    last_error: Mutex<Option<String>>,
}

static HEALTH: OnceLock<Health> = OnceLock::new();

/// The process-wide readiness state.
pub fn health() -> &'static Health {
    HEALTH.get_or_init(Health::default)
}

impl Health {
    /// Whether the source connection is up (reading the binlog or a snapshot).
    pub fn set_source_connected(&self, up: bool) {
        self.source_connected.store(up, Ordering::Relaxed);
        if up {
            self.failed.store(false, Ordering::Relaxed);
        }
    }

    /// Whether librdkafka reports at least one broker up.
    pub fn set_broker_connected(&self, up: bool) {
        self.broker_connected.store(up, Ordering::Relaxed);
    }

    /// The pipeline stopped with `error` (it restarts if transient).
    pub fn pipeline_failed(&self, error: &impl std::fmt::Display) {
        self.source_connected.store(false, Ordering::Relaxed);
        self.failed.store(true, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
    }

    /// An operator paused the connector (`true`) or resumed it.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Whether an operator paused the connector.
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Connected to source and broker, and not failed; or paused by an operator, which is what they asked
    /// for (`/readyz` says so).
    pub fn ready(&self) -> bool {
        self.paused()
            || (self.source_connected.load(Ordering::Relaxed)
                && self.broker_connected.load(Ordering::Relaxed)
                && !self.failed.load(Ordering::Relaxed))
    }

    /// Why the connector is not ready, for `/readyz`.
    pub fn readiness(&self) -> std::result::Result<(), String> {
        if self.ready() {
            return Ok(());
        }
        let mut reasons = Vec::new();
        if self.failed.load(Ordering::Relaxed) {
            let last = self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
            reasons.push(format!("pipeline failed: {}", last.unwrap_or_default()));
        }
        if !self.source_connected.load(Ordering::Relaxed) {
            reasons.push("not reading from the source".to_string());
        }
        if !self.broker_connected.load(Ordering::Relaxed) {
            reasons.push("no Kafka broker connection".to_string());
        }
        Err(reasons.join("; "))
    }
}
