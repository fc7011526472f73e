//! `[poll]`: the polling relay's settings.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::time::Duration;

use serde::Deserialize;

use super::{millis, KafkaConfig, SourceKind};
use crate::error::{Error, Result};
use crate::outbox::TableName;

/// `[poll]`: the polling relay (`source.kind = "poll"`), for servers whose binlog the connector may not read.
///
/// One relay of a connector (`[state] name`) is active at a time, holding the lease on the source server
/// that the binlog source's standby uses ([`crate::lease`]); the others wait and take over within
/// `[delivery] failover_timeout_ms`. The active relay reads unpublished rows (`published_at IS NULL`) in the
/// order of the table's sequence column, publishes them, and once Kafka acknowledged them sets
/// `published_at`, one statement per batch (see `relay`).
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "PollConfigToml")]
pub struct PollConfig {
    /// How an aggregate's events are ordered: "sequence" (default: the table's `AUTO_INCREMENT` column,
    /// insertion order; a table without one is refused with the `ALTER TABLE` that adds it) or
    /// "occurred_at" (`occurred_at`, then `id`: events that share a timestamp come out in id order, and
    /// writers with skewed clocks reorder an aggregate's events; every read also looks again at all
    /// unpublished rows, which costs more with many parked rows).
    pub order: PollOrder,
    /// The longest pause between reads while the table has nothing unpublished, in milliseconds: after an
    /// empty read the relay waits a sixteenth of it, doubling up to it, so an idle relay costs the
    /// database one statement per interval, and the first event after a quiet spell waits at most one
    /// interval. While rows keep coming, reads follow each other without pause. Between 16 and 3600000;
    /// default 1500: with the lease's renewal (one statement every `failover_timeout_ms / 6`, 0.2/s by
    /// default) an idle relay stays under one statement a second.
    pub poll_interval: Duration,
    /// Rows read per statement, and the most marked published by one statement. Between 1 and 10000;
    /// default 1000.
    pub batch_rows: usize,
    /// No longer used: the relay takes over from a dead one after `[delivery] failover_timeout_ms`, and
    /// leases no rows. Accepted so that older files still load.
    pub lease_ms: Option<u64>,
    /// No longer used: a record the broker refuses for good is dead-lettered at once, as with the binlog
    /// source (its row's `attempts` counts the refusal), and an unreachable or slow broker is waited out,
    /// never counted. Accepted so that older files still load.
    pub max_attempts: Option<u32>,
    /// This relay's name in logs and in the lease (who holds it). Default: the host name and the process id
    /// (`host:pid`). Up to 128 characters.
    pub relay_id: Option<String>,
    /// Publish in Kafka transactions (default false), so that a relay that lost its lease is fenced at the
    /// broker: the producer's `transactional.id` is `[delivery] transactional_id` (default `[state] name`),
    /// shared by the relays of one connector, and the one that takes over fences the one before, whose
    /// open transaction is aborted and whose later records are refused. Without it, a relay paused past
    /// its lease (a VM freeze) can still send the records it had handed to its producer after its
    /// successor's: late duplicates that consumers applying events in order see as a step back. Needs a
    /// broker with transactions, and consumers reading with `isolation.level = read_committed` (the
    /// default of librdkafka and of the Java client's Kafka Streams with exactly-once; the Java consumer's
    /// default is `read_uncommitted`). Rows are marked published once their transaction committed.
    pub transactional: bool,
    /// The table that records how far each outbox table is published (`"database.table"`, or a table
    /// name in the first outbox table's database). Without it (default) the relay marks every row it
    /// published (`published_at`): one row write per event. With it, the relay writes one number per batch
    /// instead, `published_through`: every row with a sequence number up to it is published. Rows it
    /// publishes above a number not yet settled (a transaction still open that took it, a parked row) are
    /// still marked one by one. Needs the sequence order and the table (`check` prints its `CREATE TABLE`).
    /// The `PROCESS` privilege is every relay's, with the table or without: the relay reads
    /// `information_schema.INNODB_TRX` to know when every transaction that could still commit a skipped
    /// number has ended. See README, the polling relay.
    /// Parsed once, by [`PollConfig::validate`]; written `progress_table`.
    pub progress: PollProgress,
    /// `progress_table` as written, until [`PollConfig::validate`] parses it into `progress`.
    progress_table: Option<String>,
    /// Whether the file has a `[poll]` table (only meaningful with `source.kind = "poll"`).
    set: bool,
}

/// `[poll] order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PollOrder {
    /// The table's `AUTO_INCREMENT` column: insertion order.
    #[default]
    Sequence,
    /// `occurred_at`, then the event id.
    OccurredAt,
}

