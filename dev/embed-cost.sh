#!/usr/bin/env bash
# What embedding outbox costs a service that only enqueues, measured in one run.
#
# Builds the same enqueue-only program twice, each from a clean target directory in release
# mode: once with `outbox = { path = …, default-features = false }`, once with tokio-postgres +
# serde_json + uuid alone (the INSERT written by hand, as a service without us would). Prints
# one JSON line per build and one with the ratios; fails when a crate that only the relay, the
# consumer, the admin server or the CLI need (rdkafka, axum, hyper, clap, indicatif,
# tracing-subscriber) is in the lean tree.
#
# Usage: dev/embed-cost.sh [ROUNDS]   (default 1; builds alternate baseline/ours each round)
# Env:   EMBED_PROFILE=release|dev (default release), EMBED_FEATURES (extra outbox features, e.g. tls)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${1:-1}"
PROFILE="${EMBED_PROFILE:-release}"
FEATURES="${EMBED_FEATURES:-}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/outbox-embed.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

mk() { # name, dependencies, main.rs
  mkdir -p "$WORK/$1/src"
  cat >"$WORK/$1/Cargo.toml" <<EOF
[package]
name = "$1"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
tokio = { version = "1", features = ["rt", "macros"] }
serde_json = "1"
$2
EOF
  printf '%s\n' "$3" >"$WORK/$1/src/main.rs"
  # Same versions as the repository's lock file, so both builds compile the same crates.
  cp "$ROOT/Cargo.lock" "$WORK/$1/Cargo.lock"
}

feat=""
[ -n "$FEATURES" ] && feat=", features = [\"${FEATURES//,/\",\"}\"]"
mk ours "tokio-postgres = \"0.7\"
outbox = { path = \"$ROOT\", default-features = false$feat }" '
// One outbox::enqueue call in the service'"'"'s own transaction.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")?;
    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let tx = client.transaction().await?;
    let msg = outbox::Message::new("orders.created", "order_created", "A-1",
                                   serde_json::json!({"total": 1500}));
    outbox::enqueue(&tx, &msg).await?;
    tx.commit().await?;
    Ok(())
}'
mk baseline 'uuid = { version = "1", features = ["v7"] }
tokio-postgres = { version = "0.7", features = ["with-serde_json-1"] }' '
// The same event written by hand: no validation, no typed errors.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")?;
    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let tx = client.transaction().await?;
    let id = uuid::Uuid::now_v7().to_string();
    let headers = serde_json::json!({"message_type": "order_created", "entity_id": "A-1",
                                     "message_id": id});
    tx.execute("INSERT INTO outbox (topic, message_key, headers, payload) VALUES ($1, $2, $3, $4)",
               &[&"orders.created", &"A-1", &headers, &serde_json::json!({"total": 1500})]).await?;
    tx.commit().await?;
    Ok(())
}'

flag=(); [ "$PROFILE" = release ] && flag=(--release)
for p in baseline ours; do
  (cd "$WORK/$p" && cargo fetch -q)
done

FORBIDDEN='^(rdkafka|rdkafka-sys|axum|axum-core|hyper|clap|indicatif|tracing-subscriber|metrics-exporter-prometheus) '
crates() { (cd "$WORK/$1" && cargo tree -e normal --prefix none | sed 's/ (\*)$//; s/ (proc-macro)$//' | sort -u); }
for p in baseline ours; do
  crates "$p" >"$WORK/$p.crates"
done
if grep -E "$FORBIDDEN" "$WORK/ours.crates"; then
  echo "embed-cost: the lean outbox tree holds crates only the heavy parts need (above)" >&2
  exit 1
fi

declare -A total=([baseline]=0 [ours]=0)
for r in $(seq 1 "$ROUNDS"); do
  for p in baseline ours; do
    rm -rf "$WORK/$p/target"
    start=$(date +%s.%N)
    (cd "$WORK/$p" && CARGO_TARGET_DIR="$WORK/$p/target" cargo build -q "${flag[@]}")
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    total[$p]=$(echo "${total[$p]} + $secs" | bc)
    n=$(wc -l <"$WORK/$p.crates")
    printf '{"bench":"embed_cost","build":"%s","round":%d,"profile":"%s","crates":%d,"seconds":%.1f}\n' \
      "$p" "$r" "$PROFILE" "$n" "$secs"
  done
done
nb=$(wc -l <"$WORK/baseline.crates"); no=$(wc -l <"$WORK/ours.crates")
ratio=$(echo "scale=2; ${total[ours]} / ${total[baseline]}" | bc)
printf '{"bench":"embed_cost_ratio","rounds":%d,"profile":"%s","features":"%s","crates_ours":%d,"crates_baseline":%d,"build_time_ratio":%s,"target":1.5}\n' \
  "$ROUNDS" "$PROFILE" "$FEATURES" "$no" "$nb" "$ratio"
