#!/usr/bin/env bash
# Provision a fresh Debian 12 machine (as root) for the tests: scripts/test and .ci/run. (scripts/demo installs
# only what the demo needs, through the same scripts/apt-install.sh.)
#
# Idempotent: installs only what is missing, runs `apt-get update` only when a package to install
# has no candidate, builds the Tansu broker only when `tansu` 0.6.0 is not already installed, and
# pip-installs noida-db only when 0.2.3 is not already installed.
#
# What the tests need:
#   - mariadb-server / mariadb-client: the binaries only (mariadb-install-db, mariadbd, mariadb,
#     mariadb-binlog). Tests start private servers on free ports in temp dirs; the package's own
#     system service is not used (if the package started one on 3306, it is left alone).
#   - pkg-config, libssl-dev, make, gcc, g++: librdkafka's bundled C build (rdkafka crate, features
#     ssl + zstd + curl + gssapi); libcurl4-openssl-dev for OAUTHBEARER OIDC (curl), libsasl2-dev for
#     GSSAPI/Kerberos (Cyrus SASL). sink::kafka's unit test asserts librdkafka's built-in features.
#   - openssl: the CLI makes the CA and server certificates of tests/tls.rs.
#   - docker-compose: the demo's docker-compose.yml (official Apache Kafka image) for users; and
#     scripts/check-deploy validates that file with `docker-compose config` (no engine needed).
#   - systemd: `systemd-analyze verify` of deploy/systemd/outbox-cdc.service (scripts/check-deploy).
#   - python3-pip: pip for the two Python packages below, when python3 is Debian's.
#   - kubernetes-validate (pip, pinned): the Kubernetes schemas deploy/kubernetes/ is checked against.
#   - tansu 0.6.0 with the dynostore (memory) and libsql (SQLite) storage engines: the Kafka-protocol
#     broker of the integration tests.
#   - confluent-kafka 2.16.1 with its Avro, Protobuf, JSON Schema and schema-registry extras (pip, each
#     package pinned): tests/schema_registry.rs decodes every record the connector framed with its
#     deserializers and their own registry client, an implementation independent of the connector's.
#   - grpcio-tools 1.85.4 (pip, pinned, with its grpcio and confluent-kafka's protobuf pin): Google's protoc
#     in a Python package (`python3 -m grpc_tools.protoc`). tests/protobuf_corpus.rs compiles every corpus
#     schema from its text with it, not with the connector's own compiler (protox), and decodes the
#     connector's messages with Python's protobuf runtime from those descriptors.
#   - botocore 1.43.11 (pip, pinned, with jmespath and python-dateutil): the AWS SDK for Python, whose
#     `generate_db_auth_token` tests/identity.rs compares the connector's RDS IAM auth tokens with, and
#     which tests/msk_front.py checks MSK IAM tokens with (recomputing each signature).
#   - aws-msk-iam-sasl-signer-python 1.0.2 (pip, pinned, with boto3 1.43.11, s3transfer and click): AWS's
#     MSK IAM signer, whose tokens tests/msk_iam.rs compares the connector's with.
#   - noida-db 0.2.3 (pip, pinned; a prebuilt binary in a Python package): its Kafka service is the
#     broker of the exactly-once tests, the only one here with working transactions. Not durable across
#     its own restart, so never used where the broker restarts. tests/noida_smoke.rs pins its behaviour.
set -euo pipefail

TANSU_VERSION=0.6.0
KUBERNETES_VALIDATE_VERSION=1.37.0
NOIDA_DB_VERSION=0.2.3
CONFLUENT_KAFKA_VERSION=2.16.1
GRPCIO_TOOLS_VERSION=1.85.4
BOTOCORE_VERSION=1.43.11
MSK_SIGNER_VERSION=1.0.2
# The extras' packages, pinned so that a provisioned machine decodes with the code the tests were run with.
CONFLUENT_KAFKA_EXTRAS=(fastavro==1.13.1 avro==1.12.2 protobuf==7.36.2 googleapis-common-protos==1.76.0
    jsonschema==4.26.0 referencing==0.37.0 requests==2.34.2 attrs==26.1.0 cachetools==8.0.2 authlib==1.9.10
    httpx2==2.16.2 httpcore2==2.16.2 certifi==2026.10.19.post1)
PACKAGES=(mariadb-server mariadb-client pkg-config libssl-dev libcurl4-openssl-dev libsasl2-dev openssl make gcc g++
    docker-compose systemd python3-pip)

