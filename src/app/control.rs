//! What an operator asks of a running connector ([`Command`]: pause, resume, work done while no run
//! reads), and what the connector shows of itself ([`Live`]): the app's side of the control API
//! (`crate::ops::api` serves it; `app::run` answers the commands between runs).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! # Why between runs
//! Every command stops the current run the way a stop does (the pipeline finishes what it has in hand,
//! waits for Kafka's acknowledgements and checkpoints them), is carried out with the lease still held and
//! no run reading, and the next run starts from the checkpoint, unless the connector is paused. Nothing
//! new is needed for correctness: a run's start and stop are what every restart already proves. A
//! `quarantine release` in process is safe for the same reason the offline one is: no newer event of the
//! aggregate can be published while it republishes the held ones, since nothing is.
//!
//! # A pause
//! Stored in the state store ([`Paused`]) before it is answered: a connector restarted, or a standby
//! taking over, stays paused until resumed. A `pause` signal of `[outbox] signal_table` is stored by the
//! run that reads it and stops the run the same way; a paused connector watches the signal table for a
//! `resume` ([`crate::pipeline::signals`]). A paused instance keeps its lease (a standby must not start
//! publishing) and its Kafka producer, closes its source reading, and is ready (`/readyz` says paused;
//! `outbox_cdc_paused` is 1).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use crate::checkpoint::store::Paused;
use crate::checkpoint::Store;
use crate::error::{Error, Result};
use crate::pipeline::signals;

/// Work run with the state store while no run reads (a hold's release), answering with a JSON value.
pub type Work = Box<dyn FnOnce(Arc<Store>) -> Pin<Box<dyn Future<Output = Result<serde_json::Value>> + Send>> + Send>;

/// A command's answer: a JSON document, or why it was not carried out.
pub type Answer = Result<serde_json::Value>;

/// What an operator asks.
pub enum Command {
    /// Stop reading and publishing, and stay so across restarts, until [`Command::Resume`].
    Pause { by: String, answer: oneshot::Sender<Answer> },
    /// End a pause.
    Resume { answer: oneshot::Sender<Answer> },
    /// Run `work` with the store while no run reads (the run is stopped, then started again).
    WhileStopped { what: &'static str, work: Work, answer: oneshot::Sender<Answer> },
}

impl Command {
    /// Whether carrying it out needs the run stopped: a resume of a running connector does not.
    pub(super) fn stops_a_run(&self) -> bool {
        !matches!(self, Command::Resume { .. })
    }

    /// Answers a resume of a connector that runs.
    pub(super) fn answer_running(self) {
        self.answer(Ok(serde_json::json!({ "paused": false, "was_paused": false })));
    }

    /// Answers with `error`: the run ended for good before the command could be carried out.
    pub(super) fn fail(self, error: &Error) {
        self.answer(Err(Error::transient(format!("the command was not carried out: {error}"))));
    }

    /// Answers it with `answer` (the asker may have given up: nothing to do then).
    fn answer(self, answer: Answer) {
        let sender = match self {
            Command::Pause { answer, .. } | Command::Resume { answer } | Command::WhileStopped { answer, .. } => answer,
        };
        let _ = sender.send(answer);
    }
}

/// Where the connector is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The lease or the state not taken yet: starting, or a standby waiting for the lease another instance
    /// holds.
    #[default]
    Waiting,
    /// Holding the lease, reading and publishing.
    Running,
    /// Holding the lease, paused by an operator.
    Paused,
}

/// What the connector shows of itself, as it changes.
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// Where it is.
    pub role: Role,
    /// The state store of the current run (or pause): `None` before the lease and the state are taken.
    pub store: Option<Arc<Store>>,
}

/// The app's end: receives commands, publishes [`Live`].
pub struct Control {
    commands: mpsc::Receiver<Command>,
    live: watch::Sender<Live>,
    snapshots: Arc<tokio::sync::Notify>,
}

/// The control API's end: sends commands, reads [`Live`]. Cheap to clone.
#[derive(Clone)]
pub struct ControlHandle {
    commands: mpsc::Sender<Command>,
    live: watch::Receiver<Live>,
    snapshots: Arc<tokio::sync::Notify>,
}

/// A new pair.
pub fn channel() -> (Control, ControlHandle) {
    let (tx, rx) = mpsc::channel(16);
    let (live_tx, live_rx) = watch::channel(Live::default());
    let snapshots = Arc::new(tokio::sync::Notify::new());
    (
        Control { commands: rx, live: live_tx, snapshots: snapshots.clone() },
        ControlHandle { commands: tx, live: live_rx, snapshots },
    )
}

impl ControlHandle {
    /// Tells the running pipeline that a snapshot on demand was stored or changed in the state store.
    pub fn snapshots_changed(&self) {
        self.snapshots.notify_one();
    }

    /// What the connector shows now.
    pub fn live(&self) -> Live {
        self.live.borrow().clone()
    }

