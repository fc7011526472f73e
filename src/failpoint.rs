//! Failpoints: named places where a test build crashes the process, to prove each crash window.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! `failpoint!("name")` compiles to nothing unless the crate is built with the `failpoints` feature
//! (off by default; release builds never carry it). With the feature, it reads `OUTBOX_CDC_FAILPOINT`
//! once per process: a comma-separated list of `name` or `name:nth`. On the `nth` hit of a listed point
//! (default: the first) the process prints one line to stderr and calls [`std::process::abort`]: no
//! destructor runs, no buffer is flushed, nothing is acknowledged or checkpointed any more, like `kill -9`.
//!
//! # The points
//! | name | where | window it proves |
//! | --- | --- | --- |
//! | `before_produce` | a source row was read, before it is handed to the producer | read but not produced |
//! | `row_produced` | after each streamed row is handed to the producer (use `:nth` for a large transaction) | mid-transaction |
//! | `ack_before_checkpoint` | the watermark moved (Kafka acknowledged), before the checkpoint write | acknowledged, not checkpointed |
//! | `checkpoint_write` | inside the checkpoint store's write transaction, before its commit | mid checkpoint write |
//! | `snapshot_row` | after each snapshot row is handed to the producer (use `:nth` to land mid-chunk) | mid snapshot chunk |
//! | `before_kafka_commit` | `exactly_once`: the checkpoint is in the open Kafka transaction, before its commit | events and checkpoint produced, not committed |
//! | `after_kafka_commit` | `exactly_once`: right after a Kafka transaction committed | committed, nothing local done |
//! | `shutdown_drained` | graceful stop: after the final drain, before the final checkpoint | during shutdown |
//!
//! # Why our own and not the `fail` crate
//! We need exactly one action (crash), selected by one environment variable in a child process; twenty
//! lines cover it without a dependency or a registry to configure.

/// Crashes the process here when the `failpoints` feature is on and `OUTBOX_CDC_FAILPOINT` names this
/// point (see [`crate::failpoint`](mod@crate::failpoint)); nothing at all otherwise.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        $crate::failpoint::hit($name);
    };
}

/// The environment variable that arms failpoints: `name[:nth][,name[:nth]...]`.
pub const ENV: &str = "OUTBOX_CDC_FAILPOINT";

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// Armed points: (name, crash on this hit, hits so far).
    static ARMED: OnceLock<Vec<(String, u64, AtomicU64)>> = OnceLock::new();

    fn parse(spec: &str) -> Vec<(String, u64, AtomicU64)> {
        spec.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.split_once(':') {
                Some((name, nth)) => (name.to_string(), nth.parse().unwrap_or(1).max(1), AtomicU64::new(0)),
                None => (s.to_string(), 1, AtomicU64::new(0)),
            })
            .collect()
    }

    /// Counts a hit of `name`; aborts the process on the armed hit.
    pub fn hit(name: &str) {
        let armed = ARMED.get_or_init(|| std::env::var(super::ENV).map(|s| parse(&s)).unwrap_or_default());
        for (point, nth, hits) in armed {
            if point == name && hits.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
                eprintln!("failpoint {name} hit #{nth}: aborting the process");
                std::process::abort();
            }
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn specs_parse_with_default_nth() {
            let parsed: Vec<(String, u64)> = super::parse("a, b:3,c:0,").into_iter().map(|(n, k, _)| (n, k)).collect();
            assert_eq!(parsed, [("a".into(), 1), ("b".into(), 3), ("c".into(), 1)]);
        }
    }
}

#[cfg(feature = "failpoints")]
pub use armed::hit;
