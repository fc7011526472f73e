//! # outbox-cdc
//!
//! Turns a MySQL/MariaDB transactional outbox into Kafka events. Services write a business row and an
//! outbox row in one local transaction; outbox-cdc tails the server's ROW binlog as a replication client,
//! decodes the inserts into the outbox table, routes each to a Kafka topic keyed by aggregate id, and
//! stores its binlog position only after Kafka has acknowledged every event up to it.
//!
//! See [`pipeline`] for the data flow. The same path also reads binlog files from disk instead of a server
//! (`[source] kind = "files"`, [`source::files`]) for forensics and disaster recovery.
//! For servers whose binlog the connector may not read, a polling relay (`[source] kind = "poll"`,
//! [`relay`]) reads unpublished rows of the table in the order of its sequence column, publishes them
//! through the same router and sink, and marks them `published_at`; one relay of a connector publishes at a
//! time, under the same lease as the binlog source's standby.
//!
//! # Delivery guarantee
//! - **No loss**: the checkpoint ([`checkpoint`]) is the end of the newest source transaction that Kafka
//!   acknowledged together with every earlier one. Whatever happens (kill -9, broker outage, database
//!   restart, network cut), the connector resumes from there.
//! - **At-least-once, bounded duplicates**: after a crash, only events after the last checkpoint can be
//!   published again. Each carries its stable event id in the `id` header for consumers to deduplicate.
//! - **Per-aggregate order**: events of one aggregate go to one partition (key = aggregate id, murmur2), in
//!   commit order, kept across retries by the idempotent producer: records never time out, and the first
//!   failed delivery purges the queue so that no later record of its partition gets through (gap-less
//!   idempotence, [`sink`]). There is no order across aggregates.
//!
//! # Checking the promise
//! [`ops::audit`] (`outbox-cdc audit`) compares the outbox table with the routed topics: missing ids, duplicates,
//! per-aggregate order. Every fault scenario of the test suite ends with it; the crash windows a random
//! kill -9 would hit only by luck are hit on purpose through [failpoints](mod@failpoint) (test builds only).
//!
//! # Poison rows
//! A row that cannot become a valid record never stops the stream and is never skipped: it goes to a
//! dead-letter topic and its aggregate is held until an operator releases it ([`quarantine`], [`ops::release`]),
//! so no consumer sees an aggregate's events out of order.
//!
//! # Operations
//! [`metrics`] and [`http`] (`/metrics`, `/healthz`, `/readyz`), purge-risk monitoring
//! ([`source::purge`]), and the operator commands in [`ops`] ([`ops::replay`], [`ops::prune`], …).
//!
//! # Error model
//! Every failure is transient (retry from the checkpoint) or definite (stop and tell the operator what to
//! fix); an error some code acts on beyond that (a lost lease, a fenced or failed producer, a refused record,
//! …) has an [`error::Kind`] that the code matches, never its message; see [`error`].

// These docs are for the connector's maintainers, read with `cargo doc --document-private-items`: module
// essays link to the private items they explain.
#![allow(rustdoc::private_intra_doc_links)]

pub mod allocator;
pub mod app;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod findings;
pub mod health;
pub mod http;
pub mod kafka;
pub mod lease;
pub mod metrics;
pub mod ops;
pub mod outbox;
pub mod pipeline;
pub mod poison;
pub mod position;
pub mod progress;
pub mod publish;
pub mod quarantine;
pub mod relay;
pub mod router;
pub mod scheduling;
pub mod schema;
pub mod secret;
pub mod sink;
pub mod source;
pub mod telemetry;
pub mod time;
pub mod topic;
