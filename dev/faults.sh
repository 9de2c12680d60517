#!/usr/bin/env bash
# The whole fault suite of docs/RELIABILITY.md at full size, with each test's figures printed:
# relay kill -9 loop (100,000 messages), Kafka and Postgres outages with relay and consumer
# running, a broker killed in the 3-node cluster, consumer kill -9, per-key order across
# relays, hostile input, TLS/SASL and the secret scan. (CI runs the same tests, the relay-crash
# one at 20,000 messages.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dev/up.sh
. dev/env.sh
cargo build --locked --bins --examples
shown='^(relay crashes|kafka outage|postgres outage|downstream|cluster|ordering|billing consumer|measured hop|test |test result)'
# libtest takes several filters: each binary runs just the fault tests named here.
run() { OUTBOX_FAULT_SCALE=full cargo test --locked --test "$1" -- --nocapture --test-threads 2 "${@:2}" 2>&1 | grep -E "$shown"; }
run relay crash:: ordering:: security::
run faults
run cluster
run consumer basics:: hostile::
