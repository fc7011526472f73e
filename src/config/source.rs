//! `[source]`: the database server, or binlog files on disk.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{from_env, from_file, millis, one_password, Secret, SnapshotMode};
use crate::error::{Error, Result};

/// `[source]` as written: the database server, ideally a replica — or binlog files on disk. Flat, as the
/// file has it: which keys are legal depends on `kind`, and [`SourceToml::validate`] turns it into a
/// [`SourceConfig`] that holds only what its kind uses.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SourceToml {
    /// "server" (default: stream from a live server over the replication protocol), "files" (read binlog
    /// files from disk — `binlog_dir` or `binlog_files` — publish what they hold after the checkpoint or
    /// `start_after`, then exit 0 once everything is acknowledged and checkpointed) or "poll" (the polling
    /// relay, `[poll]`: claim unpublished rows of the table, publish them, set `published_at`; no binlog
    /// access needed: `SELECT, UPDATE` on the outbox table and `PROCESS`). With "files" the connection settings
    /// (`host`, `user`, `server_id`, …) are not used; with "poll" they are, except `server_id`, which must
    /// not be set. Both need `[snapshot] mode = "never"`.
    #[serde(default)]
    pub kind: SourceKind,
    /// `kind = "files"`: a directory; every file in it that starts with the binlog magic bytes is read, in
    /// binlog index order (`mysql-bin.000009` before `mysql-bin.000010`). Other files (the `.index`) are
    /// ignored.
    #[serde(default)]
    pub binlog_dir: Option<PathBuf>,
    /// `kind = "files"`: the binlog files to read (instead of `binlog_dir`); read in binlog index order
    /// whatever order they are listed in. A file that is not a binlog is an error.
    #[serde(default)]
    pub binlog_files: Vec<PathBuf>,
    /// First run only (a checkpoint takes precedence): transactions already published, which are skipped
    /// — a MySQL GTID set (`uuid:1-100`) or a MariaDB GTID position (`0-1-100`), the way a replica's
    /// `gtid_executed` / `gtid_slave_pos` reads. With `kind = "files"` the default is everything after the
    /// first file's PREVIOUS_GTIDS / GTID_LIST. With `kind = "server"` (needs `snapshot.mode = "never"`
    /// and `resume_by = "gtid"`) the stream starts right after these GTIDs instead of at `start_from`: the
    /// way to take over from Debezium, whose offsets hold the GTIDs it published
    /// (docs/MIGRATING-FROM-DEBEZIUM.md). The server must still hold the binlogs after them, and must
    /// have executed them.
    #[serde(default)]
    pub start_after: Option<String>,
    /// Host name or IP address of the server. Required with `kind = "server"` and `kind = "poll"`.
    #[serde(default)]
    pub host: String,
    /// TCP port. Default 3306.
    #[serde(default = "default_port")]
    pub port: u16,
    /// User with REPLICATION SLAVE, REPLICATION CLIENT (MariaDB: BINLOG MONITOR) and SELECT on the outbox;
    /// with `kind = "poll"`, SELECT and UPDATE on the outbox table only. Required with `kind = "server"` and
    /// `kind = "poll"`.
    #[serde(default)]
    pub user: String,
    /// Password in clear. Prefer `password_file` or `password_env`. At most one of the three is set;
    /// none means no password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Name of an environment variable holding the password, read when the connector connects; it is an
    /// error if the variable is not set then.
    #[serde(default)]
    pub password_env: Option<String>,
    /// File holding the password (a Kubernetes Secret mounted as a volume, a Docker secret), read when the
    /// connector connects. One trailing line break is not part of the password; an empty or unreadable
    /// file is an error naming the path.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Who the connector is to the server: "password" (default: `password`, `password_env` or
    /// `password_file`), or a short-lived token from the cloud the connector runs in, made afresh for every
    /// connection it opens and sent as the password with the cleartext plugin, so only over TLS that verifies
    /// the server (`tls = "verify_identity"`); no password key may be set with one. "aws_iam": an RDS IAM auth
    /// token signed with the AWS SDK's default credentials (environment, web identity for EKS IRSA, EKS Pod
    /// Identity, ECS, instance profile). "gcp_iam": a Cloud SQL IAM database user's OAuth access token, from
    /// the GCE/GKE metadata server or `token_file`. "azure_ad": a Microsoft Entra ID access token for Azure
    /// Database for MySQL, from the instance metadata service (IMDS) or `token_file`. See
    /// docs/MANAGED-MYSQL.md for the server side.
    #[serde(default)]
    pub auth: AuthKind,
    /// `auth = "aws_iam"`: the region the RDS token is signed for (the database's region). Default: the SDK's
    /// region chain (`AWS_REGION`, `AWS_DEFAULT_REGION`, the profile, the instance metadata).
    #[serde(default)]
    pub aws_region: Option<String>,
    /// `auth = "gcp_iam"` or `"azure_ad"`: read the access token from this file (whole, one trailing line break
    /// dropped) for every connection, as a Kubernetes projected token or a sidecar-refreshed one is, instead
    /// of asking the metadata endpoint. An empty or unreadable file fails the connection attempt.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// `auth = "gcp_iam"` or `"azure_ad"` without `token_file`: the URL of the metadata endpoint's token
    /// request. Default: GCP's `http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/
    /// default/token` (header `Metadata-Flavor: Google`), Azure's `http://169.254.169.254/metadata/identity/
    /// oauth2/token?api-version=2018-02-01&resource=https://ossrdbms-aad.database.windows.net` (header
    /// `Metadata: true`). A token is reused until a minute before its `expires_in` ends.
    #[serde(default)]
    pub metadata_url: Option<String>,
    /// Replication client id; must be unique among all replicas and CDC clients of the server
    /// (a duplicate makes the server disconnect the older client). Required with `kind = "server"`, refused
    /// with `kind = "poll"`.
    #[serde(default)]
    pub server_id: u32,
    /// TLS to the server: "disabled", "required" (encrypt, do not verify) or "verify_identity".
    #[serde(default)]
    pub tls: TlsMode,
    /// PEM file with the CA certificate(s) that signed the server's certificate (for "verify_identity"). When
    /// set, only these CAs are trusted; without it, the public CAs compiled into the binary (not the system
    /// trust store).
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// How the stream resumes: "gtid" (default; requires GTIDs on MySQL) or "file" (binlog file + position,
    /// for MySQL servers with gtid_mode=OFF; positions are then only valid on this one server, so a
    /// failover needs a new snapshot).
    #[serde(default)]
    pub resume_by: ResumeBy,
    /// Where to start when there is no checkpoint: "current" (events committed from now on) or "earliest"
    /// (the oldest binlog the server still has).
    #[serde(default)]
    pub start_from: StartFrom,
    /// Heartbeat period the server is asked to keep on an idle replication connection. A connection that
    /// stays silent for three periods is considered dead and is reconnected.
    #[serde(rename = "heartbeat_interval_ms", default = "default_heartbeat_interval", deserialize_with = "millis")]
    pub heartbeat_interval: Duration,
    /// Timeout for establishing a connection.
    #[serde(rename = "connect_timeout_ms", default = "default_connect_timeout", deserialize_with = "millis")]
    pub connect_timeout: Duration,
    /// First back-off ceiling before reconnecting after a transient failure; the ceiling doubles up to
    /// `reconnect_max_backoff_ms`, and each delay is drawn from [ceiling/2, ceiling] (see `app::backoff::Backoff`).
    #[serde(
        rename = "reconnect_initial_backoff_ms",
        default = "default_reconnect_initial_backoff",
        deserialize_with = "millis"
    )]
    pub reconnect_initial_backoff: Duration,
    /// Upper bound of the reconnect delay.
    #[serde(
        rename = "reconnect_max_backoff_ms",
        default = "default_reconnect_max_backoff",
        deserialize_with = "millis"
    )]
    pub reconnect_max_backoff: Duration,
    /// Bytes of decoded changes the binlog reader may hold ahead of the producer (it reads and decodes on a
    /// task of its own). Counts towards the memory bound together with `kafka.max_in_flight_bytes`.
    #[serde(default = "default_read_ahead_bytes")]
    pub read_ahead_bytes: usize,
}

