//! The Schema Registry's REST API, the subset the connector uses: a subject's version
//! (`GET /subjects/{subject}/versions/{version}`), the subjects (`GET /subjects`, what `check` uses to
//! authenticate) and registering a schema (`POST /subjects/{subject}/versions`, `auto_register` only).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! # Error handling
//! Classified once, here: a connection failure, a timeout or a 5xx from every URL is *unreachable*
//! (transient: the run waits and starts again, nothing is dead-lettered); 401 and 403 are *refused*
//! (definite: the credentials are wrong, the operator must change them); 404 with Confluent's error codes
//! 40401 (subject) or 40402 (version) is *not found* (the row's schema is missing: its aggregate is held);
//! any other answer is definite, quoting the registry's message.

use serde::Deserialize;

use crate::config::{RegistryAuth, SchemaRegistryConfig};
use crate::error::{Error, Result};

/// A registry client (blocking; see [`super::blocking`]).
pub struct Registry {
    urls: Vec<String>,
    agent: ureq::Agent,
    authorization: Option<String>,
}

/// What a lookup found when it found nothing.
#[derive(Debug)]
pub enum Lookup {
    /// The subject or version does not exist (the registry's message).
    NotFound(String),
    /// The registry holds it, and it cannot be used: another schema type, or a schema that does not compile.
    Unusable(String),
    /// The registry could not be asked or refused: an [`Error`], transient or definite.
    Failed(Error),
}

impl From<Error> for Lookup {
    fn from(e: Error) -> Self {
        Lookup::Failed(e)
    }
}

/// A registered schema, as `GET /subjects/{subject}/versions/{version}` returns it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Registered {
    /// The subject.
    pub subject: String,
    /// The subject's version number.
    pub version: i64,
    /// The global schema id: what the wire format carries.
    pub id: u32,
    /// The schema text.
    pub schema: String,
    /// "AVRO" (absent), "PROTOBUF" or "JSON".
    #[serde(default)]
    pub schema_type: Option<String>,
    /// Other subjects' schemas this one imports or names.
    #[serde(default)]
    pub references: Vec<Reference>,
}

/// A schema reference: the name the schema uses for it, and the subject version that holds it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Reference {
    /// The name the referring schema uses (an Avro full name, a `.proto` import path, a JSON Schema URL).
    pub name: String,
    /// The subject holding it.
    pub subject: String,
    /// Its version.
    pub version: i64,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

