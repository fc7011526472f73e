//! `[prune]`: the credentials and pace of `outbox-cdc prune`.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{millis, one_password, Secret};
use crate::error::{Error, Result};

/// `[prune]`: how `outbox-cdc prune` deletes rows whose events the connector has checkpointed.
///
/// The proof that a row was delivered is read through the `[source]` connection (the replication user
/// has what it needs); only the `DELETE`s use these credentials, so the replication user never needs
/// `DELETE` on the outbox table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneConfig {
    /// Server to delete on. Default: `source.host`. Set it to the primary when `[source]` is a replica
    /// (deletes on a replica would make it diverge, or fail on a `read_only` server).
    #[serde(default)]
    pub host: Option<String>,
    /// TCP port of `host`. Default: `source.port`.
    #[serde(default)]
    pub port: Option<u16>,
    /// User with `DELETE` (and `SELECT`) on the outbox table(s). Default: `source.user` with the source
    /// password; when set, its password is one of `password`, `password_env` or `password_file` (none:
    /// no password).
    #[serde(default)]
    pub user: Option<String>,
    /// Password of `user` in clear. Prefer `password_file` or `password_env`.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Name of an environment variable holding the password of `user`; an error if named but not set.
    #[serde(default)]
    pub password_env: Option<String>,
    /// File holding the password of `user`, as `source.password_file` reads it.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Rows deleted per `DELETE` statement (one short transaction each). Small batches keep row locks,
    /// undo and binlog events small and let replicas keep up. Between 1 and 100000.
    #[serde(default = "default_prune_batch_rows")]
    pub batch_rows: usize,
    /// Pause after each batch, in milliseconds, so that the server, its replicas and the connector (which
    /// reads every DELETE from the binlog and ignores it) are not flooded. 0 = no pause.
    #[serde(rename = "pause_ms", default = "default_pause", deserialize_with = "millis")]
    pub pause: Duration,
}

impl Default for PruneConfig {
    fn default() -> Self {
        PruneConfig {
            host: None,
            port: None,
            user: None,
            password: None,
            password_env: None,
            password_file: None,
            batch_rows: default_prune_batch_rows(),
            pause: default_pause(),
        }
    }
}

fn default_prune_batch_rows() -> usize {
    1_000
}
fn default_pause() -> Duration {
    Duration::from_millis(100)
}

impl PruneConfig {
    /// Checks the section on its own: the batch bounds, and one password, only with a user of its own.
    pub(super) fn validate(&self) -> Result<()> {
        if !(1..=100_000).contains(&self.batch_rows) {
            return Err(Error::definite("prune.batch_rows must be between 1 and 100000"));
        }
        let passwords = [self.password.is_some(), self.password_env.is_some(), self.password_file.is_some()];
        one_password("prune", passwords[0], passwords[1], passwords[2])?;
        if self.user.is_none() && passwords.contains(&true) {
            return Err(Error::definite(
                "prune.password/password_env/password_file need prune.user (the default is the source user)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::tests::MINIMAL;
    use crate::config::*;

    #[test]
    fn prune_section_defaults_to_the_source_and_validates() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(
            (c.prune.batch_rows, c.prune.pause, c.prune.user.as_deref()),
            (1_000, Duration::from_millis(100), None)
        );
        let with = |section: &str| Config::parse(&format!("{MINIMAL}\n[prune]\n{section}\n"));
        let c = with("user = \"pruner\"\npassword_env = \"PW\"\nbatch_rows = 50\npause_ms = 0").unwrap();
        assert_eq!((c.prune.user.as_deref(), c.prune.batch_rows, c.prune.pause), (Some("pruner"), 50, Duration::ZERO));
        for bad in ["batch_rows = 0", "password = \"x\"", "user = \"u\"\npassword = \"x\"\npassword_env = \"PW\""] {
            assert!(with(bad).is_err(), "{bad}");
        }
        assert!(with("bogus = 1").unwrap_err().to_string().contains("bogus"));
    }
}