/// `[source]`, checked: the source with the settings its kind uses, and the settings every kind shares.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// Where change events come from, with what only that source uses.
    pub kind: Source,
    /// First back-off ceiling before a run starts again after a transient failure (any kind).
    pub reconnect_initial_backoff: Duration,
    /// Upper bound of that back-off.
    pub reconnect_max_backoff: Duration,
    /// Bytes of decoded changes a binlog reader (server or files) may hold ahead of the producer.
    pub read_ahead_bytes: usize,
}

/// Where change events come from (`source.kind`), each with the settings only it uses.
#[derive(Debug, Clone)]
pub enum Source {
    /// A live server, over the replication protocol.
    Server(ServerSource),
    /// Binlog files on disk.
    Files(FilesSource),
    /// The outbox table itself, polled (`[poll]`).
    Poll(PollSource),
}

impl Source {
    /// The server connection: the live server's, or the polling relay's; `None` for binlog files.
    pub fn connection(&self) -> Option<&Connection> {
        match self {
            Source::Server(server) => Some(&server.connection),
            Source::Poll(poll) => Some(&poll.connection),
            Source::Files(_) => None,
        }
    }

    /// How positions read on the server are stored: the live server's `resume_by`, and the polling
    /// relay's (for the consistent views of `replay` and `prune`); `None` for binlog files.
    pub fn resume_by(&self) -> Option<ResumeBy> {
        match self {
            Source::Server(server) => Some(server.resume_by),
            Source::Poll(poll) => Some(poll.resume_by),
            Source::Files(_) => None,
        }
    }
}

