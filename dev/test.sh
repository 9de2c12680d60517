#!/usr/bin/env bash
# The whole test suite on a fresh machine: services up, then every test and bench smoke run
# against the real Postgres and Kafka. `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dev/up.sh
. dev/env.sh
# The consumer crash test runs examples/billing_consumer as a process: build it as a binary
# (`cargo test --all-targets` builds examples only as test harnesses).
cargo build --locked --examples
cargo test --locked --all-targets
cargo test --locked --doc
