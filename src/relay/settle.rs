//! What becomes of the batches Kafka acknowledged (handed to the marker task, dead letters parked) and of
//! the holds `quarantine release` lifted (their aggregates' rows read again and produced in order).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4 (its methods are the run's, [`PollRun`]).

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use super::marker::MarkRequest;
use super::run::{forget_lifted_holds, Batch, PollRun};
use super::table::{Aggregate, Position};
use crate::error::Result;
use crate::publish::Publisher;

impl PollRun<'_> {
    /// Hands every batch Kafka acknowledged (with all before it) to the marker task, parks its
    /// dead-lettered rows, and takes back the rows the marker task marked; ends the run on a delivery
    /// failure or when the marker task failed.
    pub(super) async fn settle(&mut self) -> Result<()> {
        self.settle_with(false).await
    }

    /// [`PollRun::settle`]; `flush`: rows acknowledged above the frontier are marked at once rather than
    /// after a delay (at shutdown; [`super::ledger::Ledger::advance`]).
    pub(super) async fn settle_with(&mut self, flush: bool) -> Result<()> {
        if let Some(error) = self.watermark.take_failure() {
            return Err(self.failed(error).await);
        }
        while let Ok((t, keys)) = self.marked.try_recv() {
            for key in keys {
                self.tables[t].in_flight.remove(&key);
            }
        }
        if self.marker.is_finished() {
            return Err(self.marker_ended().await);
        }
        let settled = self.commits.settled_before(&self.watermark);
        let mut done: Vec<Batch> = Vec::new();
        while self.pending.front().is_some_and(|b| b.tx < settled) {
            done.extend(self.pending.pop_front());
        }
        if !done.is_empty() {
            crate::failpoint!("poll_batch_acked");
        }
        let mut requests: BTreeMap<usize, MarkRequest> = BTreeMap::new();
        let now = Instant::now();
        for batch in &done {
            let request = requests.entry(batch.t).or_insert_with(|| MarkRequest::new(batch.t));
            for row in &batch.rows {
                match &row.dead {
                    None => {
                        let key = (&row.key, row.key_bytes.as_slice());
                        if !self.ledger.acknowledged(batch.t, row.seq, row.held_at, key, now) {
                            request.keys.push(row.key.clone());
                            request.seqs.extend(row.seq);
                            request.done.push(row.key_bytes.clone());
                        }
                    }
                    Some(reason) => {
                        self.relay.park(&mut self.conn, batch.t, &row.key, reason).await?;
                        let state = &mut self.tables[batch.t];
                        state.parking.remove(&row.aggregate);
                        state.in_flight.remove(&row.key_bytes);
                        if let Some(seq) = row.seq {
                            self.ledger.parked(batch.t, seq);
                        }
                    }
                }
            }
        }
        self.ledger.advance(&mut requests, flush, now);
        let Some(marks) = &self.marks else { return Ok(()) };
        for request in
            requests.into_values().filter(|r| !r.done.is_empty() || r.frontier.is_some() || !r.held.is_empty())
        {
            if marks.send(request).await.is_err() {
                return Err(self.marker_ended().await);
            }
        }
        Ok(())
    }

    /// Reads which aggregates are parked; a held aggregate that is not any more (a `quarantine release`
    /// marked its parked row published) has the rows it held read again and produced in order: all its
    /// unpublished rows, above the last row read too (a run started again reads from the number, which
    /// may be behind rows held in an earlier run). The rows above the last row read stay in flight until
    /// marked, so the read in order leaves them alone.
    pub(super) async fn lift_released_holds(&mut self) -> Result<()> {
        for t in 0..self.tables.len() {
            if self.tables[t].held.is_empty() {
                continue;
            }
            // Only the held aggregates, in chunks, along the aggregate index: a scan of every unpublished
            // row each time cost the server more than the catch-up itself (bench, 10,000 held rows).
            let held: Vec<Aggregate> = self.tables[t].held.iter().cloned().collect();
            let mut parked: HashSet<Aggregate> = HashSet::new();
            for chunk in held.chunks(500) {
                let rows = self.relay.parked_rows(&mut self.conn, t, Some(chunk)).await?;
                parked.extend(rows.into_iter().map(|(aggregate, _)| aggregate));
            }
            let state = &mut self.tables[t];
            let lifted: Vec<Aggregate> =
                state.held.iter().filter(|a| !parked.contains(*a) && !state.parking.contains(*a)).cloned().collect();
            if lifted.is_empty() {
                continue;
            }
            for aggregate in &lifted {
                state.held.remove(aggregate);
            }
            if forget_lifted_holds(&self.store, &self.tables)? {
                self.publisher = Publisher::new(self.config, self.router.clone(), self.store.clone())?;
            }
            for aggregate in lifted {
                tracing::info!(
                    aggregate_type = %String::from_utf8_lossy(&aggregate.0),
                    aggregate_id = %String::from_utf8_lossy(&aggregate.1),
                    "hold lifted: publishing the aggregate's rows it held, in order"
                );
                let mut after: Option<Position> = None;
                loop {
                    while self.room() < self.config.poll.batch_rows {
                        self.wait_for_room().await?;
                    }
                    let rows = self.relay.read_aggregate(&mut self.conn, t, &aggregate, after.as_ref()).await?;
                    let full = rows.len() >= self.config.poll.batch_rows;
                    after = rows.last().map(|r| r.position.clone());
                    self.produce(t, rows.into_iter()).await?;
                    if !full || self.tables[t].held.contains(&aggregate) {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}
