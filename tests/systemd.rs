//! The systemd unit (`deploy/systemd/outbox-cdc.service`) starts: its install steps, run as written, and what
//! systemd does before `ExecStart`, emulated, give a connector that reads its config and reaches the database
//! as a user that is not root.
//!
//! # What runs, and what is emulated
//! - The install steps are the indented command lines at the top of the unit's comment. Each runs in bash, as
//!   root, from a directory laid out as the release tarball (`scripts/release`), with the test's password on
//!   its stdin. Absolute paths under `/etc`, `/usr`, `/var` and `/run` are moved under a scratch root;
//!   `systemctl` is a stub that records what it is asked.
//! - `systemctl enable --now` is emulated from the unit the steps installed, in the order systemd acts: a
//!   fresh credentials directory for `LoadCredential=` (0500, files 0400, for the service's user: systemd
//!   grants it by an ACL where the file system has them, by ownership otherwise, as here),
//!   `EnvironmentFile=` read as root with systemd's quoting rules, `StateDirectory=` created for the user with
//!   `StateDirectoryMode=`, `WorkingDirectory=`, `UMask=`, a clean environment, the specifiers expanded; then
//!   `ExecStart=` as uid and gid [`SERVICE_UID`] with no supplementary groups (`setpriv`), which is what
//!   `DynamicUser=yes` gives.
//! - Not emulated: the sandbox (`ProtectSystem=` and the rest, and the mount namespace that hides
//!   `/var/lib/private`, so the state directory is made in place), which `scripts/check-deploy` judges with
//!   `systemd-analyze security`.
//!
//! Needs root (it switches users) and `setpriv` (util-linux); without them each test says why and passes.
//! `OUTBOX_CDC_UNIT=<path>` runs the same checks on another unit file (e.g. an older one, to see them fail).

mod common;

use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use common::{free_port, process, wait_until, MariaDb};
use tempfile::TempDir;

/// The uid and gid the service runs as: what `DynamicUser=yes` allocates is some unused id like it.
const SERVICE_UID: u32 = 61234;

/// The MySQL password the install steps are given. Quotes, a backslash, a dollar and a space: it must reach
/// the server unchanged through the step that writes the `EnvironmentFile` and systemd's reading of it.
const PASSWORD: &str = r#"pa ss'w"o\rd$x"#;

/// How long the connector may take to get somewhere; the wait ends as soon as it does.
const PATIENCE: Duration = Duration::from_secs(180);

