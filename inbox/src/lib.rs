//! The consumer's half of "exactly once, end to end": the inbox pattern for services that read outbox-cdc's
//! topics with `rdkafka` and keep their state in MySQL/MariaDB with `mysql_async`.
//!
//! A crate of its own in the workspace (`inbox/`): library code for consumers, not part of the connector,
//! which neither imports it nor is imported by it.
//!
//! outbox-cdc delivers at least once: after a connector crash, events can be published again (docs/CONTRACT.md,
//! "Delivery"), and a consumer crash makes Kafka deliver again whatever the consumer had not committed. Every
//! record carries its stable event id in the `id` header. [`Inbox::handle`] turns that into "each side effect
//! exactly once" for side effects that live in the consumer's own database:
//!
//! ```text
//! BEGIN
//!   INSERT INTO consumed_events (consumer_group, event_id, topic, kafka_partition, kafka_offset) …
//!       duplicate key? → ROLLBACK, Outcome::Skipped (applied before, by this or an earlier run)
//!   the caller's side effect, on the same transaction
//! COMMIT                                   → Outcome::Applied
//! commit_after(consumer, record)           → Kafka offset = record offset + 1, synchronously
//! ```
//!
//! ```no_run
//! # async fn demo(conn: &mut mysql_async::Conn, consumer: &rdkafka::consumer::StreamConsumer)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use mysql_async::prelude::*;
//! use outbox_cdc_inbox::{commit_after, Inbox};
//!
//! let inbox = Inbox::new("billing");
//! inbox.ensure_table(conn).await?;
//! loop {
//!     let record = consumer.recv().await?;
//!     inbox
//!         .handle(conn, &record, async |tx| tx.exec_drop("UPDATE accounts SET balance = balance + 1", ()).await)
//!         .await?;
//!     commit_after(consumer, &record)?;
//! }
//! # }
//! ```
//!
//! # Invariants
//! - **The event id and the side effect commit together or not at all.** A row in `consumed_events` means
//!   the side effect is committed, and the side effect never commits without that row. The primary key
//!   `(consumer_group, event_id)` lets a second application of the same id fail on the duplicate key before
//!   the side effect runs, also when two consumers race (InnoDB makes the second insert wait for the first
//!   transaction, then fail).
//! - **The Kafka offset moves only after the database commit** ([`commit_after`]), so everything below a
//!   committed offset is applied (or was a duplicate). A side-effect error rolls back and is returned:
//!   the caller stops or retries the same record, it never commits past it.
//! - **Nothing is applied without an id**: a record without an `id` header is [`InboxError::MissingId`],
//!   naming its topic, partition and offset, never applied and never skipped silently.
//!
//! # Failure cases
//! - *Crash before the database commit*: the transaction is rolled back by the server (the connection
//!   dies with the process), the offset was not committed, the record is delivered again and applied once.
//! - *Crash after the database commit, before the offset commit*: the record is delivered again, the
//!   insert hits the duplicate key, it is skipped.
//! - *Duplicates published by the connector* (a connector crash): the second copy is skipped, whatever
//!   partition or offset it has.
//! - *Rebalance* (group subscription): the partition's new owner starts at the last committed offset, which
//!   may be behind what the old owner applied (it had not committed yet, or is still finishing a record).
//!   Everything between is delivered again and skipped; if the old owner's transaction is still open, the
//!   new owner's insert waits for it and then skips or applies, depending on whether it committed.
//! - *Database unavailable, deadlock, lock wait timeout*: [`InboxError::Database`]; nothing was applied,
//!   handle the same record again.
//!
//! # Consumer settings
//! - `enable.auto.commit=false`: an auto-commit moves the offset on a timer, possibly before the database
//!   commit; a crash then loses the record (its offset is committed, so it is never delivered again).
//!   The inbox protects against applying twice, not against never applying.
//! - `isolation.level=read_committed`: a transactional producer's aborted records (another producer
//!   writing to the same topic, or a future transactional connector) must never be applied. It is
//!   librdkafka's default; set it explicitly so a copied configuration keeps it.
//!
//! # Where to resume: the database, then Kafka
//! The table records every applied event's partition and offset in the same transaction, so the database
//! knows exactly how far this group has got, even when the process died between the database commit and
//! the offset commit. [`Inbox::assignment`] builds a manual assignment from it (partitions the table does
//! not know resume from the Kafka-committed offset, [`Offset::Stored`]). The example consumer
//! (`examples/inbox_consumer.rs` in this crate) uses that instead of a group subscription: no rebalance
//! pause after a crash, and a resume point that cannot be behind the applied state (Kafka offsets are still
//! committed after each record, for lag monitoring and for a switch to a subscription). With `subscribe`,
//! the inbox is just as correct; the committed offset can then be a little behind and those records are
//! skipped.
//!
//! # Why not Kafka transactions
//! A transactional consumer-producer (`send_offsets_to_transaction`) makes Kafka → Kafka exactly once: the
//! offsets commit with the records it produces. Here the side effect is a database write, which no Kafka
//! transaction can include; the database transaction is the one that must hold both the effect and the
//! proof of consumption, and Kafka's offset can only follow it.
//!
//! # Not covered
//! - **Side effects outside this database** (an e-mail, an HTTP call, a write to another database): the
//!   transaction cannot roll them back, so a crash between them and the commit repeats them. Make them
//!   idempotent (pass the event id on as an idempotency key) or write them to the service's own outbox.
//! - **Growth of `consumed_events`**: one row per event. Delete old rows only when their events can no
//!   longer be delivered again (older than the topic's retention) and keep each partition's newest row,
//!   which is the resume point.
//! - **Order across partitions**: events of one aggregate are in one partition, in order; there is no
//!   order between aggregates.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::fmt;

