//! The connector's own signals in `[outbox] signal_table`, `pause` and `resume`, beside Debezium's
//! snapshot signals ([`super::on_demand`] carries those out): the pause a run reads ([`SignalledPause`]),
//! the relay's reads of the table ([`poll_running`]), and a paused connector's wait for its `resume`
//! ([`watch_for_resume`]).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! # Where a paused connector reads its resume
//! A paused connector reads no outbox row, so it could never read a `resume` written after its pause the
//! way the run reads signals. It reads the signal table on the side instead: the binlog source opens a
//! second stream of its own from the checkpoint that decodes the signal table only (so its signals come in
//! commit order, and everything after the `resume` is read again by the run that follows), the polling
//! relay reads the table every [`SIGNAL_POLL_EVERY`]. A `pause` read meanwhile changes nothing and is noted;
//! the other signals are left to the run (the relay, which takes no other, notes them ignored).
//!
//! # Once
//! A signal is carried out once, by id: a note in the state store after it (`signal/<id>`), and a pause by
//! signal is stored naming its signal, in one record, before the run's checkpoint can pass the signal. So a
//! crash between the pause and its note neither loses the pause nor, read again, pauses twice
//! ([`Store::signal_carried_out`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::checkpoint::store::{AppliedSignal, Paused, SIGNAL_BY};
use crate::checkpoint::Store;
use crate::config::{Config, Source};
use crate::error::Result;
use crate::outbox::TableName;
use crate::source::binlog::{BinlogReader, Change, ReaderSettings, Signal};
use crate::source::signal::read_signals;
use crate::source::{current_position, server_info, SourceConn};

/// How often the polling relay reads the signal table, running or paused.
pub const SIGNAL_POLL_EVERY: Duration = Duration::from_secs(1);
/// How long a paused connector waits before it reads the signal table again after an error.
const WATCH_RETRY: Duration = Duration::from_secs(5);

/// A pause asked by a `pause` signal, carried from the run that read it (the stream, or the relay's read of
/// the table) to the app, which stops the run as it does for an operator's pause. The run stores the pause
/// itself ([`SignalledPause::carry_out`]) and only asks: it cannot wait for its own stop.
#[derive(Debug, Clone)]
pub struct SignalledPause(Arc<watch::Sender<Option<String>>>);

impl Default for SignalledPause {
    fn default() -> Self {
        Self(Arc::new(watch::channel(None).0))
    }
}

impl SignalledPause {
    /// Carries out the `pause` signal `id` a run read: stores the pause naming it (before the run's
    /// checkpoint can pass the signal), then its note, and asks the app to stop the run.
    ///
    /// # Errors
    /// The store's.
    pub fn carry_out(&self, store: &Store, id: &str) -> Result<()> {
        store.set_paused(Some(&Paused { at_ms: crate::time::now_ms(), by: format!("{SIGNAL_BY}{id}") }))?;
        note(store, id, "pause", "paused")?;
        tracing::warn!(
            signal = id,
            "paused by a signal: nothing is read or published until a resume signal, \
            `outbox-cdc resume` or POST /v1/resume"
        );
        self.0.send_if_modified(|asked| match asked {
            Some(_) => false,
            None => {
                *asked = Some(id.to_string());
                true
            }
        });
        Ok(())
    }

    /// Resolves with the signal's id once a pause was asked (at once when one is already).
    pub async fn asked(&self) -> String {
        let mut rx = self.0.subscribe();
        let asked = rx.wait_for(Option::is_some).await.expect("the sender is ours");
        asked.clone().expect("waited for Some")
    }

    /// The pause asked, if one was, taken: the next run starts with none.
    pub fn take(&self) -> Option<String> {
        self.0.send_replace(None)
    }
}

/// Records that signal `id` of type `kind` was carried out, and what it did.
///
/// # Errors
/// The store's.
pub fn note(store: &Store, id: &str, kind: &str, outcome: &str) -> Result<()> {
    let applied = AppliedSignal { at_ms: crate::time::now_ms(), kind: kind.to_string(), outcome: outcome.to_string() };
    store.put_applied_signal(id, &applied)
}

/// The running relay's read of the signal table: carries out, in the order of `id`, each signal not
/// carried out before. A `pause` pauses (the signals after it wait for the paused relay's read); a
/// `resume` of a relay that runs does nothing; the relay takes no other type (it has no snapshots on
/// demand: it publishes every row not marked published), so they are logged and noted ignored.
///
/// # Errors
/// The read's and the store's.
pub async fn poll_running(
    conn: &mut mysql_async::Conn,
    table: &TableName,
    store: &Store,
    pause: &SignalledPause,
) -> Result<()> {
    for signal in read_signals(conn, table).await? {
        if store.signal_carried_out(&signal.id)? {
            continue;
        }
        match signal.kind.as_str() {
            "pause" => return pause.carry_out(store, &signal.id),
            "resume" => note(store, &signal.id, &signal.kind, "not paused: nothing to do")?,
            _ => ignored_by_relay(store, &signal)?,
        }
    }
    Ok(())
}

/// Notes a signal the polling relay does not take.
fn ignored_by_relay(store: &Store, signal: &Signal) -> Result<()> {
    tracing::warn!(
        id = %signal.id,
        kind = %signal.kind,
        "signal the polling relay does not take: ignored (it takes pause and resume; it has no snapshots on demand)"
    );
    note(store, &signal.id, &signal.kind, "ignored: the polling relay takes pause and resume")
}