impl Registry {
    /// A client for the configured registry, its credentials read now.
    ///
    /// # Errors
    /// Definite when a credential or the CA file cannot be read.
    pub fn new(config: &SchemaRegistryConfig) -> Result<Self> {
        let authorization = match config.auth()? {
            RegistryAuth::None => None,
            RegistryAuth::Basic { username, password } => {
                use base64::Engine as _;
                let pair = format!("{username}:{}", password.expose());
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair)))
            }
            RegistryAuth::Bearer(token) => Some(format!("Bearer {}", token.expose())),
        };
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(path) = &config.tls_ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| Error::definite(format!("schema_registry.tls_ca_file {}: {e}", path.display())))?;
            let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(Error::definite(format!(
                    "schema_registry.tls_ca_file {} holds no PEM certificate",
                    path.display()
                )));
            }
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            .tls_config(tls.build())
            .user_agent(concat!("outbox-cdc/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Ok(Registry { urls: config.url.clone(), agent, authorization })
    }

    /// The subject's `version` (a number, or `latest`).
    ///
    /// # Errors
    /// [`Lookup::NotFound`] when the registry has no such subject or version; otherwise as the module docs say.
    pub fn version(&self, subject: &str, version: &str) -> std::result::Result<Registered, Lookup> {
        let path = format!("/subjects/{}/versions/{version}", encode_path(subject));
        let body = self.request("GET", &path, None)?;
        body.map_err(Lookup::NotFound).and_then(|text| {
            serde_json::from_str(&text).map_err(|e| {
                Lookup::Failed(Error::definite(format!(
                    "the schema registry's answer to GET {path} is not a schema version: {e}"
                )))
            })
        })
    }

    /// Every subject (`check` authenticates with it).
    ///
    /// # Errors
    /// As the module docs say.
    pub fn subjects(&self) -> Result<Vec<String>> {
        let text =
            self.request("GET", "/subjects", None)?.map_err(|m| Error::definite(format!("GET /subjects: {m}")))?;
        serde_json::from_str(&text)
            .map_err(|e| Error::definite(format!("the schema registry's subject list is not a JSON list: {e}")))
    }

    /// Registers `schema` (an Avro schema's JSON text) under `subject`; its id.
    ///
    /// # Errors
    /// As the module docs say.
    pub fn register(&self, subject: &str, schema: &str) -> Result<u32> {
        #[derive(Deserialize)]
        struct Id {
            id: u32,
        }
        let path = format!("/subjects/{}/versions", encode_path(subject));
        let body = serde_json::json!({ "schema": schema }).to_string();
        let text =
            self.request("POST", &path, Some(&body))?.map_err(|m| Error::definite(format!("POST {path}: {m}")))?;
        let id: Id = serde_json::from_str(&text)
            .map_err(|e| Error::definite(format!("the schema registry's answer to POST {path}: {e}")))?;
        Ok(id.id)
    }

    /// One request, to each URL in turn while they cannot be reached: the body, or the registry's
    /// not-found message.
    fn request(&self, method: &str, path: &str, body: Option<&str>) -> Result<std::result::Result<String, String>> {
        let mut unreachable = Vec::new();
        for base in &self.urls {
            let url = format!("{base}{path}");
            let mut request = ureq::http::Request::builder()
                .method(method)
                .uri(&url)
                .header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
            if let Some(authorization) = &self.authorization {
                request = request.header("Authorization", authorization);
            }
            let sent = match body {
                Some(body) => {
                    let request = request
                        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
                        .body(body.to_string())
                        .map_err(|e| Error::definite(format!("schema registry request {url}: {e}")))?;
                    self.agent.run(request)
                }
                None => {
                    let request =
                        request.body(()).map_err(|e| Error::definite(format!("schema registry request {url}: {e}")))?;
                    self.agent.run(request)
                }
            };
            let mut response = match sent {
                Ok(response) => response,
                Err(e) => {
                    unreachable.push(format!("{base}: {e}"));
                    continue;
                }
            };
            let status = response.status().as_u16();
            let text = match response.body_mut().read_to_string() {
                Ok(text) => text,
                Err(e) => {
                    unreachable.push(format!("{base}: reading the answer: {e}"));
                    continue;
                }
            };
            let message = || match serde_json::from_str::<ErrorBody>(&text) {
                Ok(e) => (e.error_code, e.message),
                Err(_) => (0, text.chars().take(200).collect()),
            };
            return match status {
                200..=299 => Ok(Ok(text)),
                401 | 403 => Err(Error::definite(format!(
                    "the schema registry at {base} refused the connector's credentials (HTTP {status}: {}). \
                     Set schema_registry.username with password/password_env/password_file (basic auth), or \
                     bearer_token/bearer_token_env/bearer_token_file, to credentials allowed to read the subjects",
                    message().1
                ))),
                404 if (40401..=40403).contains(&message().0) => Ok(Err(message().1)),
                408 | 429 | 500..=599 => {
                    unreachable.push(format!("{base}: HTTP {status}: {}", message().1));
                    continue;
                }
                _ => Err(Error::definite(format!(
                    "the schema registry at {base} answered {method} {path} with HTTP {status}: {}",
                    message().1
                ))),
            };
        }
        Err(Error::transient(format!(
            "the schema registry cannot be reached ({}); waiting for it",
            unreachable.join("; ")
        )))
    }
}

/// A subject in a URL path: everything but unreserved characters percent-encoded.
fn encode_path(subject: &str) -> String {
    let mut out = String::with_capacity(subject.len());
    for b in subject.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_percent_encoded_in_paths() {
        assert_eq!(encode_path("outbox.event.order-value"), "outbox.event.order-value");
        assert_eq!(encode_path("com.acme/Order Created"), "com.acme%2FOrder%20Created");
    }
}
