#!/usr/bin/env bash
# The whole job, end to end, on a fresh machine, one line per step:
#   services up → migrate → topics → the order service writes orders and their events in one
#   transaction each (one rolled back, two poison) → the relay publishes → billing_consumer
#   charges every good order once and dead-letters the poison ones → the archiver archives them
#   → the summary by cause → the admin dashboard left running on loopback with a fresh token.
#
#   dev/demo.sh          run it (again: each run has its own schema and topic)
#   dev/demo.sh stop     stop what it left running (dashboard, consumer, archiver)
#
# Env: DEMO_ORDERS (10), DEMO_POISON (2), DEMO_ADMIN_PORT (8080), DEMO_SKIP_BUILD (unset: build),
# DEMO_STATE (dev/.state/demo: logs and the pids `stop` ends).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
state=${DEMO_STATE:-dev/.state/demo}
pids=$state/pids

# Only our own processes: a pid left in a stale file may belong to something else by now.
ours() { ps -p "$1" -o args= 2>/dev/null | grep -qE 'target/debug/(outbox|examples/billing_consumer)'; }
stop() {
  [ -f "$pids" ] || return 0
  while read -r pid; do ours "$pid" && kill -TERM "$pid" 2>/dev/null || true; done <"$pids"
  # Each ends on SIGTERM (the consumer commits its offsets first); wait up to 15 s for it.
  local deadline=$((SECONDS + 15))
  while read -r pid; do
    while ours "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    ours "$pid" && kill -KILL "$pid" 2>/dev/null || true
  done <"$pids"
  rm -f "$pids"
}
if [ "${1:-}" = stop ]; then
  stop
  echo "demo stopped"
  exit 0
fi
stop
mkdir -p "$state"
# A step that fails (or Ctrl-C) stops what the demo started so far.
trap 'stop; exit 130' INT TERM
trap 'status=$?; [ $status -eq 0 ] || stop' EXIT

step() { printf '\n== %s\n' "$*"; }
# Waits up to $1 s for the command after it to succeed.
wait_for() {
  local secs=$1; shift
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.3
  done
}

step "services: Postgres and Kafka on loopback"
dev/up.sh >"$state/up.log" 2>&1 || { cat "$state/up.log"; exit 1; }
. dev/env.sh
echo "Postgres $DATABASE_URL, Kafka $KAFKA_BOOTSTRAP_SERVERS"
if [ -z "${DEMO_SKIP_BUILD:-}" ]; then
  cargo build --locked --quiet --bin outbox --example order_service --example billing_consumer
fi
OUTBOX=target/debug/outbox
ORDERS=${DEMO_ORDERS:-10}
POISON=${DEMO_POISON:-2}
PORT=${DEMO_ADMIN_PORT:-8080}
run=$(date +%s)
export OUTBOX_SCHEMA="demo_$run"
topic="demo.$run.orders"
sql() { psql "$DATABASE_URL" -qtAc "$1"; }

step "schema $OUTBOX_SCHEMA and topic $topic"
$OUTBOX migrate >"$state/migrate.log" 2>&1 || { cat "$state/migrate.log"; exit 1; }
cat >"$state/topics.toml" <<EOF
[defaults]
partitions = 3
replication_factor = 1
retention = "7d"
groups = ["billing-service"]

[[topic]]
name = "$topic"
EOF
$OUTBOX topics apply "$state/topics.toml" | sed 's/^/  /'

step "order service: $ORDERS orders (every fifth rolled back) and $POISON from an old version"
ORDER_TOPIC=$topic ORDER_POISON=$POISON target/debug/examples/order_service "$ORDERS" |
  sed -E 's/  message_id=.*//; s/^/  /'
good=$((ORDERS - ORDERS / 5))

step "relay: publishing the outbox"
$OUTBOX relay --cleanup-interval off >"$state/relay.log" 2>&1 &
relay=$!
echo $relay >>"$pids"
pending() { [ "$(sql "SELECT count(*) FROM $OUTBOX_SCHEMA.outbox WHERE status = 'pending'")" = 0 ]; }
wait_for 60 pending || { echo "the relay did not drain the outbox in 60 s"; tail "$state/relay.log"; exit 1; }
kill -TERM $relay 2>/dev/null || true
wait $relay || true
echo "  $(sql "SELECT count(*) FROM $OUTBOX_SCHEMA.outbox WHERE status = 'sent'") events sent, none pending; the rolled-back orders left no event"

step "billing_consumer: charging each order once"
BILLING_TOPIC=$topic RUST_LOG=warn target/debug/examples/billing_consumer >"$state/billing.log" 2>&1 &
echo $! >>"$pids"
$OUTBOX dlq archive --topic "$topic.dlq" >"$state/archiver.log" 2>&1 &
echo $! >>"$pids"
charged() { [ "$(sql "SELECT count(DISTINCT message_id) FROM $OUTBOX_SCHEMA.charges")" = "$good" ]; }
archived() { [ "$(sql "SELECT count(*) FROM $OUTBOX_SCHEMA.dead_letters")" = "$POISON" ]; }
wait_for 90 charged || { echo "not every order was charged in 90 s"; tail "$state/billing.log"; exit 1; }
echo "  $(sql "SELECT count(*) || ' charges for ' || count(DISTINCT message_id) || ' orders' FROM $OUTBOX_SCHEMA.charges") (no order twice)"

step "dead letters: the poison orders, archived and grouped by cause"
wait_for 60 archived || { echo "the $POISON dead letters were not archived in 60 s"; tail "$state/archiver.log"; exit 1; }
$OUTBOX dlq summary | sed 's/^/  /'

step "dashboard"
token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
OUTBOX_ADMIN_TOKEN=$token $OUTBOX admin --listen "127.0.0.1:$PORT" >"$state/admin.log" 2>&1 &
echo $! >>"$pids"
wait_for 30 curl -fsS "http://127.0.0.1:$PORT/healthz" || { echo "the admin server did not start"; tail "$state/admin.log"; exit 1; }
echo "  open http://127.0.0.1:$PORT/ and sign in with the token $token"
echo "  (the consumer and the archiver keep running; logs in $state/)"
echo "  stop everything with: dev/demo.sh stop"
