//! The stored formats do not change by accident: state directories written by an earlier build
//! (`tests/fixtures/state/`, see its README) load with today's code and give back the same bytes.

use std::path::{Path, PathBuf};

use outbox_cdc::checkpoint::Store;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state").join(name)
}

/// A private copy: opening a store for writing may touch the file.
fn copy_of(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(name).join("outbox-cdc.redb"), dir.path().join("outbox-cdc.redb")).unwrap();
    dir
}

fn text(name: &str, file: &str) -> String {
    std::fs::read_to_string(fixture(name).join(file)).unwrap()
}

fn lines<T: serde::Serialize>(records: &[T]) -> String {
    records.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect()
}

/// Regression guard for issue 17's moves: a checkpoint, snapshot progress, holds (in both stored shapes) and
/// known poison written before the move load unchanged, through the writer and through the read-only path.
#[test]
fn stores_written_by_an_earlier_build_load_unchanged() {
    for name in ["mysql-snapshot", "mariadb-stream", "files-no-gtid"] {
        let dir = copy_of(name);
        let inspection = Store::inspect(dir.path()).unwrap().expect("a store");
        let checkpoint = inspection.checkpoint.expect("a checkpoint");
        assert_eq!(serde_json::to_string(&checkpoint).unwrap(), text(name, "checkpoint.json"), "{name}");
        assert_eq!(lines(&inspection.holds), text(name, "holds.jsonl"), "{name}");

        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.load().unwrap().as_ref(), Some(&checkpoint), "{name}");
        assert_eq!(lines(&store.holds().unwrap()), text(name, "holds.jsonl"), "{name}");
        assert_eq!(lines(&store.known_poison().unwrap()), text(name, "known_poison.jsonl"), "{name}");
        let last_error = store.last_error().unwrap().expect("a last error");
        assert_eq!(last_error.class, "definite");
        assert_eq!(last_error.message, "binlog purged: mysql-bin.000007 is no longer on the server");
    }
}

/// `outbox-cdc status --json` prints the stored records as it did before the move.
#[test]
fn status_json_of_an_earlier_store_is_unchanged() {
    let dir = copy_of("mysql-snapshot");
    let config = dir.path().join("connector.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\nhost = \"127.0.0.1\"\nport = 9\nuser = \"cdc\"\nserver_id = 99\n\
             [outbox]\ntables = [\"shop.outbox_events\", \"shop.outbox_payments\"]\n\
             [kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n[state]\ndir = {:?}\n",
            dir.path()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["status", "--json", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text("mysql-snapshot", "status.json"));
}
