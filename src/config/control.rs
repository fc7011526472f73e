//! `[control]`: the control API of a running connector (status, pause, resume, hold release) and the token
//! it asks for.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{default_true, from_env, from_file, Secret};
use crate::error::{Error, Result};

/// The environment variable a token is read from when neither `token_env` nor `token_file` is set.
pub const TOKEN_ENV: &str = "OUTBOX_CDC_CONTROL_TOKEN";
/// The file in the state directory that holds the token the connector made, when none is configured.
pub const TOKEN_FILE_NAME: &str = "control.token";

/// `[control]`: the control API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Serve the control API (`/v1/...`).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Its address: loopback by default. Every request needs the bearer token, wherever it listens.
    #[serde(default = "default_control_listen")]
    pub listen: std::net::SocketAddr,
    /// Environment variable holding the token.
    pub token_env: Option<String>,
    /// File holding the token.
    pub token_file: Option<PathBuf>,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig { enabled: true, listen: default_control_listen(), token_env: None, token_file: None }
    }
}

fn default_control_listen() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 9188))
}

/// Where the control API's token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `token_env`, or [`TOKEN_ENV`] when it is set and nothing else is configured.
    Env(String),
    /// `token_file`.
    File(PathBuf),
    /// Made by the connector at its first start: [`TOKEN_FILE_NAME`] in the state directory, readable by
    /// its user only; the commands on the same host read it there.
    Made(PathBuf),
}

impl ControlConfig {
    /// Checks the section on its own.
    pub(super) fn validate(&self) -> Result<()> {
        if self.token_env.is_some() && self.token_file.is_some() {
            return Err(Error::definite("[control] sets both token_env and token_file: keep one"));
        }
        Ok(())
    }

    /// Where the token comes from, with `state_dir` the state directory.
    pub fn token_source(&self, state_dir: &Path) -> TokenSource {
        match (&self.token_env, &self.token_file) {
            (Some(var), _) => TokenSource::Env(var.clone()),
            (None, Some(path)) => TokenSource::File(path.clone()),
            (None, None) if std::env::var_os(TOKEN_ENV).is_some() => TokenSource::Env(TOKEN_ENV.to_string()),
            (None, None) => TokenSource::Made(state_dir.join(TOKEN_FILE_NAME)),
        }
    }

    /// The token as configured; `None` for a token the connector makes that it has not made yet.
    ///
    /// # Errors
    /// A definite error when the variable is not set or the file cannot be read or is empty.
    pub fn token(&self, state_dir: &Path) -> Result<Option<Secret>> {
        match self.token_source(state_dir) {
            TokenSource::Env(var) => from_env("control.token_env", &var).map(Some),
            TokenSource::File(path) => from_file("control.token_file", &path).map(Some),
            TokenSource::Made(path) => match path.exists() {
                true => from_file("the control API's token", &path).map(Some),
                false => Ok(None),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `token_env`, then `token_file`, then the one the connector makes in the state directory; both set is
    /// refused.
    #[test]
    fn the_token_comes_from_the_setting_then_a_file_the_connector_makes() {
        let dir = Path::new("/var/lib/outbox-cdc");
        let env = ControlConfig { token_env: Some("MY_TOKEN".into()), ..ControlConfig::default() };
        assert_eq!(env.token_source(dir), TokenSource::Env("MY_TOKEN".into()));
        let file = ControlConfig { token_file: Some("/run/secrets/t".into()), ..ControlConfig::default() };
        assert_eq!(file.token_source(dir), TokenSource::File("/run/secrets/t".into()));
        if std::env::var_os(TOKEN_ENV).is_none() {
            let made = ControlConfig::default();
            assert_eq!(made.token_source(dir), TokenSource::Made(dir.join(TOKEN_FILE_NAME)));
            let missing = tempfile::tempdir().unwrap();
            assert_eq!(made.token(missing.path()).unwrap().map(|s| s.expose().to_string()), None, "not made yet");
        }
        let both =
            ControlConfig { token_env: Some("T".into()), token_file: Some("/t".into()), ..ControlConfig::default() };
        assert!(both.validate().unwrap_err().to_string().contains("both token_env and token_file"));
        assert_eq!(ControlConfig::default().listen.to_string(), "127.0.0.1:9188");
    }
}
