#!/usr/bin/env bash
# Local Apache Kafka 4.x (KRaft, broker+controller in one JVM) on loopback, without Docker.
#
#   dev/kafka.sh start     fetch jars (once), format storage (once), start, wait until ready
#   dev/kafka.sh stop      stop the broker (SIGTERM, then SIGKILL after 30 s)
#   dev/kafka.sh kill      SIGKILL the broker (fault tests)
#   dev/kafka.sh status    exit 0 when the broker accepts connections
#
# Environment (defaults give the single dev broker used by tests and the demo):
#   KAFKA_INSTANCE=single  name of the instance; state lives in dev/.state/kafka-$KAFKA_INSTANCE
#   KAFKA_PORT=9092        client listener, 127.0.0.1 only
#   KAFKA_CONTROLLER_PORT=9093
#   KAFKA_NODE_ID=1, KAFKA_VOTERS=1@127.0.0.1:$KAFKA_CONTROLLER_PORT, KAFKA_CLUSTER_ID (random
#   at first format), KAFKA_RF=1 (replication of internal topics and the default for new topics;
#   min.insync.replicas = RF-1 when RF > 1), KAFKA_HEAP=1g: set by dev/kafka-cluster.sh
#   KAFKA_SASL_PORT=9094   SASL_SSL listener (PLAIN, users outbox / outbox-secret and
#                          scanner / scanner-Pa55-9f3k for the secret-scan test, certificate of
#                          dev/tls.sh for 127.0.0.1); empty to disable
#
# Idempotent: when the broker is already up, `start` returns at once.
set -euo pipefail

DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$DEV/.state"
LIB="$STATE/kafka-lib"
INSTANCE="${KAFKA_INSTANCE:-single}"
PORT="${KAFKA_PORT:-9092}"
CPORT="${KAFKA_CONTROLLER_PORT:-9093}"
SASL_PORT="${KAFKA_SASL_PORT-9094}"
NODE_ID="${KAFKA_NODE_ID:-1}"
VOTERS="${KAFKA_VOTERS:-$NODE_ID@127.0.0.1:$CPORT}"
RF="${KAFKA_RF:-1}"
MIN_ISR=$(( RF > 1 ? RF - 1 : 1 ))
HEAP="${KAFKA_HEAP:-1g}"
DIR="$STATE/kafka-$INSTANCE"
PIDFILE="$DIR/kafka.pid"

