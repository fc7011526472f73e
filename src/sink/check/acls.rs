//! The Kafka ACLs each command needs, as one table: `check` names its fixes from it, and
//! `tests/acl_table.rs` holds the README's "Kafka ACLs" table to it, and it to the refusals the code makes.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! No consumer group is in it: the readers assign partitions and read from explicit offsets, and ignore
//! the refusal of the group lookup librdkafka makes ([`crate::kafka::read`]).

use crate::config::{Config, StateBackend};

/// The principal in the `kafka-acls` commands, as `crate::error` writes it: the client does not always know
/// its own (mTLS, OAuth).
const PRINCIPAL: &str = "User:<the connector's principal>";

/// A Kafka resource a command uses, as the README names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    /// The topics the outbox rows route to (`kafka.topic`).
    RoutedTopics,
    /// `kafka.dead_letter_topic`.
    DeadLetterTopic,
    /// `state.topic`, with `[state] backend = "kafka"`.
    StateTopic,
    /// `replay`'s topics: `<routed topic><suffix>`, or `--topic`.
    ReplayTopics,
    /// The topics `audit` reads.
    AuditedTopics,
    /// The event producer's transactional id (`exactly_once`, `poll.transactional`): [`Config::transactional_id`].
    TransactionalId,
    /// The state writer's transactional id ([`state_writer_id`]).
    StateWriterId,
    /// The cluster.
    Cluster,
}

impl Resource {
    /// How the README's table names it.
    pub fn readme_name(self) -> &'static str {
        match self {
            Resource::RoutedTopics => "each routed topic",
            Resource::DeadLetterTopic => "the dead-letter topic",
            Resource::StateTopic => "the state topic",
            Resource::ReplayTopics => "the replay topics",
            Resource::AuditedTopics => "the topics it reads",
            Resource::TransactionalId => "`<transactional_id>`",
            Resource::StateWriterId => "`<transactional_id>.state`",
            Resource::Cluster => "the cluster",
        }
    }
}

/// A command, as the README's table names it (its first column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Command {
    /// `run`: the binlog pipeline or the polling relay.
    Run,
    /// `check`.
    Check,
    /// `status`, `quarantine list` and `prune`: they read the state.
    ReadState,
    /// `state copy --to local`.
    StateCopyToLocal,
    /// `state copy --to kafka`.
    StateCopyToKafka,
    /// `quarantine release`.
    QuarantineRelease,
    /// `replay`.
    Replay,
    /// `audit`.
    Audit,
}

impl Command {
    /// Every command.
    pub const ALL: [Command; 8] = [
        Command::Run,
        Command::Check,
        Command::ReadState,
        Command::StateCopyToLocal,
        Command::StateCopyToKafka,
        Command::QuarantineRelease,
        Command::Replay,
        Command::Audit,
    ];

    /// The README's first column.
    pub fn readme_name(self) -> &'static str {
        match self {
            Command::Run => "`run`",
            Command::Check => "`check`",
            Command::ReadState => "`status`, `quarantine list`, `prune`",
            Command::StateCopyToLocal => "`state copy --to local`",
            Command::StateCopyToKafka => "`state copy --to kafka`",
            Command::QuarantineRelease => "`quarantine release`",
            Command::Replay => "`replay`",
            Command::Audit => "`audit`",
        }
    }
}

/// Operations on one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub resource: Resource,
    /// As `kafka-acls --operation` spells them.
    pub operations: &'static [&'static str],
}

/// Reading a topic: the readers of [`crate::kafka::read`] (Fetch, ListOffsets, Metadata).
const READ: &[&str] = &["Read", "Describe"];
/// Producing to a topic.
const WRITE: &[&str] = &["Write", "Describe"];
/// A transactional id: InitProducerId and the transaction's requests need Write, FindCoordinator Describe.
const TRANSACT: &[&str] = &["Write", "Describe"];
/// Creating a topic that is missing (`kafka.create_topics`), on the topic or on the cluster.
const CREATE: &[&str] = &["Create"];
/// The state topic as the Kafka backend uses it: read at start, written, its `cleanup.policy` verified.
const STATE: &[&str] = &["Read", "Write", "Describe", "DescribeConfigs"];
/// `check` reads each topic's `max.message.bytes` and the state topic's policy (a refusal is a warning).
const DESCRIBE_CONFIGS: &[&str] = &["DescribeConfigs"];
/// The idempotent producer's id on brokers before Kafka 2.8 (later ones take Write on any topic).
const IDEMPOTENT: &[&str] = &["IdempotentWrite"];

