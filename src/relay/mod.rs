//! The polling relay (`source.kind = "poll"`), for servers whose binlog the connector may not read: it
//! reads unpublished rows of the outbox tables in order, publishes them through the same router and sink
//! as the binlog source, and records in the table what it published.
//!
//! Floor 3 (docs/ARCHITECTURE.md): this file is the front door only (it imports nothing); each room says
//! its own floor. The rooms that face the tables are on floor 3, beside `source`, because
//! `source::preflight` (`check`) and the operator commands (`ops`: prune, audit, release, status) use
//! them: [`table`] (the relay's view of its tables, [`Relay`]), [`reads`], [`marks`] (marked, held, parked,
//! refused, released), [`progress`] (`[poll] progress_table`), [`counter`] (a sequence that started again
//! below what was published), [`fence`] (every write checks the run's lease), [`server`] (every connection
//! reaches the lease's server, writable), [`columns`] (the columns, indexes and order it needs, and the
//! `ALTER TABLE` that adds them), [`ranges`] (sequence-number arithmetic), [`proof`] (the listing of open
//! writers that proves a gap free).
//! The run is on floor 5, beside `pipeline`, whose shutdown it shares: [`run`] (the loop), [`gaps`] (rows a
//! read in order can miss, and their proof), [`settle`] (acknowledged batches, lifted holds), [`ledger`] (the
//! run's side of [`Progress`]: what the progress table's number may pass), [`marker`] (the task that marks),
//! [`commit`] (`poll.transactional`).
//!
//! # One relay at a time, and no lease per row
//! Relays of one connector (`[state] name`) take the same lease on the source server ([`crate::lease`]):
//! one publishes, the others stand by and take over when it dies. So a row is never claimed or locked: the
//! active relay reads, publishes, and writes each row once, when Kafka acknowledged it (`published_at`).
//! That is what makes it cheap: one row write per event, a few statements per batch, no head test.
//!
//! # The columns
//! An `AUTO_INCREMENT` sequence column (the order: see below), `published_at` (NULL until Kafka
//! acknowledged the row's event), `attempts` (how often the broker refused the row's record),
//! `next_attempt_at` (`9999-12-31 23:59:59`, [`PARKED_UNTIL`], when the row was dead-lettered: *parked*),
//! `last_error` (why). The relay's own times are `UTC_TIMESTAMP(6)`; nothing it does compares a time a
//! writer wrote, so a writer's session time zone does not matter. `outbox-cdc check` verifies the columns
//! and the index `(published_at, <sequence>)` the reads go along.
//!
//! # The order
//! An aggregate's events are published in the order of the sequence column: insertion order, whatever the
//! writers' clocks or the ties of `occurred_at`. A table without one is refused unless `poll.order =
//! "occurred_at"` (then `(occurred_at, id)`, which reverses events that share a timestamp). The relay
//! reads in that order from a cursor, so each unpublished row is read once while it publishes:
//! - **A row committed after rows with higher sequence numbers** (its transaction took its number first and
//!   committed later) is below the cursor when it becomes visible. Each read that skips numbers records
//!   them as *gaps*; gaps are read again on every poll, after the read in order and produced before it
//!   ([`gaps`]), until a row fills them or no transaction that could still commit one is open ([`proof`]),
//!   then once more. So a row that commits late is published before every later row of its aggregate that
//!   committed after it. In `occurred_at` order there are no gaps to know of: every read looks at all of
//!   them.
//! - **A parked row** holds its aggregate: the relay skips the aggregate's later rows (they stay
//!   unpublished) until `quarantine release` marks the parked row published; then it reads the aggregate's
//!   rows again ([`Relay::read_aggregate`]) and publishes them in order. Parking is in the table, so every
//!   relay that becomes active knows it ([`Relay::parked`]).
//!
//! An event whose transaction commits after a later event of its aggregate was already published (the
//! application wrote two events of one aggregate in concurrent transactions) is published after it: the
//! relay sees rows only once they are committed. The binlog source publishes in commit order instead.

pub mod columns;
mod commit;
pub mod counter;
pub mod fence;
mod gaps;
mod ledger;
mod marker;
pub mod marks;
pub mod progress;
pub mod proof;
mod ranges;
pub mod reads;
pub mod run;
pub mod server;
mod settle;
pub mod table;

pub use columns::{
    columns_of, no_order_key, order_key, poll_column_problems, poll_columns_ddl, read_index_columns, read_index_ddl,
    sequence_ddl, OrderKey, PARKED_UNTIL, POLL_COLUMNS, POLL_COLUMN_DEFINITIONS, SEQUENCE_COLUMN,
};
pub use counter::{fresh_counters, refuse_reset, reset_statement, Counter, CounterReset, COUNTER_CHECK_EVERY};
pub use marks::mark_released;
pub use progress::{
    check_progress_table, progress_table_ddl, read_frontier, Progress, ProgressTable, HELD_AT, NOT_PUBLISHED,
};
pub use proof::{open_transactions, Writers};
pub use table::{
    key_bytes, sequence_value, Aggregate, Glimpse, PollTable, Polled, Position, Relay, FULL_SWEEP_EVERY, SWEEP_PAGE,
};
