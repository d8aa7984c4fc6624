# ---- builder ---------------------------------------------------------------
# Cargo.lock pins crates that need rustc >= 1.89 (uuid 1.29 via tower-http's
# request-id, icu_* via url, home via sqlx-postgres), so a 1.85 toolchain fails
# with --locked. Use the current stable image, or pin RUST_VERSION >= 1.89.
ARG RUST_VERSION=1
FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /build

# Compile-time query checks read the committed .sqlx/ data, never a database.
ENV SQLX_OFFLINE=true \
    CARGO_TERM_COLOR=never

# 1. Dependencies only, against a dummy crate, so this layer is reused until
#    a manifest, Cargo.lock or .cargo/config.toml change. .cargo/ comes first
#    so any flags in it apply to the cached dependency build too. The root
#    manifest is a workspace with the benchmark (bench/) and the worker
#    client (client/) as members: cargo loads every member's manifest, so
#    their Cargo.toml and placeholder targets come along; only the service
#    is ever built here (it links none of the client: the shell worker's
#    command is the client's own binary, `quota-arbiter-client`).
COPY Cargo.toml Cargo.lock ./
COPY bench/Cargo.toml bench/
COPY client/Cargo.toml client/
COPY .cargo/ .cargo/
RUN mkdir -p src bench/src client/src \
 && echo 'fn main() {}' > src/main.rs \
 && mkdir -p client/src/bin \
 && touch src/lib.rs client/src/lib.rs \
 && echo 'fn main() {}' > client/src/bin/quota-arbiter-client.rs \
 && echo 'fn main() {}' > bench/src/main.rs \
 && cargo build --release --locked -p quota-arbiter --bin quota-arbiter \
 && rm -rf src

# 2. The real crate. Migrations (sqlx::migrate!), sql/*.sql (query_file!,
#    include_str!) and .sqlx/ are all read at compile time.
COPY build.rs ./
COPY src/ src/
COPY sql/ sql/
COPY migrations/ migrations/
COPY .sqlx/ .sqlx/
# COPY keeps the context's mtimes, which can be older than the dummy build's
# artifacts; touch so cargo rebuilds the crate instead of keeping the dummy.
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked -p quota-arbiter --bin quota-arbiter \
 && cp target/release/quota-arbiter /quota-arbiter

# ---- runtime ---------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 arbiter \
 && useradd --system --uid 10001 --gid arbiter --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin arbiter
COPY --from=builder /quota-arbiter /usr/local/bin/quota-arbiter

# The service reads ./quota-arbiter.toml when present and QUOTA_CONFIG is unset.
WORKDIR /app
USER arbiter:arbiter

ENV QUOTA_LISTEN=0.0.0.0:8080
EXPOSE 8080
# No HEALTHCHECK: the image has no HTTP client. Probe GET /healthz (alive) and
# GET /readyz (store reachable, migrations applied) from the orchestrator.
ENTRYPOINT ["quota-arbiter"]
CMD ["serve"]
