//! Kafka client routines that several rooms share: reading topics to their end ([`read`]), committing a
//! transaction until its outcome is known ([`commit`]), and the identity every client presents with
//! `kafka.auth = "aws_iam"` ([`identity`]).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.

pub mod commit;
pub mod identity;
pub mod read;
