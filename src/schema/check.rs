//! `check`'s Schema Registry findings: the registry answers, accepts the credentials, and every subject the
//! configuration can name resolves.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.

use super::registry::{Lookup, Why};
use super::{key_subject, render_subject, Schemas};
use crate::config::{Config, RegistryVersion};
use crate::findings::Report;

/// The findings for `config`'s registry, with the routed `topics` `check` found in the outbox tables;
/// `None` without a registry. Blocking: call off the async runtime.
pub fn check(config: &Config, topics: &[String]) -> Option<Report> {
    let schemas = Schemas::for_config(config)?;
    let registry = config.schema_registry.as_ref()?;
    let mut report = Report::default();
    let urls = registry.url.join(", ");
    let client = match schemas.client() {
        Ok(client) => client,
        Err(e) => {
            report.push("schema registry credentials", "readable", "not readable", false, &e.to_string());
            return Some(report);
        }
    };
    match client.subjects() {
        Ok(subjects) => report.push(
            "schema registry",
            "reachable, credentials accepted",
            &format!("{urls}: {} subject(s)", subjects.len()),
            true,
            "",
        ),
        Err(e) => {
            report.push("schema registry", "reachable, credentials accepted", &urls, false, &e.to_string());
            return Some(report);
        }
    }
    let template = registry.subject_template();
    let mut subjects: Vec<String> = Vec::new();
    if schemas.encodes_values() {
        if template.contains("${aggregate_type}") || template.contains("${event_type}") {
            report.warn(
                "schema_registry.subject",
                "subjects named by the configuration",
                &format!("{template:?} depends on each row's aggregate or event type"),
                "each row's subject is looked up when it is first published; a missing one is dead-lettered as \
                 schema_missing (register it, then `outbox-cdc quarantine release`)",
            );
        } else {
            subjects.extend(topics.iter().map(|t| render_subject(template, t, "", "")));
        }
    }
    if schemas.encodes_keys() {
        subjects.extend(topics.iter().map(|t| key_subject(t)));
    }
    for subject in subjects {
        let expected = match (registry.version, subject.ends_with("-key")) {
            (RegistryVersion::SchemaVersion, false) => "registered (the rows name its versions)",
            _ => "registered",
        };
        let message = match client.version(&subject, "latest") {
            Ok(latest) => {
                let found = format!("latest version {} (id {})", latest.version, latest.id);
                report.push(&format!("subject {subject}"), expected, &found, true, "");
                continue;
            }
            Err(Lookup::Failed(e)) => {
                report.push(&format!("subject {subject}"), expected, "not looked up", false, &e.to_string());
                continue;
            }
            // Invalid, a conflict, denied: the refusal says what to do.
            Err(Lookup::Refused(refusal)) if refusal.why != Why::NotFound => {
                report.push(&format!("subject {subject}"), expected, &refusal.to_string(), false, "");
                continue;
            }
            Err(Lookup::Refused(refusal)) => refusal.to_string(),
            Err(Lookup::Unusable(message)) => message,
        };
        let fix = match (subject.ends_with("-key"), registry.auto_register) {
            (true, true) => "auto_register registers \"string\" at the first key",
            (true, false) => "register the schema \"string\" under it, or set schema_registry.auto_register",
            _ => {
                "register the event's schema under it (the application's CI does); rows published before \
                  are dead-lettered as schema_missing until then"
            }
        };
        match subject.ends_with("-key") && registry.auto_register {
            true => report.warn(&format!("subject {subject}"), expected, &message, fix),
            false => report.push(&format!("subject {subject}"), expected, &message, false, fix),
        }
    }
    Some(report)
}
