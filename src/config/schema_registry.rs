//! `[schema_registry]`: where the schemas of the registry formats come from.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{from_env, from_file, millis, one_password, ColumnNames, KafkaConfig, KeyFormat, Secret};
use crate::error::{Error, Result};

/// `[schema_registry]`: a Confluent-compatible Schema Registry (Confluent, Apicurio's `ccompat` API,
/// Karapace, Redpanda) holding the schemas of the payloads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    /// Base URL, or several tried in order while one cannot be reached: `"https://registry:8081"`.
    #[serde(deserialize_with = "one_or_many")]
    pub url: Vec<String>,
    /// The subject of a row's schema: a preset or a template. "topic_name" (default, Confluent's
    /// TopicNameStrategy: `${topic}-value`), "record_name" (RecordNameStrategy: `${event_type}`, so the
    /// event type is the record's full name), "topic_record_name" (`${topic}-${event_type}`), or a template
    /// with `${topic}`, `${aggregate_type}`, `${event_type}`.
    #[serde(default = "default_subject")]
    pub subject: String,
    /// Which version of the subject: "schema_version" (default: the row's `schema_version` is the
    /// subject's version number, so the table must have the column) or "latest" (the subject's latest
    /// version, looked up again every `latest_refresh_ms`).
    #[serde(default)]
    pub version: RegistryVersion,
    /// Register what is missing instead of dead-lettering: only the key schema (`"string"` under
    /// `<topic>-key`, with `key_format = "avro"`). Value schemas are never registered by the connector:
    /// they are the application's contract, written by its CI. Default false.
    #[serde(default)]
    pub auto_register: bool,
    /// HTTP basic auth user (Confluent Cloud: the API key). Needs a password.
    pub username: Option<String>,
    /// Basic auth password (Confluent Cloud: the API secret). Better `password_env` or `password_file`.
    pub password: Option<Secret>,
    /// Environment variable holding the basic auth password, read once, when a command first talks to the
    /// registry.
    pub password_env: Option<String>,
    /// File holding the basic auth password (a mounted secret), read again at every registry request, so a
    /// password a sidecar rewrites is used from the next request on, without a restart. Unreadable or empty
    /// at a request: a definite error naming the file.
    pub password_file: Option<PathBuf>,
    /// Bearer token (`Authorization: Bearer …`), instead of basic auth. Better `bearer_token_env` or
    /// `bearer_token_file`.
    pub bearer_token: Option<Secret>,
    /// Environment variable holding the bearer token, read once, when a command first talks to the registry.
    pub bearer_token_env: Option<String>,
    /// File holding the bearer token, read again at every registry request: a token that a sidecar (Vault
    /// agent, a Kubernetes projected token) rewrites is used from the next request on, without a restart.
    /// Unreadable or empty at a request: a definite error naming the file.
    pub bearer_token_file: Option<PathBuf>,
    /// PEM file of the CA certificates that sign the registry's certificate; default: the Mozilla roots
    /// built into the connector.
    pub tls_ca_file: Option<PathBuf>,
    /// Time limit of one registry request; a registry that does not answer in time is unreachable
    /// (transient: the run waits and starts again).
    #[serde(rename = "timeout_ms", default = "default_registry_timeout", deserialize_with = "millis")]
    pub timeout: Duration,
    /// With `version = "latest"`: how old a subject's latest version may be before it is looked up again, in
    /// the background: rows go on with the cached one until the answer replaces it (and keep it when the
    /// registry cannot be asked).
    #[serde(rename = "latest_refresh_ms", default = "default_latest_refresh", deserialize_with = "millis")]
    pub latest_refresh: Duration,
}

/// Which version of a subject a row is encoded with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistryVersion {
    /// The row's `schema_version`.
    #[default]
    SchemaVersion,
    /// The subject's latest version.
    Latest,
}

/// An authentication secret of the registry, as configured (read by [`SchemaRegistryConfig::auth`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    /// No credentials.
    None,
    /// HTTP basic auth.
    Basic {
        /// The user.
        username: String,
        /// The password.
        password: Secret,
    },
    /// `Authorization: Bearer`.
    Bearer(Secret),
}

impl SchemaRegistryConfig {
    /// The subject template, presets expanded.
    pub fn subject_template(&self) -> &str {
        match self.subject.as_str() {
            "topic_name" => "${topic}-value",
            "record_name" => "${event_type}",
            "topic_record_name" => "${topic}-${event_type}",
            template => template,
        }
    }

