//! `check` names every privilege the configured mode needs, and prints the `GRANT` that fixes each for the
//! connector's own account: for a user missing one grant at a time, the exact finding; then that fix, run
//! as printed, makes the finding pass. Privileges held through a default role (and a role granted to it)
//! count; those of a role the session does not activate do not. The binlog source and the polling relay
//! (marking rows, then with its progress table) each, on MariaDB. MySQL's snapshot lock privileges (`LOCK TABLES`, `RELOAD`)
//! are MySQL-only findings, tested on `SHOW GRANTS` lines in `src/source/preflight.rs`.

mod common;

use std::time::Duration;

use common::connector::toml_str;
use common::{Broker, Connector, Engine, MariaDb};

const USER: &str = "probe";
const PASSWORD: &str = "probe-pw";
/// The account as `CURRENT_USER()` and every fix name it.
const ACCOUNT: &str = "'probe'@'%'";

/// The README's grants for the binlog source on MariaDB ("On your own MySQL", step 2).
const BINLOG_GRANTS: &[&str] = &[
    "GRANT REPLICATION SLAVE, BINLOG MONITOR, SLAVE MONITOR ON *.* TO 'probe'@'%'",
    "GRANT SELECT ON shop.outbox_events TO 'probe'@'%'",
];

/// `check`'s exit code and stdout for `connector`'s config with the probe account.
fn check(connector: &Connector) -> (Option<i32>, String) {
    let (status, stdout, stderr) =
        connector.command(&["check"], Duration::from_secs(120)).unwrap_or_else(|e| panic!("check runs: {e}"));
    assert!(!stdout.is_empty(), "check printed nothing: {stderr}");
    eprintln!("check: {status}\n{stdout}");
    // A crash is never a finding.
    assert!(matches!(status.code(), Some(0..=3)), "check ended with {status}:\n{stdout}\n{stderr}");
    assert!(
        status.success() || stdout.contains("[FAIL]"),
        "check failed without a finding (a missing privilege must be reported, not stop it):\n{stdout}\n{stderr}"
    );
    (status.code(), stdout)
}

/// A connector whose config connects as the probe account.
fn probe_connector(db: &MariaDb, broker: &Broker) -> Connector {
    let connector = Connector::new();
    let path = connector.write_config(db, broker, "");
    let text = std::fs::read_to_string(&path).expect("read config");
    let text = text.replacen("user = \"cdc\"", &format!("user = {}", toml_str(USER)), 1).replacen(
        &format!("password = {}", toml_str(common::mariadb::CDC_PASSWORD)),
        &format!("password = {}", toml_str(PASSWORD)),
        1,
    );
    assert!(text.contains(PASSWORD), "the config names the probe account: {text}");
    std::fs::write(&path, text).expect("write config");
    connector
}

/// (Re)creates the probe account with `grants`.
fn create_probe(db: &MariaDb, grants: &[&str]) {
    db.sql(&format!(
        "DROP USER IF EXISTS 'probe'@'%'; CREATE USER 'probe'@'%' IDENTIFIED BY '{PASSWORD}'; {}",
        grants.iter().map(|g| format!("{g};")).collect::<String>()
    ));
}

/// The statement after `fix: ` on the line after the finding `setting` (`[FAIL] privilege …`) in `check`'s
/// output.
fn fix_of<'a>(stdout: &'a str, setting: &str) -> &'a str {
    let finding = format!("{setting}: expected");
    let at = stdout.find(&finding).unwrap_or_else(|| panic!("no {finding:?} in\n{stdout}"));
    let rest = &stdout[at..];
    let line = rest.lines().nth(1).unwrap_or_default();
    line.trim().strip_prefix("fix: ").unwrap_or_else(|| panic!("no fix after {finding:?} in\n{stdout}"))
}

