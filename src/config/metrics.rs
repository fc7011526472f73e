//! `[metrics]`: the operations endpoint and purge-risk monitoring.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::time::Duration;

use serde::Deserialize;

use super::{default_true, millis};
use crate::error::{Error, Result};

/// `[metrics]`: the HTTP operations endpoint and purge-risk monitoring.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `/metrics` (Prometheus/OpenMetrics text), `/healthz` and `/readyz`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Address of the endpoint. Keep it on loopback or a private network: it has no authentication.
    #[serde(default = "default_metrics_listen")]
    pub listen: std::net::SocketAddr,
    /// How often the server's binlog list and retention are read to measure the purge risk.
    #[serde(rename = "purge_check_interval_ms", default = "default_purge_check_interval", deserialize_with = "millis")]
    pub purge_check_interval: Duration,
    /// Log a warning when the oldest binlog the connector still needs has used this fraction of the
    /// server's retention (`binlog_expire_logs_seconds`): at 1.0 the server may delete it, and resuming
    /// then needs a new snapshot.
    #[serde(default = "default_purge_warn_ratio")]
    pub purge_warn_ratio: f64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            listen: default_metrics_listen(),
            purge_check_interval: default_purge_check_interval(),
            purge_warn_ratio: default_purge_warn_ratio(),
        }
    }
}

fn default_metrics_listen() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 9187))
}

fn default_purge_check_interval() -> Duration {
    Duration::from_millis(60_000)
}

fn default_purge_warn_ratio() -> f64 {
    0.5
}

impl MetricsConfig {
    /// Checks the section on its own.
    pub(super) fn validate(&self) -> Result<()> {
        if self.purge_warn_ratio.is_nan() || self.purge_warn_ratio <= 0.0 {
            return Err(Error::definite("metrics.purge_warn_ratio must be > 0 (e.g. 0.5)"));
        }
        Ok(())
    }
}
