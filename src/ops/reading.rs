//! Reading topics to their end, for the commands that must see all of a topic (`audit`, `quarantine
//! release`).
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.

/// Where a consumer will read next in each assigned partition: `(topic, partition, offset)`. A
/// `read_committed` consumer of a transactional topic (`exactly_once`) moves past commit markers and aborted
/// records, offsets at which no record is ever returned: a reader that waits for a record at the end
/// offset minus one would wait for ever, this position is where it really is.
pub(crate) fn consumer_positions(consumer: &rdkafka::consumer::BaseConsumer) -> Vec<(String, i32, i64)> {
    use rdkafka::consumer::Consumer;
    let Ok(positions) = consumer.position() else { return Vec::new() };
    positions
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            rdkafka::Offset::Offset(at) => Some((e.topic().to_string(), e.partition(), at)),
            _ => None,
        })
        .collect()
}
