//! Schema Registry formats: which schema a row is encoded with, fetched once and cached, and the
//! Confluent wire format (`0x00`, the schema id as 4 bytes big-endian, then the datum: Avro binary
//! ([`avro`]), the validated JSON ([`json_schema`]), or the message-index array and the Protobuf message
//! ([`protobuf`])).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2; the router (same floor) imports it.
//!
//! # Which schema
//! A row's subject is `[schema_registry] subject` rendered with the row's topic, aggregate type and event
//! type; its version is the row's `schema_version` (`version = "schema_version"`, the outbox's contract
//! version and the registry's agree) or the subject's latest. The key's subject is `<topic>-key`, latest.
//!
//! # Invariants
//! - The hot path never waits on the registry for a schema it holds: [`Schemas::resolve`] looks a
//!   (subject, version) up once and caches it for the run (a numbered version never changes in a registry).
//!   A `latest` older than `latest_refresh_ms` is returned at once and looked up again in the background
//!   (`Schemas::refresh_in_background`: one lookup in flight per subject, on its own thread); its answer
//!   replaces the entry, and a lookup that fails keeps the cached one, with a warning, until the next
//!   refresh. Only a first lookup blocks: without a schema there is nothing to publish with.
//! - A record is never published without its schema: an answer about the row's subject or version (not
//!   found, invalid, a conflict, denied to these credentials: [`registry::Lookup::Refused`], the rule table is
//!   in [`registry`]) is poison ([`crate::poison::PoisonKind::SchemaMissing`], the reason quoting the
//!   registry), which holds that aggregate only; the answer is remembered for [`MISSING_RETRY`], then asked
//!   again, so a schema registered meanwhile is found by the next row that needs it, and `quarantine
//!   release` republishes the held ones.
//! - An answer about the registry itself is the same for every row, so it is never poison: one that cannot
//!   be reached is a transient error from [`Schemas::resolve`] (the run waits and starts again from its
//!   checkpoint); refused credentials, a URL that does not serve the API, a certificate the CA does not
//!   verify are definite.

pub mod avro;
pub mod check;
pub mod json_schema;
pub mod protobuf;
pub mod registry;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::config::{Config, KeyFormat, RegistryVersion, SchemaRegistryConfig, ValueFormat};
use crate::error::{Error, Result};
use crate::outbox::{OutboxRow, SchemaVersion};

use avro::{AvroCodec, Mismatch};
use json_schema::JsonSchemaCodec;
use protobuf::ProtobufCodec;
use registry::{Lookup, Registered, Registry, Why};

/// How long a "no such subject or version" answer stands before the registry is asked again.
pub const MISSING_RETRY: Duration = Duration::from_secs(5);

/// The Confluent wire format's first byte.
pub const MAGIC: u8 = 0;

/// The schemas of one run: the registry client, what it answered, and how rows name their schema.
pub struct Schemas {
    config: SchemaRegistryConfig,
    format: ValueFormat,
    key_avro: bool,
    /// Built on first use: credentials are read when the connector first talks to the registry. Shared with
    /// the background refreshes of `latest`.
    client: OnceLock<Arc<Registry>>,
    /// What the registry answered for each (subject, version); shared with the background refreshes.
    cache: Arc<Mutex<HashMap<CacheKey, Entry>>>,
}

/// A subject and a version (`None`: the latest).
type CacheKey = (String, Option<i64>);

impl std::fmt::Debug for Schemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schemas").field("url", &self.config.url).field("format", &self.format).finish()
    }
}

#[derive(Clone)]
enum Entry {
    /// The schema, looked up `at`; `refreshing` while a background lookup of a stale `latest` is in flight.
    Known { schema: Arc<Resolved>, at: Instant, refreshing: bool },
    /// The registry's no about this subject or version (the row's poison), answered `at`.
    Missing { reason: String, at: Instant },
}