use mysql_async::prelude::*;
use mysql_async::{Conn, Transaction, TxOpts};
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// The table [`Inbox::new`] uses.
pub const DEFAULT_TABLE: &str = "consumed_events";

/// The event id column's size: outbox ids are UUIDs or similar keys, compared byte for byte.
pub const MAX_ID_BYTES: usize = 255;

/// ER_DUP_ENTRY: the event id is already in the table.
const ER_DUP_ENTRY: u16 = 1062;

/// Where a record is: `topic[partition]@offset`, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordAt {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
}

impl RecordAt {
    /// The coordinates of `record`.
    pub fn of(record: &impl Message) -> RecordAt {
        RecordAt { topic: record.topic().to_owned(), partition: record.partition(), offset: record.offset() }
    }
}

impl fmt::Display for RecordAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]@{}", self.topic, self.partition, self.offset)
    }
}

/// What [`Inbox::handle`] did with a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The side effect ran and committed with the event id; it returned `T`.
    Applied(T),
    /// The event id was already recorded: the side effect did not run.
    Skipped,
}

/// Why a record was not handled. Nothing was applied in any case.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The record has no `id` header (or a null one): it cannot be deduplicated, so it is not applied.
    #[error(
        "record {0} has no `id` header: it cannot be deduplicated and was not applied (outbox-cdc sets `id` on \
         every record; is another producer writing to this topic?)"
    )]
    MissingId(RecordAt),
    /// The `id` header is empty or longer than [`MAX_ID_BYTES`].
    #[error("record {at} has an `id` header of {len} bytes (1 to {MAX_ID_BYTES} allowed): not applied")]
    BadId {
        /// The record.
        at: RecordAt,
        /// The header's length.
        len: usize,
    },
    /// The table name is not a plain identifier.
    #[error("inbox table name {0:?} must be 1 to 64 ASCII letters, digits or underscores")]
    TableName(String),
    /// A statement of the inbox failed (connection lost, deadlock, lock wait timeout, missing table, …).
    #[error("inbox: {what}: {source}")]
    Database {
        /// What the inbox was doing, with the record where there is one.
        what: String,
        /// The client's error.
        source: mysql_async::Error,
    },
    /// The caller's side effect failed; its transaction was rolled back.
    #[error("side effect of event {id:?} ({at}) failed and was rolled back: {source}")]
    SideEffect {
        /// The event id (lossy UTF-8).
        id: String,
        /// The record.
        at: RecordAt,
        /// The side effect's error.
        source: Box<dyn StdError + Send + Sync>,
    },
    /// Committing the offset to Kafka failed (after the database commit: the record is applied, and will be
    /// skipped when delivered again).
    #[error("committing offset {} of {}[{}] to Kafka: {source}", .at.offset + 1, .at.topic, .at.partition)]
    Commit {
        /// The record whose successor offset was being committed.
        at: RecordAt,
        /// The client's error.
        source: KafkaError,
    },
}

