//! The Kafka sink and its delivery proofs, one room per concern: [`kafka`] the sink itself (producing
//! within the in-flight budget), [`delivery`] the callback that mints [`Delivered`] proofs, [`topics`] the
//! topics it writes to, [`limits`] their size rule, [`transaction`] the Kafka transaction of `exactly_once`, [`probe`]
//! the broker probe behind `/readyz`, and [`check`] the Kafka half of `outbox-cdc check`.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3; the watermark takes the sink's delivery proof, the one seam.

pub mod check;
mod delivery;
pub mod kafka;
mod limits;
mod probe;
mod topics;
mod transaction;

pub use kafka::{KafkaSink, IN_FLIGHT_OVERHEAD_BYTES};
pub use transaction::{CheckpointRecord, OnCommit, Transactional};

use crate::checkpoint::TxId;

/// Proof that Kafka acknowledged one record of a source transaction.
///
/// Only the sink's delivery callback can create one (the constructor is private to this module tree), so
/// only an acknowledgement can move the checkpoint.
#[derive(Debug)]
pub struct Delivered {
    tx: TxId,
}

impl Delivered {
    fn new(tx: TxId) -> Self {
        Delivered { tx }
    }

    /// The transaction the acknowledged record belongs to.
    pub fn tx(&self) -> TxId {
        self.tx
    }

    /// A proof for unit tests of the watermark.
    #[cfg(test)]
    pub(crate) fn for_test(tx: TxId) -> Self {
        Delivered::new(tx)
    }
}