/// `[poll] progress_table`, parsed: how the relay records what it published. The relay gives each its
/// behaviour (`relay::progress::Progress`); nothing else asks which it is but for the table's name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PollProgress {
    /// No progress table (the default): the relay marks every row it published (`published_at`).
    #[default]
    Marking,
    /// The progress table, its bare name resolved to the first outbox table's database: one number per
    /// outbox table, every row with a sequence number up to which is published.
    Table(TableName),
}

impl PollProgress {
    /// The progress table, when there is one.
    pub fn table(&self) -> Option<&TableName> {
        match self {
            PollProgress::Marking => None,
            PollProgress::Table(table) => Some(table),
        }
    }
}

/// `[poll]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PollConfigToml {
    #[serde(default)]
    order: PollOrder,
    #[serde(rename = "poll_interval_ms", default = "default_poll_interval", deserialize_with = "millis")]
    poll_interval: Duration,
    #[serde(default = "default_poll_batch_rows")]
    batch_rows: usize,
    #[serde(default)]
    lease_ms: Option<u64>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    relay_id: Option<String>,
    #[serde(default)]
    transactional: bool,
    #[serde(default)]
    progress_table: Option<String>,
}

impl From<PollConfigToml> for PollConfig {
    fn from(t: PollConfigToml) -> Self {
        PollConfig {
            order: t.order,
            poll_interval: t.poll_interval,
            batch_rows: t.batch_rows,
            lease_ms: t.lease_ms,
            max_attempts: t.max_attempts,
            relay_id: t.relay_id,
            transactional: t.transactional,
            progress: PollProgress::Marking,
            progress_table: t.progress_table,
            set: true,
        }
    }
}

impl Default for PollConfig {
    fn default() -> Self {
        PollConfig {
            order: PollOrder::default(),
            poll_interval: default_poll_interval(),
            batch_rows: default_poll_batch_rows(),
            lease_ms: None,
            max_attempts: None,
            relay_id: None,
            transactional: false,
            progress: PollProgress::Marking,
            progress_table: None,
            set: false,
        }
    }
}

impl PollConfig {
    /// `relay_id`, or `host:pid` (the host name from the kernel, `HOSTNAME`, else `localhost`).
    pub fn relay_id(&self) -> String {
        if let Some(id) = &self.relay_id {
            return id.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let pid = std::process::id().to_string();
        let host: String = host.chars().take(127 - pid.len()).collect();
        format!("{host}:{pid}")
    }

    /// The keys this file sets that no longer do anything, for a warning at start.
    pub fn ignored_keys(&self) -> Vec<&'static str> {
        [("lease_ms", self.lease_ms.is_some()), ("max_attempts", self.max_attempts.is_some())]
            .into_iter()
            .filter_map(|(key, set)| set.then_some(key))
            .collect()
    }
}

fn default_poll_interval() -> Duration {
    Duration::from_millis(1_500)
}
fn default_poll_batch_rows() -> usize {
    1_000
}

