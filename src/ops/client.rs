//! The commands' way to a running connector's control API ([`super::api`]): `status`, `pause`/`resume`
//! and `quarantine release` ask it first, and work offline when it does not answer ([`Client::call`]).
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; the commands above use it.

use std::time::Duration;

use crate::config::Config;
use crate::error::{Error, Result};

/// The header naming the connector (`[state] name`) a request is meant for.
pub const CONNECTOR_HEADER: &str = "outbox-cdc-connector";

/// The CLI's way to a running connector's control API.
pub struct Client {
    base: String,
    token: String,
    name: String,
}

/// How long a command may take: a release reads the dead-letter topic and republishes.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);

impl Client {
    /// The client for `config`'s connector; `None` when nothing could answer: the API disabled, on an
    /// ephemeral port, or no token to present (the connector never made one here).
    ///
    /// # Errors
    /// A definite error when a configured token cannot be read.
    pub fn for_config(config: &Config) -> Result<Option<Client>> {
        let control = &config.control;
        if !control.enabled || control.listen.port() == 0 {
            return Ok(None);
        }
        let Some(token) = control.token(&config.state.dir)? else { return Ok(None) };
        let mut addr = control.listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        Ok(Some(Client {
            base: format!("http://{addr}"),
            token: token.expose().to_string(),
            name: config.state.name.clone(),
        }))
    }

    /// `method path` with the token; `None` when this connector's API does not answer there: nothing
    /// listens (it is not running), or another connector does (`421`), or one that does not take this
    /// token (`401`: another connector's, or this one started with another token; logged), or something that
    /// is not the API at all (no JSON; logged). The caller then works offline, where a running connector
    /// refuses what needs it stopped.
    ///
    /// # Errors
    /// The API's refusal (`{"error": …}`) with its class (`409`: definite, else transient); transient for a
    /// connection that broke or an answer that is not the API's.
    pub fn call(&self, method: &str, path: &str) -> Result<Option<serde_json::Value>> {
        self.call_with(method, path, None)
    }

    /// [`Client::call`] with a JSON body (`POST`).
    ///
    /// # Errors
    /// As [`Client::call`]; `400` and `404` are definite too.
    pub fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Option<serde_json::Value>> {
        let agent = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(2)))
            .timeout_global(Some(COMMAND_TIMEOUT))
            .http_status_as_error(false)
            .user_agent(format!("outbox-cdc/{}", crate::metrics::VERSION))
            .build()
            .new_agent();
        let url = format!("{}{path}", self.base);
        let bearer = format!("Bearer {}", self.token);
        let sent = match method {
            "GET" => agent.get(&url).header("authorization", &bearer).header(CONNECTOR_HEADER, &self.name).call(),
            "DELETE" => agent.delete(&url).header("authorization", &bearer).header(CONNECTOR_HEADER, &self.name).call(),
            _ => {
                let post = agent.post(&url).header("authorization", &bearer).header(CONNECTOR_HEADER, &self.name);
                match body {
                    Some(body) => post.send_json(body),
                    None => post.send_empty(),
                }
            }
        };
        self.send(sent)
    }

    fn send(
        &self,
        sent: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Option<serde_json::Value>> {
        let mut response = match sent {
            Ok(response) => response,
            Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(None),
            Err(ureq::Error::ConnectionFailed) => return Ok(None),
            Err(e) => return Err(Error::transient(format!("the control API at {}: {e}", self.base))),
        };
        let status = response.status();
        match status.as_u16() {
            401 => {
                tracing::warn!(
                    api = %self.base,
                    "the control API there refused the token (another connector's, or this one was started with \
                     another [control] token): working without it"
                );
                return Ok(None);
            }
            421 => return Ok(None),
            _ => {}
        }
        let body: serde_json::Value = match response.body_mut().read_json() {
            Ok(body) => body,
            Err(e) => {
                tracing::warn!(
                    api = %self.base,
                    %status,
                    error = %e,
                    "something that is not this connector's control API answers there: working without it (set \
                     [control] listen)"
                );
                return Ok(None);
            }
        };
        let error = || body["error"].as_str().unwrap_or("no reason given").to_string();
        match status.as_u16() {
            200 | 202 => Ok(Some(body)),
            400 | 404 | 409 => Err(Error::definite(error())),
            _ => Err(Error::transient(error())),
        }
    }
}
