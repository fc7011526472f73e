//! Progress of long scans (snapshot, audit) for humans: a progress bar on a terminal, periodic log lines otherwise.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How often progress is logged when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Items done out of an estimated total.
pub struct Progress {
    /// What is progressing, e.g. "snapshot", as shown on the bar and in log lines.
    what: &'static str,
    bar: Option<ProgressBar>,
    total: u64,
    started: Instant,
    first_done: u64,
    last_log: Mutex<Instant>,
}

impl Progress {
    /// Starts reporting snapshot rows; `done` rows were finished by an earlier run.
    pub fn new(total: u64, done: u64) -> Self {
        Progress::labelled("snapshot", "rows", total, done)
    }

    /// Starts reporting `what` (counted in `unit`), `done` of them finished already.
    pub fn labelled(what: &'static str, unit: &str, total: u64, done: u64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total.max(done));
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{what} {{bar:40.cyan/blue}} {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, ETA {{eta}})"
                ))
                .expect("valid template"),
            );
            bar.set_position(done);
            bar
        });
        Progress { what, bar, total, started: Instant::now(), first_done: done, last_log: Mutex::new(Instant::now()) }
    }

    /// Updates the rows done.
    pub fn set(&self, done: u64) {
        if let Some(bar) = &self.bar {
            if done > bar.length().unwrap_or(0) {
                bar.set_length(done);
            }
            bar.set_position(done);
            return;
        }
        let mut last = self.last_log.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() >= LOG_EVERY {
            *last = Instant::now();
            let rate = (done - self.first_done) as f64 / self.started.elapsed().as_secs_f64().max(0.001);
            let eta_s = if rate > 0.0 { self.total.saturating_sub(done) as f64 / rate } else { f64::NAN };
            tracing::info!(
                rows_done = done,
                rows_estimate = self.total,
                rows_per_s = rate as u64,
                eta_s = eta_s.round(),
                "{} progress",
                self.what
            );
        }
    }

    /// Reports completion.
    pub fn finish(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            bar.finish();
        }
    }
}