impl Entry {
    fn known(schema: Resolved) -> Entry {
        Entry::Known { schema: Arc::new(schema), at: Instant::now(), refreshing: false }
    }

    fn missing(reason: String) -> Entry {
        Entry::Missing { reason, at: Instant::now() }
    }
}

/// A registered schema, ready to encode with.
#[derive(Debug)]
pub struct Resolved {
    /// Its global id: what the wire format carries.
    pub id: u32,
    /// Its subject.
    pub subject: String,
    /// Its version in the subject.
    pub version: i64,
    codec: Codec,
}

#[derive(Debug)]
enum Codec {
    /// Boxed: a parsed Avro schema is several times the size of the other codecs.
    Avro(Box<AvroCodec>),
    JsonSchema(JsonSchemaCodec),
    Protobuf(ProtobufCodec),
}

impl Resolved {
    /// Appends the framed datum of `payload` (whose JSON text is `text`) to `out`; `event_type` picks the
    /// message of a Protobuf schema that defines several.
    ///
    /// # Errors
    /// Where the payload does not fit the schema; `out` then holds a partial value.
    pub fn encode(
        &self,
        payload: &serde_json::Value,
        text: &str,
        event_type: &str,
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), Mismatch> {
        out.push(MAGIC);
        out.extend_from_slice(&self.id.to_be_bytes());
        match &self.codec {
            Codec::Avro(codec) => codec.encode(payload, out),
            Codec::JsonSchema(codec) => codec.encode(payload, text, out),
            Codec::Protobuf(codec) => codec.encode(event_type, text, out),
        }
    }

    /// Whether this is the Avro `string` schema (what a key subject must hold).
    fn is_string(&self) -> bool {
        match &self.codec {
            Codec::Avro(codec) => codec.is_string(),
            Codec::JsonSchema(_) | Codec::Protobuf(_) => false,
        }
    }
}

/// A cached answer for a (subject, version).
pub enum Cached {
    /// The schema.
    Known(Arc<Resolved>),
    /// The registry's answer about the subject or version is no (not found, invalid, a conflict, denied), or
    /// what it holds cannot be used: why.
    Missing(String),
    /// Not looked up (a caller skipped [`Schemas::resolve`]).
    Unknown,
}

impl Schemas {
    /// The schemas `config` needs, if any.
    pub fn for_config(config: &Config) -> Option<Arc<Schemas>> {
        let registry = config.schema_registry.as_ref()?;
        Some(Arc::new(Schemas {
            config: registry.clone(),
            format: config.kafka.value_format,
            key_avro: config.kafka.key_format == KeyFormat::Avro,
            client: OnceLock::new(),
            cache: Arc::new(Mutex::new(HashMap::new())),
        }))
    }

    /// Whether values are encoded with the registry's schemas.
    pub fn encodes_values(&self) -> bool {
        self.format.uses_registry()
    }

    /// Whether keys are Avro strings.
    pub fn encodes_keys(&self) -> bool {
        self.key_avro
    }

    /// The subject of a row routed to `topic`.
    pub fn value_subject(&self, topic: &str, aggregate_type: &str, event_type: &str) -> String {
        render_subject(self.config.subject_template(), topic, aggregate_type, event_type)
    }

    /// The version a row names: `Some(n)`, or `None` for the latest.
    ///
    /// # Errors
    /// Why the row names no version of a registry (no `schema_version`, or not an integer from 1 to
    /// 2147483647): the row's poison, never a question to the registry.
    pub fn version_of(&self, row: &OutboxRow) -> std::result::Result<Option<i64>, String> {
        if self.config.version == RegistryVersion::Latest {
            return Ok(None);
        }
        registry_version(row.schema_version.as_ref()).map(Some)
    }

