# Source this for the local services' addresses:  . dev/env.sh
export DATABASE_URL="${DATABASE_URL:-postgres://outbox:outbox@127.0.0.1:5432/outbox}"
export KAFKA_BOOTSTRAP_SERVERS="${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:9092}"
export SCHEMA_REGISTRY_URL="${SCHEMA_REGISTRY_URL:-http://127.0.0.1:18081/apis/ccompat/v7}"
