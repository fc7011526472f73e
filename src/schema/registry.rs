//! The Schema Registry's REST API, the subset the connector uses: a subject's version
//! (`GET /subjects/{subject}/versions/{version}`), the subjects (`GET /subjects`, what `check` uses to
//! authenticate, and what an ambiguous answer is decided by) and registering a schema
//! (`POST /subjects/{subject}/versions`, `auto_register` only).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! # Error handling: whom an answer concerns
//! Every answer is classified once, here, by what it concerns (`verdict` on the HTTP status and the
//! Confluent error code, `unanswered` on ureq's error variant; never on a message's text). An answer about
//! one row's subject or version is that row's poison ([`Lookup::Refused`]: its aggregate is held and
//! dead-lettered, the others flow on); an answer about the registry itself is transient (waiting can heal
//! it) or definite (an operator must act), and is the same for every row.
//!
//! | answer | to a subject path (`/subjects/{s}/versions…`) | to `GET /subjects` |
//! |---|---|---|
//! | 2xx, the body the API describes | the answer | the answer |
//! | 2xx, another body | definite, quoting it | definite, quoting it |
//! | 404 with code 40401, 40402 or 40403 | poison: not found | definite: not a registry |
//! | 404 without such a code | ask `GET /subjects` on the same URL: a JSON list, poison (not found); another answer, definite (the URL does not serve the API) | definite: not a registry |
//! | 403 with code 40301 | poison: denied (RBAC denies that subject; the credentials work elsewhere) | definite: credentials |
//! | 403 without it | ask `GET /subjects`: a JSON list, poison (denied); another answer, definite (credentials) | definite: credentials |
//! | 409 | poison: conflict (registering is incompatible with the subject's versions) | definite |
//! | 422 (42201 invalid schema, 42202 invalid version, any other) | poison: invalid | definite |
//! | 401 | definite (credentials); a file credential that changed since the request was built is tried once first | same |
//! | 408, 429, 5xx; connection refused or cut, DNS, timeout | the next URL; transient when every URL fails | same |
//! | a TLS certificate the CA does not verify; a URL ureq cannot use | the next URL; definite when every URL fails for such a reason (waiting cannot fix it) | same |
//! | any other status (400, 405, 406, 415, 3xx …) | definite, quoting the answer | same |
//!
//! Asking `GET /subjects` settles the two ambiguous answers: a bare 404 is what a registry answers for an
//! odd subject, and also what any web server answers for a `schema_registry.url` that is not a registry (a
//! missing path prefix); a 403 without Confluent's RBAC code is what a registry answers for a subject the
//! credentials may not read, and also what a proxy answers for credentials it refuses everywhere. Only the
//! first of each pair is about one subject, and only then does the registry list its subjects.
//!
//! # Credentials
//! Inline and environment credentials are read once, when the client is built. A file credential
//! (`password_file`, `bearer_token_file`) is read again for every request, so a secret that a sidecar
//! rewrites is used from the next request on; on a 401, the file is read once more, and if it changed since
//! the request was built (the sidecar wrote it meanwhile) the request is sent again, once, with the new
//! value. A file that cannot be read at a request is definite, naming the file. No secret reaches a message:
//! the header value is a [`Secret`] and a message names only the setting and the file.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::{RegistryAuth, SchemaRegistryConfig, Secret};
use crate::error::{Error, Result};

/// Confluent's error codes, as the body's `error_code` carries them.
pub mod codes {
    /// `40301`: the user is denied the operation on the subject (RBAC).
    pub const SUBJECT_DENIED: i64 = 40301;
    /// `40401`: subject not found.
    pub const SUBJECT_NOT_FOUND: i64 = 40401;
    /// `40402`: version not found.
    pub const VERSION_NOT_FOUND: i64 = 40402;
    /// `40403`: schema not found.
    pub const SCHEMA_NOT_FOUND: i64 = 40403;
    /// `42201`: invalid schema.
    pub const INVALID_SCHEMA: i64 = 42201;
    /// `42202`: invalid version.
    pub const INVALID_VERSION: i64 = 42202;
}

/// A registry client (blocking; see [`super::blocking`]).
pub struct Registry {
    urls: Vec<String>,
    agent: ureq::Agent,
    credentials: Credentials,
}

