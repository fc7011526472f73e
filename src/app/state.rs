//! The state store's one owner in a running connector: which store each run writes, and which one the
//! purge watch reads.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::sync::Arc;

use tokio::sync::watch;

use crate::checkpoint::Store;
use crate::config::{Config, StateBackend};
use crate::error::Result;
use crate::kafka::commit::Deadline;

/// The state store of the current run.
pub(super) struct State {
    backend: Backend,
    /// The store the current run writes; `None` before the Kafka backend's first run.
    current: watch::Sender<Option<Arc<Store>>>,
}

enum Backend {
    /// `[state] backend = "local"`: opened once for the process; it refuses a second one.
    Local(Arc<Store>),
    /// `"kafka"`: opened again before each run, after the lease fenced older writers: what is committed in
    /// Kafka is the truth, whatever the last run held in memory.
    Kafka(Arc<Config>),
}

impl State {
    /// Opens the local store now; the Kafka one waits for [`State::for_run`].
    ///
    /// # Errors
    /// As [`Store::open`].
    pub(super) fn open(config: &Arc<Config>) -> Result<State> {
        let backend = match config.state.backend {
            StateBackend::Local => Backend::Local(Arc::new(Store::open(&config.state.dir)?)),
            StateBackend::Kafka => Backend::Kafka(config.clone()),
        };
        let current = match &backend {
            Backend::Local(store) => Some(store.clone()),
            Backend::Kafka(_) => None,
        };
        Ok(State { backend, current: watch::Sender::new(current) })
    }

    /// The store the next run writes (call it once the run's lease is held): the local one, or the Kafka
    /// one read again.
    ///
    /// # Errors
    /// As [`Store::open_for`], with the Kafka backend.
    pub(super) async fn for_run(&self, deadline: &Deadline) -> Result<Arc<Store>> {
        let store = match &self.backend {
            Backend::Local(store) => store.clone(),
            Backend::Kafka(config) => {
                Arc::new(Store::open_for(config, deadline).await.map_err(|e| e.context("opening the state in Kafka"))?)
            }
        };
        self.current.send_replace(Some(store.clone()));
        Ok(store)
    }

    /// The store of the current run, as it changes.
    pub(super) fn watch(&self) -> watch::Receiver<Option<Arc<Store>>> {
        self.current.subscribe()
    }
}