    /// What is cached for `subject` at `version` (`None`: latest).
    pub fn cached(&self, subject: &str, version: Option<i64>) -> Cached {
        let cache = self.cache.lock().expect("cache lock");
        match cache.get(&(subject.to_string(), version)) {
            Some(Entry::Known { schema, .. }) => Cached::Known(schema.clone()),
            Some(Entry::Missing { reason, .. }) => Cached::Missing(reason.clone()),
            None => Cached::Unknown,
        }
    }

    /// Makes sure the cache answers for `subject` at `version` (`None`: latest), asking the registry when
    /// it does not yet (or no longer: an old "missing"). A cached `latest` older than `latest_refresh_ms` is
    /// kept, and looked up again in the background: this call never waits for it.
    ///
    /// # Errors
    /// Transient when the registry cannot be reached, definite when its answer concerns the registry itself
    /// (refused credentials, a URL that does not serve the API, an answer the API does not describe).
    pub fn resolve(&self, subject: &str, version: Option<i64>) -> Result<()> {
        self.resolve_as(subject, version, self.format)
    }

    fn resolve_as(&self, subject: &str, version: Option<i64>, format: ValueFormat) -> Result<()> {
        let key = (subject.to_string(), version);
        if subject.is_empty() {
            // `GET /subjects//versions/1` is a bare 404 (no Confluent error code), which is not "not found"
            // and stopped the connector for one row (issue 44: an empty event type under `record_name`).
            let reason = format!(
                "the row's subject is empty: schema_registry.subject {:?} rendered with its topic, aggregate \
                 type and event type names no subject",
                self.config.subject_template()
            );
            self.cache.lock().expect("cache lock").insert(key, Entry::missing(reason));
            return Ok(());
        }
        if !self.needs_lookup(&key, format)? {
            return Ok(());
        }
        let answer = blocking(|| fetch(self.client()?, subject, version, format));
        let entry = entry_of(answer)?;
        self.cache.lock().expect("cache lock").insert(key, entry);
        Ok(())
    }

    /// Whether `key` must be looked up before a row can use it: not yet asked, or an old "missing". A
    /// stale `latest` needs none: its background refresh starts here, unless one is in flight.
    fn needs_lookup(&self, key: &CacheKey, format: ValueFormat) -> Result<bool> {
        let mut cache = self.cache.lock().expect("cache lock");
        match cache.get_mut(key) {
            None => Ok(true),
            Some(Entry::Missing { at, .. }) => Ok(at.elapsed() >= MISSING_RETRY),
            Some(Entry::Known { at, refreshing, .. }) => {
                if key.1.is_none() && !*refreshing && at.elapsed() >= self.config.latest_refresh {
                    // A Known entry came from the client, so it is built.
                    if let Some(client) = self.client.get() {
                        *refreshing = true;
                        drop(cache);
                        self.refresh_in_background(Arc::clone(client), key.clone(), format);
                    }
                }
                Ok(false)
            }
        }
    }

    /// Looks `key`'s latest version up again on a thread of its own; its answer replaces the entry, a
    /// failure keeps it (with a warning) until the next refresh.
    fn refresh_in_background(&self, client: Arc<Registry>, key: CacheKey, format: ValueFormat) {
        let cache = Arc::clone(&self.cache);
        let spawned = std::thread::Builder::new().name("registry-refresh".into()).spawn({
            let (cache, key) = (Arc::clone(&cache), key.clone());
            move || {
                let answer = fetch(&client, &key.0, key.1, format);
                refreshed(&cache, key, answer);
            }
        });
        if let Err(error) = spawned {
            let error = Error::transient(format!("no thread to look it up on: {error}"));
            refreshed(&cache, key, Err(Lookup::Failed(error)));
        }
    }

