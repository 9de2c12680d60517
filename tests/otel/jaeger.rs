//! The binaries as a team runs them, exporting over OTLP/HTTP with nothing but the standard
//! `OTEL_*` variables, into Jaeger (`dev/jaeger.sh start`, which `dev/test.sh` runs); then
//! Jaeger's query API is asked for one event's trace.
//!
//! Every process runs with `OTEL_BSP_SCHEDULE_DELAY` of ten minutes: its spans can only reach
//! Jaeger through the flush at shutdown (SIGTERM for the relay and the consumer).

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_testkit::*;
use serde_json::Value;

fn otlp_endpoint() -> String {
    std::env::var("OUTBOX_TEST_OTLP_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:14318".into())
}

fn query_url() -> String {
    std::env::var("OUTBOX_TEST_JAEGER_QUERY").unwrap_or_else(|_| "http://127.0.0.1:16686".into())
}

/// The OTEL_* variables of one process, named `service`.
fn traced(c: &mut Command, service: &str) {
    c.env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint())
        .env("OTEL_SERVICE_NAME", service)
        .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_SAMPLER");
}

fn sigterm(child: &std::process::Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// Waits (bounded) for a SIGTERMed child to exit 0.
async fn exits_0(mut k: Kill, what: &str) -> String {
    sigterm(&k.0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = k.0.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = k.0.stderr.take() {
                use std::io::Read as _;
                let _ = e.read_to_string(&mut err);
            }
            assert!(status.success(), "{what} exited {status}: {err}");
            return err;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One span as Jaeger's query API gives it.
#[derive(Debug, Clone)]
struct JSpan {
    id: String,
    trace: String,
    service: String,
    /// The process's (resource's) tags.
    process: HashMap<String, String>,
    name: String,
    tags: HashMap<String, String>,
    /// (refType, traceID, spanID)
    refs: Vec<(String, String, String)>,
    start: u64,
}

fn tag(t: &Value) -> (String, String) {
    let v = match &t["value"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    (t["key"].as_str().unwrap().to_owned(), v)
}

async fn trace(id: &str) -> Vec<JSpan> {
    let url = format!("{}/api/traces/{id}", query_url());
    let Ok(resp) = reqwest::get(&url).await else {
        return Vec::new();
    };
    let Ok(v) = resp.json::<Value>().await else {
        return Vec::new();
    };
    let Some(t) = v["data"].get(0) else {
        return Vec::new();
    };
    let mut spans: Vec<JSpan> = t["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| JSpan {
            id: s["spanID"].as_str().unwrap().to_owned(),
            trace: s["traceID"].as_str().unwrap().to_owned(),
            service: t["processes"][s["processID"].as_str().unwrap()]["serviceName"]
                .as_str()
                .unwrap()
                .to_owned(),
            process: t["processes"][s["processID"].as_str().unwrap()]["tags"]
                .as_array()
                .map(|tags| tags.iter().map(tag).collect())
                .unwrap_or_default(),
            name: s["operationName"].as_str().unwrap().to_owned(),
            tags: s["tags"].as_array().unwrap().iter().map(tag).collect(),
            refs: s["references"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["refType"].as_str().unwrap().to_owned(),
                        r["traceID"].as_str().unwrap().to_owned(),
                        r["spanID"].as_str().unwrap().to_owned(),
                    )
                })
                .collect(),
            start: s["startTime"].as_u64().unwrap(),
        })
        .collect();
    spans.sort_by_key(|s| s.start);
    spans
}

/// Polls Jaeger (bounded) until the trace holds every span `want` names.
async fn trace_with(id: &str, want: &[&str]) -> Vec<JSpan> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let spans = trace(id).await;
        if want.iter().all(|w| spans.iter().any(|s| s.name == *w)) {
            return spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "trace {id} lacks some of {want:?}: {:#?}",
            spans
                .iter()
                .map(|s| (&s.service, &s.name))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn one<'a>(spans: &'a [JSpan], name: &str) -> &'a JSpan {
    let all: Vec<&JSpan> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(all.len(), 1, "one {name}: {all:#?}");
    all[0]
}

fn child_of(s: &JSpan, parent: &JSpan) -> bool {
    s.refs
        .iter()
        .any(|(t, tr, id)| t == "CHILD_OF" && *tr == parent.trace && *id == parent.id)
}

