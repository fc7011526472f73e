//! The `outbox-cdc` binary as a child process, with a temp work dir for its config, `state/` and
//! logs that survives restarts of the process.

use super::broker::Broker;
use super::mariadb::{MariaDb, CDC_PASSWORD};
use super::process;
use rand::Rng;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;
use tempfile::TempDir;

/// How long a graceful shutdown may take before [`Connector::terminate`] fails the test.
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `outbox-cdc status` may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `outbox-cdc audit` may take (it reads the whole table and every routed topic).
const AUDIT_TIMEOUT: Duration = Duration::from_secs(300);

/// What `outbox-cdc audit --json` said.
#[derive(Debug, Clone)]
pub struct AuditRun {
    /// Its exit code (0 passed, 1 missing or out of order, 2/3 the audit could not run).
    pub code: Option<i32>,
    /// The JSON report (`Null` when it printed none).
    pub report: serde_json::Value,
    /// Its stderr (logs).
    pub stderr: String,
}

impl AuditRun {
    /// A count field of the report (0 when absent).
    pub fn count(&self, field: &str) -> u64 {
        self.report[field].as_u64().unwrap_or(0)
    }

    /// The ids of the report's `duplicates` list with their counts.
    pub fn duplicates(&self) -> Vec<(String, u64)> {
        self.report["duplicates"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| (d["id"].as_str().unwrap_or_default().to_owned(), d["count"].as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The `[metrics]` and `[control]` tables of every test config that does not choose its own: ephemeral
/// ports, so that connectors running in parallel never collide (a command never reaches a control API on
/// port 0: it works offline, as before the API).
pub const EPHEMERAL_METRICS: &str = "\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n[control]\nlisten = \"127.0.0.1:0\"\n";

/// The `[control]` table of a test config that chooses its own `[metrics]` and not its `[control]`.
pub const EPHEMERAL_CONTROL: &str = "\n[control]\nlisten = \"127.0.0.1:0\"\n";

/// Writes `<dir>/connector.toml` for `db` and `broker` (user `cdc`, a random replica `server_id` in
/// `1000..60000`, topic `outbox.event.${aggregate_type}`, state in `<dir>/state`), with
/// `extra_toml` appended verbatim. Returns the file's path.
pub fn write_config(dir: &Path, db: &MariaDb, broker: &Broker, extra_toml: &str) -> PathBuf {
    let server_id: u32 = rand::rng().random_range(1000..60000);
    let state = toml_str(&dir.join("state").to_string_lossy());
    let text = format!(
        "[source]\n\
         host = \"127.0.0.1\"\n\
         port = {port}\n\
         user = \"cdc\"\n\
         password = {password}\n\
         server_id = {server_id}\n\
         start_from = \"earliest\"\n\
         \n\
         [outbox]\n\
         table = \"shop.outbox_events\"\n\
         \n\
         [kafka]\n\
         bootstrap_servers = {bootstrap}\n\
         topic = \"outbox.event.${{aggregate_type}}\"\n\
         \n\
         {state_table}\
         {snapshot}\
         {metrics}\
         {extra_toml}\n",
        port = db.port(),
        password = toml_str(CDC_PASSWORD),
        bootstrap = toml_str(&broker.bootstrap()),
        // A test's own [state] table gets the directory (TOML allows a table once).
        state_table = match extra_toml.contains("[state]\n") {
            true => String::new(),
            false => format!("[state]\ndir = {state}\n"),
        },
        extra_toml = extra_toml.replacen("[state]\n", &format!("[state]\ndir = {state}\n"), 1),
        // Tests of the stream start without a snapshot unless they configure one.
        snapshot = if extra_toml.contains("[snapshot]") { "" } else { "\n[snapshot]\nmode = \"never\"\n" },
        // Tests that scrape set their own.
        metrics = match (extra_toml.contains("[metrics]"), extra_toml.contains("[control]")) {
            (false, false) => EPHEMERAL_METRICS,
            (true, false) => EPHEMERAL_CONTROL,
            (false, true) => "\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
            (true, true) => "",
        },
    );
    let path = dir.join("connector.toml");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// A TOML basic string literal.
pub fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The connector process. Its work dir (config, `state/`, `stdout.log`, `stderr.log`) lives until
/// the `Connector` is dropped, across any number of process restarts; the process is killed on drop.
#[derive(Debug)]
pub struct Connector {
    /// The running process; `None` before the first start and after it exited and was reaped.
    child: Option<Child>,
    /// Arguments of the last start, reused by [`Connector::restart`].
    args: Vec<OsString>,
    /// Extra environment variables for the process.
    envs: Vec<(OsString, OsString)>,
    /// Variables of the test's own environment the process does not inherit.
    unset: Vec<OsString>,
    /// Number of starts so far (marks in the logs).
    starts: usize,
    /// Work dir; declared last so the process is gone before it is deleted.
    dir: TempDir,
}

impl Connector {
    /// A work dir and no process yet.
    pub fn new() -> Connector {
        let dir = tempfile::Builder::new().prefix("outbox-cdc-").tempdir().expect("create connector temp dir");
        Connector { child: None, args: Vec::new(), envs: Vec::new(), unset: Vec::new(), starts: 0, dir }
    }

    /// Writes the config for `db` and `broker` (see [`write_config`]) and runs `run --config` on it.
    pub fn start(db: &MariaDb, broker: &Broker, extra_toml: &str) -> Connector {
        let mut c = Connector::new();
        let config = c.write_config(db, broker, extra_toml);
        c.run(&config);
        c
    }

    /// The work dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `<dir>/state`, the connector's checkpoint dir in configs written by [`write_config`].
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `<dir>/connector.toml` written by [`write_config`].
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("connector.toml")
    }

    /// [`write_config`] into this connector's work dir.
    pub fn write_config(&self, db: &MariaDb, broker: &Broker, extra_toml: &str) -> PathBuf {
        write_config(self.dir.path(), db, broker, extra_toml)
    }

    /// Adds `line` to the `[outbox]` section of the config written in its work dir (after its `table`).
    ///
    /// # Panics
    /// When the config has no `table = "shop.outbox_events"` line.
    pub fn outbox_setting(&self, line: &str) {
        let table = "table = \"shop.outbox_events\"\n";
        let text = std::fs::read_to_string(self.config_path()).expect("read the config");
        assert!(text.contains(table), "no {table:?} in the config:\n{text}");
        std::fs::write(self.config_path(), text.replacen(table, &format!("{table}{line}\n"), 1)).expect("write");
    }

    /// Writes a config that reads a real MariaDB binlog file (no server needed) and sends to a port where
    /// no broker listens, with `extra` appended; returns its path.
    pub fn write_files_config(&self, extra: &str) -> PathBuf {
        let file = super::binlog_fixture("mariadb-operator-mariadb-poc/domain_id_0.mariadb-repl-bin.000010");
        let text = format!(
            "[source]\nkind = \"files\"\nbinlog_files = [{file}]\n\n[outbox]\ntable = \"shop.outbox_events\"\n\n\
             [state]\ndir = {state}\n\n[snapshot]\nmode = \"never\"\n\n[metrics]\nenabled = false\n\n\
             [kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n{extra}",
            file = toml_str(&file.to_string_lossy()),
            state = toml_str(&self.state_dir().to_string_lossy()),
        );
        let path = self.config_path();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Sets an environment variable for the next starts (e.g. `RUST_LOG`).
    pub fn env(&mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> &mut Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Keeps `key` of the test's own environment from the next starts (e.g. the machine's AWS credentials).
    pub fn unset_env(&mut self, key: impl Into<OsString>) -> &mut Self {
        self.unset.push(key.into());
        self
    }

    /// Removes an environment variable set with [`Connector::env`] from the next starts.
    pub fn remove_env(&mut self, key: &str) -> &mut Self {
        self.envs.retain(|(k, _)| k != key);
        self
    }

    /// Runs `outbox-cdc audit --json --limit 1000000 --config <config_path> <extra args>` as a separate
    /// process (the connector process is not touched) and returns its exit code and report.
    ///
    /// # Panics
    /// When the audit does not finish within 300 s, or prints no JSON although it exited 0 or 1.
    pub fn audit(&self, extra_args: &[&str]) -> AuditRun {
        let out = self.dir.path().join("audit.json");
        let err = self.dir.path().join("audit.stderr.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"));
        cmd.args(["audit", "--json", "--limit", "1000000", "--config"])
            .arg(self.config_path())
            .args(extra_args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("create audit.json"))
            .stderr(std::fs::File::create(&err).expect("create audit.stderr.log"));
        let mut child = process::spawn(cmd).expect("start outbox-cdc audit");
        let Some(status) = process::wait_timeout(&mut child, AUDIT_TIMEOUT) else {
            process::kill_now(&mut child);
            panic!("outbox-cdc audit did not finish within {AUDIT_TIMEOUT:?}:\n{}", read_lossy(&err));
        };
        let (stdout, stderr) = (read_lossy(&out), read_lossy(&err));
        let report = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
        if matches!(status.code(), Some(0 | 1)) {
            assert!(report.is_object(), "outbox-cdc audit exited {status} without a JSON report:\n{stdout}\n{stderr}");
        }
        AuditRun { code: status.code(), report, stderr }
    }

    /// Starts `outbox-cdc run --config <config>`.
    pub fn run(&mut self, config: &Path) {
        self.spawn(["run".into(), "--config".into(), config.as_os_str().to_owned()]);
    }

    /// Starts `outbox-cdc` with arbitrary arguments (cwd = work dir), e.g. for `check` or bad flags.
    ///
    /// # Panics
    /// When a previous process is still running, or the binary cannot be started.
    pub fn spawn<I: IntoIterator<Item = OsString>>(&mut self, args: I) {
        if let Some(child) = self.child.as_mut() {
            assert!(!matches!(child.try_wait(), Ok(None)), "connector is already running (pid {})", child.id());
        }
        self.args = args.into_iter().collect();
        self.starts += 1;
        let (out, err) = (self.dir.path().join("stdout.log"), self.dir.path().join("stderr.log"));
        for path in [&out, &err] {
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open log");
            writeln!(f, "=== harness: start #{} {:?} ===", self.starts, self.args).expect("write log");
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"));
        cmd.args(&self.args)
            .current_dir(self.dir.path())
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(process::append_log(&out))
            .stderr(process::append_log(&err));
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info,outbox_cdc=debug");
        }
        for key in &self.unset {
            cmd.env_remove(key);
        }
        cmd.envs(self.envs.iter().map(|(k, v)| (k, v)));
        self.child = Some(process::spawn(cmd).expect("start outbox-cdc binary"));
    }

    /// Starts the process again with the arguments of the last start (after `kill`, `terminate` or
    /// an exit).
    pub fn restart(&mut self) {
        assert!(self.starts > 0, "restart() before the first start");
        self.spawn(self.args.clone());
    }

    /// Whether the process is running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Process id of the running (or last) process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL (a crash) and reap.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            process::kill_now(child);
        }
    }

    /// SIGTERM and wait for the exit; returns the exit status.
    ///
    /// # Panics
    /// When no process was started, or it does not exit within 60 s (it is then killed; the message
    /// carries the logs).
    pub fn terminate(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("terminate() before start");
        let (status, graceful) = process::terminate(child, TERMINATE_TIMEOUT);
        assert!(graceful, "outbox-cdc ignored SIGTERM for {TERMINATE_TIMEOUT:?}; logs:\n{}", self.logs());
        status
    }

    /// Waits up to `timeout` for the process to exit by itself; `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut().expect("wait_exit() before start");
        process::wait_timeout(child, timeout)
    }

    /// Runs `outbox-cdc <args> --config <config>` to completion (killed after `timeout`) and returns its
    /// exit status, stdout and stderr. Output is read while the command runs, so it may be large.
    ///
    /// # Errors
    /// When the command does not finish within `timeout`.
    pub fn command(&self, args: &[&str], timeout: Duration) -> Result<(ExitStatus, String, String), String> {
        self.command_during(args, timeout, |_| {})
    }

    /// Like [`Connector::command`], with `during` run on another thread while the command runs: it gets the
    /// command's [`Running`] output so far, so that a test can act on a line the command logs (end a
    /// transaction the command said it waits for) instead of at a time. The command's result is returned
    /// after both the command and `during` ended.
    ///
    /// # Errors
    /// When the command does not finish within `timeout`.
    pub fn command_during(
        &self,
        args: &[&str],
        timeout: Duration,
        during: impl FnOnce(&Running) + Send,
    ) -> Result<(ExitStatus, String, String), String> {
        use std::sync::atomic::Ordering;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"));
        cmd.args(args)
            .arg("--config")
            .arg(self.config_path())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = process::spawn(cmd).expect("start outbox-cdc");
        let running = Running::default();
        let collect = |pipe: Box<dyn std::io::Read + Send>, into: &std::sync::Mutex<Vec<u8>>| {
            let mut pipe = pipe;
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                into.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(&buf[..n]);
            }
        };
        let (stdout, stderr) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
        std::thread::scope(|s| {
            let out = s.spawn(|| collect(Box::new(stdout), &running.stdout));
            let err = s.spawn(|| collect(Box::new(stderr), &running.stderr));
            let acting = s.spawn(|| during(&running));
            let status = process::wait_timeout(&mut child, timeout);
            if status.is_none() {
                process::kill_now(&mut child);
            }
            // The pipes are drained once the readers end: then everything the command wrote is in `running`.
            let _ = (out.join(), err.join());
            running.finished.store(true, Ordering::Release);
            if let Err(panic) = acting.join() {
                std::panic::resume_unwind(panic);
            }
            match status {
                Some(status) => Ok((status, running.stdout(), running.stderr())),
                None => Err(format!(
                    "outbox-cdc {args:?} did not finish within {timeout:?}\nstdout: {}\nstderr: {}",
                    running.stdout(),
                    running.stderr()
                )),
            }
        })
    }

