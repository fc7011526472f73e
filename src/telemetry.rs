//! OpenTelemetry (`[opentelemetry] enabled`): the writer's trace continued through the connector into the
//! record. An event whose row carries a W3C trace context gets two spans in that trace, exported over
//! OTLP, and its record carries the second one's `traceparent`, so the consumer's span is its child:
//!
//! - `outbox write <table>` (internal), the row's commit, backdated: it starts at the row's `occurred_at`
//!   and ends when the connector reads the row; a child of the writer's span;
//! - `send <topic>` (producer, the `messaging.*` semantic conventions: `messaging.system = kafka`, the
//!   topic, the event id as the message id, the key), the record handed to the producer; its child.
//!
//! The context is the row's `traceparent` (and `tracestate`), from its `headers` JSON object or a column
//! placed as a header, else Debezium's `tracingspancontext` column placed as a header (Java `Properties`
//! text, as Debezium's outbox router reads it). An event without one gets no span: no trace is started per
//! event. Sampling follows the writer's flag (`OTEL_TRACES_SAMPLER`, parent-based by default).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2, and the router's record.
//!
//! # Cost
//! Off, a record costs one check of a `OnceLock`. On, the spans are built on the producing task and handed
//! to the SDK's batch processor, which exports them from a thread of its own (`OTEL_BSP_*`); a full queue
//! drops spans, never waits. docs/PERFORMANCE.md has the bench's figures with tracing on.

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::error::{Error, Result};
use crate::outbox::TableName;
use crate::router::{HeaderName, KafkaRecord};

/// The header Debezium's outbox router reads the writer's context from (its `tracingspancontext` column).
pub const DEBEZIUM_CONTEXT: &str = "tracingspancontext";

/// The process's tracer, once [`start`] made it.
static TELEMETRY: OnceLock<Telemetry> = OnceLock::new();

/// The tracer and what exports its spans.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

/// What a row says of its event, for the spans.
pub struct EventSpans<'a> {
    /// The outbox table.
    pub table: &'a TableName,
    /// The event id.
    pub id: &'a str,
    /// The record's key as text (the aggregate id).
    pub aggregate_id: &'a str,
    /// The event type.
    pub event_type: Option<&'a str>,
    /// The row's `occurred_at` (ms since the epoch), when it has one.
    pub occurred_at_ms: Option<i64>,
}

/// Starts the exporter from the standard `OTEL_*` variables and makes the tracer [`tracer`] returns.
///
/// # Errors
/// A definite error when the exporter cannot be built (an endpoint that does not parse, a protocol this
/// build has not: `grpc`).
pub fn start() -> Result<()> {
    let protocol = match std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .as_deref()
    {
        Err(_) | Ok("http/protobuf") => opentelemetry_otlp::Protocol::HttpBinary,
        Ok("http/json") => opentelemetry_otlp::Protocol::HttpJson,
        Ok(other) => {
            return Err(Error::definite(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL = {other:?}: outbox-cdc exports over http/protobuf (the default) or \
                 http/json; a collector takes both on its port 4318"
            )))
        }
    };
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_http_client(Blocking::new())
        .build()
        .map_err(|e| Error::definite(format!("the OTLP exporter: {e}")))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name("outbox-cdc");
    }
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
    let tracer = provider.tracer("outbox-cdc");
    let telemetry = Telemetry { provider, tracer, propagator: TraceContextPropagator::new() };
    if TELEMETRY.set(telemetry).is_err() {
        return Err(Error::definite("OpenTelemetry was started twice"));
    }
    tracing::info!("OpenTelemetry on: a span for each event that carries a trace context, exported over OTLP");
    Ok(())
}

/// The tracer, when `[opentelemetry]` is enabled and [`start`] ran.
pub fn tracer() -> Option<&'static Telemetry> {
    TELEMETRY.get()
}

/// Exports the spans not yet exported (at the process's end).
pub fn shutdown() {
    if let Some(telemetry) = TELEMETRY.get() {
        if let Err(e) = telemetry.provider.shutdown() {
            tracing::warn!(error = %e, "OpenTelemetry: the last spans were not all exported");
        }
    }
}