/// Waits while the connector is paused for a `resume` signal not carried out yet, and returns it (the
/// caller resumes and notes it). Never returns without a signal table, or for binlog files. An error (the
/// server away, the binlog purged) is logged and the wait starts again: a paused connector stays paused.
pub async fn watch_for_resume(
    config: &Config,
    source: Option<&SourceConn>,
    settings: &ReaderSettings,
    store: &Store,
) -> Signal {
    let (Some(table), Some(source)) = (config.signal_table(), source) else { return std::future::pending().await };
    loop {
        let watched = match &config.source.kind {
            Source::Server(server) => watch_binlog(source, settings, server.resume_by, store).await,
            Source::Poll(_) => poll_paused(source, table, store).await,
            Source::Files(_) => return std::future::pending().await,
        };
        match watched {
            Ok(signal) => return signal,
            Err(error) => {
                tracing::warn!(%error, table = %table, "paused: cannot read the signal table; trying again");
                tokio::time::sleep(WATCH_RETRY).await;
            }
        }
    }
}

/// A paused binlog connector's wait: a stream of its own from the checkpoint (from the server's end when
/// there is none yet), decoding the signal table only.
async fn watch_binlog(
    source: &SourceConn,
    settings: &ReaderSettings,
    resume_by: crate::config::ResumeBy,
    store: &Store,
) -> Result<Signal> {
    let mut conn = source.connect().await?;
    let info = server_info(&mut conn).await?;
    let position = match store.load()? {
        Some(checkpoint) => checkpoint.position().clone(),
        None => current_position(&mut conn, &info, resume_by).await?,
    };
    drop(conn);
    let signals_only = ReaderSettings { tables: Vec::new(), ..settings.clone() };
    let mut reader = BinlogReader::start(source, &info, Arc::new(signals_only), position).await?;
    loop {
        if let Change::Signal(signal) = reader.next().await? {
            if let Some(resume) = while_paused(store, *signal, false)? {
                return Ok(resume);
            }
        }
    }
}

/// A paused relay's wait: the signal table read every [`SIGNAL_POLL_EVERY`].
async fn poll_paused(source: &SourceConn, table: &TableName, store: &Store) -> Result<Signal> {
    let mut conn = source.connect().await?;
    loop {
        for signal in read_signals(&mut conn, table).await? {
            if let Some(resume) = while_paused(store, signal, true)? {
                return Ok(resume);
            }
        }
        tokio::time::sleep(SIGNAL_POLL_EVERY).await;
    }
}

/// What a signal read while paused does: a `resume` not carried out yet is returned; a `pause` is noted
/// (already paused); the others are left to the run, or noted ignored where the run would (`relay`).
fn while_paused(store: &Store, signal: Signal, relay: bool) -> Result<Option<Signal>> {
    if store.signal_carried_out(&signal.id)? {
        return Ok(None);
    }
    match signal.kind.as_str() {
        "resume" => return Ok(Some(signal)),
        "pause" => note(store, &signal.id, &signal.kind, "already paused: nothing to do")?,
        _ if relay => ignored_by_relay(store, &signal)?,
        _ => {}
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signal(id: &str, kind: &str) -> Signal {
        Signal { id: id.into(), kind: kind.into(), data: None }
    }

    /// A pause by signal is one record naming it: carried out before its note is written, and once noted;
    /// the run's ask reaches the app once, until taken.
    #[tokio::test]
    async fn a_pause_by_signal_is_stored_naming_it_and_asked_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let pause = SignalledPause::default();
        pause.carry_out(&store, "p-1").unwrap();
        assert_eq!(store.paused().unwrap().unwrap().signal(), Some("p-1"));
        assert!(store.signal_carried_out("p-1").unwrap());
        assert_eq!(pause.asked().await, "p-1");
        pause.carry_out(&store, "p-2").unwrap();
        assert_eq!(pause.take().as_deref(), Some("p-1"), "the first ask stands until taken");
        assert_eq!(pause.take(), None);
        // The pause alone (its note not yet written) already counts: read again, it is not carried out twice.
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.set_paused(Some(&Paused { at_ms: 1, by: "signal p-3".into() })).unwrap();
        assert!(store.signal_carried_out("p-3").unwrap());
        assert!(!store.signal_carried_out("p-4").unwrap());
    }

    /// While paused: a resume is returned (not noted: the resume notes it), a pause is noted, the
    /// others are left to the binlog run and noted ignored by the relay; a signal carried out is skipped.
    #[test]
    fn signals_read_while_paused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(while_paused(&store, signal("r-1", "resume"), false).unwrap(), Some(signal("r-1", "resume")));
        assert!(store.applied_signal("r-1").unwrap().is_none());
        assert_eq!(while_paused(&store, signal("p-1", "pause"), false).unwrap(), None);
        assert_eq!(store.applied_signal("p-1").unwrap().unwrap().outcome, "already paused: nothing to do");
        assert_eq!(while_paused(&store, signal("s-1", "execute-snapshot"), false).unwrap(), None);
        assert!(store.applied_signal("s-1").unwrap().is_none(), "left to the run");
        assert_eq!(while_paused(&store, signal("s-1", "execute-snapshot"), true).unwrap(), None);
        assert!(store.applied_signal("s-1").unwrap().unwrap().outcome.starts_with("ignored"));
        note(&store, "r-2", "resume", "resumed").unwrap();
        assert_eq!(while_paused(&store, signal("r-2", "resume"), false).unwrap(), None);
    }
}