/// The unit under test: the repository's, or the file `OUTBOX_CDC_UNIT` names.
fn unit_text() -> String {
    let path = std::env::var_os("OUTBOX_CDC_UNIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("deploy/systemd/outbox-cdc.service"));
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read the unit {}: {e}", path.display()))
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Why these tests cannot run here, if they cannot.
fn cannot_switch_users() -> Option<&'static str> {
    if !process::is_root() {
        return Some("not root: the service's user cannot be switched to");
    }
    let setpriv = Command::new("setpriv").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    match setpriv {
        Ok(status) if status.success() => None,
        _ => Some("setpriv (util-linux) is missing"),
    }
}

macro_rules! skip_unless_able {
    () => {
        if let Some(reason) = cannot_switch_users() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

/// A systemd unit file: its `[Service]` settings in order, and the command lines its comment shows.
struct Unit {
    /// `[Service]`'s settings, in file order.
    service: Vec<(String, String)>,
    /// The first block of indented comment lines: the install steps.
    install_steps: Vec<String>,
    /// Every indented comment line.
    commands: Vec<String>,
}

impl Unit {
    /// Parses what systemd reads of the file (no line continuations: the unit has none, and a line ending in
    /// a backslash fails here rather than being misread), and the comment's command lines.
    fn parse(text: &str) -> Unit {
        let mut unit = Unit { service: Vec::new(), install_steps: Vec::new(), commands: Vec::new() };
        let mut section = String::new();
        let mut steps_done = false;
        for line in text.lines() {
            let line = line.trim_end();
            if let Some(comment) = line.strip_prefix('#') {
                match comment.strip_prefix("   ") {
                    Some(command) if !command.trim().is_empty() && section.is_empty() => {
                        if !steps_done {
                            unit.install_steps.push(command.trim().to_owned());
                        }
                        unit.commands.push(command.trim().to_owned());
                    }
                    _ => steps_done |= !unit.install_steps.is_empty() && comment.trim().is_empty(),
                }
                continue;
            }
            if line.starts_with(';') {
                continue;
            }
            assert!(!line.ends_with('\\'), "a continued line; teach Unit::parse to join them: {line}");
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
            } else if let Some((key, value)) = line.split_once('=') {
                if section == "Service" {
                    unit.service.push((key.trim().to_owned(), value.trim().to_owned()));
                }
            }
        }
        assert!(!unit.install_steps.is_empty(), "the unit's comment shows no install steps");
        unit
    }

    /// Every value of `key` in `[Service]`, in order (an empty assignment resets the list, as in systemd).
    fn all(&self, key: &str) -> Vec<&str> {
        let mut values = Vec::new();
        for (k, v) in &self.service {
            if k == key {
                match v.is_empty() {
                    true => values.clear(),
                    false => values.push(v.as_str()),
                }
            }
        }
        values
    }

    /// The last value of `key` in `[Service]`.
    fn one(&self, key: &str) -> Option<&str> {
        self.all(key).last().copied()
    }
}

/// `text` with every absolute path under `/etc`, `/usr`, `/var` or `/run` moved under `root` (`/dev` stays:
/// `/dev/null` is the host's).
fn rebase(text: &str, root: &Path) -> String {
    let root = root.to_str().expect("a UTF-8 scratch path");
    let mut out = String::with_capacity(text.len());
    let mut previous = None;
    for (at, c) in text.char_indices() {
        let starts_path = previous.is_none_or(|p: char| !(p.is_ascii_alphanumeric() || "/._-%~$".contains(p)));
        if c == '/' && starts_path && ["etc/", "usr/", "var/", "run/"].iter().any(|d| text[at + 1..].starts_with(d)) {
            out.push_str(root);
        }
        out.push(c);
        previous = Some(c);
    }
    out
}

/// The variables of an `EnvironmentFile=`, read as systemd 252 reads one (`parse_env_file_internal`): `#` and
/// `;` start comments, a value may be `'single'` or `"double"` quoted where it starts (then `\` escapes only
/// `"`, `\`, `` ` `` and `$`), elsewhere `\` takes the next character as it is; unquoted trailing blanks are
/// dropped.
fn environment_file(text: &str) -> Vec<(String, String)> {
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        PreKey,
        Key,
        PreValue,
        Value,
        ValueEscape,
        Single,
        Double,
        DoubleEscape,
        Comment,
    }
    let mut vars = Vec::new();
    let (mut key, mut value) = (String::new(), String::new());
    // Where the value's trailing unquoted blanks begin, if it ends in any.
    let mut blanks_from: Option<usize> = None;
    let mut at = At::PreKey;
    for c in text.chars().chain(['\n']) {
        let newline = c == '\n' || c == '\r';
        at = match at {
            At::PreKey if c == '#' || c == ';' => At::Comment,
            At::PreKey if c.is_whitespace() => At::PreKey,
            At::PreKey => {
                key = c.to_string();
                At::Key
            }
            At::Key if newline => At::PreKey,
            At::Key if c == '=' => {
                value.clear();
                blanks_from = None;
                At::PreValue
            }
            At::Key => {
                key.push(c);
                At::Key
            }
            At::PreValue | At::Value if newline => {
                value.truncate(blanks_from.unwrap_or(value.len()));
                vars.push((key.trim().to_owned(), std::mem::take(&mut value)));
                At::PreKey
            }
            At::PreValue if c == '\'' => At::Single,
            At::PreValue if c == '"' => At::Double,
            At::PreValue | At::Value if c == '\\' => {
                blanks_from = None;
                At::ValueEscape
            }
            At::PreValue if c.is_whitespace() => At::PreValue,
            At::PreValue | At::Value => {
                match (c.is_whitespace(), blanks_from) {
                    (false, _) => blanks_from = None,
                    (true, None) => blanks_from = Some(value.len()),
                    (true, Some(_)) => {}
                }
                value.push(c);
                At::Value
            }
            At::ValueEscape => {
                if !newline {
                    value.push(c);
                }
                At::Value
            }
            At::Single if c == '\'' => At::PreValue,
            At::Double if c == '"' => At::PreValue,
            At::Double if c == '\\' => At::DoubleEscape,
            At::Single | At::Double => {
                value.push(c);
                at
            }
            At::DoubleEscape => {
                match c {
                    '"' | '\\' | '`' | '$' => value.push(c),
                    '\n' => {}
                    _ => value.extend(['\\', c]),
                }
                At::Double
            }
            At::Comment if newline => At::PreKey,
            At::Comment => At::Comment,
        };
    }
    vars
}

/// A host that followed the install steps: the scratch root they wrote into.
struct Host {
    /// Holds `root/`, `tarball/` and `stub/`.
    dir: TempDir,
}

impl Host {
    /// Runs the unit's install steps as written, from a release tarball whose `connector.toml` is the
    /// repository's pointed at 127.0.0.1:`mysql_port` (the broker and the metrics at free ports), with
    /// `password` typed where a step asks for it. Returns once `systemctl enable --now outbox-cdc` was asked.
    fn install(unit_text: &str, mysql_port: u16, password: &str) -> Host {
        let dir = tempfile::Builder::new().prefix("systemd-host-").tempdir().expect("scratch dir");
        // The service's user must reach the binary and its directories, as on a real host.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod the scratch dir");
        let host = Host { dir };
        let (root, tarball, stub) = (host.root(), host.path("tarball"), host.path("stub"));
        // What any host has before the steps run.
        for existing in ["etc/systemd/system", "usr/local/bin", "usr/local/share", "var/lib", "run"] {
            fs::create_dir_all(root.join(existing)).expect("scratch host dirs");
        }
        fs::create_dir_all(tarball.join("bin")).expect("tarball/bin");
        fs::create_dir_all(tarball.join("deploy/systemd")).expect("tarball/deploy/systemd");
        // A link where it can be (the debug binary is large; the install step copies it once more).
        let (binary, bin) = (env!("CARGO_BIN_EXE_outbox-cdc"), tarball.join("bin/outbox-cdc"));
        if fs::hard_link(binary, &bin).is_err() {
            fs::copy(binary, &bin).expect("copy the binary");
        }
        fs::copy(repo().join("README.md"), tarball.join("README.md")).expect("copy the README");
        fs::write(tarball.join("connector.toml"), local_config(mysql_port)).expect("write connector.toml");
        fs::write(tarball.join("deploy/systemd/outbox-cdc.service"), unit_text).expect("write the unit");
        fs::create_dir_all(&stub).expect("stub dir");
        let systemctl = stub.join("systemctl");
        fs::write(&systemctl, "#!/bin/sh\necho \"$*\" >>\"$SYSTEMCTL_LOG\"\n").expect("write the systemctl stub");
        fs::set_permissions(&systemctl, fs::Permissions::from_mode(0o755)).expect("chmod the stub");
        let typed = host.path("typed");
        fs::write(&typed, format!("{password}\n")).expect("write what is typed");

        for step in &Unit::parse(unit_text).install_steps {
            let line = rebase(step, &root);
            let out = host
                .shell(&line)
                .current_dir(&tarball)
                .stdin(fs::File::open(&typed).expect("open what is typed"))
                .output()
                .expect("run bash");
            assert!(
                out.status.success(),
                "install step failed ({}): {step}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let asked = fs::read_to_string(host.path("systemctl.log")).unwrap_or_default();
        assert_eq!(asked, "daemon-reload\nenable --now outbox-cdc\n", "what the install steps ask of systemctl");
        host
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The scratch `/`.
    fn root(&self) -> PathBuf {
        self.path("root")
    }

    /// `bash -c line` as root, with the installed binary and the `systemctl` stub on PATH.
    fn shell(&self, line: &str) -> Command {
        let path = format!(
            "{}:{}:{}",
            self.path("stub").display(),
            self.root().join("usr/local/bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("bash");
        cmd.args(["-c", line]).env("PATH", path).env("SYSTEMCTL_LOG", self.path("systemctl.log"));
        cmd
    }

    /// What systemd does for `systemctl start outbox-cdc` with the unit the steps installed, up to starting
    /// `ExecStart=` as the service's user; its stdout and stderr go to [`Service::log`].
    fn start(&self) -> Service {
        let root = self.root();
        let text = fs::read_to_string(root.join("etc/systemd/system/outbox-cdc.service")).expect("the installed unit");
        let unit = Unit::parse(&text);
        assert_eq!(unit.one("DynamicUser"), Some("yes"), "the emulation knows DynamicUser=yes only");
        let owned = |path: &Path, mode: u32| {
            chown(path, Some(SERVICE_UID), Some(SERVICE_UID)).expect("chown to the service's user");
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
        };

        // LoadCredential=ID:PATH: a copy of PATH, read as root, that only the service's user can read.
        let credentials = root.join("run/credentials/outbox-cdc.service");
        fs::create_dir_all(&credentials).expect("credentials dir");
        for credential in unit.all("LoadCredential") {
            let (id, source) = credential.split_once(':').expect("LoadCredential=ID:PATH");
            let copy = credentials.join(id);
            fs::copy(rebase(source, &root), &copy).unwrap_or_else(|e| panic!("LoadCredential={credential}: {e}"));
            owned(&copy, 0o400);
        }
        owned(&credentials, 0o500);

        // A clean environment, as systemd gives a service, plus what the unit adds.
        let state_root = root.join("var/lib");
        let mut env = vec![
            ("PATH".to_owned(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()),
            ("CREDENTIALS_DIRECTORY".to_owned(), credentials.display().to_string()),
        ];
        for file in unit.all("EnvironmentFile") {
            let (optional, file) = file.strip_prefix('-').map_or((false, file), |f| (true, f));
            match fs::read_to_string(rebase(file, &root)) {
                Ok(text) => env.extend(environment_file(&text)),
                Err(e) if !optional => panic!("EnvironmentFile={file}: {e}"),
                Err(_) => {}
            }
        }
        let mode = |key: &str, default: u32| {
            unit.one(key).map_or(default, |m| u32::from_str_radix(m, 8).unwrap_or_else(|_| panic!("{key}={m}")))
        };
        for name in unit.all("StateDirectory").iter().flat_map(|v| v.split_whitespace()) {
            let dir = state_root.join(name);
            fs::create_dir_all(&dir).expect("state dir");
            owned(&dir, mode("StateDirectoryMode", 0o755));
            env.push(("STATE_DIRECTORY".to_owned(), dir.display().to_string()));
        }
        let umask = mode("UMask", 0o022);

        let specifiers = |word: &str| expand(word, &credentials, &state_root);
        let exec = unit.one("ExecStart").expect("ExecStart=");
        assert!(!exec.starts_with(['-', '@', '+', '!', ':']), "ExecStart prefixes are not emulated: {exec}");
        let argv: Vec<String> = rebase(exec, &root).split_whitespace().map(specifiers).collect();
        let working_dir = unit.one("WorkingDirectory").map(|d| specifiers(&rebase(d, &root)));

        let log = self.path("service.log");
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={SERVICE_UID}"))
            .arg(format!("--regid={SERVICE_UID}"))
            // Put back the harness's parent-death signal, which a change of user clears.
            .args(["--clear-groups", "--pdeathsig=keep", "--"])
            .args(&argv)
            .env_clear()
            .envs(env)
            .current_dir(working_dir.unwrap_or_else(|| "/".to_owned()))
            .stdin(Stdio::null())
            .stdout(process::append_log(&log))
            .stderr(process::append_log(&log));
        // SAFETY: umask(2) is async-signal-safe and cannot fail.
        unsafe {
            cmd.pre_exec(move || {
                libc::umask(umask as libc::mode_t);
                Ok(())
            });
        }
        let child = process::spawn(cmd).unwrap_or_else(|e| panic!("start {argv:?} with setpriv: {e}"));
        Service { child, log }
    }
}

/// `word` with the specifiers the unit uses expanded: `%d` the credentials directory, `%S` the state root,
/// `%%` a percent sign. Any other fails the test: teach this function what systemd means by it.
fn expand(word: &str, credentials: &Path, state_root: &Path) -> String {
    let mut out = String::new();
    let mut chars = word.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&credentials.display().to_string()),
            Some('S') => out.push_str(&state_root.display().to_string()),
            Some('%') => out.push('%'),
            other => panic!("specifier %{} in {word:?} is not emulated", other.unwrap_or(' ')),
        }
    }
    out
}

/// The repository's `connector.toml` (its hosts are 127.0.0.1 already), changed in ports only: the source's
/// is `mysql_port`, the broker's one nothing listens on, the metrics' a free one.
fn local_config(mysql_port: u16) -> String {
    let mut config = fs::read_to_string(repo().join("connector.toml")).expect("read connector.toml");
    for (line, replacement) in [
        ("port = 3306\n", format!("port = {mysql_port}\n")),
        ("bootstrap_servers = \"127.0.0.1:9092\"\n", format!("bootstrap_servers = \"127.0.0.1:{}\"\n", free_port())),
        ("listen = \"127.0.0.1:9187\"\n", format!("listen = \"127.0.0.1:{}\"\n", free_port())),
    ] {
        assert_eq!(config.matches(line).count(), 1, "connector.toml no longer has one line {line:?}: update me");
        config = config.replace(line, &replacement);
    }
    config
}

/// The started service: `ExecStart`'s process.
struct Service {
    /// `setpriv`, which became the connector (exec).
    child: Child,
    /// Its stdout and stderr (the journal).
    log: PathBuf,
}

impl Service {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The first line the service logged at WARN or ERROR, once there is one; `None` if it exited without or
    /// [`PATIENCE`] passed.
    fn first_problem(&mut self) -> Option<String> {
        let problem =
            |log: &str| log.lines().find(|l| l.contains(" WARN ") || l.contains(" ERROR ")).map(str::to_owned);
        let mut found = None;
        wait_until(PATIENCE, || {
            let exited = !matches!(self.child.try_wait(), Ok(None));
            found = problem(&self.log());
            found.is_some() || exited
        });
        found
    }

    /// Waits for the process to exit, up to [`PATIENCE`].
    fn wait_exit(&mut self) -> Option<ExitStatus> {
        process::wait_timeout(&mut self.child, PATIENCE)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        process::kill_now(&mut self.child);
    }
}

/// Issue 43: the unit installed as its comment says starts, reads its config as its dynamic user, gets the
/// password systemd read for it, opens its state in the state directory, and reaches the database; then the
/// comment's `status` command, run as root, reads that state.
///
/// The server's account is locked: MariaDB checks the lock only once the password matched, so "this account is
/// locked" proves the password arrived intact, and it comes straight after the connect, before anything of
/// the pipeline that this test is not about.
#[test]
fn the_unit_installed_as_its_comment_says_reaches_the_database() {
    skip_unless_able!();
    let db = MariaDb::start();
    let quoted = PASSWORD.replace('\\', "\\\\").replace('\'', "\\'");
    for host in ["127.0.0.1", "localhost"] {
        db.sql(&format!("ALTER USER 'cdc'@'{host}' IDENTIFIED BY '{quoted}' ACCOUNT LOCK"));
    }
    let text = unit_text();
    let host = Host::install(&text, db.port(), PASSWORD);
    let mut service = host.start();

    let problem = service.first_problem();
    let log = service.log();
    let problem = problem.unwrap_or_else(|| panic!("the service logged no warning or error:\n{log}"));
    assert!(
        problem.contains("this account is locked"),
        "the service's first problem is not the server's answer to the right password:\n{problem}\n\nlog:\n{log}"
    );
    let state = host.root().join("var/lib/outbox-cdc");
    let files = fs::read_dir(&state).map(|entries| entries.count()).unwrap_or(0);
    assert!(files > 0, "nothing in the state directory {}:\n{log}", state.display());
    drop(service);

    let status = Unit::parse(&text).commands.into_iter().find(|c| c.contains(" status ")).expect("a status command");
    let out = host.shell(&rebase(&status, &host.root())).stdin(Stdio::null()).output().expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("last error:") && stdout.contains("this account is locked"),
        "`{status}` ({}) does not show the service's last error:\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Regression guard for issue 43, and the proof that the emulation switches users for real: read directly as
/// the dynamic user, the root-only config cannot be read, and `run` stops at once with exit 2 (which
/// `RestartPreventExitStatus=2` then leaves down). The unit here is this repository's with its credential
/// undone: `ExecStart=` names the file in /etc/outbox-cdc, as it did before.
#[test]
fn reading_the_root_only_config_directly_stops_on_the_file() {
    skip_unless_able!();
    let text = unit_text();
    let unit = Unit::parse(&text);
    let mut old = text.clone();
    for credential in unit.all("LoadCredential") {
        let (id, source) = credential.split_once(':').expect("LoadCredential=ID:PATH");
        old = old.replace(&format!("LoadCredential={credential}\n"), "").replace(&format!("%d/{id}"), source);
    }
    let exec = Unit::parse(&old).one("ExecStart").unwrap_or_default().to_owned();
    assert!(!exec.contains("%d"), "ExecStart= still names the credentials directory: {exec}");
    // Nothing listens there: the service must not get that far.
    let host = Host::install(&old, free_port(), PASSWORD);
    let mut service = host.start();

    let status = service.wait_exit();
    let log = service.log();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "exit 2, a definite error:\n{log}");
    let problem = service.first_problem().unwrap_or_default();
    assert!(
        problem.contains("cannot read config file") && problem.contains("Permission denied"),
        "the first problem is not the config file's permissions:\n{log}"
    );
}