/// How the connector reaches the database server (`[source]` host, port, user, password, TLS).
#[derive(Debug, Clone)]
pub struct Connection {
    /// Host name or IP address of the server.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The user.
    pub user: String,
    /// Password in clear.
    pub password: Option<Secret>,
    /// Environment variable holding the password, read at connect time.
    pub password_env: Option<String>,
    /// File holding the password, read at connect time.
    pub password_file: Option<PathBuf>,
    /// TLS to the server.
    pub tls: TlsMode,
    /// The CA certificates trusted for `verify_identity`.
    pub tls_ca_file: Option<PathBuf>,
    /// Timeout for establishing a connection.
    pub connect_timeout: Duration,
    /// Who the connector is to the server: the password keys above, or a cloud token.
    pub auth: Auth,
}

/// `source.auth` as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthKind {
    /// `password`, `password_env` or `password_file` (or none).
    #[default]
    Password,
    /// An RDS IAM auth token.
    AwsIam,
    /// A Cloud SQL IAM database user's access token.
    GcpIam,
    /// A Microsoft Entra ID access token.
    AzureAd,
}

impl AuthKind {
    /// The name `source.auth` gives it.
    pub fn name(self) -> &'static str {
        match self {
            AuthKind::Password => "password",
            AuthKind::AwsIam => "aws_iam",
            AuthKind::GcpIam => "gcp_iam",
            AuthKind::AzureAd => "azure_ad",
        }
    }
}

/// `source.auth`, checked: what the password sent at each connection attempt is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// The configured password (`Connection::password`).
    Password,
    /// An RDS IAM auth token, signed for `region` (`None`: the SDK's region chain).
    AwsIam {
        /// `source.aws_region`.
        region: Option<String>,
    },
    /// An OAuth access token of a cloud identity.
    Token {
        /// Which cloud, so which metadata endpoint and header.
        cloud: TokenCloud,
        /// Where the token comes from.
        from: TokenFrom,
    },
}