/// Where the `Authorization` header comes from.
enum Credentials {
    /// None, inline or from the environment: read once, when the client was built.
    Fixed(Option<Secret>),
    /// From a file: read again for every request ([`SchemaRegistryConfig::auth`] reads it).
    File {
        /// The section, to read the file with.
        config: Box<SchemaRegistryConfig>,
        /// The setting that names the file, for messages.
        setting: &'static str,
        /// The file, for messages.
        path: PathBuf,
    },
}

impl Credentials {
    /// The `Authorization` header a request is built with now.
    fn authorization(&self) -> Result<Option<Secret>> {
        match self {
            Credentials::Fixed(header) => Ok(header.clone()),
            Credentials::File { config, .. } => config.auth().map(header),
        }
    }
}

/// The `Authorization` header of `auth`.
fn header(auth: RegistryAuth) -> Option<Secret> {
    match auth {
        RegistryAuth::None => None,
        RegistryAuth::Basic { username, password } => {
            use base64::Engine as _;
            let pair = format!("{username}:{}", password.expose());
            Some(Secret::new(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))))
        }
        RegistryAuth::Bearer(token) => Some(Secret::new(format!("Bearer {}", token.expose()))),
    }
}

/// What a lookup found when it found no usable schema.
#[derive(Debug)]
pub enum Lookup {
    /// The registry's answer about this subject or version is no: the row's poison.
    Refused(Refusal),
    /// The registry holds it, and it cannot be used: another schema type, or a schema that does not compile.
    Unusable(String),
    /// The registry could not be asked, or its answer concerns the registry itself: an [`Error`], transient
    /// or definite.
    Failed(Error),
}

impl From<Error> for Lookup {
    fn from(e: Error) -> Self {
        Lookup::Failed(e)
    }
}

/// Why the registry said no about one subject or version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No such subject or version: 404 with 40401, 40402 or 40403, or a bare 404 from a registry.
    NotFound,
    /// 422: the registry refuses the version (42202) or the schema (42201) as invalid.
    Invalid,
    /// 409: registering the schema conflicts with the subject's versions (its compatibility level).
    Conflict,
    /// 403 about this subject (RBAC, 40301): the credentials are accepted, not for this subject.
    Denied,
}

/// The registry's no about one subject or version, with what it said: the reason of the row's poison.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// Why.
    pub why: Why,
    /// The subject asked about.
    pub subject: String,
    /// The version asked for (`"3"`, `"latest"`); `None` for registering a new one.
    pub version: Option<String>,
    /// The HTTP status.
    pub status: u16,
    /// The registry's `error_code`, if it sent one.
    pub code: Option<i64>,
    /// The registry's message (or the start of its body).
    pub message: String,
    /// Set when the subject is one that the row's schema references: which schema references it, and as
    /// what.
    pub referenced_by: Option<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let subject = &self.subject;
        let what = match self.version.as_deref() {
            Some("latest") => format!("subject {subject:?} latest"),
            Some(version) => format!("subject {subject:?} version {version}"),
            None => format!("a new version of subject {subject:?}"),
        };
        let referenced = self.referenced_by.as_deref().map(|by| format!(", {by},")).unwrap_or_default();
        let code = self.code.map(|code| format!(", error code {code}")).unwrap_or_default();
        let answer = format!("HTTP {}{code}: {:?}", self.status, self.message);
        match self.why {
            Why::NotFound => write!(
                f,
                "the schema registry has no {what}{referenced} ({answer}): register it (the application's CI \
                 does), then `outbox-cdc quarantine release` the held aggregates"
            ),
            Why::Invalid => write!(
                f,
                "the schema registry refuses {what}{referenced} as invalid ({answer}): the row names a version \
                 the registry does not accept, or the registry does not accept the schema; correct the row's \
                 schema_version or the registered schema, then `outbox-cdc quarantine release`"
            ),
            Why::Conflict => write!(
                f,
                "the schema registry refuses {what}{referenced} as a conflict ({answer}): the schema is \
                 incompatible with the subject's versions under its compatibility level; register a \
                 compatible schema under it or change the subject's compatibility, then `outbox-cdc \
                 quarantine release`"
            ),
            Why::Denied => write!(
                f,
                "the schema registry denies the connector {what}{referenced} ({answer}): the credentials are \
                 accepted, but not for this subject; grant the connector's principal {} access to it \
                 (Confluent RBAC: {} on the subject), then `outbox-cdc quarantine release`",
                if self.version.is_some() { "read" } else { "write" },
                if self.version.is_some() { "DeveloperRead" } else { "DeveloperWrite" },
            ),
        }
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
    error_code: Option<i64>,
    #[serde(default)]
    message: String,
}