log() { printf 'provision: %s\n' "$*"; }
die() { printf 'provision: ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (apt-get install needs it)"

# --- Debian packages ---------------------------------------------------------------------------
bash "$(dirname "$0")/apt-install.sh" provision "${PACKAGES[@]}"

# mariadbd lives in /usr/sbin, which may not be on a non-login PATH; the test harness looks there too.
for bin in mariadb-install-db mariadb mariadb-binlog; do
    command -v "$bin" >/dev/null || die "$bin not found after installing mariadb-server/mariadb-client"
done
[[ -x /usr/sbin/mariadbd ]] || command -v mariadbd >/dev/null || die "mariadbd not found"
log "MariaDB: $(/usr/sbin/mariadbd --version 2>/dev/null || mariadbd --version)"

# --- kubernetes-validate (Python) -------------------------------------------------------------
command -v python3 >/dev/null || die "python3 not found (scripts/check-deploy and kubernetes-validate need it)"
# pip install into python3. Debian's own python3 is "externally managed" (PEP 668) and refuses a plain
# pip install; these are test tools on a test machine, so install into it anyway (a pyenv or venv
# python3 takes the plain path).
pip_install() {
    local opts=(--quiet --disable-pip-version-check --root-user-action=ignore)
    if python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
        log "$(command -v python3) is externally managed (PEP 668): pip install --break-system-packages"
        opts+=(--break-system-packages)
    fi
    python3 -m pip install "${opts[@]}" "$@"
}
if python3 -c 'import kubernetes_validate.version as v, sys; sys.exit(v.__version__ != sys.argv[1])' \
    "$KUBERNETES_VALIDATE_VERSION" 2>/dev/null; then
    log "kubernetes-validate $KUBERNETES_VALIDATE_VERSION already installed"
else
    log "pip install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    pip_install "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi

# --- confluent-kafka (Python) with its schema-registry deserializers -----------------------------
if python3 -c 'import importlib.metadata as m, sys
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
sys.exit(m.version("confluent-kafka") != sys.argv[1])' "$CONFLUENT_KAFKA_VERSION" 2>/dev/null; then
    log "confluent-kafka $CONFLUENT_KAFKA_VERSION (with its deserializers) already installed"
else
    log "pip install confluent-kafka[avro,protobuf,json,schemaregistry]==$CONFLUENT_KAFKA_VERSION"
    pip_install "confluent-kafka[avro,protobuf,json,schemaregistry]==$CONFLUENT_KAFKA_VERSION" \
        "${CONFLUENT_KAFKA_EXTRAS[@]}"
fi

# --- grpcio-tools (Python): protoc for the Protobuf corpus --------------------------------------
if python3 -c 'import importlib.metadata as m, sys
import grpc_tools.protoc
sys.exit(m.version("grpcio-tools") != sys.argv[1])' "$GRPCIO_TOOLS_VERSION" 2>/dev/null; then
    log "grpcio-tools $GRPCIO_TOOLS_VERSION already installed"
else
    log "pip install grpcio-tools==$GRPCIO_TOOLS_VERSION (protoc for tests/protobuf_corpus.rs)"
    # The protobuf runtime stays at the version confluent-kafka's extras pin.
    pip_install "grpcio-tools==$GRPCIO_TOOLS_VERSION" "grpcio==$GRPCIO_TOOLS_VERSION" \
        "$(printf '%s\n' "${CONFLUENT_KAFKA_EXTRAS[@]}" | grep '^protobuf==')"
fi

# --- botocore (Python): the independent RDS IAM auth token ---------------------------------------
if python3 -c 'import importlib.metadata as m, sys
import botocore.session
sys.exit(m.version("botocore") != sys.argv[1])' "$BOTOCORE_VERSION" 2>/dev/null; then
    log "botocore $BOTOCORE_VERSION already installed"
else
    log "pip install botocore==$BOTOCORE_VERSION (tests/identity.rs)"
    pip_install "botocore==$BOTOCORE_VERSION" jmespath==1.1.0 python-dateutil==2.9.0.post0
fi

# --- AWS's MSK IAM signer (Python): the independent MSK token ------------------------------------
if python3 -c 'import importlib.metadata as m, sys
import aws_msk_iam_sasl_signer
sys.exit(m.version("aws-msk-iam-sasl-signer-python") != sys.argv[1])' "$MSK_SIGNER_VERSION" 2>/dev/null; then
    log "aws-msk-iam-sasl-signer-python $MSK_SIGNER_VERSION already installed"
else
    log "pip install aws-msk-iam-sasl-signer-python==$MSK_SIGNER_VERSION (tests/msk_iam.rs)"
    pip_install "aws-msk-iam-sasl-signer-python==$MSK_SIGNER_VERSION" "botocore==$BOTOCORE_VERSION" \
        boto3==1.43.11 s3transfer==0.17.1 click==8.5.1 jmespath==1.1.0 python-dateutil==2.9.0.post0
fi

# --- noida-db (Python package with a prebuilt broker binary) ------------------------------------
# The installed distribution's version (the module's own __version__ is stale: 0.1.0 in 0.2.3).
noida_db_version() {
    python3 -c 'import importlib.metadata as m; print(m.version("noida-db"))' 2>/dev/null || true
}
# The packaged binary, which the tests run directly (pip's `noida-db` script is a Python wrapper).
noida_db_bin() {
    python3 -c "from importlib.resources import files; print(files('noida_db').joinpath('noida-db'))" 2>/dev/null || true
}
if [[ $(noida_db_version) == "$NOIDA_DB_VERSION" ]]; then
    log "noida-db $NOIDA_DB_VERSION already installed"
else
    installed=$(noida_db_version)
    if [[ -n $installed ]]; then
        log "found noida-db $installed, want $NOIDA_DB_VERSION"
    fi
    log "pip install noida-db==$NOIDA_DB_VERSION (the transactional Kafka broker of the exactly-once tests)"
    pip_install "noida-db==$NOIDA_DB_VERSION"
fi
noida_bin=$(noida_db_bin)
[[ -n $noida_bin && -f $noida_bin ]] || die "noida-db $NOIDA_DB_VERSION installed but its binary was not found"
# pip's wrapper makes it executable on every run; the tests run it directly.
[[ -x $noida_bin ]] || chmod 0755 "$noida_bin"
# Built against a newer glibc than Debian 12's: it warns on stderr and runs; check that it runs.
[[ $("$noida_bin" version 2>/dev/null) == "noida-db $NOIDA_DB_VERSION" ]] ||
    die "$noida_bin version does not print 'noida-db $NOIDA_DB_VERSION'"
log "noida-db $NOIDA_DB_VERSION: $noida_bin"

# --- Rust toolchain ----------------------------------------------------------------------------
if ! command -v cargo >/dev/null; then
    if [[ -x ${CARGO_HOME:-$HOME/.cargo}/bin/cargo ]]; then
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    else
        die "cargo not found: install a Rust toolchain (https://rustup.rs) and re-run"
    fi
fi
CARGO_BIN="${CARGO_HOME:-$HOME/.cargo}/bin"
# scripts/test gates on rustfmt and clippy: a toolchain installed without them gets them from rustup.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || die "cargo fmt and cargo clippy are needed: install the rustfmt and clippy components"
    rustup component add rustfmt clippy
fi

# --- Tansu broker ------------------------------------------------------------------------------
tansu_version() { # prints the version of the tansu binary given as $1, or nothing
    "$1" --version 2>/dev/null | awk '{ print $NF }' | sed 's/^v//' || true
}

tansu_bin=$(command -v tansu || true)
if [[ -z $tansu_bin && -x $CARGO_BIN/tansu ]]; then
    tansu_bin=$CARGO_BIN/tansu
fi
if [[ -n $tansu_bin && $(tansu_version "$tansu_bin") == "$TANSU_VERSION" ]]; then
    log "tansu $TANSU_VERSION already installed: $tansu_bin"
else
    if [[ -n $tansu_bin ]]; then
        log "found $tansu_bin at version '$(tansu_version "$tansu_bin")', want $TANSU_VERSION"
    fi
    log "building tansu $TANSU_VERSION with cargo install (features dynostore,libsql)"
    log "this takes 15-30 min on a fresh 2-core machine; later runs are a no-op"
    # No `postgres` feature: with it, the build fails on a newer deadpool-postgres.
    cargo install tansu --version "$TANSU_VERSION" --locked --features dynostore,libsql
    tansu_bin=$CARGO_BIN/tansu
    [[ $(tansu_version "$tansu_bin") == "$TANSU_VERSION" ]] ||
        die "tansu built but '$tansu_bin --version' does not report $TANSU_VERSION"
    log "tansu $TANSU_VERSION installed: $tansu_bin"
fi
case ":$PATH:" in
    *":$(dirname "$tansu_bin"):"*) ;;
    *) log "note: $(dirname "$tansu_bin") is not on PATH; the tests find tansu there anyway (or set TANSU=$tansu_bin)" ;;
esac

log "done"