impl PollConfig {
    /// `[poll]`: only with `source.kind = "poll"` (a `[poll]` table elsewhere is a misunderstanding), and
    /// with bounds that keep the relay's load and its lease meaningful. Parses `progress_table` into
    /// `progress`: a bare name is in the first of `tables` (the outbox tables, never empty).
    pub(super) fn validate(&mut self, kind: SourceKind, kafka: &KafkaConfig, tables: &[TableName]) -> Result<()> {
        if kind != SourceKind::Poll {
            if self.set {
                return Err(Error::definite("[poll] applies only with source.kind = \"poll\""));
            }
            return Ok(());
        }
        if !(1..=10_000).contains(&self.batch_rows) {
            return Err(Error::definite("poll.batch_rows must be between 1 and 10000"));
        }
        if !(16..=3_600_000).contains(&self.poll_interval.as_millis()) {
            return Err(Error::definite("poll.poll_interval_ms must be between 16 and 3600000"));
        }
        if self.transactional {
            // The relay's transactions commit back to back; only the timeout's bounds apply.
            kafka.transaction_timeout_ms()?;
        }
        if let Some(table) = &self.progress_table {
            if self.order != PollOrder::Sequence {
                return Err(Error::definite(
                    "poll.progress_table needs [poll] order = \"sequence\": the number it records is a sequence \
                     number",
                ));
            }
            if table.is_empty() || table.split('.').count() > 2 || table.split('.').any(str::is_empty) {
                return Err(Error::definite(format!(
                    "poll.progress_table = {table:?}: write it as \"database.table\" or \"table\""
                )));
            }
            self.progress = PollProgress::Table(match table.split_once('.') {
                Some((database, table)) => TableName { database: database.into(), table: table.into() },
                None => TableName { database: tables[0].database.clone(), table: table.clone() },
            });
        }
        match &self.relay_id {
            Some(id) if id.is_empty() || id.len() > 128 => {
                Err(Error::definite("poll.relay_id must be 1 to 128 characters"))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;
    use crate::config::*;

    const POLL: &str = r#"
        [source]
        kind = "poll"
        host = "127.0.0.1"
        user = "relay"
        [outbox]
        table = "shop.outbox_events"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
        [snapshot]
        mode = "never"
    "#;

    /// `kind = "poll"` takes the connection settings without `server_id`, `[poll]` gets defaults and
    /// bounds, and `[poll]` is refused with the binlog sources (a relay config pointed at the wrong kind).
    #[test]
    fn poll_source_settings_are_validated() {
        let c = Config::parse(POLL).unwrap();
        assert!(matches!(c.source.kind, Source::Poll(_)), "{:?}", c.source.kind);
        let p = &c.poll;
        assert_eq!(
            (p.order, p.poll_interval, p.batch_rows),
            (PollOrder::Sequence, Duration::from_millis(1_500), 1_000)
        );
        assert!(p.ignored_keys().is_empty());
        let id = p.relay_id();
        assert!(id.ends_with(&format!(":{}", std::process::id())) && id.len() <= 128, "{id}");
        let with = |extra: &str| Config::parse(&format!("{POLL}\n[poll]\n{extra}\n"));
        let c = with(
            "order = \"occurred_at\"\npoll_interval_ms = 50\nbatch_rows = 20\nrelay_id = \"r1\"\nlease_ms = 5000\nmax_attempts = 3",
        )
        .unwrap();
        assert_eq!(
            (c.poll.order, c.poll.poll_interval, c.poll.batch_rows, c.poll.relay_id()),
            (PollOrder::OccurredAt, Duration::from_millis(50), 20, "r1".to_string())
        );
        assert_eq!(c.poll.ignored_keys(), ["lease_ms", "max_attempts"], "older files load, with a warning");
        assert!(!p.transactional && with("transactional = true").unwrap().poll.transactional);
        assert_eq!(p.progress, PollProgress::Marking);
        let named = |database: &str, table: &str| TableName { database: database.into(), table: table.into() };
        assert_eq!(
            with("progress_table = \"other.p\"").unwrap().poll.progress,
            PollProgress::Table(named("other", "p"))
        );
        // A bare name is in the first outbox table's database.
        assert_eq!(with("progress_table = \"p\"").unwrap().poll.progress, PollProgress::Table(named("shop", "p")));
        let timeout = POLL.replace("[kafka]", "[kafka]\nproperties = { \"transaction.timeout.ms\" = \"soon\" }");
        let e = Config::parse(&format!("{timeout}\n[poll]\ntransactional = true\n")).unwrap_err().to_string();
        assert!(e.contains("\"transaction.timeout.ms\" = \"soon\" is not a number"), "{e}");
        let cases: &[(&str, &str)] = &[
            ("poll_interval_ms = 10", "poll.poll_interval_ms"),
            ("batch_rows = 0", "poll.batch_rows"),
            ("relay_id = \"\"", "poll.relay_id"),
            ("order = \"random\"", "unknown variant `random`"),
            ("lease = 5", "unknown field `lease`"),
            ("progress_table = \"a.b.c\"", "write it as"),
            ("progress_table = \"p\"\norder = \"occurred_at\"", "needs [poll] order = \"sequence\""),
        ];
        for (extra, expected) in cases {
            let e = with(extra).unwrap_err().to_string();
            assert!(e.contains(expected), "{extra}: {e}");
        }
        // The default snapshot mode fits the relay (it publishes every unpublished row); the modes that
        // promise more are refused.
        assert!(Config::parse(&POLL.replace("mode = \"never\"", "mode = \"initial\"")).is_ok());
        assert!(Config::parse(&POLL.replace("[snapshot]\n        mode = \"never\"", "")).is_ok());
        let refusals: &[(String, &str)] = &[
            (POLL.replace("user = \"relay\"", "user = \"relay\"\nserver_id = 7"), "remove it"),
            (POLL.replace("host = \"127.0.0.1\"", ""), "source.host and source.user are required"),
            (POLL.replace("mode = \"never\"", "mode = \"when_needed\""), "has nothing to do"),
            (POLL.replace("kind = \"poll\"", "kind = \"poll\"\nbinlog_dir = \"/b\""), "only with"),
            (format!("{MINIMAL}\n[poll]\nbatch_rows = 5\n"), "[poll] applies only with source.kind = \"poll\""),
        ];
        for (text, expected) in refusals {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}\n{text}");
        }
    }
}