    /// The credentials, read from the environment or files where configured so (each call reads them again).
    ///
    /// # Errors
    /// A definite error naming an unset variable or an unreadable or empty file.
    pub fn auth(&self) -> Result<RegistryAuth> {
        let password = match (&self.password, &self.password_env, &self.password_file) {
            (_, Some(var), _) => Some(from_env("schema_registry.password_env", var)?),
            (_, None, Some(path)) => Some(from_file("schema_registry.password_file", path)?),
            (password, None, None) => password.clone(),
        };
        let token = match (&self.bearer_token, &self.bearer_token_env, &self.bearer_token_file) {
            (_, Some(var), _) => Some(from_env("schema_registry.bearer_token_env", var)?),
            (_, None, Some(path)) => Some(from_file("schema_registry.bearer_token_file", path)?),
            (token, None, None) => token.clone(),
        };
        Ok(match (&self.username, password, token) {
            (Some(username), Some(password), _) => RegistryAuth::Basic { username: username.clone(), password },
            (_, _, Some(token)) => RegistryAuth::Bearer(token),
            _ => RegistryAuth::None,
        })
    }

    /// The setting and the file the credentials come from (`password_file` or `bearer_token_file`), if a
    /// file holds them: the registry client reads it at every request ([`SchemaRegistryConfig::auth`]).
    /// Inline and environment credentials are fixed for the process.
    pub fn auth_file(&self) -> Option<(&'static str, &Path)> {
        match (&self.password_env, &self.password_file, &self.bearer_token_env, &self.bearer_token_file) {
            (None, Some(path), _, _) => Some(("schema_registry.password_file", path)),
            (_, _, None, Some(path)) => Some(("schema_registry.bearer_token_file", path)),
            _ => None,
        }
    }

    /// Checks the section on its own: URLs, one way to authenticate, the subject template.
    fn validate(&self) -> Result<()> {
        if self.url.is_empty() {
            return Err(Error::definite("schema_registry.url needs at least one URL"));
        }
        for url in &self.url {
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains(['?', '#']) {
                return Err(Error::definite(format!(
                    "schema_registry.url {url:?} must be an http:// or https:// base URL (no query)"
                )));
            }
        }
        one_password(
            "schema_registry",
            self.password.is_some(),
            self.password_env.is_some(),
            self.password_file.is_some(),
        )?;
        let token = [self.bearer_token.is_some(), self.bearer_token_env.is_some(), self.bearer_token_file.is_some()];
        if token.iter().filter(|t| **t).count() > 1 {
            return Err(Error::definite(
                "schema_registry: set only one of bearer_token, bearer_token_env and bearer_token_file",
            ));
        }
        let password = self.password.is_some() || self.password_env.is_some() || self.password_file.is_some();
        if self.username.is_some() != password {
            return Err(Error::definite("schema_registry: basic auth needs both username and a password"));
        }
        if password && token.contains(&true) {
            return Err(Error::definite("schema_registry: choose basic auth (username, password) or a bearer token"));
        }
        if self.timeout.is_zero() {
            return Err(Error::definite("schema_registry.timeout_ms must be at least 1"));
        }
        let template = self.subject_template();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            let end = rest[start..].find('}').map(|e| start + e).ok_or_else(|| {
                Error::definite(format!("schema_registry.subject {:?}: an unclosed ${{", self.subject))
            })?;
            let name = &rest[start + 2..end];
            if !["topic", "aggregate_type", "event_type"].contains(&name) {
                return Err(Error::definite(format!(
                    "schema_registry.subject {:?}: unknown placeholder ${{{name}}} (use ${{topic}},                      ${{aggregate_type}}, ${{event_type}}, or a preset: topic_name, record_name, topic_record_name)",
                    self.subject
                )));
            }
            rest = &rest[end + 1..];
        }
        if template.is_empty() {
            return Err(Error::definite("schema_registry.subject must not be empty"));
        }
        Ok(())
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(url) => vec![url],
        OneOrMany::Many(urls) => urls,
    })
    .map(|urls| urls.into_iter().map(|u| u.trim_end_matches('/').to_string()).collect())
}

fn default_subject() -> String {
    "topic_name".into()
}

fn default_registry_timeout() -> Duration {
    Duration::from_millis(10_000)
}

fn default_latest_refresh() -> Duration {
    Duration::from_millis(300_000)
}

