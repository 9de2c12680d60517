# The `outbox` binary for the relay sidecar in compose.yml.
FROM rust:1.85-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake libssl-dev pkg-config && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin outbox

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 outbox
COPY --from=build /src/target/release/outbox /usr/local/bin/outbox
USER outbox
ENTRYPOINT ["outbox"]
