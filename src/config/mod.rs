//! `connector.toml`: the one configuration file.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).
//!
//! The serde structs of the sections are the user-facing reference (their `///` comments are the docs);
//! unknown keys are rejected. Each TOML section has a file of its own holding its struct, its defaults and
//! the checks that need only it (or what it is handed); this file holds the whole ([`Config`]), parsing,
//! and the order in which the sections are checked. [`Config::load`] parses and validates, so the rest of
//! the program only sees settings that make sense together. Secrets can be written in the file, or come
//! from the environment (`password_env`, `[kafka] properties_env`) or from files (`password_file`,
//! `[kafka] properties_file`: a Kubernetes or Docker secret mounted as a volume). The environment and the
//! files are read when a command connects ([`Config::source_password`], [`KafkaConfig::resolved_properties`]),
//! not when the config is loaded, so `status` works without them. Secrets are never logged: [`Secret`] and
//! [`Properties`] redact themselves in `Debug`, and a TOML error never quotes the file (see [`crate::secret`]).

mod control;
mod delivery;
mod kafka;
mod metrics;
mod opentelemetry;
mod outbox;
mod poll;
mod prune;
mod schema_registry;
mod snapshot;
mod source;
mod state;

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub use self::control::{ControlConfig, TokenSource, TOKEN_ENV, TOKEN_FILE_NAME};
pub use self::delivery::{DeliveryConfig, Guarantee};
pub use self::kafka::{
    KafkaAuth, KafkaConfig, KeyFormat, RecordTimestamp, ValueFormat, DEFAULT_TRANSACTION_TIMEOUT_MS,
};
pub use self::metrics::MetricsConfig;
pub use self::opentelemetry::OpenTelemetryConfig;
pub use self::outbox::{ColumnNames, OnPoison, OnUpdate, OutboxConfig, PayloadEncoding, Placement, PlacementTarget};
pub use self::poll::{PollConfig, PollOrder, PollProgress};
pub use self::prune::PruneConfig;
pub use self::schema_registry::{RegistryAuth, RegistryVersion, SchemaRegistryConfig};
pub use self::snapshot::{SnapshotConfig, SnapshotLock, SnapshotMode};
pub use self::source::{
    Auth, AuthKind, Binlogs, Connection, FilesSource, PollSource, ResumeBy, ServerSource, Source, SourceConfig,
    SourceKind, StartFrom, TlsMode, TokenCloud, TokenFrom,
};
pub use self::state::{StateBackend, StateConfig};
use crate::error::{Error, Result};
use crate::outbox::TableName;
pub use crate::secret::{Properties, Secret};
use crate::topic::TopicTemplate;

/// The whole configuration file, as written. Only [`Config::parse`] reads one: it validates it into a
/// [`Config`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    /// The MySQL/MariaDB server to replicate from.
    pub source: source::SourceToml,
    /// Which table(s) hold the outbox and how its columns are named.
    pub outbox: OutboxConfig,
    /// Where events go.
    pub kafka: KafkaConfig,
    /// Where the checkpoint lives.
    #[serde(default)]
    pub state: StateConfig,
    /// The initial snapshot of rows already in the outbox.
    #[serde(default)]
    pub snapshot: SnapshotConfig,
    /// The operations endpoint (`/metrics`, `/healthz`, `/readyz`) and purge-risk monitoring.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The control API of a running connector.
    #[serde(default)]
    pub control: ControlConfig,
    /// Spans for the events that carry the writer's trace.
    #[serde(default)]
    pub opentelemetry: OpenTelemetryConfig,
    /// `outbox-cdc prune`: deleting published outbox rows.
    #[serde(default)]
    pub prune: PruneConfig,
    /// The polling relay (`source.kind = "poll"`).
    #[serde(default)]
    pub poll: PollConfig,
    /// The delivery guarantee, and taking over from another instance.
    #[serde(default)]
    pub delivery: DeliveryConfig,
    /// The Schema Registry of `kafka.value_format = "avro" | "json_schema" | "protobuf"` and
    /// `kafka.key_format = "avro"`.
    pub schema_registry: Option<SchemaRegistryConfig>,
}

