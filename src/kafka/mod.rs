//! Kafka client routines that several rooms share: reading topics to their end ([`read`]) and committing a
//! transaction until its outcome is known ([`commit`]).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.

pub mod commit;
pub mod read;