    /// Makes sure the key schema of `topic` is cached (`<topic>-key`, latest; registered as `"string"`
    /// with `auto_register`). A registration the registry refuses for this subject (409 incompatible, 422,
    /// 403) is the poison of that topic's rows, as a missing key schema is.
    ///
    /// # Errors
    /// As [`Schemas::resolve`], and definite when the key subject holds another schema than `"string"`.
    pub fn resolve_key(&self, topic: &str) -> Result<()> {
        let subject = key_subject(topic);
        let key = (subject.clone(), None);
        // A key schema, once found, is kept for the run: it is "string", or the connector stopped.
        if matches!(self.cached(&subject, None), Cached::Known(_)) || !self.needs_lookup(&key, ValueFormat::Avro)? {
            return self.key_is_string(&subject);
        }
        let entry = match blocking(|| fetch(self.client()?, &subject, None, ValueFormat::Avro)) {
            Err(Lookup::Refused(refusal)) if refusal.why == Why::NotFound && self.config.auto_register => {
                match blocking(|| self.client()?.register(&subject, "\"string\"")) {
                    Ok(id) => {
                        tracing::info!(
                            subject,
                            id,
                            "registered the key schema \"string\" (schema_registry.auto_register)"
                        );
                        entry_of(blocking(|| fetch(self.client()?, &subject, None, ValueFormat::Avro)))?
                    }
                    Err(Lookup::Refused(refusal)) => Entry::missing(format!(
                        "schema_registry.auto_register could not register the key schema \"string\": {refusal}"
                    )),
                    Err(other) => entry_of(Err(other))?,
                }
            }
            answer => entry_of(answer)?,
        };
        self.cache.lock().expect("cache lock").insert(key, entry);
        self.key_is_string(&subject)
    }

    /// Definite when the cached key schema of `subject` is another than the Avro `"string"`.
    fn key_is_string(&self, subject: &str) -> Result<()> {
        match self.cached(subject, None) {
            Cached::Known(schema) if !schema.is_string() => Err(Error::definite(format!(
                "kafka.key_format = \"avro\" writes keys as the Avro schema \"string\", but subject {subject:?} \
                 version {} (id {}) holds another schema: register \"string\" as its new version",
                schema.version, schema.id
            ))),
            _ => Ok(()),
        }
    }

    /// The registry client, built on first use.
    ///
    /// # Errors
    /// Definite when a credential or the CA file cannot be read.
    pub fn client(&self) -> Result<&Registry> {
        if let Some(client) = self.client.get() {
            return Ok(client);
        }
        let client = Arc::new(Registry::new(&self.config)?);
        Ok(self.client.get_or_init(|| client))
    }
}

/// The cache entry of a lookup's answer: the schema, or the row's poison; an error about the registry
/// itself is returned.
fn entry_of(answer: std::result::Result<Resolved, Lookup>) -> Result<Entry> {
    match answer {
        Ok(schema) => Ok(Entry::known(schema)),
        Err(Lookup::Refused(refusal)) => Ok(Entry::missing(refusal.to_string())),
        Err(Lookup::Unusable(reason)) => Ok(Entry::missing(reason)),
        Err(Lookup::Failed(error)) => Err(error),
    }
}

/// Stores the answer of a background refresh of `key`: a schema or a no replaces the entry; a failure
/// keeps the cached schema, and it is looked up again after `latest_refresh_ms`.
fn refreshed(cache: &Mutex<HashMap<CacheKey, Entry>>, key: CacheKey, answer: std::result::Result<Resolved, Lookup>) {
    let subject = key.0.clone();
    let mut cache = cache.lock().expect("cache lock");
    match entry_of(answer) {
        Ok(entry) => {
            match (&entry, cache.get(&key)) {
                (Entry::Known { schema, .. }, Some(Entry::Known { schema: old, .. })) if schema.id != old.id => {
                    tracing::info!(subject, id = schema.id, version = schema.version, "a new latest schema");
                }
                (Entry::Missing { reason, .. }, _) => {
                    tracing::warn!(subject, reason, "the latest schema is no longer usable: its rows are poison");
                }
                _ => {}
            }
            cache.insert(key, entry);
        }
        Err(error) => {
            if let Some(Entry::Known { at, refreshing, .. }) = cache.get_mut(&key) {
                *at = Instant::now();
                *refreshing = false;
            }
            tracing::warn!(subject, %error, "keeping the cached latest schema: the registry's latest cannot be looked up");
        }
    }
}

