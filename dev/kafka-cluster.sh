#!/usr/bin/env bash
# A 3-broker Apache Kafka 4.x KRaft cluster on loopback for the fault tests: every node is
# broker+controller, RF 3 and min.insync.replicas=2 for internal and new topics.
#
#   dev/kafka-cluster.sh start        start all three (idempotent), wait until ready
#   dev/kafka-cluster.sh kill N       SIGKILL node N (1..3)
#   dev/kafka-cluster.sh start-node N restart one node
#   dev/kafka-cluster.sh stop         stop all three
#
# Bootstrap: 127.0.0.1:19092,127.0.0.1:19192,127.0.0.1:19292
set -euo pipefail
DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VOTERS="1@127.0.0.1:19093,2@127.0.0.1:19193,3@127.0.0.1:19293"
CLUSTER_ID_FILE="$DEV/.state/kafka-cluster.id"

node_env() {
  local n="$1"
  # node 1: 19092/19093, node 2: 19192/19193, node 3: 19292/19293
  export KAFKA_INSTANCE="cluster-$n" KAFKA_NODE_ID="$n" KAFKA_VOTERS="$VOTERS" KAFKA_RF=3 KAFKA_HEAP=512m \
    KAFKA_PORT="$((18992 + n * 100))" KAFKA_CONTROLLER_PORT="$((18993 + n * 100))" KAFKA_SASL_PORT=""
  [ -f "$CLUSTER_ID_FILE" ] && export KAFKA_CLUSTER_ID="$(cat "$CLUSTER_ID_FILE")"
  return 0
}

ensure_cluster_id() {
  if [ ! -f "$CLUSTER_ID_FILE" ]; then
    # The same cluster id must be formatted into every node's storage.
    java -cp "$DEV/.state/kafka-lib/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1 > "$CLUSTER_ID_FILE"
  fi
}

case "${1:-start}" in
  start)
    "$DEV/kafka.sh" fetch
    ensure_cluster_id
    # A quorum needs a majority: start all nodes, then wait for each.
    for n in 1 2 3; do (node_env "$n"; KAFKA_NO_WAIT=1 "$DEV/kafka.sh" start); done
    for n in 1 2 3; do (node_env "$n"; "$DEV/kafka.sh" wait); done
    ;;
  start-node) (node_env "$2"; "$DEV/kafka.sh" start) ;;
  kill) (node_env "$2"; "$DEV/kafka.sh" kill) ;;
  stop) for n in 1 2 3; do (node_env "$n"; "$DEV/kafka.sh" stop); done ;;
  *) echo "usage: $0 start|start-node N|kill N|stop" >&2; exit 2 ;;
esac