impl Auth {
    /// The `source.auth` it was configured as.
    pub fn kind(&self) -> AuthKind {
        match self {
            Auth::Password => AuthKind::Password,
            Auth::AwsIam { .. } => AuthKind::AwsIam,
            Auth::Token { cloud: TokenCloud::Gcp, .. } => AuthKind::GcpIam,
            Auth::Token { cloud: TokenCloud::Azure, .. } => AuthKind::AzureAd,
        }
    }
}

/// The cloud whose metadata endpoint hands out access tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCloud {
    /// GCE/GKE metadata server (Cloud SQL IAM database authentication).
    Gcp,
    /// Azure Instance Metadata Service (Microsoft Entra ID authentication).
    Azure,
}

impl TokenCloud {
    /// The metadata endpoint's token URL.
    pub fn default_url(self) -> &'static str {
        match self {
            TokenCloud::Gcp => {
                "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
            }
            TokenCloud::Azure => {
                "http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01\
                 &resource=https://ossrdbms-aad.database.windows.net"
            }
        }
    }

    /// The header the endpoint requires (it refuses requests without, against server-side request forgery).
    pub fn header(self) -> (&'static str, &'static str) {
        match self {
            TokenCloud::Gcp => ("Metadata-Flavor", "Google"),
            TokenCloud::Azure => ("Metadata", "true"),
        }
    }
}

/// Where an access token is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenFrom {
    /// `source.token_file`, read for every connection.
    File(PathBuf),
    /// The metadata endpoint at this URL.
    Endpoint(String),
}

impl Connection {
    /// The password, read from the environment or a file if configured so.
    ///
    /// # Errors
    /// A definite error when `password_env` names a variable that is not set, or `password_file` a file
    /// that cannot be read or is empty.
    pub fn password(&self) -> Result<Option<Secret>> {
        match (&self.password_env, &self.password_file) {
            (Some(var), _) => from_env("source.password_env", var).map(Some),
            (None, Some(path)) => from_file("source.password_file", path).map(Some),
            (None, None) => Ok(self.password.clone()),
        }
    }
}

/// `kind = "server"`: a live server, streamed over the replication protocol.
#[derive(Debug, Clone)]
pub struct ServerSource {
    /// How to reach it.
    pub connection: Connection,
    /// Replication client id, never 0.
    pub server_id: u32,
    /// How the stream resumes.
    pub resume_by: ResumeBy,
    /// Where to start when there is no checkpoint (unless `start_after`).
    pub start_from: StartFrom,
    /// First run only: GTIDs already published; checked to parse as MySQL or MariaDB GTIDs, and only with
    /// `resume_by = "gtid"` and `[snapshot] mode = "never"`.
    pub start_after: Option<String>,
    /// Heartbeat period asked of the server.
    pub heartbeat_interval: Duration,
}

/// `kind = "files"`: binlog files on disk.
#[derive(Debug, Clone)]
pub struct FilesSource {
    /// Which files.
    pub binlogs: Binlogs,
    /// First run only: GTIDs already published; checked to parse as MySQL or MariaDB GTIDs.
    pub start_after: Option<String>,
}

/// `source.binlog_dir` or `source.binlog_files`: exactly one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binlogs {
    /// Every binlog file in the directory.
    Dir(PathBuf),
    /// These files.
    Files(Vec<PathBuf>),
}

/// `kind = "poll"`: the polling relay.
#[derive(Debug, Clone)]
pub struct PollSource {
    /// How to reach the server.
    pub connection: Connection,
    /// How `replay` and `prune` read the position of their consistent view (the relay reads none).
    pub resume_by: ResumeBy,
}

/// `source.kind` as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A live server, over the replication protocol.
    #[default]
    Server,
    /// Binlog files on disk.
    Files,
    /// The outbox table itself, polled (`[poll]`): for servers whose binlog the connector may not read.
    Poll,
}