/// Guards against `check` passing a user that `run` then fails with, and against fixes that name no
/// account ("TO the connector's user") or do not run: each missing grant of the binlog source.
#[tokio::test(flavor = "multi_thread")]
async fn each_missing_binlog_grant_is_named_with_the_grant_that_fixes_it() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let connector = probe_connector(&db, &broker);

    create_probe(&db, BINLOG_GRANTS);
    let (code, all) = check(&connector);
    assert_eq!(code, Some(0), "the README's grants are enough:\n{all}");

    // (what is taken away, the finding and its fix exactly as printed)
    let cases = [
        (
            "REVOKE REPLICATION SLAVE ON *.* FROM 'probe'@'%'",
            format!(
                "[FAIL] privilege REPLICATION SLAVE: expected granted on *.*, actual missing\n       \
                 fix: GRANT REPLICATION SLAVE ON *.* TO {ACCOUNT}\n"
            ),
        ),
        (
            "REVOKE BINLOG MONITOR ON *.* FROM 'probe'@'%'",
            format!(
                "[FAIL] privilege BINLOG MONITOR: expected granted on *.*, actual missing\n       \
                 fix: GRANT BINLOG MONITOR ON *.* TO {ACCOUNT}\n"
            ),
        ),
        (
            "REVOKE SELECT ON shop.outbox_events FROM 'probe'@'%'",
            format!(
                "[FAIL] table shop.outbox_events: expected exists and is readable, actual not found (or no privilege \
                 on it)\n       fix: create the outbox table, or GRANT SELECT ON shop.outbox_events TO {ACCOUNT}\n"
            ),
        ),
    ];
    for (revoke, finding) in &cases {
        create_probe(&db, BINLOG_GRANTS);
        db.sql(&format!("{revoke};"));
        let (code, stdout) = check(&connector);
        assert_eq!(code, Some(2), "{revoke}:\n{stdout}");
        assert!(stdout.contains(finding.as_str()), "{revoke}: expected\n{finding}in\n{stdout}");
        let setting = finding.lines().next().expect("a line").split(": expected").next().expect("a setting");
        let fix = fix_of(&stdout, setting);
        let statement = fix.strip_prefix("create the outbox table, or ").unwrap_or(fix);
        db.sql(&format!("{statement};"));
        let (code, stdout) = check(&connector);
        assert_eq!(code, Some(0), "after `{statement}`:\n{stdout}");
    }
}

/// Privileges count where the session holds them: through its default role and the roles granted to that
/// role, not through a role it was granted but does not activate (the connector never runs `SET ROLE`).
#[tokio::test(flavor = "multi_thread")]
async fn privileges_of_the_default_role_count_and_of_an_inactive_role_do_not() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let connector = probe_connector(&db, &broker);
    db.sql(
        "CREATE ROLE cdc_binlog; CREATE ROLE cdc_reader;
         GRANT REPLICATION SLAVE, BINLOG MONITOR, SLAVE MONITOR ON *.* TO cdc_binlog;
         GRANT SELECT ON shop.outbox_events TO cdc_reader;
         GRANT cdc_binlog TO cdc_reader;",
    );
    create_probe(&db, &["GRANT cdc_reader TO 'probe'@'%'"]);
    let (code, stdout) = check(&connector);
    assert_eq!(code, Some(2), "an inactive role grants nothing:\n{stdout}");
    assert!(stdout.contains("[FAIL] privilege REPLICATION SLAVE"), "{stdout}");

    db.sql("SET DEFAULT ROLE cdc_reader FOR 'probe'@'%';");
    let (code, stdout) = check(&connector);
    assert_eq!(code, Some(0), "the default role, and the role granted to it:\n{stdout}");
    assert!(stdout.contains("[ok  ] privilege REPLICATION SLAVE"), "{stdout}");
}

