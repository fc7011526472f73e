# Builds the outbox-cdc binary and ships it in a slim Debian image.
FROM rust:1-bookworm AS build
# librdkafka's build: OpenSSL (TLS, SASL PLAIN/SCRAM/OAUTHBEARER), libcurl (OAUTHBEARER OIDC), Cyrus SASL
# (GSSAPI/Kerberos).
RUN apt-get update && apt-get install -y --no-install-recommends cmake pkg-config libssl-dev \
        libcurl4-openssl-dev libsasl2-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY examples ./examples
COPY inbox ./inbox
COPY connector.toml ./
# .dockerignore keeps .git out: outbox_cdc_build_info's commit comes from
# `docker build --build-arg OUTBOX_CDC_COMMIT=$(git rev-parse --short=12 HEAD) .`, else "unknown".
ARG OUTBOX_CDC_COMMIT=unknown
# The release profile keeps line tables for profiling (~90 MB binary); the image needs only the symbols,
# so a panic's backtrace still names functions (~18 MB), as in scripts/release's tarball.
RUN cargo build --release --locked --bin outbox-cdc && strip --strip-debug target/release/outbox-cdc

FROM debian:bookworm-slim
# The libraries the binary links (libcurl for OAUTHBEARER OIDC, libsasl2 for GSSAPI), Cyrus SASL's GSSAPI
# plugin and kinit (librdkafka renews a Kerberos ticket from the keytab with `kinit`).
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates libssl3 libcurl4 libsasl2-2 libsasl2-modules-gssapi-mit krb5-user \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home /var/lib/outbox-cdc outbox-cdc \
    && mkdir -p /var/lib/outbox-cdc/state && chown -R outbox-cdc /var/lib/outbox-cdc
COPY --from=build /src/target/release/outbox-cdc /usr/local/bin/outbox-cdc
USER outbox-cdc
WORKDIR /var/lib/outbox-cdc
VOLUME ["/var/lib/outbox-cdc/state"]
ENTRYPOINT ["outbox-cdc"]
CMD ["run", "--config", "/etc/outbox-cdc/connector.toml"]