/// TLS mode of the database connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsMode {
    /// Plain TCP.
    #[default]
    Disabled,
    /// Encrypted, server certificate not verified.
    Required,
    /// Encrypted, certificate and host name verified.
    VerifyIdentity,
}

/// How positions are stored and streams resumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeBy {
    /// GTID set (MySQL) or GTID position (MariaDB): survives failover to another server of the topology.
    #[default]
    Gtid,
    /// Binlog file name and byte offset: explicit opt-in for MySQL with gtid_mode=OFF.
    File,
}

/// Start point when no checkpoint exists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartFrom {
    /// The server's current position: only transactions committed after start-up.
    #[default]
    Current,
    /// The oldest binlog the server still holds.
    Earliest,
}

fn default_port() -> u16 {
    3306
}
fn default_heartbeat_interval() -> Duration {
    Duration::from_millis(5_000)
}
fn default_connect_timeout() -> Duration {
    Duration::from_millis(10_000)
}
fn default_reconnect_initial_backoff() -> Duration {
    Duration::from_millis(250)
}
fn default_reconnect_max_backoff() -> Duration {
    Duration::from_millis(30_000)
}

fn default_read_ahead_bytes() -> usize {
    1024 * 1024
}

impl SourceToml {
    /// Checks the section, with the snapshot mode that the source kind constrains, and keeps what the
    /// kind uses: the refusals of keys a kind does not take are here, so that a [`SourceConfig`] cannot
    /// hold them. (`kind = "files"` accepts the connection keys and ignores them, as it always has.)
    pub(super) fn validate(self, snapshot: SnapshotMode) -> Result<SourceConfig> {
        one_password("source", self.password.is_some(), self.password_env.is_some(), self.password_file.is_some())?;
        self.validate_kind(snapshot)?;
        if self.kind == SourceKind::Server && self.server_id == 0 {
            return Err(Error::definite("source.server_id must be a non-zero id unique among the server's replicas"));
        }
        if self.tls != TlsMode::VerifyIdentity && self.tls_ca_file.is_some() {
            return Err(Error::definite("source.tls_ca_file only applies with source.tls = \"verify_identity\""));
        }
        let auth = self.auth()?;
        if !(256 * 1024..=1024 * 1024 * 1024).contains(&self.read_ahead_bytes) {
            return Err(Error::definite("source.read_ahead_bytes must be between 256 KiB and 1 GiB"));
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval.as_millis() > 4_294_967 {
            return Err(Error::definite("source.heartbeat_interval_ms must be between 1 and 4294967"));
        }
        let connection = Connection {
            host: self.host,
            port: self.port,
            user: self.user,
            password: self.password,
            password_env: self.password_env,
            password_file: self.password_file,
            tls: self.tls,
            tls_ca_file: self.tls_ca_file,
            connect_timeout: self.connect_timeout,
            auth,
        };
        let kind = match self.kind {
            SourceKind::Server => Source::Server(ServerSource {
                connection,
                server_id: self.server_id,
                resume_by: self.resume_by,
                start_from: self.start_from,
                start_after: self.start_after,
                heartbeat_interval: self.heartbeat_interval,
            }),
            SourceKind::Files => Source::Files(FilesSource {
                binlogs: match self.binlog_dir {
                    Some(dir) => Binlogs::Dir(dir),
                    None => Binlogs::Files(self.binlog_files),
                },
                start_after: self.start_after,
            }),
            SourceKind::Poll => Source::Poll(PollSource { connection, resume_by: self.resume_by }),
        };
        Ok(SourceConfig {
            kind,
            reconnect_initial_backoff: self.reconnect_initial_backoff,
            reconnect_max_backoff: self.reconnect_max_backoff,
            read_ahead_bytes: self.read_ahead_bytes,
        })
    }

    /// `auth` and the keys that go with it: a token is sent in clear text inside the connection, so only
    /// over TLS that verifies the server, and it replaces the password.
    fn auth(&self) -> Result<Auth> {
        let kind = self.auth.name();
        let token_keys = self.token_file.is_some() || self.metadata_url.is_some();
        if self.auth != AuthKind::AwsIam && self.aws_region.is_some() {
            return Err(Error::definite("source.aws_region applies only with source.auth = \"aws_iam\""));
        }
        if !matches!(self.auth, AuthKind::GcpIam | AuthKind::AzureAd) && token_keys {
            return Err(Error::definite(
                "source.token_file and source.metadata_url apply only with source.auth = \"gcp_iam\" or \"azure_ad\"",
            ));
        }
        if self.auth == AuthKind::Password {
            return Ok(Auth::Password);
        }
        if self.password.is_some() || self.password_env.is_some() || self.password_file.is_some() {
            return Err(Error::definite(format!(
                "source.auth = \"{kind}\" makes a fresh token the password of every connection: remove \
                 source.password, source.password_env and source.password_file (or set source.auth = \"password\")"
            )));
        }
        if self.tls != TlsMode::VerifyIdentity {
            return Err(Error::definite(format!(
                "source.auth = \"{kind}\" sends its token in clear text inside the connection (the cleartext \
                 plugin), so only over TLS that verifies the server: set source.tls = \"verify_identity\" (with \
                 source.tls_ca_file naming the cloud's CA bundle, e.g. RDS's global-bundle.pem, unless a public CA \
                 signed the server's certificate)"
            )));
        }
        let cloud = match self.auth {
            AuthKind::Password => unreachable!("returned above"),
            AuthKind::AwsIam => return Ok(Auth::AwsIam { region: self.aws_region.clone() }),
            AuthKind::GcpIam => TokenCloud::Gcp,
            AuthKind::AzureAd => TokenCloud::Azure,
        };
        let from = match (&self.token_file, &self.metadata_url) {
            (Some(_), Some(_)) => {
                return Err(Error::definite(format!(
                    "source.auth = \"{kind}\" reads its token from source.token_file or from the metadata endpoint \
                     (source.metadata_url), not both: remove one"
                )))
            }
            (Some(file), None) => TokenFrom::File(file.clone()),
            (None, url) => TokenFrom::Endpoint(url.clone().unwrap_or_else(|| cloud.default_url().to_string())),
        };
        if let TokenFrom::Endpoint(url) = &from {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                return Err(Error::definite(format!(
                    "source.metadata_url = {url:?} must be an http:// or https:// URL"
                )));
            }
        }
        Ok(Auth::Token { cloud, from })
    }

