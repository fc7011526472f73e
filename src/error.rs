//! The error model: every failure is either *transient* or *definite*.
//!
//! Floor 1 (docs/ARCHITECTURE.md): imports only the ground floor.
//!
//! - **Transient**: the world may heal by itself (connection refused or cut, server restarting, broker
//!   unreachable, delivery timed out). The pipeline is torn down and restarted, with capped exponential
//!   back-off, from the last position whose events Kafka acknowledged. Nothing is lost because nothing past
//!   the acknowledged watermark is ever checkpointed.
//! - **Definite**: retrying cannot help (bad server setting, purged binlog, missing privilege, undecodable
//!   row, different server than the checkpoint's). The connector stops, and the message says what is wrong,
//!   where, and what the operator should do.
//!
//! Each upstream client's errors are classified exactly once, here: [`classify_mysql`] and
//! [`classify_kafka`]. Everything else constructs [`Error::definite`] or [`Error::transient`] itself with a
//! message written for the operator, or, for an error some code acts on, the constructor of its [`Kind`].
//!
//! # Kinds, not text
//! Beyond its class, an error that some code decides on has a [`Kind`]: the lease lost or held on another
//! server, a fenced or fatally failed producer, a commit whose outcome is unknown, a refused ACL, records
//! deleted under a reader, a record the broker refused, a poison row. The decision matches the kind, and a
//! test asserts it; [`Error::context`] keeps it. The message stays what the operator reads.
//!
//! Every message passes through [`crate::secret::redact`] when the error is built, so whatever shows or
//! stores an error (the log, the state store's `last_error`, `outbox-cdc status`) never sees the value of a
//! secret-looking key.

use std::fmt;

use crate::poison::{KnownPoison, Poison, PoisonKind};

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Retry from the last acknowledged position.
    Transient,
    /// Stop and tell the operator.
    Definite,
}

/// What an error is, for the code that decides on it: the supervisor (restart, count, stop), the pipeline and
/// the relay (dead-letter a refused record), the readers and their callers. Code that acts on an error
/// matches its kind, never its message; the message is for the person who reads it.
///
/// Each kind has one class ([`Error::class`]), set by its constructor: [`Kind::AuthorizationDenied`],
/// [`Kind::RecordsDeleted`] and [`Kind::Poison`] are definite, the others transient.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// Nothing beyond its class: a transient error is retried, a definite one stops.
    Other,
    /// This instance no longer provably holds its lease ([`Error::lease_lost`]): it stops publishing and
    /// waits as a standby.
    LeaseLost,
    /// The lease is held on another server than the one `source.host` now leads to (the binlog connection's,
    /// after a switchover or behind a name over several servers) ([`Error::lease_elsewhere`]): another
    /// instance could hold the lease there, so this run does not start.
    LeaseElsewhere,
    /// A transactional producer was fenced ([`Error::producer_fenced`]): a newer one with its
    /// `transactional.id` started, or the broker aborted a transaction open past `transaction.timeout.ms`.
    /// Not a producer fault: not counted towards [`Kind::ProducerFatal`]'s stop.
    ProducerFenced,
    /// The idempotent producer failed fatally ([`Error::producer_fatal`]): the run restarts with a new
    /// producer, a bounded number of times in a row.
    ProducerFatal,
    /// A stop gave up waiting for a Kafka commit's outcome ([`Error::commit_unknown`]): it is neither
    /// counted as committed nor aborted; the next start's `init_transactions` settles it.
    CommitUnknown,
    /// The broker refused an operation for want of an ACL on this kind of resource
    /// ([`Error::authorization_denied`]); the message names the `kafka-acls` command that grants it.
    AuthorizationDenied(Denied),
    /// Records a reader had not reached yet were deleted from under it (retention, DeleteRecords)
    /// ([`Error::records_deleted`]): the read stops instead of skipping them.
    RecordsDeleted,
    /// The broker refused one record for good ([`Error::refused_record`]): the run restarts from the
    /// checkpoint and dead-letters that event.
    RecordRefused(Box<KnownPoison>),
    /// A row that cannot become a record, where poison stops the connector (`outbox.on_poison = "fail"`, a
    /// release without `--skip-poison`) ([`Error::poison`]): [`PoisonKind::SchemaMissing`] when the
    /// registry has no schema for it.
    Poison(PoisonKind),
}

/// The kind of Kafka resource an ACL was missing on ([`Kind::AuthorizationDenied`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// A topic (TOPIC_AUTHORIZATION_FAILED).
    Topic,
    /// A consumer group (GROUP_AUTHORIZATION_FAILED).
    Group,
    /// The cluster (CLUSTER_AUTHORIZATION_FAILED).
    Cluster,
    /// A transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
    TransactionalId,
    /// A delegation token (DELEGATION_TOKEN_AUTHORIZATION_FAILED).
    DelegationToken,
}

