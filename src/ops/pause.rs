//! `outbox-cdc pause | resume`: stop reading and publishing, and stay so across restarts and failovers,
//! until resumed. Through the running connector's control API when it answers ([`super::api`]); with the
//! connector stopped, in its state store, so that it starts paused (or not).
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.

use crate::checkpoint::store::Paused;
use crate::config::Config;
use crate::error::Result;

/// Pauses (`pause`) or resumes the connector, and says what it did.
///
/// # Errors
/// The control API's refusal (a standby, another connector there, a wrong token); the store's, offline.
pub async fn set(config: &Config, pause: bool) -> Result<()> {
    let verb = if pause { "paused" } else { "resumed" };
    if let Some(client) = super::client::Client::for_config(config)? {
        let path = if pause { "/v1/pause" } else { "/v1/resume" };
        if let Some(answer) = tokio::task::block_in_place(|| client.call("POST", path))? {
            match answer["was_paused"].as_bool() == Some(pause) {
                true => {
                    println!("connector {} was already {}", config.state.name, if pause { "paused" } else { "running" })
                }
                false => println!("connector {} {verb} (through its control API)", config.state.name),
            }
            return Ok(());
        }
    }
    let why = "pausing or resuming a connector whose control API does not answer needs it stopped (it writes \
               the state store)";
    let was = super::with_stopped_store(config, why, async |store| {
        let was = store.paused()?.is_some();
        if was != pause {
            store.set_paused(pause.then(|| Paused { at_ms: crate::time::now_ms(), by: "cli".to_string() }).as_ref())?;
        }
        Ok(was)
    })
    .await?;
    match was == pause {
        true => println!("connector {} was already {}", config.state.name, if pause { "paused" } else { "not paused" }),
        false => println!(
            "connector {} {verb}: it is not running; it starts {}",
            config.state.name,
            match pause {
                true => "paused",
                false => "publishing",
            }
        ),
    }
    Ok(())
}