    /// Sends `command` built around its answer's sender, and waits for the answer.
    ///
    /// # Errors
    /// Definite when this instance does not hold the lease; transient when the connector is stopping
    /// (nobody answers); the command's own error.
    pub async fn ask(&self, command: impl FnOnce(oneshot::Sender<Answer>) -> Command) -> Answer {
        if self.live.borrow().role == Role::Waiting {
            return Err(not_active());
        }
        let (tx, rx) = oneshot::channel();
        let gone = || Error::transient("the connector is stopping: the command was not carried out");
        self.commands.send(command(tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

impl Control {
    /// What wakes the pipeline when a snapshot on demand was stored or changed ([`ControlHandle::snapshots_changed`]).
    pub(super) fn snapshot_requests(&self) -> Arc<tokio::sync::Notify> {
        self.snapshots.clone()
    }

    /// Shows `role` with `store`.
    pub(super) fn show(&self, role: Role, store: Option<Arc<Store>>) {
        crate::metrics::metrics().paused(role == Role::Paused);
        crate::health::health().set_paused(role == Role::Paused);
        self.live.send_replace(Live { role, store });
    }

    /// The next command; pending for ever once every handle is gone.
    pub(super) async fn next(&mut self) -> Command {
        match self.commands.recv().await {
            Some(command) => command,
            None => std::future::pending().await,
        }
    }

    /// Carries out `command` with no run reading, on `store`. Returns whether the connector is paused
    /// after it.
    pub(super) async fn carry_out(&self, command: Command, store: &Arc<Store>) -> Result<bool> {
        let paused = store.paused()?.is_some();
        match command {
            Command::Pause { by, answer } => {
                if !paused {
                    store.set_paused(Some(&Paused { at_ms: crate::time::now_ms(), by }))?;
                    tracing::warn!("paused by an operator: nothing is read or published until resumed");
                }
                // Shown before it is answered: a status asked right after the answer says paused.
                self.show(Role::Paused, Some(store.clone()));
                let _ = answer.send(Ok(serde_json::json!({ "paused": true, "was_paused": paused })));
                Ok(true)
            }
            Command::Resume { answer } => {
                if paused {
                    resume(store)?;
                    tracing::info!("resumed by an operator");
                }
                self.show(Role::Running, Some(store.clone()));
                let _ = answer.send(Ok(serde_json::json!({ "paused": false, "was_paused": paused })));
                Ok(false)
            }
            Command::WhileStopped { what, work, answer } => {
                tracing::info!(what, "carrying out an operator's command with the run stopped");
                let _ = answer.send(work(store.clone()).await);
                Ok(paused)
            }
        }
    }
}

impl Control {
    /// Ends the pause on a `resume` signal of `[outbox] signal_table` read while paused, and notes it.
    ///
    /// # Errors
    /// The store's.
    pub(super) fn resume_by_signal(&self, store: &Arc<Store>, id: &str) -> Result<()> {
        resume(store)?;
        signals::note(store, id, "resume", "resumed")?;
        tracing::info!(signal = id, "resumed by a signal");
        self.show(Role::Running, Some(store.clone()));
        Ok(())
    }
}

/// Ends a pause. A pause by signal gets its note first, if the crash of its run left it without one: the
/// pause was what marked the signal carried out.
fn resume(store: &Store) -> Result<()> {
    if let Some(id) = store.paused()?.as_ref().and_then(Paused::signal) {
        if store.applied_signal(id)?.is_none() {
            signals::note(store, id, "pause", "paused")?;
        }
    }
    store.set_paused(None)
}

/// The answer of an instance that does not hold the lease.
fn not_active() -> Error {
    Error::definite(
        "this instance does not hold the lease (a standby, or starting): send the command to the active one, or \
         try again in a moment",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance that does not hold the lease refuses a command at once, for good (ask the active
    /// one), without waiting for the app to look.
    #[tokio::test]
    async fn a_waiting_instance_refuses_commands_at_once() {
        let (_control, handle) = channel();
        let refused = handle.ask(|answer| Command::Resume { answer }).await.unwrap_err();
        assert!(refused.is_definite(), "{refused}");
        assert!(refused.to_string().contains("does not hold the lease"), "{refused}");
    }

    /// A pause is in the store before it is answered, a second one changes nothing, a resume removes it;
    /// only a resume of a running connector leaves the run alone.
    #[tokio::test]
    async fn a_pause_is_stored_before_it_is_answered_and_a_resume_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let (control, handle) = channel();
        let ask = |command: fn(oneshot::Sender<Answer>) -> Command| {
            let (tx, rx) = oneshot::channel();
            (command(tx), rx)
        };
        let pause = |answer| Command::Pause { by: "api".into(), answer };
        let (command, answered) = ask(pause);
        assert!(command.stops_a_run());
        assert!(control.carry_out(command, &store).await.unwrap(), "paused after it");
        assert_eq!(store.paused().unwrap().map(|p| p.by), Some("api".to_string()));
        assert_eq!(answered.await.unwrap().unwrap()["was_paused"], false);
        let (command, answered) = ask(pause);
        assert!(control.carry_out(command, &store).await.unwrap());
        assert_eq!(answered.await.unwrap().unwrap()["was_paused"], true);

        let (command, answered) = ask(|answer| Command::Resume { answer });
        assert!(!command.stops_a_run(), "a resume never stops a run");
        assert!(!control.carry_out(command, &store).await.unwrap(), "running after it");
        assert_eq!(store.paused().unwrap(), None);
        assert_eq!(answered.await.unwrap().unwrap()["was_paused"], true);
        // What a standby taking over, or the next start, reads: the store, reopened (the control shows it
        // until both ends are dropped).
        drop((control, handle, store));
        assert_eq!(Store::open(dir.path()).unwrap().paused().unwrap(), None);
    }
}
