#!/usr/bin/env bash
# Local PostgreSQL from Debian's package, on 127.0.0.1:5432 only, without Docker.
#
#   dev/postgres.sh start     install (once), configure, start, create role + database
#   dev/postgres.sh restart   fast restart (fault tests)
#   dev/postgres.sh stop
#
# A second server (a fleet's other database, stopped by the fault tests on its own):
#   OUTBOX_PG_CLUSTER=shard2 PGPORT=5433 dev/postgres.sh start|stop
#
# After `start`:  DATABASE_URL=postgres://outbox:outbox@127.0.0.1:5432/outbox
# Idempotent: when the server is already up and configured, `start` returns at once.
set -euo pipefail

PGPORT="${PGPORT:-5432}"
# The Debian cluster's name (`main`: the one everything uses).
CLUSTER="${OUTBOX_PG_CLUSTER:-main}"
DB_USER=outbox
DB_PASS=outbox
DB_NAME=outbox

log() { echo "[postgres] $*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

install_pg() {
  if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && command -v pg_ctlcluster >/dev/null; then return; fi
  log "installing postgresql from Debian's packages (once)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
}

cluster() {
  # The newest installed major version and its `main` cluster.
  PGVER="$(ls /usr/lib/postgresql | sort -n | tail -1)"
  if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$PGVER $CLUSTER"; then
    log "creating cluster $PGVER/$CLUSTER"
    pg_createcluster "$PGVER" "$CLUSTER" --port "$PGPORT" >/dev/null
  fi
  CONF="/etc/postgresql/$PGVER/$CLUSTER"
}

configure() {
  mkdir -p "$CONF/conf.d"
  # TLS with the dev CA's certificate for 127.0.0.1, so sslmode=verify-full works locally.
  "$(dirname "${BASH_SOURCE[0]}")/tls.sh"
  local tls="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/.state/tls"
  for f in server.pem server.key; do
    if ! cmp -s "$tls/$f" "$CONF/outbox-$f"; then
      install -m 600 -o postgres -g postgres "$tls/$f" "$CONF/outbox-$f"
      CHANGED=1
    fi
  done
  local want="$CONF/conf.d/outbox-dev.conf"
  local body
  body="# Written by dev/postgres.sh: loopback only, room for parallel tests and benches.
listen_addresses = '127.0.0.1'
port = $PGPORT
max_connections = 400
shared_buffers = 512MB
work_mem = 16MB
maintenance_work_mem = 256MB
wal_buffers = 16MB
max_wal_size = 4GB
checkpoint_timeout = 15min
# After an unclean stop Postgres syncs the data directory before recovery; syncfs does it in
# one call per file system instead of an fsync per file (minutes on a big dev database).
recovery_init_sync_method = syncfs
log_min_messages = warning
ssl = on
ssl_cert_file = '$CONF/outbox-server.pem'
ssl_key_file = '$CONF/outbox-server.key'
"
  if ! printf '%s' "$body" | cmp -s - "$want"; then
    printf '%s' "$body" > "$want"
    grep -q "^include_dir = 'conf.d'" "$CONF/postgresql.conf" || echo "include_dir = 'conf.d'" >> "$CONF/postgresql.conf"
    CHANGED=1
  fi
}

start() {
  install_pg
  cluster
  CHANGED=0
  configure
  if port_open "$PGPORT" && [ "$CHANGED" = 0 ]; then
    ensure_db; log "already up on 127.0.0.1:$PGPORT"; return 0
  fi
  if [ "$CHANGED" = 1 ] && pg_lsclusters -h | grep -q "^$PGVER $CLUSTER .* online"; then
    pg_ctlcluster "$PGVER" "$CLUSTER" restart -m fast
  else
    # pg_ctl gives up waiting after 60 s; a crash recovery can take longer, and the wait
    # below follows it for as long as the server process lives.
    pg_ctlcluster "$PGVER" "$CLUSTER" start || true
  fi
  ensure_db
  log "ready on 127.0.0.1:$PGPORT"
}

# Waits until the server takes queries: up to 10 minutes while its process lives (crash
# recovery after an unclean stop), 30 s once no server process is left.
ensure_db() {
  local deadline=$((SECONDS + 600)) gone=0 said=0
  until su postgres -c "psql -qAtX -p $PGPORT -c 'select 1'" >/dev/null 2>&1; do
    if pg_lsclusters -h | grep -q "^$PGVER $CLUSTER .* down"; then
      gone=$((gone + 1))
      # A start right after an unclean stop can fail on the old postmaster's socket lock
      # while its last children exit: try again.
      [ $((gone % 25)) = 0 ] && { pg_ctlcluster "$PGVER" "$CLUSTER" start >/dev/null 2>&1 || true; }
      [ "$gone" -ge 150 ] && { log "server is not running"; tail -n 30 /var/log/postgresql/*.log >&2; exit 1; }
    else
      gone=0
    fi
    if [ $SECONDS -ge $deadline ]; then log "server does not accept queries after 600 s"; tail -n 30 /var/log/postgresql/*.log >&2; exit 1; fi
    if [ $SECONDS -ge $((said + 15)) ]; then
      [ "$said" != 0 ] && log "waiting for the server (recovering?)"
      said=$SECONDS
    fi
    sleep 0.2
  done
  su postgres -c "psql -qAtX -p $PGPORT" <<SQL >/dev/null
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$DB_USER') THEN
    CREATE ROLE $DB_USER LOGIN SUPERUSER PASSWORD '$DB_PASS';
  END IF;
END \$\$;
SELECT 'CREATE DATABASE $DB_NAME OWNER $DB_USER' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB_NAME') \gexec
SQL
}

case "${1:-start}" in
  start) start ;;
  restart) install_pg; cluster; pg_ctlcluster "$PGVER" "$CLUSTER" restart -m fast; start ;;
  stop) install_pg; cluster; pg_ctlcluster "$PGVER" "$CLUSTER" stop -m fast || true ;;
  *) echo "usage: $0 start|restart|stop" >&2; exit 2 ;;
esac
