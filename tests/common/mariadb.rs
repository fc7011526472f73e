//! A private MariaDB server per test: own datadir in a temp dir, own port, ROW binlog with GTIDs.

use super::process;
use super::{free_port, port_accepts, tail_file};
use rand::Rng;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Password of the `cdc` user created in every server.
pub const CDC_PASSWORD: &str = "cdc-secret";

/// How long a start (including crash recovery) may take before the test fails.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a graceful shutdown may take.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// The outbox table, exactly as users are told to create it: the `CREATE TABLE` of
/// `deploy/mysql-init.sql` (the reference schema the README and the demo use), relay columns included.
pub fn outbox_ddl() -> &'static str {
    const INIT: &str = include_str!("../../deploy/mysql-init.sql");
    let start = INIT.find("CREATE TABLE").expect("deploy/mysql-init.sql creates the outbox table");
    let end = start + INIT[start..].find(";\n").expect("the CREATE TABLE ends with `;`");
    &INIT[start..end]
}

/// The polling relay's progress table (`[poll] progress_table`), as `deploy/mysql-init.sql` creates it.
pub fn progress_ddl() -> &'static str {
    const INIT: &str = include_str!("../../deploy/mysql-init.sql");
    let start = INIT.find("CREATE TABLE IF NOT EXISTS shop.outbox_relay_progress").expect("the progress table");
    let end = start + INIT[start..].find(";\n").expect("the CREATE TABLE ends with `;`");
    &INIT[start..end]
}

/// The business table written in the same transaction as the outbox row.
pub const ORDERS_DDL: &str = "CREATE TABLE orders (
 id BIGINT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(64), amount DECIMAL(10,2), created_at DATETIME(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// Privileges of the `cdc` user on `*.*`: binlog dump (`REPLICATION SLAVE`), `SHOW BINARY LOGS` /
/// `SHOW MASTER STATUS` (`BINLOG MONITOR`; `REPLICATION CLIENT` is its pre-10.5 alias and is shown as
/// `BINLOG MONITOR` by `SHOW GRANTS`), `FLUSH TABLES WITH READ LOCK` for a locked snapshot (`RELOAD`).
/// `@@gtid_binlog_pos` and `@@binlog_row_metadata` need no privilege.
pub const CDC_GLOBAL_GRANTS: &str = "REPLICATION SLAVE, REPLICATION CLIENT, BINLOG MONITOR, SLAVE MONITOR, RELOAD";

/// Configures a [`MariaDb`] before starting it.
#[derive(Debug, Clone, Default)]
pub struct MariaDbBuilder {
    /// Server arguments appended after the defaults; a later `--x=` overrides an earlier one.
    extra_args: Vec<String>,
    /// `--server-id`; random in `1..1000` when unset (connector ids are chosen in `1000..60000`).
    server_id: Option<u32>,
    /// Whether to create `shop`, its tables and the `cdc` user.
    skip_schema: bool,
    /// Serve TLS with these files and refuse plain TCP (see [`MariaDbBuilder::tls`]).
    tls: Option<ServerTls>,
}

/// The files a server serves TLS with: `--ssl-cert`, `--ssl-key`, `--ssl-ca` (PEM).
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signed it.
    pub ca: PathBuf,
}

impl MariaDbBuilder {
    /// Appends one server argument, e.g. `"--binlog-row-metadata=MINIMAL"` (overrides the default).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Appends several server arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Fixes `--server-id` (default: random in `1..1000`).
    pub fn server_id(mut self, id: u32) -> Self {
        self.server_id = Some(id);
        self
    }

    /// Starts an empty server: no `shop` database, no `cdc` user.
    pub fn skip_schema(mut self) -> Self {
        self.skip_schema = true;
        self
    }

    /// Serves TLS with `tls` and refuses every TCP connection without it (`--require-secure-transport=ON`;
    /// the harness's own SQL goes through the Unix socket, which counts as secure, and its TCP URLs ask for
    /// TLS without verifying the certificate).
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Initialises the datadir (a copy of a per-binary template made by `mariadb-install-db`), starts the server, waits until it accepts connections and creates the
    /// schema and the `cdc` user.
    ///
    /// # Panics
    /// When initialisation or start-up fails or takes longer than 90 s; the message carries the tail of
    /// the error log.
    pub fn start(self) -> MariaDb {
        let dir = tempfile::Builder::new().prefix("mariadb-").tempdir().expect("create MariaDB temp dir");
        let server_id = self.server_id.unwrap_or_else(|| rand::rng().random_range(1..1000));
        let mut db = MariaDb {
            child: None,
            has_schema: !self.skip_schema,
            port: free_port(),
            server_id,
            extra_args: self.extra_args,
            tls: self.tls,
            dir,
        };
        db.install();
        db.spawn_and_wait();
        if !self.skip_schema {
            db.create_schema();
        }
        db
    }
}

