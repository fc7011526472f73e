//! The purge watch: how close the server is to deleting binlogs the stored checkpoint still needs.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::checkpoint::Store;
use crate::source::SourceConn;

/// Measures the purge risk of the stored checkpoint every `interval` on a connection of its own, exports
/// it, and warns once per crossing of `warn_ratio` (and at every reading while above it, at most hourly).
pub(super) async fn watch_purge_risk(
    source: SourceConn,
    store: watch::Receiver<Option<Arc<Store>>>,
    interval: Duration,
    warn_ratio: f64,
) {
    const REMIND_EVERY: Duration = Duration::from_secs(3600);
    let mut conn = None;
    let mut warned_at: Option<Instant> = None;
    // The first reading comes soon after start: a connector restarted after a long outage is the case
    // that matters most.
    let mut delay = Duration::from_secs(5).min(interval);
    loop {
        tokio::time::sleep(delay).await;
        delay = interval;
        let current = store.borrow().clone();
        let Some(Ok(Some(checkpoint))) = current.map(|s| s.load()) else { continue };
        if conn.is_none() {
            match source.connect().await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "purge-risk check: cannot connect");
                    continue;
                }
            }
        }
        let now_s = crate::time::now_ms() / 1000;
        let c = conn.as_mut().expect("connected above");
        match crate::source::purge::measure(c, checkpoint.position(), checkpoint.source_timestamp(), now_s).await {
            Ok(risk) => {
                crate::metrics::metrics().purge_risk(
                    risk.needed_age_seconds,
                    risk.needed_bytes,
                    risk.retention_seconds,
                    risk.ratio(),
                );
                if risk.ratio() >= warn_ratio {
                    if warned_at.is_none_or(|at| at.elapsed() >= REMIND_EVERY) {
                        tracing::warn!(
                            position = %checkpoint.position(),
                            "purge risk {risk}: the server may soon delete binlogs the connector still needs. \
                             Let the connector catch up (see the lag metrics), or raise the server's binlog retention \
                             (`outbox-cdc check` prints how on this server)"
                        );
                        warned_at = Some(Instant::now());
                    }
                } else {
                    warned_at = None;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "purge-risk check failed");
                conn = None;
            }
        }
    }
}