/// The polling relay: `UPDATE` on the outbox table and `PROCESS` in either mode, and with a progress table
/// `SELECT, INSERT, UPDATE` on it, each named with its fix for the relay's account, each fix run as printed.
/// Guards against `check` passing a relay without a progress table that `run` then refuses: `PROCESS` was
/// checked only beside a progress table, while every relay lists the open transactions to prove a gap free.
#[tokio::test(flavor = "multi_thread")]
async fn each_missing_relay_grant_is_named_with_the_grant_that_fixes_it() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    // `poll`: the lines of `[poll]`.
    let write_config = |poll: &str| {
        let text = format!(
            "[source]\nkind = \"poll\"\nhost = \"127.0.0.1\"\nport = {port}\nuser = {user}\npassword = {password}\n\
             [outbox]\ntable = \"shop.outbox_events\"\n\
             [kafka]\nbootstrap_servers = {bootstrap}\ntopic = \"outbox.event.${{aggregate_type}}\"\n\
             [state]\ndir = {state}\n[poll]\n{poll}",
            port = db.port(),
            user = toml_str(USER),
            password = toml_str(PASSWORD),
            bootstrap = toml_str(&broker.bootstrap()),
            state = toml_str(&connector.state_dir().to_string_lossy()),
        );
        std::fs::write(connector.config_path(), text).expect("write relay config");
    };
    let update = format!(
        "[FAIL] privilege UPDATE on shop.outbox_events: expected granted (the relay marks rows published, \
         refused, parked), actual missing\n       fix: GRANT SELECT, UPDATE ON shop.outbox_events TO {ACCOUNT} \
         (no REPLICATION privilege is needed)\n"
    );
    let process = format!(
        "[FAIL] privilege PROCESS: expected granted (the relay reads information_schema.INNODB_TRX to know when \
         a skipped sequence number can no longer be committed), actual missing\n       fix: GRANT PROCESS ON \
         *.* TO {ACCOUNT}\n"
    );
    // Runs the fixes of both findings in `stdout`, as printed.
    let run_fixes = |stdout: &str| {
        for setting in ["[FAIL] privilege UPDATE on shop.outbox_events", "[FAIL] privilege PROCESS"] {
            let fix = fix_of(stdout, setting);
            let statement = fix.split(" (").next().expect("a statement");
            db.sql(&format!("{statement};"));
        }
    };

    // Marking rows (no progress table): only SELECT on the outbox table, UPDATE and PROCESS missing.
    write_config("");
    create_probe(&db, &["GRANT SELECT ON shop.outbox_events TO 'probe'@'%'"]);
    let (code, stdout) = check(&connector);
    assert_eq!(code, Some(2), "{stdout}");
    for finding in [&update, &process] {
        assert!(stdout.contains(finding.as_str()), "expected\n{finding}in\n{stdout}");
    }
    run_fixes(&stdout);
    let (code, stdout) = check(&connector);
    assert_eq!(code, Some(0), "the fixes as printed are what a relay marking rows needs:\n{stdout}");
    assert!(stdout.contains("[ok  ] privilege PROCESS"), "{stdout}");

    // With a progress table: the same two, and the table's own grants.
    write_config("progress_table = \"shop.outbox_relay_progress\"\n");
    db.sql(&format!("{};", common::mariadb::progress_ddl()));
    create_probe(&db, &["GRANT SELECT ON shop.outbox_events TO 'probe'@'%'"]);
    let (code, stdout) = check(&connector);
    assert_eq!(code, Some(2), "{stdout}");
    for finding in [
        update.clone(),
        "[FAIL] progress table shop.outbox_relay_progress: expected a table with the columns outbox_table, \
         published_through, updated_at, actual none (or not visible to this user)\n"
            .to_string(),
        process.clone(),
    ] {
        assert!(stdout.contains(finding.as_str()), "expected\n{finding}in\n{stdout}");
    }
    run_fixes(&stdout);
    // The progress table exists, but this user cannot see it without a privilege on it: the finding's fix
    // is the CREATE TABLE; the grant is the README's.
    db.sql(&format!("GRANT SELECT ON shop.outbox_relay_progress TO {ACCOUNT};"));
    let (code, stdout) = check(&connector);
    assert_eq!(code, Some(2), "{stdout}");
    let finding = format!(
        "[FAIL] privileges on shop.outbox_relay_progress: expected SELECT, INSERT, UPDATE (the relay records how \
         far each table is published), actual missing\n       fix: GRANT SELECT, INSERT, UPDATE ON \
         shop.outbox_relay_progress TO {ACCOUNT}\n"
    );
    assert!(stdout.contains(finding.as_str()), "expected\n{finding}in\n{stdout}");
    db.sql(&format!("{};", fix_of(&stdout, "[FAIL] privileges on shop.outbox_relay_progress")));
    let (code, stdout) = check(&connector);
    assert_eq!(code, Some(0), "{stdout}");
}