/// An error with its class, what it is ([`Kind`]) and an operator-facing message.
#[derive(Debug, Clone, thiserror::Error)]
pub struct Error {
    class: Class,
    kind: Kind,
    message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error {
    fn new(class: Class, kind: Kind, message: String) -> Self {
        let message = match crate::secret::redact(&message) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(redacted) => redacted,
        };
        Error { class, kind, message }
    }

    /// An error that retrying from the last acknowledged position may cure.
    pub fn transient(message: impl Into<String>) -> Self {
        Error::new(Class::Transient, Kind::Other, message.into())
    }

    /// An error that needs an operator: the message must say what to do.
    pub fn definite(message: impl Into<String>) -> Self {
        Error::new(Class::Definite, Kind::Other, message.into())
    }

    /// The broker refused event `id` for good ([`Kind::RecordRefused`]). Transient for the pipeline (it
    /// restarts from the checkpoint), which then routes that event to the dead-letter path.
    pub fn refused_record(id: String, message: String) -> Self {
        Error::new(
            Class::Transient,
            Kind::RecordRefused(Box::new(KnownPoison { id: id.clone(), message: message.clone() })),
            format!("Kafka refused event {id} for good: {message}; it goes to the dead-letter path"),
        )
    }

    /// The idempotent producer failed fatally ([`Kind::ProducerFatal`]): transient (the run restarts from
    /// the checkpoint with a new producer), and counted, so that a fault that recurs at once stops the
    /// connector instead.
    pub fn producer_fatal(message: impl Into<String>) -> Self {
        Error::new(Class::Transient, Kind::ProducerFatal, message.into())
    }

    /// A transactional producer was fenced ([`Kind::ProducerFenced`]): transient, and not a producer fault.
    /// [`fenced_transaction`] writes the message for the event producer.
    pub fn producer_fenced(message: impl Into<String>) -> Self {
        Error::new(Class::Transient, Kind::ProducerFenced, message.into())
    }

    /// This instance no longer provably holds its lease ([`Kind::LeaseLost`]): transient, the run ends and
    /// the instance waits as a standby. `message` says what noticed it and what stopped.
    pub fn lease_lost(message: impl Into<String>) -> Self {
        Error::new(Class::Transient, Kind::LeaseLost, message.into())
    }

    /// The lease is held on another server than the one `source.host` now leads to ([`Kind::LeaseElsewhere`]):
    /// transient, the run does not start and is tried again after the back-off.
    pub fn lease_elsewhere(message: impl Into<String>) -> Self {
        Error::new(Class::Transient, Kind::LeaseElsewhere, message.into())
    }

    /// A stop gave up waiting for a Kafka commit's outcome ([`Kind::CommitUnknown`]): transient.
    pub fn commit_unknown(message: impl Into<String>) -> Self {
        Error::new(Class::Transient, Kind::CommitUnknown, message.into())
    }

    /// The broker refused an operation for want of an ACL on a resource of kind `denied`
    /// ([`Kind::AuthorizationDenied`]): definite, and `message` must name the grant.
    pub fn authorization_denied(denied: Denied, message: impl Into<String>) -> Self {
        Error::new(Class::Definite, Kind::AuthorizationDenied(denied), message.into())
    }

    /// Records not read yet were deleted from under a reader ([`Kind::RecordsDeleted`]): definite.
    pub fn records_deleted(message: impl Into<String>) -> Self {
        Error::new(Class::Definite, Kind::RecordsDeleted, message.into())
    }

    /// A poison row where poison stops the connector ([`Kind::Poison`]): definite.
    pub fn poison(kind: PoisonKind, message: impl Into<String>) -> Self {
        Error::new(Class::Definite, Kind::Poison(kind), message.into())
    }

    /// What this error is, for the code that decides on it.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The class of this error.
    pub fn class(&self) -> Class {
        self.class
    }

    /// True when retrying cannot help.
    pub fn is_definite(&self) -> bool {
        self.class == Class::Definite
    }

    /// Prefixes the message with what was being done, keeping the class and the kind.
    pub fn context(self, what: impl fmt::Display) -> Self {
        Error::new(self.class, self.kind, format!("{what}: {}", self.message))
    }

    /// Process exit code for this error: 2 for definite (configuration or server problem), 3 for transient.
    pub fn exit_code(&self) -> i32 {
        match self.class {
            Class::Definite => EXIT_DEFINITE,
            Class::Transient => EXIT_TRANSIENT,
        }
    }
}

/// Exit code: a configuration or server problem that an operator must fix.
pub const EXIT_DEFINITE: i32 = 2;
/// Exit code: a transient failure (e.g. `check` could not reach the server).
pub const EXIT_TRANSIENT: i32 = 3;