/// The inbox of one consumer group: the table that records which event ids the group has applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbox {
    /// The consumer group (or any name for the consuming service): ids are deduplicated per group, so two
    /// services can share one table.
    group: String,
    /// The table, checked to be a plain identifier (it is spliced into SQL).
    table: String,
}

impl Inbox {
    /// The inbox of `group` in table [`DEFAULT_TABLE`].
    pub fn new(group: impl Into<String>) -> Inbox {
        Inbox { group: group.into(), table: DEFAULT_TABLE.to_owned() }
    }

    /// The inbox of `group` in `table` (in the connection's default database).
    ///
    /// # Errors
    /// [`InboxError::TableName`] unless `table` is 1–64 ASCII letters, digits or underscores.
    pub fn with_table(group: impl Into<String>, table: &str) -> Result<Inbox, InboxError> {
        let plain =
            !table.is_empty() && table.len() <= 64 && table.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !plain {
            return Err(InboxError::TableName(table.to_owned()));
        }
        Ok(Inbox { group: group.into(), table: table.to_owned() })
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table if it does not exist. `event_id` is `VARBINARY`: ids compare byte for byte (a
    /// case-insensitive collation would take `A1` for `a1`). The record's coordinates are `topic`,
    /// `kafka_partition` and `kafka_offset` (`PARTITION` is a reserved word); `consumed_at` is the server's
    /// time of the insert.
    ///
    /// # Errors
    /// [`InboxError::Database`] when the statement fails (e.g. no CREATE privilege).
    pub async fn ensure_table(&self, conn: &mut Conn) -> Result<(), InboxError> {
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS `{}` (
               consumer_group VARCHAR(255) NOT NULL,
               event_id VARBINARY({MAX_ID_BYTES}) NOT NULL,
               topic VARCHAR(249) NOT NULL,
               kafka_partition INT NOT NULL,
               kafka_offset BIGINT NOT NULL,
               consumed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
               PRIMARY KEY (consumer_group, event_id),
               KEY resume_point (consumer_group, topic, kafka_partition, kafka_offset)
             ) ENGINE=InnoDB",
            self.table
        );
        conn.query_drop(ddl).await.map_err(|source| database(format!("creating table {}", self.table), source))
    }

    /// Applies `record` exactly once: in one transaction, records its event id and runs `side_effect` on
    /// that transaction, then commits. An id already recorded rolls back before the side effect runs
    /// ([`Outcome::Skipped`]). Call [`commit_after`] when this returns `Ok`, whichever the outcome.
    ///
    /// `side_effect` must do all its work through the transaction it is given, and must not commit or roll
    /// it back.
    ///
    /// # Errors
    /// Nothing is applied on any error: [`InboxError::MissingId`] / [`InboxError::BadId`] (the record cannot
    /// be deduplicated: stop, never skip it); [`InboxError::SideEffect`] (rolled back); and
    /// [`InboxError::Database`] (handle the same record again once the database is back).
    pub async fn handle<T, E>(
        &self,
        conn: &mut Conn,
        record: &impl Message,
        side_effect: impl AsyncFnOnce(&mut Transaction<'_>) -> Result<T, E>,
    ) -> Result<Outcome<T>, InboxError>
    where
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        let at = RecordAt::of(record);
        let id = event_id(record)?;
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(|source| database(format!("starting the transaction for {at}"), source))?;
        let insert = format!(
            "INSERT INTO `{}` (consumer_group, event_id, topic, kafka_partition, kafka_offset) VALUES (?, ?, ?, ?, ?)",
            self.table
        );
        match tx.exec_drop(insert, (&self.group, id, &at.topic, at.partition, at.offset)).await {
            Ok(()) => {}
            Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => {
                tx.rollback().await.map_err(|source| database(format!("rolling back duplicate {at}"), source))?;
                return Ok(Outcome::Skipped);
            }
            Err(source) => return Err(database(format!("recording event id of {at}"), source)),
        }
        let value = match side_effect(&mut tx).await {
            Ok(value) => value,
            Err(e) => {
                // The rollback's own error adds nothing: the server rolls back when the connection goes.
                let _ = tx.rollback().await;
                return Err(InboxError::SideEffect {
                    id: String::from_utf8_lossy(id).into_owned(),
                    at,
                    source: e.into(),
                });
            }
        };
        tx.commit().await.map_err(|source| database(format!("committing {at}"), source))?;
        Ok(Outcome::Applied(value))
    }

    /// For each partition of `topic` this group has applied events from, the offset to resume at (the
    /// highest recorded offset + 1).
    ///
    /// # Errors
    /// [`InboxError::Database`] when the query fails.
    pub async fn positions(&self, conn: &mut Conn, topic: &str) -> Result<BTreeMap<i32, i64>, InboxError> {
        let query = format!(
            "SELECT kafka_partition, MAX(kafka_offset) + 1 FROM `{}` WHERE consumer_group = ? AND topic = ? \
             GROUP BY kafka_partition",
            self.table
        );
        let rows: Vec<(i32, i64)> = conn
            .exec(query, (&self.group, topic))
            .await
            .map_err(|source| database(format!("reading the resume points of {topic}"), source))?;
        Ok(rows.into_iter().collect())
    }

    /// A manual assignment of partitions `0..partitions` of `topic`, each starting where this group's
    /// applied events end ([`Inbox::positions`]), or else at the offset committed to Kafka
    /// ([`Offset::Stored`]; the consumer's `auto.offset.reset` when there is none). Pass it to
    /// `Consumer::assign`.
    ///
    /// # Errors
    /// [`InboxError::Database`] when the query fails.
    pub async fn assignment(
        &self,
        conn: &mut Conn,
        topic: &str,
        partitions: i32,
    ) -> Result<TopicPartitionList, InboxError> {
        let positions = self.positions(conn, topic).await?;
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions {
            let offset = positions.get(&partition).map_or(Offset::Stored, |&next| Offset::Offset(next));
            assignment.add_partition_offset(topic, partition, offset).expect("a new partition entry takes any offset");
        }
        Ok(assignment)
    }
}

/// Commits `record`'s successor offset (record offset + 1) to Kafka, synchronously. Call it only after
/// [`Inbox::handle`] returned `Ok`. Works with a group subscription and with a manual assignment (the
/// consumer needs a `group.id` either way).
///
/// # Errors
/// [`InboxError::Commit`]: the record stays applied; after a restart it is delivered again and skipped.
pub fn commit_after<C, X>(consumer: &C, record: &impl Message) -> Result<(), InboxError>
where
    C: Consumer<X>,
    X: ConsumerContext + 'static,
{
    let at = RecordAt::of(record);
    let mut offsets = TopicPartitionList::new();
    let commit = offsets
        .add_partition_offset(&at.topic, at.partition, Offset::Offset(at.offset + 1))
        .and_then(|()| consumer.commit(&offsets, CommitMode::Sync));
    commit.map_err(|source| InboxError::Commit { at, source })
}

/// The record's event id: the first `id` header, 1 to [`MAX_ID_BYTES`] bytes.
///
/// # Errors
/// [`InboxError::MissingId`] or [`InboxError::BadId`].
pub fn event_id<M: Message>(record: &M) -> Result<&[u8], InboxError> {
    let header = record.headers().and_then(|headers| headers.iter().find(|h| h.key == "id")).and_then(|h| h.value);
    let Some(id) = header else {
        return Err(InboxError::MissingId(RecordAt::of(record)));
    };
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(InboxError::BadId { at: RecordAt::of(record), len: id.len() });
    }
    Ok(id)
}

fn database(what: String, source: mysql_async::Error) -> InboxError {
    InboxError::Database { what, source }
}
