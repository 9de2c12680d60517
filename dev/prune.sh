#!/usr/bin/env bash
# Drops the schemas that earlier test and bench runs left in the dev database. Every test gets
# its own schema (t_*, s_*, m_*, r_*), benches and the demo theirs (bench_*, demo_*), and none
# drops it: a failed test's rows are what one reads to see why. Left alone they pile up (3,500
# schemas and 13 GB after a few weeks), and a Postgres that stopped uncleanly then spends
# minutes syncing the data directory before it takes a connection.
#
# `dev/test.sh` runs this before the suite, so do not run two suites against one database at
# once. Only names of that exact shape are dropped; anything else in the database is kept.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
pattern='^(t|s|m|r|bench|demo)_[a-z0-9]{8,16}$'
mapfile -t schemas < <(psql "$DATABASE_URL" -qAtX -c \
  "SELECT nspname FROM pg_namespace WHERE nspname ~ '$pattern' ORDER BY nspname")
[ ${#schemas[@]} -eq 0 ] && { echo "[prune] no test schemas left over" >&2; exit 0; }
echo "[prune] dropping ${#schemas[@]} test schemas left by earlier runs" >&2
# One schema per transaction: a single DROP of thousands would exceed the lock table.
# A schema a live session holds a lock in is skipped after a second, not waited for.
{ echo "SET lock_timeout = '1s';"; for s in "${schemas[@]}"; do printf 'DROP SCHEMA IF EXISTS "%s" CASCADE;\n' "$s"; done; } |
  psql "$DATABASE_URL" -qAtX -v ON_ERROR_STOP=0 >/dev/null 2>&1 || true
left=$(psql "$DATABASE_URL" -qAtX -c "SELECT count(*) FROM pg_namespace WHERE nspname ~ '$pattern'")
echo "[prune] $left left (held by a live session)" >&2
