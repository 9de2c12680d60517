#!/usr/bin/env bash
# The whole test suite on a fresh machine: services up, then every test and bench smoke run
# against the real Postgres and Kafka, the docs and the packages. `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dev/up.sh
. dev/env.sh
# The consumer crash test runs examples/billing_consumer as a process: build it as a binary
# (`cargo test --all-targets` builds examples only as test harnesses), and the `outbox` binary
# of crates/outbox-cli that the CLI tests run.
cargo build --locked --bins --examples
cargo test --locked --all-targets
cargo test --locked --doc
# Every public item documented, every intra-doc link resolving.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps -p outbox
# Publishable: both packages pack (metadata, readme, license, include lists), and the library
# builds from its package alone (migrations inside it). The lean build keeps this cheap; the
# full build is the one the tests above ran.
cargo package --locked --workspace --exclude outbox-testkit --no-verify
cargo package --locked -p outbox --no-default-features
