//! The marker task: marks the rows Kafka acknowledged published on a connection of its own, so that reading
//! and producing never wait for the marks, and sends their keys back to the run ([`MarkRequest`]). It ends
//! with the run ([`MarkerTask`]), and each of its writes is fenced by the run's lease ([`super::fence`]): a
//! relay that lost its lease writes nothing more.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};
use tokio::sync::mpsc::{Receiver, UnboundedSender};
use tokio::task::JoinHandle;

use super::table::Relay;
use crate::error::{classify_mysql, Error, Result};
use crate::metrics::metrics;

/// The marker task of a run, aborted when dropped: a run dropped because its lease was lost (the app drops
/// it at once) leaves no marker behind that writes what it was given.
pub(super) struct MarkerTask(JoinHandle<Result<()>>);

impl MarkerTask {
    /// Starts [`marker`] on `conn`.
    pub(super) fn spawn(
        relay: Arc<Relay>,
        conn: Conn,
        requests: Receiver<MarkRequest>,
        done: UnboundedSender<(usize, Vec<Vec<u8>>)>,
    ) -> MarkerTask {
        MarkerTask(tokio::spawn(marker(relay, conn, requests, done)))
    }

    /// Whether it ended.
    pub(super) fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Waits for its end (once: it ends when the run closed its channel, or failed).
    ///
    /// # Errors
    /// Its error; transient when it panicked.
    pub(super) async fn join(&mut self) -> Result<()> {
        match (&mut self.0).await {
            Ok(result) => result,
            Err(e) => Err(Error::transient(format!("poll: the marker task failed: {e}"))),
        }
    }
}

impl Drop for MarkerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Rows of one table acknowledged by Kafka, for the marker task ([`marker`]) to mark published.
#[derive(Default)]
pub(super) struct MarkRequest {
    pub(super) t: usize,
    pub(super) keys: Vec<Value>,
    pub(super) seqs: Vec<u64>,
    /// Their keys as bytes, sent back once marked (the run keeps them in flight until then, so that no
    /// read takes an acknowledged row that is not marked yet for a new one).
    pub(super) done: Vec<Vec<u8>>,
    /// `[poll] progress_table`: the new frontier, written after the marks; the rows of `done` not in
    /// `keys` are published by it.
    pub(super) frontier: Option<u64>,
    /// `[poll] progress_table`: rows of held aggregates to mark `HELD_AT` (by sequence number), first.
    pub(super) held: Vec<u64>,
    /// How many rows of `done` the frontier publishes.
    pub(super) by_frontier: u64,
}

impl MarkRequest {
    pub(super) fn new(t: usize) -> MarkRequest {
        MarkRequest { t, ..MarkRequest::default() }
    }
}

/// The marker task: marks the rows it is given published, on its own connection, one statement per table
/// for all the requests waiting, and sends their keys back.
///
/// # Errors
/// Classified query errors, and a lease no longer this run's (the rows stay unpublished: the next run
/// publishes them again).
async fn marker(
    relay: Arc<Relay>,
    mut conn: Conn,
    mut requests: Receiver<MarkRequest>,
    done: UnboundedSender<(usize, Vec<Vec<u8>>)>,
) -> Result<()> {
    // Its session ends when silent for the lease's `wait_timeout` (`relay::fence`): a ping keeps it while idle.
    let keepalive = relay.fence.session_timeout_s().map(|s| Duration::from_secs(s.max(1)) / 3);
    loop {
        let next = match keepalive {
            None => requests.recv().await,
            Some(every) => match tokio::time::timeout(every, requests.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    conn.ping().await.map_err(|e| classify_mysql(&e).context("poll: the marks' connection"))?;
                    continue;
                }
            },
        };
        let Some(first) = next else { break };
        let mut waiting = vec![first];
        while let Ok(more) = requests.try_recv() {
            waiting.push(more);
        }
        // One statement per table for all the requests waiting (their `done` stays with each request).
        let mut by_table: BTreeMap<usize, MarkRequest> = BTreeMap::new();
        let mut published = 0;
        for request in &waiting {
            let merged = by_table.entry(request.t).or_insert_with(|| MarkRequest::new(request.t));
            merged.keys.extend(request.keys.iter().cloned());
            merged.seqs.extend(&request.seqs);
            merged.frontier = merged.frontier.max(request.frontier);
            merged.held.extend(&request.held);
            merged.by_frontier += request.by_frontier;
        }
        // One transaction: committed whole while the lease is this run's, else not at all (`relay::fence`).
        relay.fence.begin(&mut conn).await?;
        for (t, merged) in by_table {
            // Held rows first: the frontier written below may pass them, and rows marked on their own
            // may be among them (released since).
            if !merged.held.is_empty() {
                relay.mark_held(&mut conn, t, &merged.held).await?;
            }
            if !merged.keys.is_empty() {
                published += relay.mark_published(&mut conn, t, &merged.keys, &merged.seqs).await?;
            }
            if let Some(frontier) = merged.frontier {
                relay.write_frontier(&mut conn, t, frontier).await?;
            }
            published += merged.by_frontier;
        }
        relay.fence.commit(&mut conn).await?;
        metrics().poll_published(published);
        for request in waiting {
            // The run may have ended meanwhile: nothing to tell then.
            let _ = done.send((request.t, request.done));
        }
    }
    let _ = conn.disconnect().await;
    Ok(())
}
