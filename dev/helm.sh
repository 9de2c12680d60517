#!/usr/bin/env bash
# The Kubernetes chart's tools, offline: built or unpacked once into dev/.state/k8s, from the
# Go module proxy and PyPI only (no Docker, no cluster, no download site).
#
#   dev/helm.sh install   build helm v4.3.2, helm-unittest v1.1.2 and kubeconform v0.8.0;
#                         unpack the Kubernetes JSON schemas (v1.31 and v1.37, strict) from
#                         PyPI's kubernetes-validate 1.37.0 wheel; turn the CRDs kept in
#                         tests/fixtures/crds (Prometheus operator, KEDA) into JSON schemas;
#                         a venv with PyYAML for the checks. Idempotent, quick once done.
#   dev/helm.sh env       print the shell assignments of the tools' paths (eval "$(dev/helm.sh env)")
#
# tests/ops/helm.rs calls `install` (one at a time: a lock) and then runs the tools.
set -euo pipefail

DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$DEV")"
K8S="$DEV/.state/k8s"
BIN="$K8S/bin"
HELM_VER=v4.3.2
UNITTEST_VER=v1.1.2
KUBECONFORM_VER=v0.8.0
VALIDATE_VER=1.37.0
# The Kubernetes versions the rendered chart is validated against: the oldest we support and
# the newest the wheel carries.
KUBE_VERSIONS="1.31.0 1.37.0"

log() { echo "[helm] $*" >&2; }

install() {
  mkdir -p "$BIN"
  exec 9>"$K8S/install.lock"
  flock 9
  command -v go >/dev/null || { log "needs Go (the machine's go)"; exit 1; }
  if [ ! -x "$BIN/helm-$HELM_VER" ]; then
    log "building helm $HELM_VER from the Go module proxy (once)"
    GOBIN="$K8S/gobin" go install "helm.sh/helm/v4/cmd/helm@$HELM_VER"
    mv "$K8S/gobin/helm" "$BIN/helm-$HELM_VER"
  fi
  if [ ! -x "$BIN/kubeconform-$KUBECONFORM_VER" ]; then
    log "building kubeconform $KUBECONFORM_VER (once)"
    GOBIN="$K8S/gobin" go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VER"
    mv "$K8S/gobin/kubeconform" "$BIN/kubeconform-$KUBECONFORM_VER"
  fi
  if [ ! -x "$BIN/helm-unittest-$UNITTEST_VER" ]; then
    log "building helm-unittest $UNITTEST_VER (once)"
    # Its go.mod replaces a module, which `go install pkg@v` refuses: a module of our own
    # repeats the replacement. The binary runs on its own (helm's plugin runner not needed).
    local src="$K8S/unittest-src"
    mkdir -p "$src"
    (
      cd "$src"
      [ -f go.mod ] || go mod init outbox-dev-helm-unittest >/dev/null 2>&1
      go mod edit -replace github.com/vmware-labs/yaml-jsonpath@v0.3.2=github.com/helm-unittest/yaml-jsonpath@v0.4.0
      go get -tool "github.com/helm-unittest/helm-unittest/cmd/helm-unittest@$UNITTEST_VER" >/dev/null 2>&1
      go build -trimpath -o "$BIN/helm-unittest-$UNITTEST_VER.tmp" github.com/helm-unittest/helm-unittest/cmd/helm-unittest
    )
    mv "$BIN/helm-unittest-$UNITTEST_VER.tmp" "$BIN/helm-unittest-$UNITTEST_VER"
  fi
  if [ ! -x "$K8S/venv/bin/python" ] || ! "$K8S/venv/bin/python" -c 'import yaml' 2>/dev/null; then
    log "a venv with PyYAML (once)"
    python3 -m venv "$K8S/venv"
    "$K8S/venv/bin/pip" install -q 'PyYAML==6.0.3'
  fi
  local v
  for v in $KUBE_VERSIONS; do
    if [ ! -f "$K8S/schemas/v$v-local-strict/deployment-apps-v1.json" ] || grep -q '"\$id"' "$K8S/schemas/v$v-local-strict/configmap-v1.json"; then
      log "Kubernetes $v schemas from kubernetes-validate $VALIDATE_VER (PyPI)"
      local wheel="$K8S/wheel"
      mkdir -p "$wheel"
      ls "$wheel"/kubernetes_validate-"$VALIDATE_VER"-*.whl >/dev/null 2>&1 ||
        "$K8S/venv/bin/pip" download -q --no-deps -d "$wheel" "kubernetes-validate==$VALIDATE_VER"
      rm -rf "$K8S/unpack"
      mkdir -p "$K8S/unpack" "$K8S/schemas"
      (cd "$K8S/unpack" && unzip -q "$wheel"/kubernetes_validate-"$VALIDATE_VER"-*.whl "kubernetes_validate/kubernetes-json-schema/v$v-local-strict/*")
      "$K8S/venv/bin/python" "$DEV/k8s/k8s_schemas.py" "$K8S/unpack/kubernetes_validate/kubernetes-json-schema/v$v-local-strict"
      rm -rf "$K8S/schemas/v$v-local-strict"
      mv "$K8S/unpack/kubernetes_validate/kubernetes-json-schema/v$v-local-strict" "$K8S/schemas/"
      rm -rf "$K8S/unpack"
    fi
  done
  # The CRD schemas are regenerated each time: the fixtures may have changed.
  "$K8S/venv/bin/python" "$DEV/k8s/crd_schemas.py" "$ROOT/tests/fixtures/crds" "$K8S/crd-schemas"
  flock -u 9
}

env_vars() {
  echo "HELM=$BIN/helm-$HELM_VER"
  echo "HELM_UNITTEST=$BIN/helm-unittest-$UNITTEST_VER"
  echo "KUBECONFORM=$BIN/kubeconform-$KUBECONFORM_VER"
  echo "K8S_PYTHON=$K8S/venv/bin/python"
  echo "K8S_SCHEMAS=$K8S/schemas"
  echo "K8S_CRD_SCHEMAS=$K8S/crd-schemas"
  echo "K8S_VERSIONS=\"$KUBE_VERSIONS\""
}

case "${1:-}" in
  install) install ;;
  env) env_vars ;;
  *) echo "usage: dev/helm.sh install|env" >&2; exit 2 ;;
esac