/// Looks `subject` at `version` (`None`: latest) up, with the schemas it references, and makes the codec
/// `format` writes with.
fn fetch(
    client: &Registry,
    subject: &str,
    version: Option<i64>,
    format: ValueFormat,
) -> std::result::Result<Resolved, Lookup> {
    let version_text = version.map_or_else(|| "latest".to_string(), |v| v.to_string());
    let registered = client.version(subject, &version_text)?;
    let schema_type = registered.schema_type.as_deref().unwrap_or("AVRO");
    let mut references = Vec::new();
    collect_references(client, &registered, &mut references, 0)?;
    let unusable = |what: &str, e: String| {
        Lookup::Unusable(format!(
            "subject {subject:?} version {} (id {}) is not {what} the connector can read: {e}",
            registered.version, registered.id
        ))
    };
    let codec = match (format, schema_type) {
        (ValueFormat::Avro, "AVRO") => {
            let texts: Vec<String> = references.into_iter().map(|(_, r)| r.schema).collect();
            Codec::Avro(Box::new(
                AvroCodec::parse(&registered.schema, &texts).map_err(|e| unusable("an Avro schema", e))?,
            ))
        }
        (ValueFormat::JsonSchema, "JSON") => {
            let named: Vec<(String, String)> = references.into_iter().map(|(name, r)| (name, r.schema)).collect();
            Codec::JsonSchema(
                JsonSchemaCodec::parse(&registered.schema, &named).map_err(|e| unusable("a JSON Schema", e))?,
            )
        }
        (ValueFormat::Protobuf, "PROTOBUF") => {
            let named: Vec<(String, String)> = references.into_iter().map(|(name, r)| (name, r.schema)).collect();
            Codec::Protobuf(
                ProtobufCodec::parse(&registered.schema, &named).map_err(|e| unusable("a Protobuf schema", e))?,
            )
        }
        (format, found) => {
            return Err(Lookup::Unusable(format!(
                "subject {subject:?} version {} (id {}) holds a {found} schema, and the connector writes {format:?} \
                 there",
                registered.version, registered.id
            )))
        }
    };
    Ok(Resolved { id: registered.id, subject: registered.subject, version: registered.version, codec })
}

/// The registry version a row's `schema_version` names. Registries number versions with 32-bit integers:
/// a larger number was answered 422 ("invalid version"), which is not "not found", and stopped the
/// connector for one row (issue 44); it is that row's poison instead.
fn registry_version(version: Option<&SchemaVersion>) -> std::result::Result<i64, String> {
    let number = match version {
        Some(SchemaVersion::Integer(n)) => i64::try_from(*n).ok(),
        Some(SchemaVersion::Text(text)) => text.trim().parse::<i64>().ok(),
        None => return Err("the row has no schema_version, which names its schema's version".into()),
    };
    match number {
        Some(n) if (1..=i64::from(i32::MAX)).contains(&n) => Ok(n),
        _ => Err(format!(
            "schema_version {:?} is not a registry version (an integer from 1 to 2147483647)",
            version.map(|v| format!("{v:?}")).unwrap_or_default()
        )),
    }
}

/// The subject of a topic's keys.
pub fn key_subject(topic: &str) -> String {
    format!("{topic}-key")
}

/// `template` with its placeholders filled in.
pub fn render_subject(template: &str, topic: &str, aggregate_type: &str, event_type: &str) -> String {
    template
        .replace("${topic}", topic)
        .replace("${aggregate_type}", aggregate_type)
        .replace("${event_type}", event_type)
}