log() { echo "[kafka:$INSTANCE] $*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

fetch_jars() {
  if [ -f "$LIB/.complete" ]; then return; fi
  command -v mvn >/dev/null || { log "mvn not found: install Maven (apt-get install maven)"; exit 1; }
  command -v java >/dev/null || { log "java not found: install a JDK 17+"; exit 1; }
  log "fetching Kafka jars from Maven Central (once)"
  mkdir -p "$LIB"
  mvn -q -B -Dstyle.color=never -f "$DEV/pom.xml" dependency:copy-dependencies
  touch "$LIB/.complete"
}

java_run() {
  java -Xms256m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Dlog4j2.configurationFile="$DEV/kafka/log4j2.yaml" -Dkafka.logs.dir="$DIR/logs" \
    -cp "$LIB/*" "$@"
}

write_config() {
  mkdir -p "$DIR/data" "$DIR/logs"
  local listeners="PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT"
  local advertised="PLAINTEXT://127.0.0.1:$PORT"
  local protocols="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
  local sasl=""
  if [ -n "$SASL_PORT" ]; then
    "$DEV/tls.sh"
    listeners="$listeners,SASL_SSL://127.0.0.1:$SASL_PORT"
    advertised="$advertised,SASL_SSL://127.0.0.1:$SASL_PORT"
    protocols="$protocols,SASL_SSL:SASL_SSL"
    # Dev-only credentials for the SASL_SSL listener; clients verify dev/.state/tls/ca.pem.
    sasl="sasl.enabled.mechanisms=PLAIN
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"outbox\" password=\"outbox-secret\" user_outbox=\"outbox-secret\" user_scanner=\"scanner-Pa55-9f3k\";
ssl.keystore.location=$STATE/tls/server.p12
ssl.keystore.type=PKCS12
ssl.keystore.password=changeit
ssl.key.password=changeit"
  fi
  cat > "$DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=$NODE_ID
controller.quorum.voters=$VOTERS
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
$sasl
log.dirs=$DIR/data
num.partitions=3
auto.create.topics.enable=false
offsets.topic.replication.factor=$RF
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$RF
transaction.state.log.min.isr=$MIN_ISR
# Exactly-once relays: the transaction log created quickly on first use, timeouts capped.
transaction.state.log.num.partitions=8
transaction.max.timeout.ms=900000
share.coordinator.state.topic.replication.factor=$RF
share.coordinator.state.topic.min.isr=$MIN_ISR
default.replication.factor=$RF
min.insync.replicas=$MIN_ISR
group.initial.rebalance.delay.ms=0
log.retention.hours=168
num.network.threads=2
num.io.threads=4
PROPS
}

start() {
  if port_open "$PORT"; then
    if [ -z "$SASL_PORT" ] || port_open "$SASL_PORT"; then log "already up on 127.0.0.1:$PORT"; return 0; fi
    log "up without its SASL_SSL listener (older config): restarting"
    stop_with TERM
  fi
  fetch_jars
  write_config
  if [ ! -f "$DIR/data/meta.properties" ]; then
    local id="${KAFKA_CLUSTER_ID:-}"
    [ -n "$id" ] || id="$(java_run kafka.tools.StorageTool random-uuid | tail -1)"
    log "formatting storage (cluster id $id)"
    java_run kafka.tools.StorageTool format -t "$id" -c "$DIR/server.properties" >/dev/null
  fi
  log "starting on 127.0.0.1:$PORT"
  nohup java -Xms256m -Xmx"$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Dlog4j2.configurationFile="$DEV/kafka/log4j2.yaml" -Dkafka.logs.dir="$DIR/logs" \
    -cp "$LIB/*" kafka.Kafka "$DIR/server.properties" >"$DIR/logs/stdout.log" 2>&1 &
  echo $! > "$PIDFILE"
  [ "${KAFKA_NO_WAIT:-}" = 1 ] && return 0
  wait_ready
}

wait_ready() {
  local deadline=$((SECONDS + 120))
  until grep -q "Kafka Server started" "$DIR/logs/server.log" 2>/dev/null && port_open "$PORT"; do
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      log "broker exited during start; last lines of its log:"; tail -n 30 "$DIR/logs/stdout.log" "$DIR/logs/server.log" >&2 || true; exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then log "not ready after 120 s"; exit 1; fi
    sleep 0.5
  done
  log "ready"
}

stop_with() {
  local sig="$1"
  if [ ! -f "$PIDFILE" ]; then
    # A broker this checkout did not start (another clone's) would keep serving: say so and
    # fail, rather than report a stop that did not happen.
    if port_open "$PORT"; then
      log "a broker this checkout did not start listens on 127.0.0.1:$PORT (no pid file in $DIR): stop it from its own checkout"
      return 1
    fi
    log "not running (no pid file)"
    return 0
  fi
  local pid; pid="$(cat "$PIDFILE")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "-$sig" "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then kill -KILL "$pid" 2>/dev/null || true; fi
      sleep 0.2
    done
  fi
  # The server log's "started" line must not satisfy the next start's readiness check.
  : > "$DIR/logs/server.log" 2>/dev/null || true
  rm -f "$PIDFILE"
  log "stopped ($sig)"
}

case "${1:-start}" in
  start) start ;;
  wait) wait_ready ;;
  fetch) fetch_jars ;;
  stop) stop_with TERM ;;
  kill) stop_with KILL ;;
  status) port_open "$PORT" ;;
  *) echo "usage: $0 start|stop|kill|status" >&2; exit 2 ;;
esac