    /// The stored checkpoint record as printed by `outbox-cdc status --json --config <config_path>`,
    /// run as a separate short-lived process (the connector process, running or not, is not touched);
    /// `None` when no checkpoint has been stored yet.
    ///
    /// # Panics
    /// When [`Connector::try_status_json`] fails; the message carries the command's output.
    pub fn status_json(&self) -> Option<serde_json::Value> {
        self.try_status_json().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Connector::status_json`], returning what went wrong instead of panicking.
    ///
    /// # Errors
    /// When `status` exits unsuccessfully, prints no JSON, or takes longer than 30 s (it is then killed).
    pub fn try_status_json(&self) -> Result<Option<serde_json::Value>, String> {
        let (status, out, err) = self.command(&["status", "--json"], STATUS_TIMEOUT)?;
        if !status.success() {
            return Err(format!("outbox-cdc status --json failed ({status}):\nstdout: {out}\nstderr: {err}"));
        }
        let mut value: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| format!("outbox-cdc status --json printed no JSON ({e}):\nstdout: {out}\nstderr: {err}"))?;
        // Before the first checkpoint: the stored error and holds only, no `position`.
        if value.get("position").is_none() {
            return Ok(None);
        }
        // The checkpoint record only: `holds` and `last_error` sit beside it and change without it.
        if let Some(object) = value.as_object_mut() {
            object.remove("holds");
            object.remove("last_error");
        }
        Ok(Some(value))
    }

    /// Waits until the connector logs that it streams (after its snapshot, if it takes one), so that later
    /// writes are streamed; fails the test with its logs after `timeout`. Log text rather than `/readyz`:
    /// the endpoint turns ready during the snapshot already, and listens on a port chosen at start.
    pub fn wait_streaming(&self, timeout: Duration) {
        let ok = super::wait_until(timeout, || self.stderr().contains(" streaming "));
        assert!(ok, "connector never started streaming\n{}", self.logs());
    }

    /// The last `max_lines` lines of the process's stderr (its logs), for assertion messages.
    pub fn log_tail(&self, max_lines: usize) -> String {
        super::tail_file(&self.dir().join("stderr.log"), max_lines)
    }

    /// Everything the process(es) wrote so far: stdout then stderr, with start markers.
    pub fn logs(&self) -> String {
        format!("--- stdout ---\n{}\n--- stderr ---\n{}", self.stdout(), self.stderr())
    }

    /// stdout of all runs.
    pub fn stdout(&self) -> String {
        read_lossy(&self.dir.path().join("stdout.log"))
    }

    /// stderr of all runs (tracing logs go here by default).
    pub fn stderr(&self) -> String {
        read_lossy(&self.dir.path().join("stderr.log"))
    }
}

/// What a command started by [`Connector::command_during`] printed so far, and whether it ended.
#[derive(Debug, Default)]
pub struct Running {
    /// Its stdout so far.
    stdout: std::sync::Mutex<Vec<u8>>,
    /// Its stderr (logs) so far.
    stderr: std::sync::Mutex<Vec<u8>>,
    /// Set once the command exited (or was killed at its timeout) and its pipes are drained.
    finished: std::sync::atomic::AtomicBool,
}

impl Running {
    /// Its stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// Its stderr (logs) so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// Whether the command has ended: nothing more will come.
    pub fn finished(&self) -> bool {
        self.finished.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until the command's stderr contains `text` (true) or the command ended without it (false).
    /// No deadline of its own: the command's timeout bounds the wait.
    pub fn wait_for_stderr(&self, text: &str) -> bool {
        loop {
            // `finished` first: once it is set, everything the command wrote is in the buffer.
            let ended = self.finished();
            if self.stderr().contains(text) {
                return true;
            }
            if ended {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Default for Connector {
    fn default() -> Self {
        Connector::new()
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            process::kill_now(child);
        }
    }
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// Edits the stored stream checkpoint of the state directory `dir` in place, as JSON, bypassing the connector
/// (which alone may write one): for tests that need a checkpoint the connector would never store, e.g. one
/// of another server.
pub fn rewrite_checkpoint(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    use redb::ReadableTable;
    const CHECKPOINTS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("checkpoints");
    let db = redb::Database::open(dir.join("outbox-cdc.redb")).expect("the state store");
    let tx = db.begin_write().unwrap();
    {
        let mut table = tx.open_table(CHECKPOINTS).unwrap();
        let mut record: serde_json::Value =
            serde_json::from_slice(table.get("stream").unwrap().expect("a stored checkpoint").value()).unwrap();
        edit(&mut record);
        table.insert("stream", serde_json::to_vec(&record).unwrap().as_slice()).unwrap();
    }
    tx.commit().unwrap();
}
