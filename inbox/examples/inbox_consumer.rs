//! A consumer that applies each outbox event exactly once, with the inbox ([`outbox_cdc_inbox`]):
//! `cargo run -p outbox-cdc-inbox --example inbox_consumer -- <bootstrap_servers> <topic> <group> <mysql_url>`.
//!
//! Each record is a deposit in outbox-cdc's default envelope: `aggregate_id` is the account, `data.amount`
//! an integer. The side effect, in the inbox's transaction: a row in `applied_effects` (a journal with no
//! unique key, so a second application would show) and the account's balance in `accounts`. The Kafka
//! offset is committed after the database commit. Partitions are assigned manually, resuming where the
//! `consumed_events` table says this group got to (no group rebalance after a crash). Prints one line per
//! record; SIGTERM or Ctrl-C stops it between records (exit 0). A record it cannot apply (no `id` header,
//! a payload that is not a deposit) stops it with exit 1 before that record's offset is committed.

use std::error::Error;
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use outbox_cdc_inbox::{commit_after, Inbox, Outcome};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::ClientConfig;
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str = "usage: inbox_consumer <bootstrap_servers> <topic> <group> <mysql_url>";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args).await {
        eprintln!("inbox_consumer: {e}");
        std::process::exit(1);
    }
}

/// The consumer: runs until SIGTERM/SIGINT (`Ok`) or a record it cannot apply (`Err`).
pub async fn run(args: &[String]) -> Result<(), Box<dyn Error>> {
    let [bootstrap, topic, group, mysql_url] = args else {
        return Err(USAGE.into());
    };
    let mut conn = Conn::new(Opts::from_url(mysql_url)?).await?;
    let inbox = Inbox::new(group.as_str());
    inbox.ensure_table(&mut conn).await?;
    ensure_business_tables(&mut conn).await?;

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "50")
        .create()?;
    let metadata = tokio::task::block_in_place(|| consumer.fetch_metadata(Some(topic), Duration::from_secs(10)))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    if partitions == 0 {
        return Err(format!("topic {topic} has no partitions (does it exist?)").into());
    }
    let assignment = inbox.assignment(&mut conn, topic, partitions).await?;
    consumer.assign(&assignment)?;
    println!("resuming {topic} for group {group} at {:?}", assignment.to_topic_map());

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let (mut applied, mut skipped) = (0u64, 0u64);
    loop {
        let record = tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            record = consumer.recv() => record?,
        };
        let deposit = Deposit::of(&record);
        let outcome = inbox
            .handle(&mut conn, &record, async |tx| {
                let Deposit { id, account, amount } = deposit?;
                tx.exec_drop(
                    "INSERT INTO applied_effects (event_id, account, amount) VALUES (?, ?, ?)",
                    (&id, &account, amount),
                )
                .await?;
                tx.exec_drop(
                    "INSERT INTO accounts (account, balance) VALUES (?, ?) \
                     ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)",
                    (&account, amount),
                )
                .await?;
                Ok::<_, Box<dyn Error + Send + Sync>>(())
            })
            .await?;
        tokio::task::block_in_place(|| commit_after(&consumer, &record))?;
        let verb = match outcome {
            Outcome::Applied(()) => {
                applied += 1;
                "applied"
            }
            Outcome::Skipped => {
                skipped += 1;
                "skipped"
            }
        };
        println!("{verb} {}[{}]@{}", record.topic(), record.partition(), record.offset());
    }
    println!("stopped: {applied} applied, {skipped} skipped (duplicates) in this run");
    Ok(())
}

/// The business tables the side effect writes.
async fn ensure_business_tables(conn: &mut Conn) -> Result<(), mysql_async::Error> {
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS applied_effects (
           seq BIGINT AUTO_INCREMENT PRIMARY KEY,
           event_id VARBINARY(255) NOT NULL,
           account VARCHAR(64) NOT NULL,
           amount BIGINT NOT NULL,
           applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
         ) ENGINE=InnoDB",
    )
    .await?;
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS accounts (
           account VARCHAR(64) PRIMARY KEY,
           balance BIGINT NOT NULL
         ) ENGINE=InnoDB",
    )
    .await
}

/// One deposit, read from an envelope record (`event_id`, `aggregate_id`, `data.amount`).
struct Deposit {
    /// The event id.
    id: String,
    /// The account (the aggregate id).
    account: String,
    /// The amount, in the account's smallest unit.
    amount: i64,
}

impl Deposit {
    /// The deposit in `record`'s value, or why it is not one (the inbox then rolls back and stops).
    fn of(record: &impl Message) -> Result<Deposit, Box<dyn Error + Send + Sync>> {
        let value: serde_json::Value = serde_json::from_slice(record.payload().unwrap_or_default())?;
        let field = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        let (Some(id), Some(account), Some(amount)) =
            (field("event_id"), field("aggregate_id"), value.pointer("/data/amount").and_then(|v| v.as_i64()))
        else {
            return Err(format!("not a deposit envelope (event_id, aggregate_id, data.amount): {value}").into());
        };
        Ok(Deposit { id, account, amount })
    }
}
