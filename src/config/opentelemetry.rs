//! `[opentelemetry]`: spans for the events that carry the writer's trace, exported over OTLP.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).
//!
//! Only the switch is here: where the spans go and how they are sampled are the standard `OTEL_*`
//! environment variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`), read by the
//! OpenTelemetry SDK as every other instrumented service of the user's reads them.

use serde::Deserialize;

/// `[opentelemetry]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenTelemetryConfig {
    /// Create a span for each event carrying a trace context and export them; off by default (then
    /// nothing is read, created or sent).
    #[serde(default)]
    pub enabled: bool,
}