fn links_to(s: &JSpan, other: &JSpan) -> bool {
    s.refs
        .iter()
        .any(|(t, tr, id)| t == "FOLLOWS_FROM" && *tr == other.trace && *id == other.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_events_journey_is_one_trace_in_jaeger_retry_dead_letter_and_replay_included() {
    let up = reqwest::get(format!("{}/api/services", query_url())).await;
    assert!(
        up.is_ok_and(|r| r.status().is_success()),
        "Jaeger is not answering at {} (start it with dev/jaeger.sh start)",
        query_url()
    );
    let db = fresh_db().await;
    let topic = topic_name();
    let run = hex(8);
    let group = format!("billing-{run}");
    create_topic_family(&topic, 1, &[&format!("{group}.retry-1s")]).await;
    let schema = db.schema.name().to_owned();
    let base = |c: &mut Command| {
        c.env("DATABASE_URL", database_url())
            .env("OUTBOX_SCHEMA", &schema)
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .env("RUST_LOG", "info");
    };

    // The order service: two orders and one poison event, each under its request's span.
    let mut c = Command::new(example_binary("order_service"));
    c.arg("2")
        .env("ORDER_TOPIC", &topic)
        .env("ORDER_POISON", "1");
    base(&mut c);
    traced(&mut c, &format!("order-service-{run}"));
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A caller's own traceparent (no export in this process): it must become the parent.
    let mut c = Command::new(example_binary("order_service"));
    c.arg("1").env("ORDER_TOPIC", &topic);
    base(&mut c);
    let out = c.output().unwrap();
    assert!(out.status.success());
    let callers_tp = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("traceparent="))
        .unwrap()
        .to_owned();

    let mut r = outbox_command(&db);
    r.arg("relay").stderr(Stdio::piped()).stdout(Stdio::null());
    traced(&mut r, &format!("relay-{run}"));
    let relay = Kill(r.spawn().unwrap());
    let billing = |extra: &[(&str, &str)]| {
        let mut b = Command::new(example_binary("billing_consumer"));
        b.env("BILLING_TOPIC", &topic)
            .env("BILLING_GROUP", &group)
            .env("BILLING_RETRY_TOPICS", "1s")
            .env("BILLING_TRACE_PARENTING", "parent")
            // One at a time, in offset order: the first order is the flaky one.
            .env("BILLING_CONCURRENCY", "1")
            .stderr(Stdio::piped())
            .stdout(Stdio::null());
        base(&mut b);
        traced(&mut b, &format!("billing-{run}"));
        for (k, v) in extra {
            b.env(k, v);
        }
        Kill(b.spawn().unwrap())
    };
    let consumer = billing(&[("BILLING_FLAKY", "1")]);
    let c = client(&db).await;
    wait_until(
        Duration::from_secs(90),
        "3 charges and 1 dead letter",
        || async {
            let charged = c
                .query_one("SELECT count(*) FROM charges", &[])
                .await
                .map_or(0, |r| r.get::<_, i64>(0));
            charged == 3 && topic_len(&format!("{topic}.dlq")).await == 1
        },
    )
    .await;

    // The operator archives the dead letter and replays it (the fix is not deployed: it is
    // dead-lettered again, and that too is in the trace).
    let mut a = outbox_command(&db);
    a.args([
        "dlq",
        "archive",
        "--once",
        "--topic",
        &format!("{topic}.dlq"),
    ]);
    traced(&mut a, &format!("dlq-{run}"));
    let out = a.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut p = outbox_command(&db);
    p.args([
        "dlq",
        "replay",
        "--topic",
        &topic,
        "--canary",
        "0",
        "--confirm-kinds",
    ]);
    traced(&mut p, &format!("dlq-{run}"));
    let out = p.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(
        Duration::from_secs(60),
        "the replayed letter dead-lettered again",
        || async { topic_len(&format!("{topic}.dlq")).await == 2 },
    )
    .await;
    // (The example logs to standard output; its spans in Jaeger are the proof it exported.)
    exits_0(consumer, "billing_consumer").await;
    let relay_log = exits_0(relay, "outbox relay").await;
    assert!(
        relay_log.contains("exporting OpenTelemetry spans"),
        "{relay_log}"
    );

    // Each event's trace id, from the traceparent its record carries.
    let records = read_all(&topic).await;
    let of = |pred: &dyn Fn(&Record) -> bool| -> Vec<String> {
        records
            .iter()
            .filter(|r| pred(r))
            .map(|r| {
                r.headers["traceparent"]
                    .split('-')
                    .nth(1)
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    let poison = of(&|r| r.json().get("total").is_some());
    let orders = of(&|r| r.json().get("total_cents").is_some());
    // Three orders (two traced here, one with its caller's context), one poison, and the
    // poison again (its replay).
    assert_eq!((orders.len(), poison.len()), (3, 2), "{records:?}");
    assert_eq!(poison[0], poison[1], "a replay keeps the event's trace");

    let (main, retry, dlq) = (
        format!("process {topic}"),
        format!("process {topic}.{group}.retry-1s"),
        format!("send {topic}.dlq"),
    );
    let create = format!("create {topic}");
    let wait = format!("outbox wait {topic}");

    // The flaky order: its trace holds the whole story.
    let mut flaky = None;
    for t in &orders[..2] {
        let spans = trace_with(t, &["place order", &create, &wait, &main]).await;
        if spans.iter().any(|s| s.name == retry) {
            flaky = Some(spans);
        }
    }
    let spans = flaky.expect("one order went through the retry topic");
    let request = one(&spans, "place order");
    let created = one(&spans, &create);
    assert!(child_of(created, request));
    assert_eq!(created.service, format!("order-service-{run}"));
    assert_eq!(
        created
            .process
            .get("deployment.environment")
            .map(String::as_str),
        Some("test"),
        "OTEL_RESOURCE_ATTRIBUTES reach the process's resource"
    );
    let waited = one(&spans, &wait);
    assert!(child_of(waited, created));
    assert_eq!(waited.service, format!("relay-{run}"));
    let first = one(&spans, &main);
    assert_eq!(first.tags["outbox.outcome"], "retried");
    assert_eq!(first.service, format!("billing-{run}"));
    assert!(child_of(first, created));
    let hop = one(&spans, &format!("send {topic}.{group}.retry-1s"));
    assert!(child_of(hop, first));
    let second = one(&spans, &retry);
    assert_eq!(second.tags["outbox.outcome"], "handled");
    assert!(
        links_to(second, first),
        "the retry links back to the first delivery"
    );
    // The batch's send span, in the relay's own trace, linked from the wait span and
    // linking back to the event's creation.
    let (_, send_trace, send_id) = waited
        .refs
        .iter()
        .find(|r| r.0 == "FOLLOWS_FROM")
        .expect("the wait span links to its send span")
        .clone();
    let sends = trace_with(&send_trace, &[&format!("send {topic}")]).await;
    let send = sends
        .iter()
        .find(|s| s.id == send_id)
        .expect("the send span");
    assert_eq!(send.tags["span.kind"], "client");
    assert!(links_to(send, created), "send links to the row's creation");
    assert!(send.tags.contains_key("messaging.batch.message_count"));

    // The poison: dead letter, replay, and its processing after the replay.
    let spans = trace_with(
        &poison[0],
        &[&create, &main, &dlq, &format!("replay {topic}")],
    )
    .await;
    let deliveries: Vec<&JSpan> = spans.iter().filter(|s| s.name == main).collect();
    assert_eq!(deliveries.len(), 2, "{spans:#?}");
    assert_eq!(deliveries[0].tags["outbox.outcome"], "dead_lettered");
    assert_eq!(deliveries[0].tags["error.type"], "permanent");
    let replay = one(&spans, &format!("replay {topic}"));
    assert_eq!(replay.service, format!("dlq-{run}"));
    assert!(
        links_to(replay, deliveries[0]),
        "the replay links to the dead-lettering delivery"
    );
    assert!(
        links_to(deliveries[1], replay),
        "the comeback links to its replay"
    );
    assert_eq!(spans.iter().filter(|s| s.name == dlq).count(), 2);

    // The caller's own traceparent: the consumer's span is its child, in its trace.
    let parts: Vec<&str> = callers_tp.split('-').collect();
    let spans = trace_with(parts[1], &[&main]).await;
    let p = one(&spans, &main);
    assert!(
        p.refs
            .iter()
            .any(|(t, _, id)| t == "CHILD_OF" && id == parts[2]),
        "{p:#?}"
    );
    assert!(
        !spans.iter().any(|s| s.name == create),
        "no create span for a caller's context"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_costs_one_warning_never_an_event() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let mut r = outbox_command(&db);
    r.arg("relay").stderr(Stdio::piped()).stdout(Stdio::null());
    traced(&mut r, "relay-unreachable");
    // A closed loopback port, exports attempted every 100 ms.
    r.env(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://tenant:s3cret-pw@127.0.0.1:{}", free_port()),
    )
    // An API key header: no more than the endpoint's password may it reach the log.
    .env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k3y-s3cret")
    .env("OTEL_BSP_SCHEDULE_DELAY", "100")
    .env("OTEL_EXPORTER_OTLP_TIMEOUT", "1000");
    let relay = Kill(r.spawn().unwrap());
    let c = client(&db).await;
    let outbox = outbox::Enqueuer::new(&db.schema);
    for round in 0..4 {
        for i in 0..50 {
            let m =
                outbox::Message::new(&topic, "t", format!("k{round}-{i}"), serde_json::json!({}));
            outbox.enqueue(&c, &m).await.unwrap();
        }
        // Spread over several export attempts.
        wait_until(Duration::from_secs(60), "this round published", || async {
            topic_len(&topic).await == 50 * (round + 1)
        })
        .await;
    }
    let log = exits_0(relay, "outbox relay").await;
    assert_eq!(topic_len(&topic).await, 200, "every event published");
    assert!(
        !log.contains("s3cret-pw") && !log.contains("k3y-s3cret"),
        "a secret in the log: {log}"
    );
    let warnings = log.matches("OTLP export failed").count();
    assert_eq!(
        warnings, 1,
        "one warning a minute, not one per batch: {log}"
    );
}

#[test]
fn an_unsupported_otlp_protocol_is_refused_with_exit_code_2() {
    let out = Command::new(outbox_bin())
        .args(["status"])
        .env("DATABASE_URL", database_url())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("http/protobuf"), "{err}");
    // And OTEL_SDK_DISABLED wins over an endpoint: no exporter, the command runs.
    let mut child = Command::new(outbox_bin())
        .args(["hash-token"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_SDK_DISABLED", "true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"a-token-long-enough-for-the-server\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