/// The schemas `registered` references, each with the name it is referenced by, each after its own
/// references (depth-first), each once.
fn collect_references(
    client: &Registry,
    registered: &Registered,
    into: &mut Vec<(String, Registered)>,
    depth: usize,
) -> std::result::Result<(), Lookup> {
    if depth > 32 {
        return Err(Lookup::Failed(Error::definite(format!(
            "subject {:?}: schema references nest deeper than 32 (a loop?)",
            registered.subject
        ))));
    }
    for reference in &registered.references {
        if into.iter().any(|(_, r)| r.subject == reference.subject && r.version == reference.version) {
            continue;
        }
        let found = client.version(&reference.subject, &reference.version.to_string()).map_err(|e| match e {
            Lookup::Refused(mut refusal) => {
                refusal.referenced_by = Some(format!(
                    "which subject {:?} version {} references as {:?}",
                    registered.subject, registered.version, reference.name
                ));
                Lookup::Refused(refusal)
            }
            failed => failed,
        })?;
        collect_references(client, &found, into, depth + 1)?;
        into.push((reference.name.clone(), found));
    }
    Ok(())
}

/// Runs a registry call from async code: off the runtime's worker where the runtime allows it (a first
/// lookup happens once per subject and version, and the run's one task must wait for it anyway).
fn blocking<T>(call: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(call)
        }
        _ => call(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44: a version beyond the registry's 32 bits was asked for, answered 422, and stopped the
    /// connector; it is now the row's poison, like every version that is not one.
    #[test]
    fn a_version_is_an_integer_from_1_to_i32_max() {
        let ok = |v: SchemaVersion| registry_version(Some(&v));
        assert_eq!(ok(SchemaVersion::Integer(1)), Ok(1));
        assert_eq!(ok(SchemaVersion::Integer(2_147_483_647)), Ok(2_147_483_647));
        assert_eq!(ok(SchemaVersion::Text(" 7 ".into())), Ok(7));
        for bad in [
            SchemaVersion::Integer(0),
            SchemaVersion::Integer(2_147_483_648),
            SchemaVersion::Integer(-1),
            SchemaVersion::Integer(i128::MAX),
            SchemaVersion::Text("v3".into()),
            SchemaVersion::Text("4294967296".into()),
        ] {
            let why = registry_version(Some(&bad)).unwrap_err();
            assert!(why.contains("an integer from 1 to 2147483647"), "{bad:?}: {why}");
        }
        assert!(registry_version(None).unwrap_err().contains("no schema_version"));
    }

    /// Issue 44: an empty subject (an empty event type under `record_name`) was asked for, answered a bare
    /// 404, and stopped the connector; it is now "missing" without asking (the registry's URL here answers
    /// nothing, so a question would be a transient error).
    #[test]
    fn an_empty_subject_is_missing_without_asking_the_registry() {
        let config = Config::parse(
            "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"s.t\"\n\
             [kafka]\nbootstrap_servers = \"k:9092\"\nvalue_format = \"avro\"\n\
             [schema_registry]\nurl = \"http://127.0.0.1:9\"\nsubject = \"record_name\"\n",
        )
        .unwrap();
        let schemas = Schemas::for_config(&config).unwrap();
        let subject = schemas.value_subject("t", "order", "");
        assert_eq!(subject, "");
        schemas.resolve(&subject, Some(1)).unwrap();
        match schemas.cached(&subject, Some(1)) {
            Cached::Missing(why) => assert!(why.contains("subject is empty"), "{why}"),
            _ => panic!("an empty subject must be missing"),
        }
    }

    #[test]
    fn subjects_render_from_presets_and_templates() {
        assert_eq!(
            render_subject("${topic}-value", "outbox.event.order", "order", "Created"),
            "outbox.event.order-value"
        );
        assert_eq!(
            render_subject("${aggregate_type}.${event_type}", "t", "order", "com.acme.Created"),
            "order.com.acme.Created"
        );
        assert_eq!(key_subject("t"), "t-key");
    }
}