/// The validated configuration: every setting of the file, checked to make sense together, with what is
/// derived from them parsed once ([`Config::tables`], [`Config::topic`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// The MySQL/MariaDB server to replicate from.
    pub source: SourceConfig,
    /// Which table(s) hold the outbox and how its columns are named.
    pub outbox: OutboxConfig,
    /// Where events go.
    pub kafka: KafkaConfig,
    /// Where the checkpoint lives.
    pub state: StateConfig,
    /// The initial snapshot of rows already in the outbox.
    pub snapshot: SnapshotConfig,
    /// The operations endpoint (`/metrics`, `/healthz`, `/readyz`) and purge-risk monitoring.
    pub metrics: MetricsConfig,
    /// The control API of a running connector.
    pub control: ControlConfig,
    /// Spans for the events that carry the writer's trace.
    pub opentelemetry: OpenTelemetryConfig,
    /// `outbox-cdc prune`: deleting published outbox rows.
    pub prune: PruneConfig,
    /// The polling relay (`source.kind = "poll"`).
    pub poll: PollConfig,
    /// The delivery guarantee, and taking over from another instance.
    pub delivery: DeliveryConfig,
    /// The Schema Registry, where a value or key format needs one (validation requires it then, and refuses
    /// it otherwise).
    pub schema_registry: Option<SchemaRegistryConfig>,
    /// The outbox tables, parsed, sorted, without duplicates; never empty.
    tables: Vec<TableName>,
    /// `[outbox] signal_table`, parsed.
    signal_table: Option<TableName>,
    /// `kafka.topic`, parsed.
    topic: TopicTemplate,
    /// `outbox.additional_placement`, parsed.
    placements: Vec<Placement>,
}

impl Config {
    /// What makes two connectors of one `state.name` the same connector: the outbox tables, the topic
    /// template, the broker and the state topic. The lease's holder announces it
    /// ([`crate::lease::Lease::acquire_as`]) so that a standby of another connector can tell.
    pub fn fingerprint(&self) -> u32 {
        let tables: Vec<String> = self.tables().iter().map(ToString::to_string).collect();
        let text = format!(
            "{}\n{}\n{}\n{}",
            tables.join(","),
            self.kafka.topic,
            self.kafka.bootstrap_servers,
            self.state.topic
        );
        crc32fast::hash(text.as_bytes())
    }

    /// `delivery.transactional_id`, or `state.name`.
    pub fn transactional_id(&self) -> &str {
        self.delivery.transactional_id.as_deref().unwrap_or(&self.state.name)
    }

    /// Where the state lives, for messages: the state directory, or the state topic and connector name.
    pub fn state_location(&self) -> String {
        match self.state.backend {
            StateBackend::Local => self.state.dir.display().to_string(),
            StateBackend::Kafka => format!("Kafka topic {} (connector {})", self.state.topic, self.state.name),
        }
    }

    /// Whether this run writes events and checkpoints in Kafka transactions.
    pub fn exactly_once(&self) -> bool {
        self.delivery.guarantee == Guarantee::ExactlyOnce
    }
}

fn default_true() -> bool {
    true
}

/// A duration the file gives in whole milliseconds (the `_ms` keys), read once into a [`Duration`] so that no
/// caller converts it again; the bounds are checked, in milliseconds, by the section's `validate`.
fn millis<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Duration, D::Error> {
    u64::deserialize(deserializer).map(Duration::from_millis)
}

/// Refuses a `section` with more than one of `password`, `password_env` and `password_file`.
fn one_password(section: &str, literal: bool, env: bool, file: bool) -> Result<()> {
    match [literal, env, file].iter().filter(|set| **set).count() {
        0 | 1 => Ok(()),
        _ => Err(Error::definite(format!(
            "set at most one of {section}.password, {section}.password_env and {section}.password_file"
        ))),
    }
}