/// Whom a request is about: decides what a refusal means ([`verdict`]).
#[derive(Clone, Copy)]
enum About<'a> {
    /// A subject path: the subject, and the version asked for (`None`: registering one).
    Subject { subject: &'a str, version: Option<&'a str> },
    /// `GET /subjects`: the registry itself.
    Registry,
}

/// What an HTTP answer means: the module docs' table, from the status and the Confluent error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The body is the answer.
    Answer,
    /// About the subject or version: the row's poison.
    Refused(Why),
    /// About the subject if the URL serves the API to these credentials: ask `GET /subjects`.
    AskRegistry(Why),
    /// The registry is away: the next URL.
    NextUrl,
    /// 401: the credentials.
    Unauthorized,
    /// 403 to `GET /subjects`: the credentials.
    Forbidden,
    /// 404 to `GET /subjects`: the URL does not serve the API.
    NotRegistry,
    /// Anything else: definite, quoting the answer.
    Definite,
}

/// The verdict on an answer with `status` and the body's `code`, to a subject path or not.
fn verdict(status: u16, code: Option<i64>, subject_path: bool) -> Verdict {
    use codes::*;
    match (status, subject_path) {
        (200..=299, _) => Verdict::Answer,
        (401, _) => Verdict::Unauthorized,
        (408 | 429 | 500..=599, _) => Verdict::NextUrl,
        (404, true) if matches!(code, Some(SUBJECT_NOT_FOUND | VERSION_NOT_FOUND | SCHEMA_NOT_FOUND)) => {
            Verdict::Refused(Why::NotFound)
        }
        (404, true) => Verdict::AskRegistry(Why::NotFound),
        (403, true) if code == Some(SUBJECT_DENIED) => Verdict::Refused(Why::Denied),
        (403, true) => Verdict::AskRegistry(Why::Denied),
        (409, true) => Verdict::Refused(Why::Conflict),
        (422, true) => Verdict::Refused(Why::Invalid),
        (404, false) => Verdict::NotRegistry,
        (403, false) => Verdict::Forbidden,
        _ => Verdict::Definite,
    }
}

/// Why a URL gave no answer, and whether waiting can heal it.
struct Unanswered {
    /// What happened, for the message.
    what: String,
    /// True when waiting cannot help (a certificate the CA does not verify, a URL ureq cannot use).
    definite: bool,
}

/// Classifies a request that got no HTTP answer by ureq's error variant.
fn unanswered(base: &str, error: &ureq::Error) -> Unanswered {
    use ureq::Error as E;
    let definite = match error {
        E::Io(io) => {
            if let Some(fix) = tls_refusal(io) {
                return Unanswered {
                    what: format!("{base}: the TLS handshake failed: {error}. {fix}"),
                    definite: true,
                };
            }
            false
        }
        E::BadUri(_)
        | E::Http(_)
        | E::Tls(_)
        | E::Pem(_)
        | E::Rustls(_)
        | E::RequireHttpsOnly(_)
        | E::InvalidProxyUrl
        | E::TooManyRedirects
        | E::RedirectFailed
        | E::LargeResponseHeader(..)
        | E::BodyExceedsLimit(_)
        | E::TlsRequired => true,
        // Timeouts, DNS, refused or cut connections, a garbled answer: a registry restarting.
        _ => false,
    };
    Unanswered { what: format!("{base}: {error}"), definite }
}