/// The state writer's transactional id: `<transactional_id>.state` (`crate::checkpoint::kafka` names it the
/// same; `tests/acl_table.rs` holds the two together).
pub fn state_writer_id(config: &Config) -> String {
    format!("{}.state", config.transactional_id())
}

/// What `command` needs under `config`. Create rows come only with `kafka.create_topics` (the topic may
/// also exist already: then it is not needed).
pub fn needs(command: Command, config: &Config) -> Vec<Acl> {
    let acl = |resource, operations| Acl { resource, operations };
    let kafka_state = config.state.backend == StateBackend::Kafka;
    let transactional = config.exactly_once() || config.poll.transactional;
    let create = config.kafka.create_topics;
    let mut needs = Vec::new();
    // The Kafka backend opened to write (`run`, `state copy --to kafka`, `quarantine release`): it fences
    // the event producer's id too with exactly_once (checkpoint::kafka, `KafkaStore::open`).
    let state_writer = |needs: &mut Vec<Acl>| {
        needs.push(acl(Resource::StateTopic, STATE));
        if create {
            needs.push(acl(Resource::StateTopic, CREATE));
        }
        needs.push(acl(Resource::StateWriterId, TRANSACT));
        if config.exactly_once() {
            needs.push(acl(Resource::TransactionalId, TRANSACT));
        }
    };
    match command {
        Command::Run => {
            needs.push(acl(Resource::RoutedTopics, WRITE));
            needs.push(acl(Resource::DeadLetterTopic, WRITE));
            if create {
                needs.push(acl(Resource::RoutedTopics, CREATE));
                needs.push(acl(Resource::DeadLetterTopic, CREATE));
            }
            needs.push(acl(Resource::Cluster, IDEMPOTENT));
            if kafka_state {
                state_writer(&mut needs);
            }
            if transactional && !needs.iter().any(|a| a.resource == Resource::TransactionalId) {
                needs.push(acl(Resource::TransactionalId, TRANSACT));
            }
        }
        Command::Check => {
            needs.push(acl(Resource::RoutedTopics, &["Describe", "DescribeConfigs"]));
            needs.push(acl(Resource::DeadLetterTopic, &["Describe", "DescribeConfigs"]));
            if create {
                needs.push(acl(Resource::RoutedTopics, CREATE));
                needs.push(acl(Resource::DeadLetterTopic, CREATE));
            }
            needs.push(acl(Resource::Cluster, IDEMPOTENT));
            if kafka_state {
                needs.push(acl(Resource::StateTopic, READ));
                needs.push(acl(Resource::StateTopic, DESCRIBE_CONFIGS));
                needs.push(acl(Resource::StateWriterId, TRANSACT));
            }
            if transactional {
                needs.push(acl(Resource::TransactionalId, TRANSACT));
            }
        }
        Command::ReadState | Command::StateCopyToLocal if kafka_state => needs.push(acl(Resource::StateTopic, READ)),
        Command::ReadState | Command::StateCopyToLocal => {}
        Command::StateCopyToKafka => state_writer(&mut needs),
        Command::QuarantineRelease => {
            needs.push(acl(Resource::DeadLetterTopic, READ));
            needs.push(acl(Resource::RoutedTopics, WRITE));
            if create {
                needs.push(acl(Resource::RoutedTopics, CREATE));
            }
            needs.push(acl(Resource::Cluster, IDEMPOTENT));
            if kafka_state {
                state_writer(&mut needs);
            }
        }
        Command::Replay => {
            needs.push(acl(Resource::ReplayTopics, WRITE));
            if create {
                needs.push(acl(Resource::ReplayTopics, CREATE));
            }
            needs.push(acl(Resource::Cluster, IDEMPOTENT));
        }
        Command::Audit => needs.push(acl(Resource::AuditedTopics, READ)),
    }
    needs
}

/// The `kafka-acls` command that grants `operations` on `what` (`--topic t`, `--transactional-id t
/// --resource-pattern-type prefixed`), written as `crate::error` writes its own.
pub fn grant(operations: &[&str], what: &str) -> String {
    let operations: String = operations.iter().map(|o| format!("--operation {o} ")).collect();
    format!("kafka-acls --bootstrap-server <kafka.bootstrap_servers> --add --allow-principal {PRINCIPAL} {operations}{what}")
}

/// The operations `command` needs on `resource` under `config` (empty: none).
pub fn operations_on(command: Command, config: &Config, resource: Resource) -> Vec<&'static str> {
    let mut operations: Vec<&'static str> = Vec::new();
    for acl in needs(command, config).into_iter().filter(|a| a.resource == resource) {
        for op in acl.operations {
            if !operations.contains(op) {
                operations.push(op);
            }
        }
    }
    operations
}
