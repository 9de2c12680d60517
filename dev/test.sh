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
if [ "${1:-}" = quick ]; then
  dev/up.sh
  . dev/env.sh
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
# Where the time goes (a clean clone on the 2-core dev machine): the build, then the test
# binaries, which mostly wait on Kafka and Postgres. So the services start while the build runs,
# each binary runs 6 tests at a time, the `cluster` tests (their own three brokers) run beside
# the others, and the fault tests, which stop and restart the shared services, run last, beside
# the per-feature builds (CPU only, no service).
dev/up.sh packages
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
dev/up.sh services >"$logs/services" 2>&1 &
services=$!
. dev/env.sh
# The consumer crash test runs examples/billing_consumer as a process: build it as a binary
# (`cargo test --all-targets` builds examples only as test harnesses), and the `outbox` binary
# of crates/outbox-cli that the CLI tests run.
cargo build --locked --bins --examples
cargo test --locked --all-targets --no-run
wait "$services" || { cat "$logs/services"; echo "[test] services did not start" >&2; exit 1; }
cat "$logs/services"
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-6}"
# Every integration test target but these two, from the manifest, so a new one is never left out.
others=$(cargo metadata --locked --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if t["kind"] == ["test"] and t["name"] not in ("cluster", "faults"):
            print("--test", t["name"])')
cargo test --locked --test cluster >"$logs/cluster" 2>&1 &
cluster=$!
rc=0
# shellcheck disable=SC2086
OUTBOX_SKIP_FEATURE_BUILDS=1 cargo test --locked --lib --bins --examples --benches $others || rc=$?
wait "$cluster" || rc=$?
cat "$logs/cluster"
[ "$rc" = 0 ] || exit "$rc"
cargo test --locked --test ops -- --exact layout::each_feature_builds_alone \
  layout::the_test_kit_takes_only_the_features_the_service_uses >"$logs/features" 2>&1 &
features=$!
cargo test --locked --test faults || rc=$?
wait "$features" || rc=$?
cat "$logs/features"
[ "$rc" = 0 ] || exit "$rc"
cargo test --locked --doc
# Every public item documented, every intra-doc link resolving.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps -p outbox
# Publishable: both packages pack (metadata, readme, license, include lists), and the library
# builds from its package alone (migrations inside it). The lean build keeps this cheap; the
# full build is the one the tests above ran.
cargo package --locked --workspace --exclude outbox-testkit --no-verify
cargo package --locked -p outbox --no-default-features