/// The fix for a TLS handshake that rustls refused because of the registry's certificate; `None` for any
/// other I/O error (a connection cut during the handshake stays transient).
fn tls_refusal(io: &std::io::Error) -> Option<&'static str> {
    use rustls::CertificateError as C;
    // rustls hands its handshake error up as the I/O error's inner error.
    let tls = io.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(match tls {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "The registry's certificate is not signed by a CA in schema_registry.tls_ca_file (without it, only \
             the public CAs built in are trusted): point schema_registry.tls_ca_file at the PEM file of the CA \
             that signed it"
        }
        rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "Use a host in schema_registry.url that the registry's certificate lists in its subjectAltName, or \
             reissue the certificate for it"
        }
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => "Renew the registry's certificate, or correct this machine's clock",
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::UnsupportedNameType
        | rustls::Error::PeerIncompatible(_) => {
            "Fix the registry's certificate or TLS settings, or schema_registry.tls_ca_file"
        }
        _ => return None,
    })
}

/// What `GET /subjects` said about a URL.
enum Probe {
    /// A JSON list of subjects: the URL serves the API to these credentials.
    Lists,
    /// No answer, or one about the registry being away: the next URL.
    Away(Unanswered),
    /// Anything else.
    Answered(Reply),
}

/// One HTTP answer.
struct Reply {
    status: u16,
    text: String,
}

impl Reply {
    /// The registry's error code and message (the start of the body when it is not Confluent's error JSON).
    fn error(&self) -> (Option<i64>, String) {
        match serde_json::from_str::<ErrorBody>(&self.text) {
            Ok(e) => (e.error_code, e.message),
            Err(_) => (None, quote(&self.text)),
        }
    }

    /// The answer as a message quotes it.
    fn quoted(&self) -> String {
        match self.error() {
            (Some(code), message) => format!("HTTP {}, error code {code}: {message:?}", self.status),
            (None, message) => format!("HTTP {}: {message:?}", self.status),
        }
    }
}

/// The start of a body, for a message.
fn quote(text: &str) -> String {
    text.chars().take(200).collect()
}

