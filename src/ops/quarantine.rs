//! `outbox-cdc quarantine list | release`: the aggregates on hold, and giving one back to its topic
//! ([`super::release`] does the work).
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.

use crate::checkpoint::Store;
use crate::config::Config;
use crate::error::Result;
use crate::schema::registry::encode_path;

/// `outbox-cdc quarantine list`: the aggregates on hold, as text or JSON.
///
/// # Errors
/// A definite error when the store cannot be read.
pub async fn list(config: &Config, json: bool) -> Result<()> {
    let holds = Store::inspect_for(config).await?.map(|i| i.holds).unwrap_or_default();
    if json {
        println!("{}", serde_json::to_string_pretty(&holds).expect("serializes"));
    } else {
        print!("{}", super::release::describe(&holds));
    }
    Ok(())
}

/// `outbox-cdc quarantine release`: republishes a hold's events and removes it, then says what happened.
///
/// # Errors
/// What [`super::release::release`] refuses, with the fix.
pub async fn release(
    config: &Config,
    aggregate_type: &str,
    aggregate_id: &str,
    skip_poison: bool,
    accept_missing: bool,
) -> Result<()> {
    if let Some(client) = super::client::Client::for_config(config)? {
        let path = format!(
            "/v1/holds/{}/{}/release?skip_poison={skip_poison}&accept_missing={accept_missing}",
            encode_path(aggregate_type),
            encode_path(aggregate_id)
        );
        if let Some(answer) = tokio::task::block_in_place(|| client.call("POST", &path))? {
            let republished = answer["republished"].as_u64().unwrap_or(0);
            let skipped: Vec<&str> =
                answer["skipped"].as_array().map(|a| a.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
            let missing_first = answer["missing_first"].as_str().map(String::from);
            let report = super::release::ReleaseReport {
                republished,
                skipped: skipped.into_iter().map(String::from).collect(),
                missing_first,
            };
            print_report(aggregate_type, aggregate_id, report, " (by the running connector)");
            return Ok(());
        }
    }
    let report = super::release::release(config, aggregate_type, aggregate_id, skip_poison, accept_missing).await?;
    print_report(aggregate_type, aggregate_id, report, "");
    Ok(())
}

/// What a release did, as both ways print it.
fn print_report(aggregate_type: &str, aggregate_id: &str, report: super::release::ReleaseReport, by: &str) {
    println!(
        "released {aggregate_type}/{aggregate_id}{by}: {} event(s) republished{}",
        report.republished,
        match report.skipped.len() {
            0 => String::new(),
            n => format!(", {n} still-poison event(s) skipped: {}", report.skipped.join(", ")),
        }
    );
    if let Some(first) = report.missing_first {
        println!("the hold's first event {first} was not in the dead-letter topic (--accept-missing)");
    }
}
