//! The broker probe: keeps `outbox_cdc_ready`'s broker half honest while the producer is idle.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.

use std::time::Duration;

use rdkafka::producer::Producer;

use super::delivery::SinkProducer;
use crate::health::health;

/// Keeps the readiness metric honest while the producer is idle (librdkafka only connects when it has
/// something to send): a metadata request every few seconds, for as long as the producer lives.
///
/// The request names one topic of ours that exists ([`probe_topic`]): any answer proves a broker is there,
/// and a request without a topic (`fetch_metadata(None)`, the probe's only request before) lists every
/// topic of the cluster, every 5 s from every connector. Only until the connector has a topic of its own
/// known to exist is the whole listing asked for, and it tells whether the dead-letter topic exists.
pub(super) async fn probe_brokers(producer: std::sync::Weak<SinkProducer>, dead_letter_topic: String) {
    const EVERY: Duration = Duration::from_secs(5);
    let mut dead_letter_topic_exists = false;
    loop {
        let Some(p) = producer.upgrade() else { return };
        let topic = {
            let checked = p.context().topic_limits.read().unwrap_or_else(|e| e.into_inner());
            probe_topic(checked.keys().map(String::as_str), &dead_letter_topic, dead_letter_topic_exists)
                .map(str::to_string)
        };
        let dlq = dead_letter_topic.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let metadata = p.client().fetch_metadata(topic.as_deref(), EVERY).ok()?;
            Some(topic.is_none() && metadata.topics().iter().any(|t| t.name() == dlq && t.error().is_none()))
        })
        .await
        .ok()
        .flatten();
        dead_letter_topic_exists |= answer == Some(true);
        health().set_broker_connected(answer.is_some());
        tokio::time::sleep(EVERY).await;
    }
}

/// The topic the broker probe asks about; `None` asks for all of them.
///
/// Only a topic known to exist: a routed topic the sink has checked (it made sure the topic exists; the
/// first by name, so the probe keeps to one), else the dead-letter topic once a listing showed it. Never
/// a topic that may be missing: librdkafka keeps a handle for every topic named to a producer and asks
/// about a missing one's metadata every second for good (measured with `debug = "metadata"`: two one-topic
/// requests a second), which would cost more than the listing it replaces.
fn probe_topic<'a>(
    checked: impl Iterator<Item = &'a str>,
    dead_letter_topic: &'a str,
    dead_letter_topic_exists: bool,
) -> Option<&'a str> {
    let (mut routed, mut dead_letter_checked) = (None, false);
    for topic in checked {
        match topic == dead_letter_topic {
            true => dead_letter_checked = true,
            false => routed = Some(routed.map_or(topic, |first: &str| first.min(topic))),
        }
    }
    routed.or((dead_letter_checked || dead_letter_topic_exists).then_some(dead_letter_topic))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression guard for `/readyz`'s broker probe listing every topic of the cluster every 5 s: it names
    /// one topic of ours known to exist, and lists all only while it has none.
    #[test]
    fn the_broker_probe_names_one_topic_known_to_exist() {
        let order = "outbox.event.order";
        let cases: &[(&[&str], bool, Option<&str>, &str)] = &[
            (&[], false, None, "nothing known to exist yet: the listing"),
            (&[], true, Some("dlq"), "a listing showed the dead-letter topic"),
            (&["dlq"], false, Some("dlq"), "the sink checked the dead-letter topic"),
            (&[order], false, Some(order), "a checked routed topic"),
            (&["dlq", order], true, Some(order), "a routed topic before the dead-letter topic"),
            (&["outbox.event.user", order], false, Some(order), "the first by name, in any order"),
        ];
        for &(checked, dlq_exists, expected, why) in cases {
            assert_eq!(probe_topic(checked.iter().copied(), "dlq", dlq_exists), expected, "{why}");
        }
    }
}
