//! The Kafka sink and its delivery proofs.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3; the watermark takes the sink's delivery proof, the one seam.

pub mod check;
pub mod kafka;

pub use kafka::{KafkaSink, IN_FLIGHT_OVERHEAD_BYTES};

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
