#!/usr/bin/env bash
# The main job, end to end, on a fresh machine:
#   services up → migrate → topics → the example order service enqueues in its transactions →
#   the relay publishes → the messages are read back from Kafka with their key and headers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dev/up.sh
. dev/env.sh
cargo build --locked --bin outbox --example order_service
OUTBOX=target/debug/outbox

$OUTBOX migrate
$OUTBOX topics apply topics.toml
target/debug/examples/order_service 5

echo "--- relay: publishing"
$OUTBOX relay --cleanup-interval off &
relay=$!
trap 'kill -TERM $relay 2>/dev/null || true' EXIT
deadline=$((SECONDS + 60))
until $OUTBOX status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if not any(c["status"]=="pending" for c in s["counts"]) else 1)'; do
  [ $SECONDS -lt $deadline ] || { echo "relay did not drain the outbox in 60 s" >&2; exit 1; }
  sleep 0.2
done
kill -TERM $relay; wait $relay; trap - EXIT

echo "--- outbox status"
$OUTBOX status

echo "--- orders.created, read back from Kafka (key, headers, body)"
# The console consumer needs Kafka's jars in this checkout, also when the broker was already
# started from another checkout (then `dev/up.sh` did not fetch them here).
dev/kafka.sh fetch
java -Dlog4j2.configurationFile=dev/kafka/log4j2.yaml -Dkafka.logs.dir=dev/.state \
  -cp "dev/.state/kafka-lib/*" org.apache.kafka.tools.consumer.ConsoleConsumer \
  --bootstrap-server "$KAFKA_BOOTSTRAP_SERVERS" --topic orders.created --from-beginning \
  --timeout-ms 5000 --property print.key=true --property print.headers=true \
  --property print.partition=true 2>/dev/null || true
