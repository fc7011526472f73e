//! Prints the records of a topic (all partitions, from the beginning), as the demo and operators use it:
//! `cargo run --example consume -- <bootstrap> <topic> [--follow]`.
//! No consumer group: partitions are assigned directly, so nothing is committed to the broker.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(bootstrap), Some(topic)) = (args.first(), args.get(1)) else {
        eprintln!("usage: consume <bootstrap_servers> <topic> [--follow]");
        std::process::exit(2);
    };
    let follow = args.iter().any(|a| a == "--follow");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "outbox-cdc-consume-example")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "50")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map(|t| t.partitions().len()).unwrap_or(0);
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        assignment.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let mut last = Instant::now();
    let mut count = 0usize;
    while follow || last.elapsed() < Duration::from_secs(3) {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last = Instant::now();
                count += 1;
                let headers: Vec<String> = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| format!("{}={}", h.key, String::from_utf8_lossy(h.value.unwrap_or_default())))
                            .collect()
                    })
                    .unwrap_or_default();
                println!(
                    "{}[{}]@{} key={} headers=[{}]\n  {}",
                    m.topic(),
                    m.partition(),
                    m.offset(),
                    String::from_utf8_lossy(m.key().unwrap_or_default()),
                    headers.join(", "),
                    String::from_utf8_lossy(m.payload().unwrap_or_default())
                );
            }
            Some(Err(e)) => eprintln!("consume error: {e}"),
            None => {}
        }
    }
    eprintln!("{count} record(s) in {topic}");
    Ok(())
}
