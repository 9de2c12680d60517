#!/usr/bin/env bash
# A Kubernetes API server without a cluster, for server-side dry runs of the Helm chart:
# kube-apiserver and kubectl v1.37.2 (module k8s.io/kubernetes) and etcd v3.7.3, both built from the Go
# module proxy, on loopback only. No scheduler, controller or kubelet: objects are admitted
# (schemas, CRD validation, PodSecurity admission) but nothing runs.
#
#   dev/kube.sh start    build (once, about 5 minutes on 2 cores; into dev/.state/kube), start
#                        etcd and the API server, wait until /readyz answers
#   dev/kube.sh stop     stop both and forget their data
#   dev/kube.sh status   exit 0 when the API server answers
#   dev/kube.sh env      print KUBECONFIG=… and KUBECTL=… (its own kubectl, built beside it)
#
# Ports (127.0.0.1 only): API $KUBE_API_PORT (16443), etcd $KUBE_ETCD_PORT (12379) and the
# next port for its peer URL. A static bearer token in system:masters; a self-signed cert.
set -euo pipefail

DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$DEV/.state/kube"
BIN="$STATE/bin"
K8S_VER=v1.37.2
STAGING_VER=v0.37.2
ETCD_VER=v3.7.3
API_PORT="${KUBE_API_PORT:-16443}"
ETCD_PORT="${KUBE_ETCD_PORT:-12379}"
RUN="$STATE/run-$API_PORT"
TOKEN="outbox-dev-token-$API_PORT"

log() { echo "[kube] $*" >&2; }
up() {
  curl -fsk -o /dev/null --max-time 2 -H "Authorization: Bearer $TOKEN" \
    "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null
}

build() {
  mkdir -p "$BIN"
  exec 8>"$STATE/build.lock"
  flock 8
  command -v go >/dev/null || { log "needs Go (the machine's go)"; exit 1; }
  if [ ! -x "$BIN/etcd-$ETCD_VER" ]; then
    log "building etcd $ETCD_VER from the Go module proxy (once)"
    local src="$STATE/etcd-src"
    mkdir -p "$src"
    (
      cd "$src"
      [ -f go.mod ] || go mod init outbox-dev-etcd >/dev/null 2>&1
      go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VER" >/dev/null 2>&1
      go build -trimpath -o "$BIN/etcd-$ETCD_VER.tmp" go.etcd.io/etcd/server/v3
    )
    mv "$BIN/etcd-$ETCD_VER.tmp" "$BIN/etcd-$ETCD_VER"
  fi
  # kube-apiserver, and a kubectl of the server's release (the machine's, if any, may be far
  # older), from one wrapper module.
  k8s_cmd kube-apiserver
  k8s_cmd kubectl
  flock -u 8
}

# Builds k8s.io/kubernetes/cmd/$1 at $K8S_VER into $BIN (once), versioned as the release.
k8s_cmd() {
  local name="$1"
  [ -x "$BIN/$name-$K8S_VER" ] && return 0
  log "building $name $K8S_VER from the Go module proxy (once, a few minutes)"
  local src="$STATE/apiserver-src"
  mkdir -p "$src"
  (
    cd "$src"
    if [ ! -f go.mod ]; then
      go mod init outbox-dev-kube-apiserver >/dev/null 2>&1
      # k8s.io/kubernetes points its k8s.io/* modules at ./staging in its own tree, which a
      # dependant cannot see: the same modules at their published release instead.
      curl -fsS --max-time 120 "$(go env GOPROXY | cut -d, -f1)/k8s.io/kubernetes/@v/$K8S_VER.mod" >kubernetes.mod
      local m
      for m in $(awk '$2 == "=>" && $3 ~ /^\.\/staging/ {print $1}' kubernetes.mod); do
        go mod edit -replace "$m=$m@$STAGING_VER"
      done
    fi
    go get -tool "k8s.io/kubernetes/cmd/$name@$K8S_VER" >/dev/null 2>&1
    local minor="${K8S_VER#v1.}"
    minor="${minor%%.*}"
    go build -trimpath -o "$BIN/$name-$K8S_VER.tmp" -ldflags "\
      -X k8s.io/component-base/version.gitVersion=$K8S_VER \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$minor" \
      "k8s.io/kubernetes/cmd/$name"
  )
  mv "$BIN/$name-$K8S_VER.tmp" "$BIN/$name-$K8S_VER"
}

kubeconfig() {
  cat >"$RUN/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
  - name: dev
    cluster: { server: "https://127.0.0.1:$API_PORT", insecure-skip-tls-verify: true }
users:
  - name: admin
    user: { token: "$TOKEN" }
contexts:
  - name: dev
    context: { cluster: dev, user: admin }
current-context: dev
KC
}

start() {
  if up; then
    log "already running on 127.0.0.1:$API_PORT"
    return 0
  fi
  build
  stop_quiet
  mkdir -p "$RUN"
  openssl genrsa -out "$RUN/sa.key" 2048 2>/dev/null
  openssl rsa -in "$RUN/sa.key" -pubout -out "$RUN/sa.pub" 2>/dev/null
  echo "$TOKEN,admin,admin,system:masters" >"$RUN/tokens.csv"
  kubeconfig
  local peer=$((ETCD_PORT + 1))
  log "starting etcd on 127.0.0.1:$ETCD_PORT and the API server on 127.0.0.1:$API_PORT"
  nohup "$BIN/etcd-$ETCD_VER" --data-dir "$RUN/etcd" --name dev \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "dev=http://127.0.0.1:$peer" --listen-metrics-urls "" >"$RUN/etcd.log" 2>&1 &
  echo $! >"$RUN/etcd.pid"
  # The endpoint reconciler refuses a loopback address; with no Service traffic there is
  # nothing for it to do.
  nohup "$BIN/kube-apiserver-$K8S_VER" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --endpoint-reconciler-type none \
    --secure-port "$API_PORT" --cert-dir "$RUN/certs" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$RUN/sa.pub" --service-account-signing-key-file "$RUN/sa.key" \
    --token-auth-file "$RUN/tokens.csv" --authorization-mode RBAC \
    --service-cluster-ip-range 10.96.0.0/16 >"$RUN/apiserver.log" 2>&1 &
  echo $! >"$RUN/apiserver.pid"
  for _ in $(seq 1 240); do
    if up; then
      log "ready: KUBECONFIG=$RUN/kubeconfig"
      return 0
    fi
    for p in etcd apiserver; do
      if ! kill -0 "$(cat "$RUN/$p.pid")" 2>/dev/null; then
        log "$p exited; its log:"
        tail -20 "$RUN/$p.log" >&2
        exit 1
      fi
    done
    sleep 0.5
  done
  log "the API server did not answer within 120 s; its log:"
  tail -20 "$RUN/apiserver.log" >&2
  exit 1
}

stop_quiet() {
  local p
  for p in apiserver etcd; do
    if [ -f "$RUN/$p.pid" ] && kill -0 "$(cat "$RUN/$p.pid")" 2>/dev/null; then
      kill "$(cat "$RUN/$p.pid")"
      for _ in $(seq 1 40); do
        kill -0 "$(cat "$RUN/$p.pid")" 2>/dev/null || break
        sleep 0.25
      done
    fi
  done
  rm -rf "$RUN"
}

case "${1:-}" in
  start) start ;;
  stop) stop_quiet; log "stopped" ;;
  status) up ;;
  env)
    echo "KUBECONFIG=$RUN/kubeconfig"
    echo "KUBECTL=$BIN/kubectl-$K8S_VER"
    ;;
  *) echo "usage: dev/kube.sh start|stop|status|env" >&2; exit 2 ;;
esac
