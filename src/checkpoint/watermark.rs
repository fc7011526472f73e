//! The acknowledged watermark: which source position Kafka has fully acknowledged.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3; the watermark takes the sink's delivery proof, the one seam.
//!
//! Source transactions are registered in binlog order ([`Watermark::open`], one [`Watermark::add_record`]
//! per produced record, then [`Watermark::close`] with the position after the transaction). Delivery
//! proofs ([`Delivered`], which only the Kafka sink can create) settle records in any order. The watermark
//! is the position of the newest closed transaction such that it and every earlier one have no record left
//! unsettled.
//!
//! # Invariants
//! - The watermark only moves forward, and only to a position passed to `close`.
//! - It never passes a transaction with an unsettled record, nor one still open (a large transaction is
//!   produced while it is read, but only counts once its commit has been read *and* all its records are
//!   acknowledged).
//! - A delivery failure freezes it for good: the pipeline must restart from the last watermark, and the
//!   failed record will be produced again.
//! - An abandoned transaction (the reader lost its connection mid-transaction; it will be read again from
//!   the start) never moves the watermark, but still waits for its in-flight records so that ordering
//!   stays a prefix.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::Error;
use crate::position::EndEvent;
use crate::position::{Position, TxProgress};
use crate::sink::Delivered;

/// Identifies a registered source transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxId(pub(crate) u64);

/// An acknowledged point: a position and the commit time of the transaction that ends there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// Position right after the transaction.
    pub position: Position,
    /// Its commit time (server clock, Unix seconds), when known.
    pub timestamp: Option<u32>,
    /// The binlog event that ends it, when a transaction ends here (not at a snapshot's start point).
    pub end_event: Option<EndEvent>,
    /// Snapshot progress at this point (during a snapshot, and while its overlap rule is in force).
    pub snapshot: Option<std::sync::Arc<crate::position::snapshot::SnapshotState>>,
    /// The outbox rows of the transaction after `position` already published (`exactly_once` commits inside
    /// a long source transaction): a resume skips them.
    pub inside: Option<TxProgress>,
    /// How far the snapshot on demand being read got at this point (`pipeline::on_demand`).
    pub on_demand: Option<std::sync::Arc<crate::position::on_demand::OnDemandProgress>>,
}

impl Mark {
    /// A point no transaction of the stream ends at (a start point, a snapshot's cut): no commit time, no end
    /// event.
    pub fn boundary(
        position: Position,
        snapshot: Option<std::sync::Arc<crate::position::snapshot::SnapshotState>>,
    ) -> Self {
        Mark { position, timestamp: None, end_event: None, snapshot, inside: None, on_demand: None }
    }
}

#[derive(Debug)]
enum End {
    Open,
    Closed(Mark),
    Abandoned,
}

#[derive(Debug)]
struct Slot {
    unsettled: u64,
    end: End,
}

#[derive(Debug, Default)]
struct Inner {
    /// TxId of `slots[0]`.
    first: u64,
    /// Next TxId to hand out.
    next: u64,
    slots: VecDeque<Slot>,
    watermark: Option<Mark>,
    /// Records registered and not yet settled, across all transactions.
    unsettled: u64,
    failure: Option<Error>,
}

/// Shared between the reader side (registers) and the delivery callbacks (settle).
#[derive(Debug, Default)]
pub struct Watermark {
    inner: Mutex<Inner>,
    /// Mirrors `inner.failure.is_some()`, read without the lock on the per-record path.
    failed: AtomicBool,
}

