//! The lease's one owner in a running connector: takes it (waiting as a standby), takes it again after it
//! was lost, and releases it when the connector stops (see [`crate::lease`]).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::pipeline::Shutdown;
use crate::source::SourceConn;

/// This instance's hold on the connector's lease, across runs: only the holder runs.
pub(super) struct Tenure {
    /// The connector's `[state] name`: the lock's name.
    name: String,
    /// The configuration's fingerprint: a standby says when the holder runs another configuration.
    fingerprint: u32,
    /// `failover_timeout_ms`.
    failover: Duration,
    /// The lease while this instance holds it, or held it until it was lost.
    lease: Option<Lease>,
}

impl Tenure {
    /// A tenure of the lease `name` (nothing held yet).
    pub(super) fn new(name: String, fingerprint: u32, failover: Duration) -> Tenure {
        Tenure { name, fingerprint, failover, lease: None }
    }

    /// The lease, for the next run: the one held, or (after releasing one that was lost) a new one, waited
    /// for as a standby. `Ok(None)` when shutdown comes first.
    ///
    /// A lease held from before is first checked against the server `source` leads to now, before the run
    /// fences anything: after a switchover behind a DNS name or a proxy, with the old primary still up, the
    /// lease would stay on the old server while the run's connections reach the new one. Then the run could
    /// not start (its binlog connection reaches another server), and a standby that reached the new server
    /// would take its lock there and be fenced by this instance at every retry. So the lease is released,
    /// and the next run takes it where `source` leads, as a standby if another instance holds it there.
    ///
    /// # Errors
    /// As [`Lease::acquire_as`]; transient, with the lease released, when `source` reaches another server
    /// than the one it is held on.
    pub(super) async fn hold(&mut self, source: &SourceConn, shutdown: &Shutdown) -> Result<Option<&Lease>> {
        if let Some(lost) = self.lease.take_if(|l| !l.is_held()) {
            lost.release().await;
        }
        if let Some(held) = &self.lease {
            let reached = crate::lease::server_reached_by(source).await?;
            if !held.server().is(reached.server_id, reached.server_uuid.as_deref()) {
                let held_on = held.server().to_string();
                if let Some(lease) = self.lease.take() {
                    lease.release().await;
                }
                return Err(Error::lease_elsewhere(format!(
                    "source.host now leads to {reached}, but the lease is held on {held_on} (a switchover, the old \
                     server still up, or a name that leads to more than one server): released it before \
                     anything was fenced; the next run takes the lease on {reached}"
                )));
            }
        }
        if self.lease.is_none() {
            let fingerprint = Some(self.fingerprint);
            match Lease::acquire_as(source, &self.name, fingerprint, self.failover, shutdown.requested()).await? {
                Some(acquired) => self.lease = Some(acquired),
                None => return Ok(None),
            }
        }
        Ok(self.lease.as_ref())
    }

    /// Releases the lease, if held: a standby takes over at once instead of after the server noticed this
    /// process is gone.
    pub(super) async fn release(self) {
        if let Some(lease) = self.lease {
            lease.release().await;
        }
    }
}

/// Runs `run` until it ends, or until `lease` is lost: then the run is dropped, which drops its producer,
/// which purges what it has not sent.
///
/// # Errors
/// The run's error, or a transient one saying the lease was lost.
pub(super) async fn while_held<T>(lease: &Lease, run: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::select! {
        result = run => result,
        reason = lease.lost() => {
            let error = Error::lease_lost(format!("lease lost ({reason}): stopped publishing; waiting as a standby"));
            // Not ready until it holds the lease and runs again.
            crate::health::health().pipeline_failed(&error);
            Err(error)
        }
    }
}