/// MySQL/MariaDB server error codes that need an operator.
pub mod mysql_codes {
    /// ER_DBACCESS_DENIED_ERROR
    pub const DB_ACCESS_DENIED: u16 = 1044;
    /// ER_ACCESS_DENIED_ERROR (bad user or password)
    pub const ACCESS_DENIED: u16 = 1045;
    /// ER_BAD_DB_ERROR
    pub const BAD_DB: u16 = 1049;
    /// ER_TABLEACCESS_DENIED_ERROR
    pub const TABLE_ACCESS_DENIED: u16 = 1142;
    /// ER_NO_SUCH_TABLE
    pub const NO_SUCH_TABLE: u16 = 1146;
    /// ER_SPECIFIC_ACCESS_DENIED_ERROR (missing global privilege such as REPLICATION SLAVE)
    pub const SPECIFIC_ACCESS_DENIED: u16 = 1227;
    /// ER_MASTER_FATAL_ERROR_READING_BINLOG: the requested position/GTID is not in the server's binlogs
    /// (purged, never existed, or diverged history).
    pub const FATAL_READING_BINLOG: u16 = 1236;
    /// ER_UNKNOWN_SYSTEM_VARIABLE
    pub const UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;
    /// ER_MASTER_HAS_PURGED_REQUIRED_GTIDS (MySQL)
    pub const PURGED_REQUIRED_GTIDS: u16 = 1789;
    /// A duplicate server_id of a replica, as some servers report it (see [`SLAVE_SAME_ID`]).
    pub const DUPLICATE_SERVER_ID: u16 = 4017;
    /// ER_SLAVE_SAME_ID (MariaDB 10.2.5+): another replica connected with this one's server_id, and the server
    /// dropped this one. MySQL says the same through [`FATAL_READING_BINLOG`], with the message
    /// "A slave with the same server_uuid/server_id as this slave has connected to the master" (or "replica").
    pub const SLAVE_SAME_ID: u16 = 4052;
    /// ER_SECURE_TRANSPORT_REQUIRED (MySQL, `require_secure_transport=ON` and no TLS; MariaDB answers
    /// [`ACCESS_DENIED`] instead)
    pub const SECURE_TRANSPORT_REQUIRED: u16 = 3159;
}

/// Classifies a `mysql_async` error once, for every caller.
pub fn classify_mysql(err: &mysql_async::Error) -> Error {
    use mysql_async::Error as E;
    match err {
        E::Server(server) => {
            use mysql_codes::*;
            let text = format!("server error {} ({}): {}", server.code, server.state, server.message);
            let same_id = server.code == SLAVE_SAME_ID
                || server.code == DUPLICATE_SERVER_ID
                || (server.code == FATAL_READING_BINLOG && server.message.contains("same server_uuid/server_id"));
            match server.code {
                // Two clients with one server_id drop each other in turn, forever: an operator must choose.
                _ if same_id => Error::definite(format!(
                    "{text}. Another replica or CDC client connected to the server with this connector's \
                     source.server_id; the server keeps only one of them. Give every connector and every replica \
                     of this server its own server_id"
                )),
                FATAL_READING_BINLOG | PURGED_REQUIRED_GTIDS => Error::definite(format!(
                    "{text}. The binlog no longer holds the position this connector needs (purged, or the \
                     server's history diverged: RESET MASTER, a restored backup, another server). Events written \
                     since the checkpoint may be gone from the binlog: re-snapshot the outbox table (move the \
                     state directory away, or use snapshot.mode = \"when_needed\") and raise the server's binlog \
                     retention (binlog_expire_logs_seconds / expire_logs_days); check the result with \
                     `outbox-cdc audit`"
                )),
                ACCESS_DENIED => Error::definite(format!(
                    "{text}. Check source.user and the password; if the server has require_secure_transport=ON \
                     (MariaDB then refuses a connection without TLS this way), set source.tls = \"required\" or \
                     \"verify_identity\""
                )),
                SECURE_TRANSPORT_REQUIRED => Error::definite(format!(
                    "{text}. The server accepts only TLS connections: set source.tls = \"required\" or \
                     \"verify_identity\""
                )),
                DB_ACCESS_DENIED | TABLE_ACCESS_DENIED | SPECIFIC_ACCESS_DENIED => Error::definite(format!(
                    "{text}. Grant the connector's user REPLICATION SLAVE, REPLICATION CLIENT (MariaDB: also \
                     BINLOG MONITOR) on *.* and SELECT on the outbox table; see `outbox-cdc check`"
                )),
                BAD_DB | NO_SUCH_TABLE | UNKNOWN_SYSTEM_VARIABLE => Error::definite(text),
                _ => Error::transient(text),
            }
        }
        // Building the TLS client from the config: a CA file that is not a certificate, a host name that
        // cannot be a TLS server name.
        E::Io(mysql_async::IoError::Tls(tls)) => Error::definite(format!(
            "TLS to the database cannot be set up: {tls}. Check source.tls_ca_file (the PEM file of the CA that \
             signed the server's certificate) and source.host"
        )),
        E::Io(mysql_async::IoError::Io(io)) => match tls_refusal(io) {
            Some(refusal) => refusal,
            None => Error::transient(format!("connection to the database failed: {io}")),
        },
        E::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => Error::definite(
            "the database server does not offer TLS, and source.tls asks for it: give the server a certificate \
             (ssl_cert, ssl_key; MariaDB: have_ssl must say YES), or set source.tls = \"disabled\" on a network \
             you trust",
        ),
        E::Driver(driver) => Error::transient(format!("database driver error: {driver}")),
        E::Url(url) => Error::definite(format!("invalid database connection settings: {url}")),
        E::Other(other) => Error::transient(format!("database error: {other}")),
    }
}

