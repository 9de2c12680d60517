#!/usr/bin/env bash
# The whole test suite on a fresh machine: services up, then every test and bench smoke run
# against the real Postgres and Kafka, the docs and the packages. `.ci/run` runs exactly this.
#
# `dev/test.sh quick` is the edit loop (about 3 minutes on a warm build): the unit tests and the
# fast integration tests of each part — the basics of the relay, the consumer and the DLQ, the
# admin API, replay jobs and the crate's shape (without the per-feature builds). It is not what
# CI runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dev/up.sh
. dev/env.sh
if [ "${1:-}" = quick ]; then
  cargo build --locked -p outbox-cli
  cargo build --locked -p outbox --example billing_consumer
  cargo test --locked --lib
  # The per-feature `cargo check` runs (17 of them) are the full suite's: after an edit of the
  # library they would redo most of the build once per feature set.
  OUTBOX_SKIP_FEATURE_BUILDS=1 cargo test --locked --test ops -- layout:: admin:: jobs::
  cargo test --locked --test relay -- basics::
  cargo test --locked --test dlq -- basics::
  cargo test --locked --test consumer -- basics::
  exit 0
fi
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
