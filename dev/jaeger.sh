#!/usr/bin/env bash
# Local tracing backend: Jaeger v2 (module github.com/jaegertracing/jaeger v1.75.0, whose
# `cmd/jaeger` is the v2 binary: an OpenTelemetry Collector with Jaeger's storage and query),
# built from the Go module proxy, traces in memory, on loopback only, without Docker.
#
#   dev/jaeger.sh start    build (once: into dev/.state/jaeger-cache, a few minutes on 2 cores;
#                          the Go module and build caches make a rebuild in a new clone quick),
#                          start, wait until its query API answers
#   dev/jaeger.sh stop     stop it (SIGTERM)
#   dev/jaeger.sh status   exit 0 when it answers
#
# Ports (127.0.0.1 only): OTLP gRPC $JAEGER_OTLP_GRPC_PORT (14317), OTLP HTTP
# $JAEGER_OTLP_HTTP_PORT (14318), query API and UI $JAEGER_QUERY_PORT (16686). Clients:
# OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:14318 (dev/env.sh). Traces live in memory: a
# restart forgets them. Idempotent: when it already answers, `start` returns at once.
set -euo pipefail

DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$DEV/.state"
CACHE="$STATE/jaeger-cache"
VER=v1.75.0
BIN="$CACHE/jaeger-$VER"
GRPC_PORT="${JAEGER_OTLP_GRPC_PORT:-14317}"
HTTP_PORT="${JAEGER_OTLP_HTTP_PORT:-14318}"
QUERY_PORT="${JAEGER_QUERY_PORT:-16686}"
RUN="$STATE/jaeger-$QUERY_PORT"
PIDFILE="$RUN/jaeger.pid"
LOG="$RUN/jaeger.log"

log() { echo "[jaeger] $*" >&2; }
up() { curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$QUERY_PORT/api/services" 2>/dev/null; }

install() {
  [ -x "$BIN" ] && return 0
  command -v go >/dev/null || { log "needs Go (the machine's go, 1.26)"; exit 1; }
  log "building Jaeger $VER from the Go module proxy (once)"
  local src="$CACHE/src"
  mkdir -p "$src"
  # A module of its own: Jaeger's go.mod has replace directives, which `go install pkg@v`
  # refuses; `go get -tool` in a module takes them as they are.
  (
    cd "$src"
    [ -f go.mod ] || go mod init outbox-dev-jaeger >/dev/null 2>&1
    go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$VER" >/dev/null 2>&1
    go build -trimpath -o "$BIN.tmp" github.com/jaegertracing/jaeger/cmd/jaeger
  )
  mv "$BIN.tmp" "$BIN"
}

config() {
  # Every listener on 127.0.0.1, including the collector's own telemetry.
  cat >"$RUN/config.yaml" <<EOF
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      # No batch processor: the exporters (outbox-otlp's 2,048 spans per request) batch
      # already, and re-batching cost Jaeger a fifth of its CPU on the 100 % drain
      # (1.71 - 2.19 CPU-s with it, 1.46 - 1.80 without; BENCHMARKS_HISTORY round 19).
      processors: []
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    traces:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:$QUERY_PORT
    grpc:
      endpoint: 127.0.0.1:$((QUERY_PORT - 1))
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 200000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$GRPC_PORT
      http:
        endpoint: 127.0.0.1:$HTTP_PORT
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
EOF
}

start() {
  if up; then
    log "already running on 127.0.0.1:$QUERY_PORT"
    return 0
  fi
  install
  mkdir -p "$RUN"
  config
  log "starting: OTLP on 127.0.0.1:$GRPC_PORT (gRPC) and :$HTTP_PORT (HTTP), query on :$QUERY_PORT"
  # Its own traces (off) would otherwise dial the default OTLP port, which nothing serves here.
  # GOGC 400 (JAEGER_GOGC): with every span of a 200,000-event drain in memory, Go's collector
  # took ~40 % of Jaeger's CPU at the default 100 (1.45 - 1.85 CPU-s per drain, 0.77 - 1.13 at
  # 400), CPU this machine's relay, Postgres and Kafka share; memory is what it has plenty of.
  OTEL_TRACES_SAMPLER=always_off GOGC="${JAEGER_GOGC:-400}" OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$GRPC_PORT" nohup "$BIN" --config "$RUN/config.yaml" >"$LOG" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 120); do
    if up; then
      log "ready at http://127.0.0.1:$QUERY_PORT"
      return 0
    fi
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      log "exited; its log:"
      tail -30 "$LOG" >&2
      exit 1
    fi
    sleep 0.5
  done
  log "did not answer within 60 s; its log:"
  tail -30 "$LOG" >&2
  exit 1
}

stop() {
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    kill "$(cat "$PIDFILE")"
    for _ in $(seq 1 40); do
      kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
      sleep 0.25
    done
    rm -f "$PIDFILE"
    log "stopped"
  else
    log "not running"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) up ;;
  *)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