impl Config {
    /// Reads, parses and validates a config file.
    ///
    /// # Errors
    /// Definite errors for an unreadable file, unknown keys, or inconsistent settings.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::definite(format!("cannot read config file {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| e.context(format_args!("config file {}", path.display())))
    }

    /// Parses and validates config text.
    ///
    /// # Errors
    /// Definite errors for unknown keys or inconsistent settings.
    pub fn parse(text: &str) -> Result<Config> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        file.validate()
    }

    /// The outbox tables, parsed, sorted, without duplicates; never empty.
    pub fn tables(&self) -> &[TableName] {
        &self.tables
    }

    /// `[outbox] signal_table`, parsed: the table whose inserts are signals.
    pub fn signal_table(&self) -> Option<&TableName> {
        self.signal_table.as_ref()
    }

    /// The outbox tables as `database.table`, in [`Config::tables`]' order.
    pub fn table_names(&self) -> Vec<String> {
        self.tables().iter().map(ToString::to_string).collect()
    }

    /// `outbox.additional_placement`, parsed: more columns to publish as headers or envelope fields.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// The topic template (`kafka.topic`), parsed.
    pub fn topic(&self) -> &TopicTemplate {
        &self.topic
    }

    /// The database password, read from the environment or a file if configured so; none for binlog files.
    ///
    /// # Errors
    /// A definite error when `password_env` names a variable that is not set, or `password_file` a file
    /// that cannot be read or is empty.
    pub fn source_password(&self) -> Result<Option<Secret>> {
        self.source.kind.connection().map_or(Ok(None), Connection::password)
    }
}

/// The secret in environment variable `var`, which `setting` names.
fn from_env(setting: &str, var: &str) -> Result<Secret> {
    match std::env::var(var) {
        Ok(value) => Ok(Secret::new(value)),
        Err(std::env::VarError::NotPresent) => {
            Err(Error::definite(format!("{setting} names {var}, but that environment variable is not set")))
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Error::definite(format!("{setting} names {var}, but that environment variable is not UTF-8 text")))
        }
    }
}

/// The secret in the file at `path`, which `setting` names ([`crate::secret::read_file`]).
fn from_file(setting: &str, path: &Path) -> Result<Secret> {
    crate::secret::read_file(path).map_err(|e| {
        let fix = match e {
            crate::secret::FileSecretError::Unreadable(_) => {
                "; mount the secret there, readable by the connector's user"
            }
            _ => "",
        };
        Error::definite(format!("{setting} names the file {}, but {e}{fix}", path.display()))
    })
}

impl ConfigFile {
    /// Checks that the settings make sense together and parses what is derived from them: each section
    /// checks itself (handed the settings of other sections it depends on), in this order, and the first
    /// setting that does not make sense is the error.
    ///
    /// # Errors
    /// A definite error naming the first setting that does not.
    fn validate(mut self) -> Result<Config> {
        let tables = self.outbox.tables()?;
        let kind = self.source.kind;
        let signal_table = self.outbox.signal_table(&tables, kind)?;
        let source = self.source.validate(self.snapshot.mode)?;
        self.poll.validate(kind, &self.kafka, &tables)?;
        self.state.validate(kind)?;
        self.delivery.validate(&self.state, kind, &self.kafka)?;
        let topic = TopicTemplate::parse(&self.kafka.topic)?;
        self.metrics.validate()?;
        self.control.validate()?;
        self.kafka.validate()?;
        self.snapshot.validate()?;
        self.prune.validate()?;
        let placements = self.outbox.validate(self.kafka.value_format)?;
        schema_registry::validate_registry(self.schema_registry.as_ref(), &self.kafka, &mut self.outbox.columns)?;
        Ok(Config {
            source,
            outbox: self.outbox,
            kafka: self.kafka,
            state: self.state,
            snapshot: self.snapshot,
            metrics: self.metrics,
            control: self.control,
            opentelemetry: self.opentelemetry,
            prune: self.prune,
            poll: self.poll,
            delivery: self.delivery,
            schema_registry: self.schema_registry,
            tables,
            signal_table,
            topic,
            placements,
        })
    }
}