impl Telemetry {
    /// The spans of the event `record` carries, when its headers hold the writer's context; the record's
    /// `traceparent` (and `tracestate`) then become those of its `send` span.
    pub fn trace(&self, record: &mut KafkaRecord, event: &EventSpans<'_>) {
        let parent = self.propagator.extract(&Carrier(&record.headers));
        let parent = match parent.span().span_context().is_valid() {
            true => parent,
            false => match properties_context(&record.headers) {
                Some(headers) => self.propagator.extract(&Owned(&headers)),
                None => return,
            },
        };
        if !parent.span().span_context().is_valid() {
            return;
        }
        let now = SystemTime::now();
        let started = event
            .occurred_at_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
            .filter(|at| *at <= now)
            .unwrap_or(now);
        let mut write = self
            .tracer
            .span_builder(format!("outbox write {}", event.table))
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .with_attributes([
                KeyValue::new("db.collection.name", event.table.to_string()),
                KeyValue::new("db.operation.name", "INSERT"),
                KeyValue::new("outbox.event.id", event.id.to_string()),
            ])
            .start_with_context(&self.tracer, &parent);
        write.end_with_timestamp(now);
        let write = parent.with_remote_span_context(write.span_context().clone());
        let mut attributes = vec![
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "send"),
            KeyValue::new("messaging.destination.name", record.topic.clone()),
            KeyValue::new("messaging.message.id", event.id.to_string()),
            KeyValue::new("messaging.kafka.message.key", event.aggregate_id.to_string()),
        ];
        if let Some(event_type) = event.event_type {
            attributes.push(KeyValue::new("outbox.event.type", event_type.to_string()));
        }
        let send = self
            .tracer
            .span_builder(format!("send {}", record.topic))
            .with_kind(SpanKind::Producer)
            .with_start_time(now)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &write);
        let sent = Context::new().with_remote_span_context(send.span_context().clone());
        drop(send);
        self.propagator.inject_context(&sent, &mut Headers(&mut record.headers));
    }
}

/// A record's headers, read by the propagator (the W3C names are lower-case, as the router writes them).
struct Carrier<'a>(&'a [(HeaderName, Vec<u8>)]);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let (_, value) = self.0.iter().find(|(name, _)| name.eq_ignore_ascii_case(key))?;
        std::str::from_utf8(value).ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_ref()).collect()
    }
}

/// Entries read from Debezium's `tracingspancontext`.
struct Owned<'a>(&'a [(String, String)]);

impl Extractor for Owned<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(name, _)| name.eq_ignore_ascii_case(key)).map(|(_, value)| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

/// A record's headers, written by the propagator: a header of the same name is replaced, else added.
struct Headers<'a>(&'a mut Vec<(HeaderName, Vec<u8>)>);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        match self.0.iter_mut().find(|(name, _)| name.eq_ignore_ascii_case(key)) {
            Some((_, old)) => *old = value.into_bytes(),
            None => self.0.push((Cow::Owned(key.to_string()), value.into_bytes())),
        }
    }
}

/// The entries of a `tracingspancontext` header: Java `Properties` text (`key=value` or `key: value`
/// lines, `#` and `!` comments), as Debezium's outbox router and its writers' libraries store a context.
fn properties_context(headers: &[(HeaderName, Vec<u8>)]) -> Option<Vec<(String, String)>> {
    let (_, text) = headers.iter().find(|(name, _)| name.eq_ignore_ascii_case(DEBEZIUM_CONTEXT))?;
    let text = std::str::from_utf8(text).ok()?;
    let entries = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#') && !line.starts_with('!'))
        .filter_map(|line| {
            let at = line.find(['=', ':'])?;
            Some((line[..at].trim().to_string(), line[at + 1..].trim().to_string()))
        })
        .collect();
    Some(entries)
}

/// The OTLP exporter's HTTP client: ureq (the registry's client), blocking, as the batch processor's own
/// thread calls it.
#[derive(Debug)]
struct Blocking(ureq::Agent);

impl Blocking {
    fn new() -> Self {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false)
            .build();
        Blocking(ureq::Agent::new_with_config(config))
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Blocking {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> std::result::Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (head, body) = request.into_parts();
        let request = http::Request::from_parts(head, body.to_vec());
        let response = self.0.run(request)?;
        let (head, mut body) = response.into_parts();
        let bytes = body.read_to_vec()?;
        Ok(http::Response::from_parts(head, bytes::Bytes::from(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debezium's `tracingspancontext`: Java `Properties` text with its date comment, read as the entries.
    #[test]
    fn a_properties_context_is_read_as_its_entries() {
        let text =
            "#\n#Wed Oct 11 12:00:00 UTC 2023\ntraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n\
                    tracestate = vendor=x\n! another comment\n";
        let headers = vec![(Cow::Borrowed("TracingSpanContext"), text.as_bytes().to_vec())];
        let entries = properties_context(&headers).unwrap();
        assert_eq!(
            entries,
            [
                ("traceparent".into(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
                ("tracestate".into(), "vendor=x".into())
            ]
        );
        assert!(properties_context(&[]).is_none());
    }
}