/// A private MariaDB server in a temp dir, killed and deleted on drop.
///
/// Root (`root@127.0.0.1`, `root@localhost`) has no password. The `cdc` user
/// (`cdc@127.0.0.1`, `cdc@localhost`, password [`CDC_PASSWORD`]) has [`CDC_GLOBAL_GRANTS`] on `*.*`
/// and `SELECT` on `shop.*`.
#[derive(Debug)]
pub struct MariaDb {
    /// The running server; `None` after `kill`/`stop`.
    child: Option<Child>,
    /// TCP port on 127.0.0.1, kept across restarts.
    port: u16,
    /// Whether `shop` was created (the root URL's default database).
    has_schema: bool,
    /// `--server-id` of this server (also the server part of its GTIDs).
    server_id: u32,
    /// Extra server arguments, re-applied on restart.
    extra_args: Vec<String>,
    /// The TLS files of a server started with [`MariaDbBuilder::tls`] (the TCP URLs then ask for TLS), kept
    /// across restarts.
    tls: Option<ServerTls>,
    /// Holds `data/`, the socket, the pid file and `error.log`; deleted on drop (declared last so the
    /// process is gone first).
    dir: TempDir,
}

impl MariaDb {
    /// Starts a server with the default settings (see [`MariaDbBuilder::start`]).
    pub fn start() -> MariaDb {
        MariaDbBuilder::default().start()
    }

    /// A builder for extra server arguments, a fixed server id, or an empty server.
    pub fn builder() -> MariaDbBuilder {
        MariaDbBuilder::default()
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `--server-id` of this server.
    pub fn server_id(&self) -> u32 {
        self.server_id
    }

    /// The temp dir holding everything of this server.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory (binlogs are `mysql-bin.NNNNNN` in it).
    pub fn datadir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The Unix socket path.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    /// The server's error log.
    pub fn error_log_path(&self) -> PathBuf {
        self.dir.path().join("error.log")
    }

    /// The last `lines` lines of the error log.
    pub fn error_log_tail(&self, lines: usize) -> String {
        tail_file(&self.error_log_path(), lines)
    }

    /// Whether the server process is running (spawned and not yet exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// mysql_async URL for root, default database `shop` (none with `skip_schema`), over TCP
    /// (`prefer_socket=false`: mysql_async would otherwise switch a loopback connection to the Unix
    /// socket, bypassing anything a test puts in front of the port).
    pub fn url_root(&self) -> String {
        let db = if self.has_schema { "shop" } else { "" };
        format!("mysql://root@127.0.0.1:{}/{db}?prefer_socket=false{}", self.port, self.url_tls())
    }

    /// mysql_async URL for the `cdc` user over TCP, no default database.
    pub fn url_cdc(&self) -> String {
        format!("mysql://cdc:{CDC_PASSWORD}@127.0.0.1:{}?prefer_socket=false{}", self.port, self.url_tls())
    }

    /// URL parameters for a server started with [`MariaDbBuilder::tls`]: encrypted, not verified (what the
    /// tests verify is the connector's connection, not the harness's).
    fn url_tls(&self) -> &'static str {
        match self.tls {
            Some(_) => "&require_ssl=true&verify_ca=false&verify_identity=false",
            None => "",
        }
    }

    /// mysql_async options for root (see [`MariaDb::url_root`]).
    pub fn opts_root(&self) -> mysql_async::Opts {
        mysql_async::Opts::from_url(&self.url_root()).expect("valid root URL")
    }

    /// A connection pool as root with default database `shop`.
    pub async fn pool(&self) -> mysql_async::Pool {
        mysql_async::Pool::new(self.opts_root())
    }

    /// One connection as root with default database `shop`.
    ///
    /// # Panics
    /// When the server does not accept the connection.
    pub async fn conn(&self) -> mysql_async::Conn {
        mysql_async::Conn::new(self.opts_root())
            .await
            .unwrap_or_else(|e| panic!("connect as root to 127.0.0.1:{}: {e}", self.port))
    }