impl Watermark {
    /// A watermark starting at `position` (the resume point: everything before it is already in Kafka).
    pub fn new(start: Option<Mark>) -> Self {
        Watermark { inner: Mutex::new(Inner { watermark: start, ..Inner::default() }), failed: AtomicBool::new(false) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves counts that are still conservative (never ahead of
        // acknowledgements), so continuing with the data is safe.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Restarts from `start` with nothing pending (between phases, once everything settled).
    pub fn reset(&self, start: Mark) {
        let mut inner = self.lock();
        debug_assert!(inner.slots.is_empty() && inner.unsettled == 0, "reset with records in flight");
        inner.slots.clear();
        inner.watermark = Some(start);
    }

    /// Registers the start of a source transaction.
    pub fn open(&self) -> TxId {
        let mut inner = self.lock();
        let id = inner.next;
        inner.next += 1;
        if inner.slots.is_empty() {
            inner.first = id;
        }
        inner.slots.push_back(Slot { unsettled: 0, end: End::Open });
        TxId(id)
    }

    /// Registers one record of `tx` about to be handed to the producer.
    pub fn add_record(&self, tx: TxId) {
        let mut inner = self.lock();
        inner.unsettled += 1;
        let slot = inner.slot_mut(tx);
        slot.unsettled += 1;
    }

    /// Registers the end of `tx` with the position after it.
    pub fn close(&self, tx: TxId, mark: Mark) {
        let mut inner = self.lock();
        inner.slot_mut(tx).end = End::Closed(mark);
        inner.advance();
    }

    /// Marks `tx` as abandoned: it will be read again; it must never move the watermark.
    pub fn abandon(&self, tx: TxId) {
        let mut inner = self.lock();
        inner.slot_mut(tx).end = End::Abandoned;
        inner.advance();
    }

    /// Settles one record with its delivery proof.
    pub fn settle(&self, delivered: Delivered) {
        let mut inner = self.lock();
        inner.unsettled -= 1;
        let slot = inner.slot_mut(delivered.tx());
        slot.unsettled -= 1;
        inner.advance();
    }

    /// Records a delivery failure: the watermark stops here for good.
    pub fn fail(&self, error: Error) {
        let mut inner = self.lock();
        if inner.failure.is_none() {
            inner.failure = Some(error);
            self.failed.store(true, Ordering::Release);
        }
    }

    /// The acknowledged mark, if any.
    pub fn mark(&self) -> Option<Mark> {
        self.lock().watermark.clone()
    }

    /// The mark of the last transaction closed (acknowledged or not), else the acknowledged mark: where an
    /// entry registered now and closed at once may put the checkpoint without moving it backwards.
    pub fn last_closed(&self) -> Option<Mark> {
        let inner = self.lock();
        let closed = inner.slots.iter().rev().find_map(|slot| match &slot.end {
            End::Closed(mark) => Some(mark),
            End::Open | End::Abandoned => None,
        });
        closed.or(inner.watermark.as_ref()).cloned()
    }

    /// Takes the first delivery failure, if one happened.
    pub fn take_failure(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let mut inner = self.lock();
        self.failed.store(false, Ordering::Release);
        inner.failure.take()
    }

    /// True when a delivery failed (and the failure was not taken yet).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The first transaction not yet passed: every one before it is settled and closed or abandoned.
    pub fn settled_before(&self) -> TxId {
        TxId(self.lock().first)
    }

    /// Records handed to the producer and not yet settled.
    pub fn unsettled(&self) -> u64 {
        self.lock().unsettled
    }
}

impl Inner {
    fn slot_mut(&mut self, tx: TxId) -> &mut Slot {
        let index = tx.0.checked_sub(self.first).expect("transaction already passed by the watermark") as usize;
        &mut self.slots[index]
    }

    fn advance(&mut self) {
        if self.failure.is_some() {
            return;
        }
        while let Some(front) = self.slots.front() {
            if front.unsettled != 0 {
                break;
            }
            match &front.end {
                End::Open => break,
                End::Closed(_) | End::Abandoned => {}
            }
            let slot = self.slots.pop_front().expect("front exists");
            self.first += 1;
            if let End::Closed(mark) = slot.end {
                self.watermark = Some(mark);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::position::{BinlogCoord, Gtids};

    fn pos(n: u64) -> Mark {
        Mark::boundary(Position { gtids: Gtids::None, coord: BinlogCoord { file: "bin.000001".into(), pos: n } }, None)
    }

    fn at(w: &Watermark) -> Option<u64> {
        w.mark().map(|m| m.position.coord.pos)
    }

    #[test]
    fn empty_transactions_advance_immediately() {
        let w = Watermark::new(Some(pos(1)));
        let tx = w.open();
        w.close(tx, pos(2));
        assert_eq!(at(&w), Some(2));
    }

    #[test]
    fn open_transaction_holds_the_watermark_even_when_acked() {
        let w = Watermark::new(None);
        let tx = w.open();
        w.add_record(tx);
        w.settle(Delivered::for_test(tx));
        assert_eq!(at(&w), None, "commit not read yet");
        w.close(tx, pos(10));
        assert_eq!(at(&w), Some(10));
    }

    #[test]
    fn later_ack_does_not_pass_an_earlier_unacked_transaction() {
        let w = Watermark::new(None);
        let a = w.open();
        w.add_record(a);
        w.close(a, pos(10));
        let b = w.open();
        w.add_record(b);
        w.close(b, pos(20));
        w.settle(Delivered::for_test(b));
        assert_eq!(at(&w), None);
        w.settle(Delivered::for_test(a));
        assert_eq!(at(&w), Some(20));
    }

    #[test]
    fn abandoned_transaction_never_moves_the_watermark() {
        let w = Watermark::new(Some(pos(5)));
        let a = w.open();
        w.add_record(a);
        w.abandon(a);
        w.settle(Delivered::for_test(a));
        assert_eq!(at(&w), Some(5));
        let b = w.open();
        w.close(b, pos(9));
        assert_eq!(at(&w), Some(9));
    }

    #[test]
    fn failure_freezes_the_watermark() {
        let w = Watermark::new(None);
        let a = w.open();
        w.add_record(a);
        w.add_record(a);
        w.close(a, pos(10));
        w.settle(Delivered::for_test(a));
        w.fail(Error::transient("delivery timed out"));
        w.settle(Delivered::for_test(a));
        assert_eq!(at(&w), None);
        assert!(w.take_failure().is_some());
    }

    proptest! {
        /// Under any acknowledgement order, the watermark is always the end of the longest fully acked
        /// prefix of closed transactions — never beyond an unsettled one.
        #[test]
        fn watermark_never_passes_an_unsettled_transaction(
            sizes in proptest::collection::vec(0u64..4, 1..40),
            seed in any::<u64>(),
        ) {
            let w = Watermark::new(None);
            let mut records = Vec::new();
            let mut ids = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let tx = w.open();
                for _ in 0..n { w.add_record(tx); records.push(i); }
                w.close(tx, pos(i as u64 + 1));
                ids.push(tx);
            }
            // Deterministic shuffle from the seed.
            let mut state = seed | 1;
            for i in (1..records.len()).rev() {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                records.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let mut remaining: Vec<u64> = sizes.clone();
            for &i in &records {
                w.settle(Delivered::for_test(ids[i]));
                remaining[i] -= 1;
                let prefix = remaining.iter().take_while(|&&r| r == 0).count();
                let expected = if prefix == 0 { None } else { Some(prefix as u64) };
                prop_assert_eq!(at(&w), expected);
            }
            prop_assert_eq!(at(&w), Some(sizes.len() as u64));
            prop_assert_eq!(w.unsettled(), 0);
        }
    }
}
