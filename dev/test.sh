#!/usr/bin/env bash
# The whole test suite on a fresh machine: services up, then every test and bench smoke run
# against the real Postgres and Kafka, the docs and the packages. `.ci/run` runs exactly this.
#
# `dev/test.sh quick` is the edit loop (about 2 minutes on a warm build): the unit tests and the
# fast integration tests of each part — the basics of the relay, the consumer and the DLQ, the
# admin API, replay jobs and the crate's shape (without the per-feature builds). It is not what
# CI runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "${1:-}" = quick ]; then
  dev/up.sh
  . dev/env.sh
  export RUST_TEST_THREADS="${RUST_TEST_THREADS:-6}"
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
# Every test binary, built once. They run as built, not through `cargo test --test NAME`: cargo
# resolves features for what it is asked to build, and a narrower selection (one test target,
# without the CLI's package) rebuilt the library and a dozen dependencies a second time.
cargo test --locked --all-targets --no-run --message-format json-render-diagnostics \
  >"$logs/build.json"
python3 - "$logs/build.json" >"$logs/binaries" <<'PY'
import json, os, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"][0]
        print(kind, m["target"]["name"], os.path.dirname(m["manifest_path"]), m["executable"])
PY
wait "$services" || { cat "$logs/services"; echo "[test] services did not start" >&2; exit 1; }
cat "$logs/services"
# Schemas left by earlier runs (each test makes its own and keeps it for reading after a
# failure) would otherwise grow the dev database without bound.
dev/prune.sh
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-6}"
# Runs the test binaries whose "kind name" matches the regex $1 and not $2 (the rest of the
# arguments go to each), in their package's directory as `cargo test` does; the exit code of
# the last failure.
run() {
  local pattern="$1" except="$2" rc=0 kind name dir exe
  shift 2
  while read -r kind name dir exe; do
    [[ "$kind $name" =~ $pattern ]] || continue
    [[ "$kind $name" =~ $except ]] && continue
    echo "[test] $kind $name"
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe" "$@") || rc=$?
  done <"$logs/binaries"
  return "$rc"
}
run '^test cluster$' '^$' >"$logs/cluster" 2>&1 &
cluster=$!
rc=0
OUTBOX_SKIP_FEATURE_BUILDS=1 run '.' '^test (cluster|faults)$' || rc=$?
wait "$cluster" || rc=$?
cat "$logs/cluster"
[ "$rc" = 0 ] || exit "$rc"
run '^test ops$' '^$' --exact layout::each_feature_builds_alone \
  layout::the_test_kit_takes_only_the_features_the_service_uses >"$logs/features" 2>&1 &
features=$!
run '^test faults$' '^$' || rc=$?
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
