#!/usr/bin/env bash
# The 30-minute soak of docs/BENCHMARKS.md (not run in CI): 2,000 msg/s, cleanup every minute,
# a transaction held open for the first 10 minutes. Output: one JSON line per minute + summary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dev/up.sh
. dev/env.sh
RATE="${RATE:-2000}" SECS="${SECS:-1800}" HOLD_SECS="${HOLD_SECS:-600}" WINDOW="${WINDOW:-60}" \
  cargo bench --bench soak
