#!/usr/bin/env bash
# A throwaway local CA and a server certificate for 127.0.0.1/localhost, used by the dev
# Postgres (TLS) and the dev Kafka (SASL_SSL listener). Idempotent; files in dev/.state/tls
# (never committed). Clients verify against dev/.state/tls/ca.pem.
set -euo pipefail
DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="$DEV/.state/tls"
[ -f "$DIR/server.p12" ] && exit 0
mkdir -p "$DIR"
cd "$DIR"
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=outbox dev CA" \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
  -extfile server.ext -out server.pem 2>/dev/null
openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name server \
  -passout pass:changeit -out server.p12
chmod 600 server.key ca.key
echo "[tls] dev CA and server certificate created in $DIR" >&2