    /// Which settings `kind` allows and needs, and a `start_after` of either GTID kind.
    fn validate_kind(&self, snapshot: SnapshotMode) -> Result<()> {
        match self.kind {
            SourceKind::Server => {
                if self.binlog_dir.is_some() || !self.binlog_files.is_empty() {
                    return Err(Error::definite(
                        "source.binlog_dir and source.binlog_files apply only with source.kind = \"files\"",
                    ));
                }
                if self.start_after.is_some() && snapshot != SnapshotMode::Never {
                    return Err(Error::definite(
                        "source.start_after starts streaming after GTIDs already published (e.g. by Debezium), \
                         without a snapshot: set [snapshot] mode = \"never\"",
                    ));
                }
                if self.start_after.is_some() && self.resume_by != ResumeBy::Gtid {
                    return Err(Error::definite(
                        "source.start_after is a GTID position: it needs source.resume_by = \"gtid\"",
                    ));
                }
                if self.host.is_empty() || self.user.is_empty() {
                    return Err(Error::definite("source.host and source.user are required (source.kind = \"server\")"));
                }
            }
            SourceKind::Poll => {
                if self.binlog_dir.is_some() || !self.binlog_files.is_empty() || self.start_after.is_some() {
                    return Err(Error::definite(
                        "source.binlog_dir, source.binlog_files and source.start_after apply only with \
                         source.kind = \"files\"",
                    ));
                }
                if self.host.is_empty() || self.user.is_empty() {
                    return Err(Error::definite("source.host and source.user are required (source.kind = \"poll\")"));
                }
                if self.server_id != 0 {
                    return Err(Error::definite(
                        "source.server_id is the binlog client's id; the polling relay (source.kind = \"poll\") \
                         reads no binlog: remove it",
                    ));
                }
                // The relay publishes every unpublished row (published_at IS NULL) whatever the mode:
                // "initial" (the default) and "never" both fit it; the modes that promise more do not.
                if matches!(snapshot, SnapshotMode::InitialOnly | SnapshotMode::WhenNeeded) {
                    return Err(Error::definite(
                        "source.kind = \"poll\" publishes every unpublished row of the table (published_at IS \
                         NULL) and reads no binlog, so [snapshot] mode = \"initial_only\" or \"when_needed\" \
                         has nothing to do: remove [snapshot] mode",
                    ));
                }
            }
            SourceKind::Files => {
                if self.binlog_dir.is_some() != self.binlog_files.is_empty() {
                    return Err(Error::definite(
                        "source.kind = \"files\" needs exactly one of source.binlog_dir (a directory) or \
                         source.binlog_files (a list of files)",
                    ));
                }
                if snapshot != SnapshotMode::Never {
                    return Err(Error::definite(
                        "source.kind = \"files\" reads only what the binlog files hold; there is no table to \
                         snapshot. Set [snapshot] mode = \"never\"",
                    ));
                }
            }
        }
        if let Some(after) = &self.start_after {
            let mysql = after.parse::<crate::position::mysql::GtidSet>();
            let mariadb = after.parse::<crate::position::mariadb::GtidPos>();
            if let (Err(a), Err(b)) = (mysql, mariadb) {
                return Err(Error::definite(format!(
                    "source.start_after = {after:?} is neither a MySQL GTID set ({a}) nor a MariaDB GTID \
                     position ({b})"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;
    use crate::config::*;

    const FILES: &str = r#"
        [source]
        kind = "files"
        binlog_dir = "/backup/binlogs"
        [outbox]
        table = "shop.outbox_events"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
        [snapshot]
        mode = "never"
    "#;

    /// `kind = "files"` needs no connection settings, exactly one of binlog_dir/binlog_files, no snapshot, and
    /// a start_after of either GTID kind; the files keys are rejected with a live server.
    #[test]
    fn files_source_settings_are_validated() {
        let c = Config::parse(FILES).unwrap();
        match &c.source.kind {
            Source::Files(files) => assert_eq!(files.binlogs, Binlogs::Dir("/backup/binlogs".into())),
            other => panic!("{other:?}"),
        }
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("binlog_dir = \"/backup/binlogs\"", "binlog_files = [\"/b/mysql-bin.000001\"]", None),
            ("binlog_dir = \"/backup/binlogs\"", "", Some("exactly one of")),
            ("binlog_dir = \"/backup/binlogs\"", "binlog_dir = \"/b\"\nbinlog_files = [\"/b/x\"]", Some("exactly one")),
            ("mode = \"never\"", "mode = \"initial\"", Some("no table to snapshot")),
            ("kind = \"files\"", "kind = \"files\"\nstart_after = \"0-1-100\"", None),
            ("kind = \"files\"", "kind = \"files\"\nstart_after = \"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5\"", None),
            ("kind = \"files\"", "kind = \"files\"\nstart_after = \"yesterday\"", Some("neither a MySQL GTID set")),
        ];
        for (from, to, error) in cases {
            let result = Config::parse(&FILES.replace(from, to));
            match error {
                None => assert!(result.is_ok(), "{to}: {result:?}"),
                Some(e) => assert!(result.unwrap_err().to_string().contains(e), "{to}"),
            }
        }
        let live = MINIMAL.replace("server_id = 5401", "server_id = 5401\nbinlog_dir = \"/b\"");
        assert!(Config::parse(&live).unwrap_err().to_string().contains("only with"));
        let no_host = MINIMAL.replace("host = \"127.0.0.1\"", "");
        assert!(Config::parse(&no_host).unwrap_err().to_string().contains("source.host"));
    }

    /// `source.auth` and its keys: each refusal with the message that says what to set, and what each
    /// accepted setting becomes. Guards against a token sent where TLS does not verify the server, and a
    /// password left beside a token.
    #[test]
    fn auth_settings_are_validated() {
        let iam = |lines: &str| {
            MINIMAL
                .replace("password = \"pw\"\n", "")
                .replace("server_id = 5401", &format!("server_id = 5401\n{lines}"))
        };
        let tls = "tls = \"verify_identity\"\n";
        let refused: &[(String, &str)] = &[
            (iam("auth = \"aws_iam\""), "set source.tls = \"verify_identity\""),
            (iam("auth = \"gcp_iam\"\ntls = \"required\""), "only over TLS that verifies the server"),
            (iam("auth = \"azure_ad\"\ntls = \"disabled\""), "set source.tls = \"verify_identity\""),
            (
                MINIMAL.replace("password = \"pw\"", &format!("auth = \"aws_iam\"\npassword = \"pw\"\n{tls}")),
                "remove source.password",
            ),
            (iam(&format!("auth = \"gcp_iam\"\npassword_file = \"/run/pw\"\n{tls}")), "remove source.password"),
            (iam(&format!("auth = \"azure_ad\"\npassword_env = \"PW\"\n{tls}")), "remove source.password"),
            (iam(&format!("auth = \"gcp_iam\"\ntoken_file = \"/t\"\nmetadata_url = \"http://x/\"\n{tls}")), "not both"),
            (
                iam(&format!("auth = \"aws_iam\"\ntoken_file = \"/t\"\n{tls}")),
                "token_file and source.metadata_url apply only",
            ),
            (iam(&format!("auth = \"gcp_iam\"\naws_region = \"eu-west-1\"\n{tls}")), "aws_region applies only"),
            (iam(&format!("auth = \"gcp_iam\"\nmetadata_url = \"file:///etc/passwd\"\n{tls}")), "http:// or https://"),
            (iam(&format!("auth = \"kerberos\"\n{tls}")), "unknown variant"),
        ];
        for (text, expected) in refused {
            let error = Config::parse(text).expect_err(text).to_string();
            assert!(error.contains(expected), "{text}\n-> {error}");
        }
        let accepted: &[(String, Auth)] = &[
            (MINIMAL.to_string(), Auth::Password),
            (
                iam(&format!("auth = \"aws_iam\"\naws_region = \"eu-west-1\"\n{tls}")),
                Auth::AwsIam { region: Some("eu-west-1".into()) },
            ),
            (iam(&format!("auth = \"aws_iam\"\n{tls}")), Auth::AwsIam { region: None }),
            (
                iam(&format!("auth = \"gcp_iam\"\n{tls}")),
                Auth::Token { cloud: TokenCloud::Gcp, from: TokenFrom::Endpoint(TokenCloud::Gcp.default_url().into()) },
            ),
            (
                iam(&format!("auth = \"azure_ad\"\ntoken_file = \"/var/run/token\"\n{tls}")),
                Auth::Token { cloud: TokenCloud::Azure, from: TokenFrom::File("/var/run/token".into()) },
            ),
            (
                iam(&format!("auth = \"azure_ad\"\nmetadata_url = \"http://127.0.0.1:9/t\"\n{tls}")),
                Auth::Token { cloud: TokenCloud::Azure, from: TokenFrom::Endpoint("http://127.0.0.1:9/t".into()) },
            ),
        ];
        for (text, auth) in accepted {
            let config = Config::parse(text).unwrap_or_else(|e| panic!("{text}\n-> {e}"));
            assert_eq!(&config.source.kind.connection().unwrap().auth, auth, "{text}");
        }
        assert!(TokenCloud::Azure
            .default_url()
            .ends_with("api-version=2018-02-01&resource=https://ossrdbms-aad.database.windows.net"));
    }
}
