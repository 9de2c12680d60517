#!/usr/bin/env bash
# The Python side of the interop tests: Confluent's own serializers (confluent-kafka with its
# Avro, Protobuf and JSON Schema extras: fastavro, protobuf, jsonschema) from PyPI, in a venv
# of their own. Idempotent; prints the venv's python.
set -euo pipefail
DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$DEV/.state/py-interop"
# The interop tests run in parallel and each calls this: one installs, the others wait for it
# (on a fresh machine they used to create the venv at once and fail with "File exists").
mkdir -p "$DEV/.state"
exec 9>"$DEV/.state/py-interop.lock"
flock 9
if ! "$VENV/bin/python" -c 'import confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.protobuf, confluent_kafka.schema_registry.json_schema' 2>/dev/null; then
  echo "[python] installing confluent-kafka with its schema extras (once)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'confluent-kafka[avro,protobuf,json]==2.16.1'
fi
echo "$VENV/bin/python"