/// `[schema_registry]`: present exactly when a format needs it; the columns its subject and version
/// read become required.
pub(super) fn validate_registry(
    registry: Option<&SchemaRegistryConfig>,
    kafka: &KafkaConfig,
    columns: &mut ColumnNames,
) -> Result<()> {
    let needs = kafka.value_format.uses_registry() || kafka.key_format == KeyFormat::Avro;
    let Some(registry) = registry else {
        return match needs {
            true => Err(Error::definite(format!(
                "kafka.value_format = {:?} / key_format = {:?} needs a [schema_registry] section (url, \
                 credentials) to read the schemas from",
                kafka.value_format, kafka.key_format
            ))),
            false => Ok(()),
        };
    };
    if !needs {
        return Err(Error::definite(
            "[schema_registry] is set, but no format uses it: set kafka.value_format = \"avro\", \"json_schema\" \\
                 or \"protobuf\" (or key_format = \"avro\"), or remove the section",
        ));
    }
    registry.validate()?;
    if kafka.value_format.uses_registry() {
        // The subject and version are read from these columns: the table must have them.
        if registry.subject_template().contains("${event_type}") {
            columns.set[3] = true;
        }
        if registry.version == RegistryVersion::SchemaVersion {
            columns.set[4] = true;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;
    use crate::config::*;

    /// `[schema_registry]` exactly when a format needs it; one way to authenticate; presets expand; the
    /// columns the subject and version read become required.
    #[test]
    fn schema_registry_section_rules() {
        let with = |kafka: &str, section: &str| {
            Config::parse(&format!("{}\n{kafka}\n{section}", MINIMAL.trim_end())).map_err(|e| e.to_string())
        };
        let registry = "[schema_registry]\nurl = \"http://r:8081/\"";
        let err = with("value_format = \"avro\"", "").unwrap_err();
        assert!(err.contains("needs a [schema_registry] section"), "{err}");
        assert!(with("", registry).unwrap_err().contains("no format uses it"));
        let c = with("value_format = \"avro\"", registry).unwrap();
        let r = c.schema_registry.as_ref().unwrap();
        assert_eq!((r.url.clone(), r.subject_template()), (vec!["http://r:8081".to_string()], "${topic}-value"));
        assert_eq!(r.auth().unwrap(), RegistryAuth::None);
        assert!(c.outbox.columns.must_exist(4) && !c.outbox.columns.must_exist(3), "schema_version is read");
        let c =
            with("value_format = \"avro\"", &format!("{registry}\nsubject = \"record_name\"\nversion = \"latest\""))
                .unwrap();
        assert!(c.outbox.columns.must_exist(3) && !c.outbox.columns.must_exist(4), "event_type is read");
        assert!(with("key_format = \"avro\"", registry).is_ok());
        for (bad, why) in [
            ("subject = \"${topic}.${table}\"", "unknown placeholder ${table}"),
            ("username = \"u\"", "needs both username and a password"),
            ("username = \"u\"\npassword = \"p\"\nbearer_token = \"t\"", "or a bearer token"),
            ("bearer_token = \"t\"\nbearer_token_env = \"T\"", "only one of bearer_token"),
            ("timeout_ms = 0", "timeout_ms"),
        ] {
            let err = with("value_format = \"avro\"", &format!("{registry}\n{bad}")).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let err = with("value_format = \"avro\"", "[schema_registry]\nurl = [\"ftp://r\"]").unwrap_err();
        assert!(err.contains("http:// or https://"), "{err}");
        let basic =
            with("value_format = \"avro\"", &format!("{registry}\nusername = \"u\"\npassword = \"p\"")).unwrap();
        let auth = basic.schema_registry.unwrap().auth().unwrap();
        assert_eq!(auth, RegistryAuth::Basic { username: "u".into(), password: Secret::new("p") });
    }

    /// Which credentials the registry client reads again at every request: those of a file, and no others.
    #[test]
    fn only_file_credentials_are_read_per_request() {
        let file = |section: &str| {
            let text = format!(
                "{}
value_format = \"avro\"\n[schema_registry]\nurl = \"http://r\"\n{section}",
                MINIMAL.trim_end()
            );
            let config = Config::parse(&text).unwrap().schema_registry.unwrap();
            config.auth_file().map(|(setting, path)| (setting, path.to_path_buf()))
        };
        let at = |setting: &'static str, path: &str| Some((setting, std::path::PathBuf::from(path)));
        assert_eq!(file("username = \"u\"\npassword_file = \"/run/p\""), at("schema_registry.password_file", "/run/p"));
        assert_eq!(file("bearer_token_file = \"/run/t\""), at("schema_registry.bearer_token_file", "/run/t"));
        for fixed in [
            "",
            "username = \"u\"\npassword = \"p\"",
            "username = \"u\"\npassword_env = \"P\"",
            "bearer_token = \"t\"",
            "bearer_token_env = \"T\"",
        ] {
            assert_eq!(file(fixed), None, "{fixed}");
        }
    }
}
