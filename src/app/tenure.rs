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
    /// # Errors
    /// As [`Lease::acquire_as`].
    pub(super) async fn hold(&mut self, source: &SourceConn, shutdown: &Shutdown) -> Result<Option<&Lease>> {
        if let Some(lost) = self.lease.take_if(|l| !l.is_held()) {
            lost.release().await;
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
pub(super) async fn while_held(lease: &Lease, run: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::select! {
        result = run => result,
        reason = lease.lost() => {
            let error = Error::transient(format!("lease lost ({reason}): stopped publishing; waiting as a standby"));
            // Not ready until it holds the lease and runs again.
            crate::health::health().pipeline_failed(&error);
            Err(error)
        }
    }
}