/// A TOML error as line, column and toml's message, without the source line toml's `Display` quotes
/// (`5 | pasword = "hunter2"` would print a misspelled password), and with the values of secret-looking
/// keys masked where the message quotes them (`invalid type: integer `1234``).
fn toml_error(text: &str, error: &toml::de::Error) -> Error {
    let message = error.message().trim().replace('\n', "; ");
    let message = crate::secret::mask_values(&message, &crate::secret::values_in_toml(text));
    match error.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Error::definite(format!("line {line}, column {column}: {message}"))
        }
        None => Error::definite(message),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    pub(super) const MINIMAL: &str = r#"
        [source]
        host = "127.0.0.1"
        user = "cdc"
        password = "pw"
        server_id = 5401
        [outbox]
        table = "shop.outbox_events"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
    "#;

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(c.source.kind.connection().map(|c| c.port), Some(3306));
        assert_eq!(c.kafka.topic, "outbox.event.${aggregate_type}");
        assert_eq!(c.kafka.value_format, ValueFormat::Envelope);
        assert_eq!(c.state.dir, PathBuf::from("state"));
        assert_eq!(c.outbox.on_update, OnUpdate::Ignore);
        assert_eq!(c.tables().to_vec(), vec![TableName { database: "shop".into(), table: "outbox_events".into() }]);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text = MINIMAL.replace("server_id = 5401", "server_id = 5401\nserverid = 1");
        let err = Config::parse(&text).unwrap_err();
        assert!(err.to_string().contains("serverid"), "{err}");
    }

    #[test]
    fn malformed_table_names_are_rejected() {
        for bad in ["outbox", ".t", "db.", "a.b.c"] {
            let text = MINIMAL.replace("shop.outbox_events", bad);
            assert!(Config::parse(&text).is_err(), "{bad}");
        }
    }

    #[test]
    fn password_env_must_exist() {
        let text = MINIMAL.replace("password = \"pw\"", "password_env = \"OUTBOX_CDC_TEST_UNSET_VAR\"");
        let c = Config::parse(&text).unwrap();
        assert!(c.source_password().unwrap_err().to_string().contains("OUTBOX_CDC_TEST_UNSET_VAR"));
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let c = Config::parse(MINIMAL).unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("\"pw\""), "{dbg}");
    }

    /// Regression: a TOML error quoted the offending line, so a misspelled `pasword = "hunter2"` printed
    /// the password; a type error quoted the value (`invalid type: integer `12345``). The error still says
    /// where and what is wrong.
    #[test]
    fn toml_errors_name_the_place_but_never_a_secret_value() {
        let cases: &[(&str, &str, &str)] = &[
            ("password = \"pw\"", "pasword = \"hunter2\"", "unknown field `pasword`"),
            ("password = \"pw\"", "password = 12345", "invalid type: integer `***`"),
            ("password = \"pw\"", "pasword = hunter2", "line 5, column"),
            ("password = \"pw\"", "password = \"hunter2", "line 5, column"),
        ];
        for (from, to, expected) in cases {
            let text = MINIMAL.replace(from, to);
            let err = Config::parse(&text).unwrap_err().to_string();
            assert!(err.contains(expected), "{to}: {err}");
            assert!(err.starts_with("line 5, column "), "{to}: {err}");
            for secret in ["hunter2", "12345"] {
                assert!(!err.contains(secret), "{to}: {err}");
            }
        }
    }

    #[test]
    fn bad_topic_template_is_rejected() {
        let text = format!("{}\ntopic = \"x.${{nope}}\"\n", MINIMAL.trim_end());
        assert!(Config::parse(&text).unwrap_err().to_string().contains("nope"));
    }

    /// Where each secret can come from, one row per rule: at most one source per password; the Kafka
    /// secret tables take only secret-looking keys, set nowhere else, never one outbox-cdc owns.
    #[test]
    fn secret_sources_are_validated() {
        let source = |password: &str| MINIMAL.replace("password = \"pw\"", password);
        let kafka = |tables: &str| format!("{MINIMAL}\n{tables}\n");
        let cases: &[(String, Option<&str>)] = &[
            (source("password_file = \"/run/secrets/db\""), None),
            (source("password_env = \"PW\""), None),
            (source(""), None),
            (source("password = \"pw\"\npassword_file = \"/f\""), Some("at most one of source.password")),
            (source("password_env = \"PW\"\npassword_file = \"/f\""), Some("at most one of source.password")),
            (format!("{MINIMAL}\n[prune]\nuser = \"p\"\npassword_file = \"/f\"\n"), None),
            (format!("{MINIMAL}\n[prune]\npassword_file = \"/f\"\n"), Some("need prune.user")),
            (
                format!("{MINIMAL}\n[prune]\nuser = \"p\"\npassword_env = \"PW\"\npassword_file = \"/f\"\n"),
                Some("at most one of prune.password"),
            ),
            (kafka("[kafka.properties_env]\n\"sasl.password\" = \"KAFKA_PASSWORD\""), None),
            (kafka("[kafka.properties_file]\n\"sasl.username\" = \"/u\"\n\"sasl.password\" = \"/p\""), None),
            (kafka("[kafka.properties_file]\n\"sasl.oauthbearer.client.secret\" = \"/s\""), None),
            (
                kafka("[kafka.properties]\n\"sasl.password\" = \"x\"\n[kafka.properties_env]\n\"sasl.password\" = \"P\""),
                Some("kafka.properties_env.\"sasl.password\" is set in kafka.properties too"),
            ),
            (
                kafka("[kafka.properties_env]\n\"sasl.password\" = \"P\"\n[kafka.properties_file]\n\"sasl.password\" = \"/p\""),
                Some("is set in kafka.properties_file too"),
            ),
            (kafka("[kafka.properties_env]\n\"sasl.password\" = \"\""), Some("names nothing")),
            (kafka("[kafka.properties_file]\n\"sasl.password\" = \"\""), Some("names nothing")),
            (kafka("[kafka.properties_env]\n\"acks\" = \"ACKS\""), Some("outbox-cdc sets acks itself")),
            (kafka("[kafka.properties_file]\n\"enable.idempotence\" = \"/i\""), Some("sets enable.idempotence itself")),
            (kafka("[kafka.properties_env]\n\"bootstrap.servers\" = \"B\""), Some("use the dedicated [kafka] setting")),
            (
                kafka("[kafka.properties_env]\n\"sasl.mechanism\" = \"M\""),
                Some("sasl.mechanism is not one, set it in [kafka.properties]"),
            ),
            (kafka("[kafka.properties_file]\n\"sasl.oauthbearer.client.id\" = \"/id\""), Some("is not one")),
        ];
        for (text, refusal) in cases {
            match (Config::parse(text), refusal) {
                (Ok(_), None) => {}
                (Err(e), Some(expected)) => assert!(e.to_string().contains(expected), "{e}\n{text}"),
                (got, _) => panic!("{:?} for\n{text}", got.map(|_| "accepted")),
            }
        }
    }

    /// `source.password_file` (and so `prune.password_file`, which `prune` reads through the same
    /// settings): read when asked for, trailing newline trimmed, the path (never the content) in the error.
    #[test]
    fn database_passwords_are_read_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("db-password");
        std::fs::write(&file, "s3cret\r\n").unwrap();
        let text = MINIMAL.replace("password = \"pw\"", &format!("password_file = \"{}\"", file.display()));
        let config = Config::parse(&text).unwrap();
        assert_eq!(config.source_password().unwrap().unwrap().expose(), "s3cret");
        std::fs::write(&file, "").unwrap();
        let error = config.source_password().unwrap_err();
        let text = error.to_string();
        assert!(error.is_definite() && text.contains("db-password") && text.contains("empty"), "{text}");
        std::fs::remove_file(&file).unwrap();
        let error = config.source_password().unwrap_err().to_string();
        assert!(
            error.starts_with("source.password_file names the file ") && error.contains("mount the secret"),
            "{error}"
        );
    }

    #[test]
    fn example_config_in_repo_is_valid() {
        let text = include_str!("../../connector.toml");
        Config::parse(text).unwrap();
    }
}