impl Registry {
    /// A client for the configured registry. Inline and environment credentials are read now, once; a
    /// credential file is read now (so that an unreadable one is found before the first request) and again
    /// for every request.
    ///
    /// # Errors
    /// Definite when a credential or the CA file cannot be read.
    pub fn new(config: &SchemaRegistryConfig) -> Result<Self> {
        let authorization = header(config.auth()?);
        let credentials = match config.auth_file() {
            Some((setting, path)) => {
                Credentials::File { config: Box::new(config.clone()), setting, path: path.to_path_buf() }
            }
            None => Credentials::Fixed(authorization),
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
        Ok(Registry { urls: config.url.clone(), agent, credentials })
    }

    /// The subject's `version` (a number, or `latest`).
    ///
    /// # Errors
    /// [`Lookup::Refused`] when the registry's answer concerns the subject or version (not found, invalid,
    /// denied); otherwise as the module docs say.
    pub fn version(&self, subject: &str, version: &str) -> std::result::Result<Registered, Lookup> {
        let path = format!("/subjects/{}/versions/{}", encode_path(subject), encode_path(version));
        let text = self.request("GET", &path, None, About::Subject { subject, version: Some(version) })?;
        serde_json::from_str(&text).map_err(|e| {
            Lookup::Failed(Error::definite(format!(
                "the schema registry's answer to GET {path} is not a schema version ({e}): {:?}. Check \
                 schema_registry.url: it must be the base URL of a Schema Registry API",
                quote(&text)
            )))
        })
    }

    /// Every subject (`check` authenticates with it).
    ///
    /// # Errors
    /// As the module docs say.
    pub fn subjects(&self) -> Result<Vec<String>> {
        let text = match self.request("GET", "/subjects", None, About::Registry) {
            Ok(text) => text,
            Err(Lookup::Failed(e)) => return Err(e),
            Err(Lookup::Refused(refusal)) => return Err(Error::definite(refusal.to_string())),
            Err(Lookup::Unusable(why)) => return Err(Error::definite(why)),
        };
        serde_json::from_str(&text).map_err(|e| {
            Error::definite(format!(
                "the schema registry's subject list is not a JSON list ({e}): {:?}. Check schema_registry.url: \
                 it must be the base URL of a Schema Registry API",
                quote(&text)
            ))
        })
    }

    /// Registers `schema` (an Avro schema's JSON text) under `subject`; its id.
    ///
    /// # Errors
    /// [`Lookup::Refused`] when the registry refuses it for this subject (409 incompatible, 422 invalid,
    /// 403 denied); otherwise as the module docs say.
    pub fn register(&self, subject: &str, schema: &str) -> std::result::Result<u32, Lookup> {
        #[derive(Deserialize)]
        struct Id {
            id: u32,
        }
        let path = format!("/subjects/{}/versions", encode_path(subject));
        let body = serde_json::json!({ "schema": schema }).to_string();
        let text = self.request("POST", &path, Some(&body), About::Subject { subject, version: None })?;
        let id: Id = serde_json::from_str(&text).map_err(|e| {
            Error::definite(format!(
                "the schema registry's answer to POST {path} is not a schema id ({e}): {:?}",
                quote(&text)
            ))
        })?;
        Ok(id.id)
    }

    /// One request, to each URL in turn while they give no answer or one about the registry being away: the
    /// body of a 2xx, or what the answer means (the module docs' table).
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        about: About<'_>,
    ) -> std::result::Result<String, Lookup> {
        let mut authorization = self.credentials.authorization()?;
        let mut unanswered_by = Vec::new();
        'urls: for base in &self.urls {
            let url = format!("{base}{path}");
            let mut retried = false;
            loop {
                let reply = match self.send(method, &url, body, authorization.as_ref()) {
                    Ok(reply) => reply,
                    Err(e) => {
                        unanswered_by.push(unanswered(base, &e));
                        continue 'urls;
                    }
                };
                let (code, message) = reply.error();
                let refusal = |why: Why| match about {
                    About::Subject { subject, version } => Lookup::Refused(Refusal {
                        why,
                        subject: subject.to_string(),
                        version: version.map(str::to_string),
                        status: reply.status,
                        code,
                        message: message.clone(),
                        referenced_by: None,
                    }),
                    // Not a verdict on `GET /subjects`; should one ever be, it concerns the registry.
                    About::Registry => Lookup::Failed(Error::definite(format!(
                        "the schema registry at {base} answered {method} {path} with {}",
                        reply.quoted()
                    ))),
                };
                let subject_path = matches!(about, About::Subject { .. });
                return match verdict(reply.status, code, subject_path) {
                    Verdict::Answer => Ok(reply.text),
                    Verdict::Refused(why) => Err(refusal(why)),
                    Verdict::AskRegistry(why) => match self.ask_registry(base, authorization.as_ref()) {
                        Probe::Lists => Err(refusal(why)),
                        Probe::Away(unanswered) => {
                            unanswered_by.push(unanswered);
                            continue 'urls;
                        }
                        Probe::Answered(probe) => Err(Lookup::Failed(match (why, probe.status) {
                            (Why::Denied, _) | (_, 401 | 403) => self.refused_credentials(base, &reply, Some(&probe)),
                            _ => not_a_registry(base, method, path, &reply, Some(&probe)),
                        })),
                    },
                    Verdict::NextUrl => {
                        unanswered_by.push(Unanswered { what: format!("{base}: {}", reply.quoted()), definite: false });
                        continue 'urls;
                    }
                    Verdict::Unauthorized => {
                        if let (false, Credentials::File { .. }) = (retried, &self.credentials) {
                            let now = self.credentials.authorization()?;
                            if now != authorization {
                                // The sidecar rewrote the file since this request was built: once more with it.
                                authorization = now;
                                retried = true;
                                continue;
                            }
                        }
                        Err(Lookup::Failed(self.refused_credentials(base, &reply, None)))
                    }
                    Verdict::Forbidden => Err(Lookup::Failed(self.refused_credentials(base, &reply, None))),
                    Verdict::NotRegistry => Err(Lookup::Failed(not_a_registry(base, method, path, &reply, None))),
                    Verdict::Definite => Err(Lookup::Failed(Error::definite(format!(
                        "the schema registry at {base} answered {method} {path} with {}",
                        reply.quoted()
                    )))),
                };
            }
        }
        let what: Vec<&str> = unanswered_by.iter().map(|u| u.what.as_str()).collect();
        Err(Lookup::Failed(match unanswered_by.iter().all(|u| u.definite) {
            true => Error::definite(format!("the schema registry cannot be used ({})", what.join("; "))),
            false => {
                Error::transient(format!("the schema registry cannot be reached ({}); waiting for it", what.join("; ")))
            }
        }))
    }

    /// Asks `GET /subjects` at `base` whether it serves the API to these credentials, to settle an answer
    /// that may be about one subject or about the registry ([`Verdict::AskRegistry`]).
    fn ask_registry(&self, base: &str, authorization: Option<&Secret>) -> Probe {
        match self.send("GET", &format!("{base}/subjects"), None, authorization) {
            Err(e) => Probe::Away(unanswered(base, &e)),
            Ok(probe) => match verdict(probe.status, None, false) {
                Verdict::Answer if serde_json::from_str::<Vec<String>>(&probe.text).is_ok() => Probe::Lists,
                Verdict::NextUrl => {
                    Probe::Away(Unanswered { what: format!("{base}/subjects: {}", probe.quoted()), definite: false })
                }
                _ => Probe::Answered(probe),
            },
        }
    }

    /// Sends one request and reads its answer.
    fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<&str>,
        authorization: Option<&Secret>,
    ) -> std::result::Result<Reply, ureq::Error> {
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(url)
            .header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
        if let Some(authorization) = authorization {
            request = request.header("Authorization", authorization.expose());
        }
        let mut response = match body {
            Some(body) => self.agent.run(
                request.header("Content-Type", "application/vnd.schemaregistry.v1+json").body(body.to_string())?,
            )?,
            None => self.agent.run(request.body(())?)?,
        };
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string()?;
        Ok(Reply { status, text })
    }

    /// The definite error of credentials the registry at `base` refused (`reply`, and the answer to
    /// `GET /subjects` when one was asked).
    fn refused_credentials(&self, base: &str, reply: &Reply, probe: Option<&Reply>) -> Error {
        let probe = probe.map(|probe| format!(", and GET /subjects with {}", probe.quoted()));
        let file = match &self.credentials {
            Credentials::File { setting, path, .. } => {
                format!(" ({setting} {} was read for this request)", path.display())
            }
            Credentials::Fixed(_) => String::new(),
        };
        Error::definite(format!(
            "the schema registry at {base} refused the connector's credentials ({}{}){file}. Set \
             schema_registry.username with password/password_env/password_file (basic auth), or \
             bearer_token/bearer_token_env/bearer_token_file, to credentials allowed to read the subjects",
            reply.quoted(),
            probe.unwrap_or_default()
        ))
    }
}

