//! A graceful stop while Kafka does not answer: `outbox-cdc run` gets SIGTERM with its broker paused
//! (SIGSTOP), must exit within README's "Stop timeouts", and the next start, with the broker back, must
//! resolve what the stop left open. Every test ends with `outbox-cdc audit`.
//!
//! The broker is paused, not killed: a paused broker accepts connections and answers nothing, which is
//! what a client sees of an unreachable cluster, and it keeps every record, so that the next start can be
//! audited (noida-db is not durable across its own restart). noida-db for both guarantees: the only broker
//! here with real transactions, which `exactly_once` needs (the mock cluster runs in the test's process
//! only, and the binary needs a bootstrap address). Tansu is not used: resumed after SIGSTOP, its metadata
//! requests timed out and the closing audit could not read the topic.

mod common;

use std::time::{Duration, Instant};

use common::reliability::{self, steady_workload, wait_commits, Duplicates, PROGRESS_TIMEOUT};
use common::{Broker, Connector, Engine, MariaDb, Writer};

/// README, "Stop timeouts": every supervisor there waits this long after SIGTERM before SIGKILL.
const SUPERVISOR_STOP_TIMEOUT: Duration = Duration::from_secs(90);

/// Lines of the connector's log shown in assertion messages.
const LOG_LINES: usize = 80;

/// Sends `signal` (`STOP`, `CONT`, `TERM`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status();
    assert!(ok.expect("kill").success(), "kill -{signal} {pid}");
}

/// The broker's process ids: the one process that listens on its port (found by its arguments; the
/// harness keeps its `Child` private).
fn broker_pids(broker: &Broker) -> Vec<u32> {
    let pattern = match broker.engine() {
        Engine::Noida => format!("--kafka-port {} ", broker.port()),
        Engine::Sqlite | Engine::Memory => format!("tcp://127.0.0.1:{} ", broker.port()),
    };
    let out = std::process::Command::new("pgrep").args(["-f", "--", &pattern]).output().expect("pgrep");
    let pids: Vec<u32> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect();
    assert!(!pids.is_empty(), "no process of the broker on port {}", broker.port());
    pids
}

/// Starts a connector with `settings` under a steady workload, pauses the broker once events flow, stops
/// the connector with SIGTERM while the broker stays paused, and returns how long the stop took. Then
/// wakes the broker, starts the connector again, and audits the topic: with `exactly_once` no duplicate,
/// else duplicates only after the checkpoint.
async fn stop_while_paused(engine: Engine, settings: &str, exactly_once: bool, name: &str) -> Duration {
    let db = MariaDb::start();
    let broker = Broker::start(engine);
    let mut connector = Connector::start(&db, &broker, settings);
    let writer = Writer::start(db.opts_root(), steady_workload());
    wait_commits(&writer, 300, "before the broker is paused").await;
    assert!(
        !broker.read_all("outbox.event.order", 1, PROGRESS_TIMEOUT).is_empty(),
        "nothing published before the pause:\n{}",
        connector.log_tail(LOG_LINES)
    );
    let pids = broker_pids(&broker);
    for pid in &pids {
        signal(*pid, "STOP");
    }
    // Events committed while the broker is paused: the connector reads them, produces them into its
    // transaction, and its commit waits for a broker that never answers.
    wait_commits(&writer, 300, "while the broker is paused").await;
    let asked = Instant::now();
    signal(connector.pid().expect("running"), "TERM");
    let exited = connector.wait_exit(SUPERVISOR_STOP_TIMEOUT);
    let took = asked.elapsed();
    if exited.is_none() {
        connector.kill();
    }
    for pid in &pids {
        signal(*pid, "CONT");
    }
    let status = exited.unwrap_or_else(|| {
        panic!(
            "{name}: outbox-cdc did not exit within {SUPERVISOR_STOP_TIMEOUT:?} of SIGTERM with Kafka unreachable:\n{}",
            connector.log_tail(LOG_LINES)
        )
    });
    assert!(status.success(), "{name}: exit {status}:\n{}", connector.log_tail(LOG_LINES));

    // The next start, with the broker back, resolves what the stop left unknown: nothing lost, nothing
    // published twice beyond what the guarantee allows.
    connector.restart();
    wait_commits(&writer, 300, "after the restart").await;
    let written = writer.finish().await;
    match exactly_once {
        true => reliability::closing_audit_exactly_once(name, &connector, &written),
        false => reliability::closing_audit(name, &connector, &written, Duplicates::AfterCheckpoint),
    };
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
    took
}

/// Guards against a SIGTERM that never ends while Kafka is unreachable (issue 46, finding 6): a commit
/// that times out has an unknown outcome and was asked again without limit, and the stop waited for it.
/// The stop must end within the supervisors' 90 s, leaving the outcome unknown and the checkpoint
/// unwritten; the next start's `init_transactions` completes or aborts that transaction, and the audit
/// sees every event exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_a_stop_while_kafka_is_unreachable_ends_in_time_and_loses_nothing() {
    let settings =
        "[delivery]\nguarantee = \"exactly_once\"\n[state]\nbackend = \"kafka\"\ncheckpoint_interval_ms = 200\n";
    let took = stop_while_paused(Engine::Noida, settings, true, "exactly_once, paused broker").await;
    eprintln!("exactly_once: stopped {took:?} after SIGTERM with the broker paused");
}

/// The same with `at_least_once` and the local state, whose stop path differs: it waits for acknowledgements for
/// `SHUTDOWN_GRACE`, purges the rest and checkpoints what was acknowledged; the next start publishes the
/// unacknowledged tail again (duplicates allowed only after the checkpoint).
#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_a_stop_while_kafka_is_unreachable_ends_in_time_and_loses_nothing() {
    let took = stop_while_paused(Engine::Noida, "", false, "at_least_once, paused broker").await;
    eprintln!("at_least_once: stopped {took:?} after SIGTERM with the broker paused");
}