    /// Runs SQL as root through the `mariadb` CLI over the socket (several `;`-separated statements
    /// allowed) and returns the output: tab-separated rows, no header.
    ///
    /// # Panics
    /// When the CLI fails; the message carries its stderr.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql).unwrap_or_else(|e| panic!("SQL failed on MariaDB port {}: {e}\nSQL: {sql}", self.port))
    }

    /// Like [`MariaDb::sql`], returning the CLI's stderr as the error.
    ///
    /// # Errors
    /// The CLI's exit status and stderr when it fails.
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new("mariadb")
            .arg("--no-defaults")
            .arg("--user=root")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["--batch", "--skip-column-names", "--default-character-set=utf8mb4", "-e"])
            .arg(sql)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run the mariadb CLI: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    /// `@@gtid_binlog_pos`, e.g. `0-17-42` (empty on a fresh server before any transaction).
    pub fn gtid_binlog_pos(&self) -> String {
        self.sql("SELECT @@GLOBAL.gtid_binlog_pos").trim().to_owned()
    }

    /// SIGKILL (a crash: no shutdown, InnoDB and binlog crash recovery on the next start).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            process::kill_now(&mut child);
        }
    }

    /// SIGTERM and wait for a clean exit.
    ///
    /// # Panics
    /// When the server does not exit within 60 s (it is then killed) or exits unsuccessfully.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let (status, graceful) = process::terminate(&mut child, STOP_TIMEOUT);
            assert!(
                graceful && status.success(),
                "MariaDB on port {} did not shut down cleanly ({status}, graceful={graceful}):\n{}",
                self.port,
                self.error_log_tail(30)
            );
        }
    }

    /// Stops the server if it runs (gracefully), then starts it again on the same datadir and port
    /// and waits until it accepts connections.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn_and_wait();
    }

    /// Like [`MariaDb::restart`] but with a new set of extra server arguments (kept for later restarts).
    pub fn restart_with_args<I, S>(&mut self, args: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.stop();
        self.extra_args = args.into_iter().map(Into::into).collect();
        self.spawn_and_wait();
    }

    /// Starts the server again after `kill`/`stop` (same as `restart` when it is already stopped).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "MariaDB on port {} is already running", self.port);
        self.spawn_and_wait();
    }

    /// Copies the per-binary template datadir into this server's dir.
    fn install(&self) {
        std::fs::create_dir_all(self.dir.path().join("tmp")).expect("create tmp dir");
        copy_dir(template_datadir(), &self.datadir())
            .unwrap_or_else(|e| panic!("copy the template datadir to {}: {e}", self.datadir().display()));
    }

    /// The full server command line (defaults, the TLS files, then `extra_args`).
    fn server_args(&self) -> Vec<String> {
        let d = self.dir.path();
        let mut args = vec![
            "--no-defaults".to_owned(), // must be first
            format!("--datadir={}", self.datadir().display()),
            format!("--socket={}", self.socket().display()),
            format!("--port={}", self.port),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--pid-file={}", d.join("mysqld.pid").display()),
            format!("--log-error={}", self.error_log_path().display()),
            format!("--tmpdir={}", d.join("tmp").display()),
            format!("--log-bin={}", self.datadir().join("mysql-bin").display()),
            "--binlog-format=ROW".to_owned(),
            "--binlog-row-image=FULL".to_owned(),
            "--binlog-row-metadata=FULL".to_owned(),
            format!("--server-id={}", self.server_id),
            "--gtid-strict-mode=1".to_owned(),
            "--log-slave-updates".to_owned(),
            "--skip-name-resolve".to_owned(),
            "--character-set-server=utf8mb4".to_owned(),
            "--collation-server=utf8mb4_general_ci".to_owned(),
            "--innodb-buffer-pool-size=64M".to_owned(),
            "--innodb-log-file-size=16M".to_owned(),
            // Survives a process kill (the OS keeps the page cache), not a power cut: enough for tests.
            "--innodb-flush-log-at-trx-commit=2".to_owned(),
            "--sync-binlog=0".to_owned(),
            "--max-allowed-packet=64M".to_owned(),
            "--max-connections=500".to_owned(),
        ];
        if process::is_root() {
            args.push("--user=root".to_owned());
        }
        if let Some(tls) = &self.tls {
            args.extend([
                format!("--ssl-cert={}", tls.cert.display()),
                format!("--ssl-key={}", tls.key.display()),
                format!("--ssl-ca={}", tls.ca.display()),
                "--require-secure-transport=ON".to_owned(),
            ]);
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    fn spawn_and_wait(&mut self) {
        assert!(self.child.is_none(), "MariaDB on port {} is already running", self.port);
        let log = self.dir.path().join("mariadbd.out");
        let mut cmd = Command::new(mariadbd_path());
        cmd.args(self.server_args())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(process::append_log(&log))
            .stderr(process::append_log(&log));
        let child = process::spawn(cmd).unwrap_or_else(|e| panic!("cannot start mariadbd: {e}"));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                panic!(
                    "mariadbd on port {} exited during start-up ({status}); args: {:?}\nerror log:\n{}\nstdout/stderr:\n{}",
                    self.port,
                    self.server_args(),
                    self.error_log_tail(40),
                    tail_file(&self.dir.path().join("mariadbd.out"), 20)
                );
            }
            if port_accepts(self.port) && self.try_sql("SELECT 1").is_ok() {
                return;
            }
            if started.elapsed() > READY_TIMEOUT {
                self.kill();
                panic!(
                    "mariadbd on port {} not ready after {READY_TIMEOUT:?}\nerror log:\n{}",
                    self.port,
                    self.error_log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn create_schema(&self) {
        let outbox_ddl = outbox_ddl();
        let sql = format!(
            "CREATE DATABASE shop CHARACTER SET utf8mb4;
             USE shop;
             {outbox_ddl};
             {ORDERS_DDL};
             CREATE USER 'cdc'@'127.0.0.1' IDENTIFIED BY '{CDC_PASSWORD}';
             CREATE USER 'cdc'@'localhost' IDENTIFIED BY '{CDC_PASSWORD}';
             GRANT {CDC_GLOBAL_GRANTS} ON *.* TO 'cdc'@'127.0.0.1', 'cdc'@'localhost';
             GRANT SELECT ON shop.* TO 'cdc'@'127.0.0.1', 'cdc'@'localhost';"
        );
        self.sql(&sql);
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            process::kill_now(child);
        }
    }
}

/// A freshly initialised datadir, made once per test binary by `mariadb-install-db` (2–4 s) and
/// copied for each server (tens of ms); removed when the test binary exits.
fn template_datadir() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir =
            tempfile::Builder::new().prefix("mariadb-template-").tempdir().expect("create template temp dir").keep();
        process::remove_dir_at_exit(dir.clone());
        let datadir = dir.join("data");
        let log = dir.join("install.log");
        let mut cmd = Command::new("mariadb-install-db");
        cmd.arg("--no-defaults") // must be first
            .arg(format!("--datadir={}", datadir.display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            // Passed through to the bootstrap server: create the redo log at its final size, so the
            // first start does not resize it.
            .arg("--innodb-log-file-size=16M")
            .stdin(Stdio::null())
            .stdout(process::append_log(&log))
            .stderr(process::append_log(&log));
        if process::is_root() {
            cmd.arg("--user=root");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run mariadb-install-db (is mariadb-server installed?): {e}"));
        assert!(status.success(), "mariadb-install-db failed ({status}):\n{}", tail_file(&log, 40));
        datadir
    })
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// `mariadbd`, which Debian installs in /usr/sbin (not on a normal user's PATH).
fn mariadbd_path() -> PathBuf {
    if let Some(path) = std::env::var_os("MARIADBD") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join("mariadbd"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("mariadbd"))
}

/// Purges every binlog file before the current one, and waits until the server really removed them:
/// MariaDB keeps a file until its binlog checkpoint is done, and `PURGE` then only warns.
///
/// # Panics
/// When the files are still there after 20 s.
pub async fn purge_binlogs_before_current(conn: &mut mysql_async::Conn) {
    use mysql_async::prelude::Queryable;
    let current: mysql_async::Row = conn.query_first("SHOW MASTER STATUS").await.unwrap().unwrap();
    let file: String = current.get(0).unwrap();
    for _ in 0..100 {
        conn.query_drop(format!("PURGE BINARY LOGS TO '{file}'")).await.unwrap();
        let first: Option<(String, u64)> = conn.query_first("SHOW BINARY LOGS").await.unwrap();
        if first.map(|(name, _)| name) == Some(file.clone()) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("the server kept the binlogs before {file}");
}