/// The definite error of a URL that answered a subject path or `GET /subjects` with a 404 that no registry
/// sends.
fn not_a_registry(base: &str, method: &str, path: &str, reply: &Reply, probe: Option<&Reply>) -> Error {
    let probe = probe.map(|probe| format!(", and GET /subjects with {}", probe.quoted())).unwrap_or_default();
    Error::definite(format!(
        "the schema registry at {base} answered {method} {path} with {} (no Schema Registry error code){probe}: \
         {base} does not serve the Schema Registry API. Check schema_registry.url: it must be the API's base \
         URL, with the path prefix the registry is served under if any (Apicurio: …/apis/ccompat/v7), such \
         that GET <url>/subjects answers a JSON list",
        reply.quoted()
    ))
}

/// A subject (or any text) as one URL path segment: everything but unreserved characters percent-encoded
/// (RFC 3986 §2.3). The control API's client encodes aggregate ids with it too, and `source::identity` an
/// RDS token's query names and values (SigV4 encodes them the same way).
pub(crate) fn encode_path(subject: &str) -> String {
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

    /// The module docs' table, one row per rule. Guards against issue 44: a 404 without a code, a 422, a
    /// 409 and a 403 about one subject were definite, and stopped the connector for one row.
    #[test]
    fn verdicts_follow_whom_the_answer_concerns() {
        use Verdict as V;
        let rows: &[(&str, u16, Option<i64>, bool, Verdict)] = &[
            ("a schema", 200, None, true, V::Answer),
            ("the subject list", 200, None, false, V::Answer),
            ("no subject", 404, Some(40401), true, V::Refused(Why::NotFound)),
            ("no version", 404, Some(40402), true, V::Refused(Why::NotFound)),
            ("no schema", 404, Some(40403), true, V::Refused(Why::NotFound)),
            ("a bare 404: ask", 404, None, true, V::AskRegistry(Why::NotFound)),
            ("Jersey's 404 code: ask", 404, Some(404), true, V::AskRegistry(Why::NotFound)),
            ("no /subjects: not a registry", 404, None, false, V::NotRegistry),
            ("RBAC on the subject", 403, Some(40301), true, V::Refused(Why::Denied)),
            ("403 without RBAC's code: ask", 403, None, true, V::AskRegistry(Why::Denied)),
            ("403 on /subjects", 403, Some(40301), false, V::Forbidden),
            ("invalid schema", 422, Some(42201), true, V::Refused(Why::Invalid)),
            ("invalid version", 422, Some(42202), true, V::Refused(Why::Invalid)),
            ("any 422", 422, None, true, V::Refused(Why::Invalid)),
            ("incompatible", 409, Some(409), true, V::Refused(Why::Conflict)),
            ("422 on /subjects", 422, None, false, V::Definite),
            ("401", 401, Some(40101), true, V::Unauthorized),
            ("401 on /subjects", 401, None, false, V::Unauthorized),
            ("request timeout", 408, None, true, V::NextUrl),
            ("too many requests", 429, None, false, V::NextUrl),
            ("server error", 500, Some(50001), true, V::NextUrl),
            ("bad gateway", 502, None, true, V::NextUrl),
            ("unavailable", 503, None, false, V::NextUrl),
            ("bad request", 400, None, true, V::Definite),
            ("method not allowed", 405, None, true, V::Definite),
            ("not acceptable", 406, None, false, V::Definite),
            ("unsupported media type", 415, None, true, V::Definite),
            ("a redirect not followed", 302, None, true, V::Definite),
        ];
        for (rule, status, code, subject_path, expected) in rows {
            assert_eq!(verdict(*status, *code, *subject_path), *expected, "{rule}");
        }
    }

    /// A certificate refusal is told from a reset by the inner error's type, never by its text: definite,
    /// naming tls_ca_file; a reset stays transient.
    #[test]
    fn a_refused_certificate_is_definite_and_a_reset_is_not() {
        let handshake = |e: rustls::Error| ureq::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        let wrong_ca = unanswered(
            "https://r",
            &handshake(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)),
        );
        assert!(wrong_ca.definite && wrong_ca.what.contains("schema_registry.tls_ca_file"), "{}", wrong_ca.what);
        let corrupted = unanswered("https://r", &handshake(rustls::Error::DecryptError));
        assert!(!corrupted.definite, "{}", corrupted.what);
        let reset = unanswered("https://r", &ureq::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        assert!(!reset.definite, "{}", reset.what);
        assert!(!unanswered("https://r", &ureq::Error::HostNotFound).definite);
        assert!(unanswered("https://r", &ureq::Error::BadUri("x".into())).definite);
    }

    /// A refusal names the subject, the version, the HTTP status, the registry's code and message, and what
    /// to do.
    #[test]
    fn a_refusal_says_what_and_what_to_do() {
        let refusal = |why, version: Option<&str>, status, code| Refusal {
            why,
            subject: "t-value".into(),
            version: version.map(str::to_string),
            status,
            code,
            message: "the registry's words".into(),
            referenced_by: None,
        };
        let cases = [
            (
                refusal(Why::NotFound, Some("3"), 404, Some(40402)),
                "has no subject \"t-value\" version 3",
                "register it",
            ),
            (
                refusal(Why::Invalid, Some("7"), 422, Some(42202)),
                "refuses subject \"t-value\" version 7 as invalid",
                "schema_version",
            ),
            (refusal(Why::Conflict, None, 409, Some(409)), "a new version of subject \"t-value\"", "compatib"),
            (refusal(Why::Denied, Some("latest"), 403, Some(40301)), "subject \"t-value\" latest", "DeveloperRead"),
        ];
        for (refusal, what, fix) in cases {
            let text = refusal.to_string();
            let code =
                format!("HTTP {}, error code {}: \"the registry's words\"", refusal.status, refusal.code.unwrap());
            for part in [what, fix, &code, "quarantine release"] {
                assert!(text.contains(part), "{part:?} in {text}");
            }
        }
    }
}