/// A TLS handshake with the database that failed because of the server's certificate or an incompatible TLS
/// setup: a definite error with the fix, since the same certificate will be refused again. `None` for any
/// other I/O error (a connection cut during the handshake stays transient).
fn tls_refusal(io: &std::io::Error) -> Option<Error> {
    use rustls::CertificateError as C;
    // tokio-rustls hands rustls' handshake error up as the I/O error's inner error.
    let tls = io.get_ref()?.downcast_ref::<rustls::Error>()?;
    let fix = match tls {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "The server's certificate is not signed by the CA in source.tls_ca_file (without source.tls_ca_file, \
             only public CAs are trusted): point source.tls_ca_file at the PEM file of the CA that signed it"
        }
        rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "Set source.host to a name or IP address that the server's certificate lists in its subjectAltName, \
             or reissue the certificate for source.host"
        }
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => "Renew the server's certificate, or correct this machine's clock",
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::UnsupportedNameType
        | rustls::Error::PeerIncompatible(_) => "Fix the server's certificate or TLS settings, or source.tls_ca_file",
        _ => return None,
    };
    Some(Error::definite(format!("the TLS handshake with the database failed: {tls}. {fix}")))
}

/// A Kafka resource an ACL names, as `kafka-acls` spells it: what a caller was using when the broker refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaResource<'a> {
    /// A topic, and the operations the caller needs on it (`["Read", "Describe"]`).
    Topic(&'a str, &'a [&'a str]),
    /// A consumer group, read with `Read` and `Describe`.
    Group(&'a str),
    /// A transactional id, used with `Write` and `Describe`.
    TransactionalId(&'a str),
}

/// The principal in the `kafka-acls` commands of our messages: the client does not always know its own
/// (mTLS, OAuth), so the operator fills it in.
const PRINCIPAL: &str = "User:<the connector's principal>";

/// The broker's authorization refusals: retrying cannot help until an operator grants an ACL.
pub fn is_authorization_failure(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        code,
        C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::DelegationTokenAuthorizationFailed
    )
}

/// The definite error of an authorization refusal (`code`), with the `kafka-acls` command that grants what
/// was refused: on `resource` when the caller named it and it is the refused kind, else with placeholders.
fn denied(code: rdkafka::types::RDKafkaErrorCode, text: &str, resource: Option<KafkaResource<'_>>) -> Error {
    use rdkafka::types::RDKafkaErrorCode as C;
    let grant = |what: &str| {
        format!("kafka-acls --bootstrap-server <kafka.bootstrap_servers> --add --allow-principal {PRINCIPAL} {what}")
    };
    let fix = match (code, resource) {
        (C::GroupAuthorizationFailed, Some(KafkaResource::Group(group))) => format!(
            "The connector's principal may not use the consumer group {group:?}. Grant it: {}",
            grant(&format!("--operation Read --operation Describe --group {group}"))
        ),
        (C::GroupAuthorizationFailed, _) => format!(
            "The connector's principal may not use a consumer group. Grant it: {}",
            grant("--operation Read --operation Describe --group <the group>")
        ),
        (C::TransactionalIdAuthorizationFailed, Some(KafkaResource::TransactionalId(id))) => format!(
            "The connector's principal may not use the transactional id {id:?}. Grant it: {}",
            grant(&format!("--operation Write --operation Describe --transactional-id {id}"))
        ),
        (C::TransactionalIdAuthorizationFailed, _) => format!(
            "The connector's principal may not use its transactional id ([delivery] transactional_id, and the \
             same with .state for the Kafka state backend). Grant it: {}",
            grant(
                "--operation Write --operation Describe --transactional-id <id> (or --resource-pattern-type \
                   prefixed with the id's prefix)"
            )
        ),
        (C::TopicAuthorizationFailed, Some(KafkaResource::Topic(topic, operations))) => {
            let operations: String = operations.iter().map(|o| format!("--operation {o} ")).collect();
            format!(
                "The connector's principal may not use the topic {topic:?}. Grant it: {}",
                grant(&format!("{operations}--topic {topic}"))
            )
        }
        (C::TopicAuthorizationFailed, _) => format!(
            "The connector's principal may not use a topic. Grant it: {} (Read to read it, Write to produce \
             to it, Create to create it)",
            grant("--operation Describe --operation <Read|Write|Create> --topic <topic>")
        ),
        (C::ClusterAuthorizationFailed, _) => format!(
            "The connector's principal may not do this on the cluster. Grant it: {} (IdempotentWrite: the \
             idempotent producer on brokers before Kafka 2.8; Create: creating topics without a topic ACL)",
            grant("--operation <IdempotentWrite|Create> --cluster")
        ),
        _ => format!(
            "The connector's principal may not use delegation tokens: grant {PRINCIPAL} Describe on the \
             delegation token (kafka-acls --add --operation Describe --delegation-token <token id>), or \
             authenticate otherwise"
        ),
    };
    let denied = match code {
        C::GroupAuthorizationFailed => Denied::Group,
        C::TransactionalIdAuthorizationFailed => Denied::TransactionalId,
        C::TopicAuthorizationFailed => Denied::Topic,
        C::ClusterAuthorizationFailed => Denied::Cluster,
        _ => Denied::DelegationToken,
    };
    Error::authorization_denied(denied, format!("Kafka: {text}. {fix}"))
}

/// Classifies an `rdkafka` error once, for every caller.
pub fn classify_kafka(err: &rdkafka::error::KafkaError) -> Error {
    classify_kafka_on(err, None)
}

/// [`classify_kafka`] for a caller that knows which resource it was using: an authorization refusal names
/// it in the `kafka-acls` command of its message.
pub fn classify_kafka_on(err: &rdkafka::error::KafkaError, resource: Option<KafkaResource<'_>>) -> Error {
    use rdkafka::error::KafkaError as K;
    use rdkafka::types::RDKafkaErrorCode as C;
    // rust-rdkafka gives no code for an admin operation's error: its code is the variant's.
    let code = match err {
        K::AdminOp(code) => Some(*code),
        _ => err.rdkafka_error_code(),
    };
    if let Some(code) = code.filter(|c| is_authorization_failure(*c)) {
        return denied(code, &err.to_string(), resource);
    }
    let definite_code = |code: C| {
        matches!(
            code,
            C::SaslAuthenticationFailed
                | C::Authentication
                | C::MessageSizeTooLarge
                | C::InvalidTopic
                | C::UnknownTopic
                | C::UnknownTopicOrPartition
                | C::InvalidConfig
                | C::InvalidArgument
                | C::UnsupportedVersion
                | C::ProducerFenced
                | C::InvalidRecord
        )
    };
    let text = err.to_string();
    match err {
        // rust-rdkafka's text repeats the property's value after its key, so a typo such as `sasl.pasword`
        // would print the password: librdkafka's own description names the key (and the value where the
        // value is what is wrong), and a secret-looking key's value is masked in it.
        K::ClientConfig(_, description, key, value) => {
            let description = match crate::secret::is_secret_key(key) && !value.is_empty() {
                true => description.replace(value.as_str(), crate::secret::REDACTED),
                false => description.clone(),
            };
            let description = match description.contains(key.as_str()) {
                true => description,
                false => format!("{key}: {description}"),
            };
            Error::definite(format!(
                "Kafka client configuration: {description}; fix [kafka.properties] (librdkafka's \
                 CONFIGURATION.md lists the properties and their values)"
            ))
        }
        K::ClientCreation(_) => Error::definite(format!("Kafka client configuration: {text}")),
        K::Transaction(_) if err.rdkafka_error_code() == Some(C::InvalidTransactionTimeout) => {
            Error::definite(format!(
                "Kafka: {text}. kafka.properties.\"transaction.timeout.ms\" is above the broker's \
             transaction.max.timeout.ms (15 minutes unless the broker sets it): lower it to at most that, or raise \
             the broker's limit"
            ))
        }
        K::Transaction(_) if is_fenced(err) => fenced_transaction(format_args!("Kafka: {text}")),
        K::Transaction(_)
            if matches!(err.rdkafka_error_code(), Some(C::UnsupportedFeature | C::UnsupportedVersion)) =>
        {
            Error::definite(format!(
                "Kafka: {text}. The broker does not support transactions, which [state] backend = \"kafka\" and \
                 [delivery] guarantee = \"exactly_once\" need (Apache Kafka 0.11 or later, or a compatible broker \
                 with transactions; Tansu 0.6 has none): with this broker use the local backend and at_least_once"
            ))
        }
        _ if err.rdkafka_error_code().is_some_and(is_producer_fatal) => Error::producer_fatal(format!(
            "Kafka: {text}. The idempotent producer cannot continue without risking reordering or duplicates; the \
             run restarts from the checkpoint with a new producer"
        )),
        K::MessageProduction(code) if definite_code(*code) => {
            Error::definite(format!("Kafka rejected a record: {text}"))
        }
        _ => match err.rdkafka_error_code() {
            Some(code) if definite_code(code) => Error::definite(format!("Kafka: {text}")),
            _ => Error::transient(format!("Kafka: {text}")),
        },
    }
}

/// Whether a transactional producer's error says a newer producer with its `transactional.id` started
/// (another instance took over): it can never commit again.
pub fn is_fenced(err: &rdkafka::error::KafkaError) -> bool {
    err.rdkafka_error_code().is_some_and(is_fenced_code)
}

/// The codes of a fenced transactional producer (its own epoch ended by a newer one or by the coordinator).
pub fn is_fenced_code(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(code, C::Fenced | C::ProducerFenced | C::InvalidProducerEpoch)
}

/// The error of a transactional producer that was fenced: a newer instance with its `transactional.id`
/// started (it took over), or the transaction stayed open past `transaction.timeout.ms` and the broker's
/// coordinator aborted it (and bumped the producer's epoch). Transient, and not a producer fault: unlike a
/// broker that keeps refusing a producer's sequence numbers, it says nothing about lost partitions, so it
/// is not counted towards the connector's stop after repeated fatal producer errors.
pub fn fenced_transaction(what: impl fmt::Display) -> Error {
    Error::producer_fenced(format!(
        "{what}: this producer's Kafka transaction was ended by the broker. Either another instance with the same \
         transactional.id started (it took over; this one stops), or the transaction stayed open longer than \
         transaction.timeout.ms and the broker aborted it (a stalled run: look for a broker or network pause). \
         Nothing of it is visible; the run restarts from the last committed checkpoint with a new producer"
    ))
}

/// Errors with which the idempotent producer gives up: a fatal error, or a delivery failed because the
/// broker's sequence state for this producer no longer matches (`OUT_OF_ORDER_SEQUENCE_NUMBER` at the head
/// of the line, `UNKNOWN_PRODUCER_ID` with records outstanding, a fenced epoch). librdkafka raises these as
/// fatal: the producer refuses every later record, and only a new producer can go on.
pub fn is_producer_fatal(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(code, C::Fatal | C::OutOfOrderSequenceNumber | C::UnknownProducerId | C::InvalidProducerEpoch)
}

/// Broker refusals of one record that retrying cannot cure: the record is poison, not the pipeline.
///
/// Size refusals (`MSG_SIZE_TOO_LARGE`, `RECORD_LIST_TOO_LARGE`) are about a whole batch and are not in this
/// list: the sink blames a record for one only when that record alone is over the limit
/// ([`crate::sink::kafka`]).
pub fn is_record_refusal(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(code, C::InvalidRecord | C::PolicyViolation | C::InvalidMessage)
}

/// A size refusal by the broker: the batch that held the record was over the topic's `max.message.bytes`
/// (or the log's segment size).
pub fn is_size_refusal(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(code, C::MessageSizeTooLarge | C::MessageBatchTooLarge)
}

impl From<redb::Error> for Error {
    fn from(err: redb::Error) -> Self {
        Error::definite(format!("checkpoint store: {err}"))
    }
}

impl From<Poison> for Error {
    fn from(poison: Poison) -> Self {
        Error::poison(poison.kind, poison.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_async::{DriverError, IoError, ServerError};
    use rustls::CertificateError as C;

    fn server(code: u16, message: &str) -> mysql_async::Error {
        mysql_async::Error::Server(ServerError { code, message: message.into(), state: "28000".into() })
    }

    fn handshake(error: rustls::Error) -> mysql_async::Error {
        mysql_async::Error::Io(IoError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, error)))
    }

    /// Guards against two connectors (or a connector and a replica) with one server_id dropping each other
    /// forever as transient errors, and against MySQL's form of it being read as a purged binlog.
    #[test]
    fn a_duplicate_server_id_is_definite_and_names_the_setting() {
        let same = "A slave with the same server_uuid/server_id as this slave has connected to the master";
        for error in [server(4052, same), server(1236, &format!("{same}; the first event 'binlog.000001' at 4"))] {
            let classified = classify_mysql(&error);
            assert!(classified.is_definite(), "{classified}");
            assert!(classified.to_string().contains("its own server_id"), "{classified}");
            assert!(!classified.to_string().contains("re-snapshot"), "{classified}");
        }
        let purged = classify_mysql(&server(1236, "Could not find first log file name in binary log index file"));
        assert!(purged.to_string().contains("re-snapshot"), "{purged}");
    }

    /// How each way a database connection can be refused over TLS is classified, and what the message sends
    /// the operator to. Guards against certificate refusals being retried forever as if the network were down.
    #[test]
    fn tls_and_secure_transport_refusals() {
        let cases: Vec<(&str, mysql_async::Error, Class, &str)> = vec![
            (
                "wrong CA",
                handshake(rustls::Error::InvalidCertificate(C::UnknownIssuer)),
                Class::Definite,
                "source.tls_ca_file",
            ),
            ("name", handshake(rustls::Error::InvalidCertificate(C::NotValidForName)), Class::Definite, "source.host"),
            ("expired", handshake(rustls::Error::InvalidCertificate(C::Expired)), Class::Definite, "Renew"),
            ("revoked", handshake(rustls::Error::InvalidCertificate(C::Revoked)), Class::Definite, "certificate"),
            ("no certificate", handshake(rustls::Error::NoCertificatesPresented), Class::Definite, "certificate"),
            (
                "corrupted record",
                handshake(rustls::Error::DecryptError),
                Class::Transient,
                "connection to the database",
            ),
            (
                "plain I/O",
                mysql_async::Error::Io(IoError::Io(std::io::ErrorKind::ConnectionReset.into())),
                Class::Transient,
                "connection to the database",
            ),
            (
                "bad CA file",
                mysql_async::Error::Io(IoError::Tls(mysql_async::TlsError::Tls(rustls::Error::General("x".into())))),
                Class::Definite,
                "source.tls_ca_file",
            ),
            (
                "server without TLS",
                mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer),
                Class::Definite,
                "source.tls = \"disabled\"",
            ),
            (
                "MySQL needs TLS",
                server(mysql_codes::SECURE_TRANSPORT_REQUIRED, "insecure"),
                Class::Definite,
                "source.tls",
            ),
            (
                "MariaDB needs TLS",
                server(mysql_codes::ACCESS_DENIED, "Access denied"),
                Class::Definite,
                "require_secure_transport",
            ),
        ];
        for (name, error, class, says) in cases {
            let classified = classify_mysql(&error);
            assert_eq!(classified.class(), class, "{name}: {classified}");
            assert!(classified.to_string().contains(says), "{name} must say {says:?}: {classified}");
        }
    }

    /// Guards against an authorization refusal being retried for ever as if the broker were down (issue 46):
    /// each is definite, and says which ACL grants what was refused, on the resource when the caller named it.
    #[test]
    fn kafka_authorization_refusals_are_definite_and_name_the_acl() {
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode as C;
        let read = ["Read", "Describe"];
        let cases: Vec<(KafkaError, Option<KafkaResource<'_>>, &str)> = vec![
            (KafkaError::MessageConsumption(C::GroupAuthorizationFailed), None, "--group <the group>"),
            (
                KafkaError::MessageConsumption(C::GroupAuthorizationFailed),
                Some(KafkaResource::Group("g")),
                "--operation Read --operation Describe --group g",
            ),
            (
                KafkaError::MessageConsumption(C::TransactionalIdAuthorizationFailed),
                Some(KafkaResource::TransactionalId("t.state")),
                "--operation Write --operation Describe --transactional-id t.state",
            ),
            (KafkaError::MessageConsumption(C::TransactionalIdAuthorizationFailed), None, "--transactional-id <id>"),
            (
                KafkaError::MetadataFetch(C::TopicAuthorizationFailed),
                Some(KafkaResource::Topic("s", &read)),
                "--operation Read --operation Describe --topic s",
            ),
            (KafkaError::MessageProduction(C::TopicAuthorizationFailed), None, "--topic <topic>"),
            (KafkaError::AdminOp(C::ClusterAuthorizationFailed), None, "--cluster"),
            (KafkaError::AdminOp(C::DelegationTokenAuthorizationFailed), None, "delegation token"),
        ];
        for (error, resource, says) in cases {
            let classified = classify_kafka_on(&error, resource);
            assert!(classified.is_definite(), "{error:?}: {classified}");
            assert!(classified.to_string().contains(says), "{error:?} must say {says:?}: {classified}");
            assert!(classified.to_string().contains("User:<the connector's principal>"), "{classified}");
        }
    }

    /// Guards against a decision taken on a message's words (issue 46): each way the broker refuses an ACL
    /// is classified as [`Kind::AuthorizationDenied`] naming the kind of resource (whatever the caller
    /// named), the fatal producer codes as [`Kind::ProducerFatal`]; the rest is [`Kind::Other`] with its
    /// class.
    #[test]
    fn kafka_errors_classify_to_their_kind() {
        use rdkafka::error::KafkaError as K;
        use rdkafka::types::RDKafkaErrorCode as C;
        let denied = |d| (Class::Definite, Kind::AuthorizationDenied(d));
        let cases: Vec<(K, Option<KafkaResource<'_>>, (Class, Kind))> = vec![
            (K::MessageConsumption(C::TransactionalIdAuthorizationFailed), None, denied(Denied::TransactionalId)),
            (
                K::MessageConsumption(C::TransactionalIdAuthorizationFailed),
                Some(KafkaResource::Group("g")),
                denied(Denied::TransactionalId),
            ),
            (K::MessageConsumption(C::GroupAuthorizationFailed), None, denied(Denied::Group)),
            (K::MetadataFetch(C::TopicAuthorizationFailed), None, denied(Denied::Topic)),
            (K::AdminOp(C::ClusterAuthorizationFailed), None, denied(Denied::Cluster)),
            (K::AdminOp(C::DelegationTokenAuthorizationFailed), None, denied(Denied::DelegationToken)),
            (K::MessageProduction(C::OutOfOrderSequenceNumber), None, (Class::Transient, Kind::ProducerFatal)),
            (K::MessageProduction(C::Fatal), None, (Class::Transient, Kind::ProducerFatal)),
            (K::MessageProduction(C::UnknownProducerId), None, (Class::Transient, Kind::ProducerFatal)),
            (K::MessageProduction(C::MessageSizeTooLarge), None, (Class::Definite, Kind::Other)),
            (K::MessageConsumption(C::AllBrokersDown), None, (Class::Transient, Kind::Other)),
        ];
        for (error, resource, (class, kind)) in cases {
            let classified = classify_kafka_on(&error, resource);
            assert_eq!((classified.class(), classified.kind()), (class, &kind), "{error:?}: {classified}");
        }
    }

    /// A transactional producer's commit that the broker answers PRODUCER_FENCED (a newer producer with its
    /// `transactional.id` took over) is [`Kind::ProducerFenced`]: transient and not a producer fault. The
    /// error is librdkafka's own, from a commit on the mock cluster (rust-rdkafka cannot build one).
    #[test]
    fn a_fenced_commit_classifies_as_producer_fenced() {
        use rdkafka::config::ClientConfig;
        use rdkafka::mocking::MockCluster;
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        use std::time::Duration;
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("transactional.id", "fenced")
            .create()
            .unwrap();
        producer.init_transactions(Duration::from_secs(30)).unwrap();
        producer.begin_transaction().unwrap();
        producer.send(BaseRecord::<str, str>::to("t").key("k").payload("v")).map_err(|(e, _)| e).unwrap();
        cluster.request_errors(RDKafkaApiKey::EndTxn, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED]);
        let error = producer.commit_transaction(Duration::from_secs(30)).expect_err("fenced");
        assert!(is_fenced(&error), "{error:?}");
        let classified = classify_kafka(&error);
        assert_eq!((classified.class(), classified.kind()), (Class::Transient, &Kind::ProducerFenced), "{classified}");
    }

    /// Each constructor gives its kind its class (the class rules of the module doc), and neither
    /// [`Error::context`] nor redaction loses the kind.
    #[test]
    fn constructors_set_kind_and_class_and_context_keeps_them() {
        let refused = || Kind::RecordRefused(Box::new(KnownPoison { id: "e-1".into(), message: "bad".into() }));
        let cases = [
            (Error::transient("t"), Class::Transient, Kind::Other),
            (Error::definite("d"), Class::Definite, Kind::Other),
            (Error::lease_lost("l"), Class::Transient, Kind::LeaseLost),
            (Error::lease_elsewhere("e"), Class::Transient, Kind::LeaseElsewhere),
            (Error::producer_fenced("f"), Class::Transient, Kind::ProducerFenced),
            (fenced_transaction("delivery"), Class::Transient, Kind::ProducerFenced),
            (Error::producer_fatal("p"), Class::Transient, Kind::ProducerFatal),
            (Error::commit_unknown("u"), Class::Transient, Kind::CommitUnknown),
            (
                Error::authorization_denied(Denied::Group, "a"),
                Class::Definite,
                Kind::AuthorizationDenied(Denied::Group),
            ),
            (Error::records_deleted("r"), Class::Definite, Kind::RecordsDeleted),
            (Error::refused_record("e-1".into(), "bad".into()), Class::Transient, refused()),
            (
                Error::from(Poison::new(PoisonKind::SchemaMissing, "no subject")),
                Class::Definite,
                Kind::Poison(PoisonKind::SchemaMissing),
            ),
        ];
        for (error, class, kind) in cases {
            let error = error.context("password=hunter2");
            assert_eq!((error.class(), error.kind()), (class, &kind), "{error}");
            assert!(!error.to_string().contains("hunter2"), "{error}");
        }
        let refused = Error::refused_record("e-1".into(), "bad".into()).context("publishing");
        let Kind::RecordRefused(record) = refused.kind() else { panic!("{refused}") };
        assert_eq!((record.id.as_str(), record.message.as_str()), ("e-1", "bad"));
    }

    /// MySQL errors are classified by class only: nothing acts on a kind of theirs.
    #[test]
    fn mysql_errors_have_no_kind() {
        for error in [server(mysql_codes::FATAL_READING_BINLOG, "purged"), server(2013, "lost connection")] {
            assert_eq!(classify_mysql(&error).kind(), &Kind::Other);
        }
    }
}
