//! The spans in process, read back from the in-memory exporter: who opens which span, with what
//! parent, links and attributes, and a golden file of every span's name, kind and attributes.

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use outbox::consumer::{
    BoxFuture, Consumer, ConsumerConfig, ConsumerStats, Delivered, Handler, HandlerError,
    RetryStrategy,
};
use outbox::dlq::{Dlq, Filter, ReplayOptions};
use outbox::otel::TraceParenting;
use outbox::{Enqueuer, Message};
use outbox_testkit::*;
use tokio_util::sync::CancellationToken;

use super::{attr, exporter, is_root, spans_of, tp};

/// Messages whose transient failure already happened, and poison messages whose fix is
/// deployed (message ids: unique across the tests running beside each other).
static FAILED_ONCE: Mutex<Vec<String>> = Mutex::new(Vec::new());
static FIXED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// While set, `{"kind": "down"}` messages find their dependency unavailable.
static DOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// `{"kind": "ok" | "flaky" | "poison"}`: flaky fails once (transient), poison fails
/// (permanent) until its id is in `FIXED`.
struct Journey;
impl Handler for Journey {
    fn handle<'a>(
        &'a self,
        m: &'a Delivered,
        _tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            match m.json()["kind"].as_str() {
                Some("flaky") => {
                    let mut f = FAILED_ONCE.lock().unwrap();
                    if !f.contains(&m.message_id) {
                        f.push(m.message_id.clone());
                        return Err(HandlerError::transient("provider hiccup"));
                    }
                    Ok(())
                }
                Some("poison") if !FIXED.lock().unwrap().contains(&m.message_id) => {
                    Err(HandlerError::permanent("refusing a total as text"))
                }
                Some("down") if DOWN.load(std::sync::atomic::Ordering::SeqCst) => Err(
                    HandlerError::unavailable("loyalty-api", "connection refused"),
                ),
                _ => Ok(()),
            }
        })
    }
}

fn msg(topic: &str, kind: &str) -> Message {
    Message::new(
        topic,
        "journey",
        format!("k-{}", hex(6)),
        serde_json::json!({ "kind": kind }),
    )
}

/// `msgs` enqueued in one committed transaction.
async fn enqueue_committed(db: &outbox::DbConfig, msgs: &[Message]) {
    let mut c = client(db).await;
    let tx = c.transaction().await.unwrap();
    Enqueuer::new(&db.schema)
        .enqueue_batch(&tx, msgs)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// The `traceparent` stored with each row, by message id.
async fn stored(db: &outbox::DbConfig) -> Vec<(String, Option<String>, f64)> {
    let c = client(db).await;
    c.query(
        "SELECT headers->>'message_id', headers->>'traceparent', \
                extract(epoch FROM created_at)::float8 FROM outbox ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_spans_give_a_message_its_traceparent_only_when_the_caller_gave_none() {
    exporter();
    let db = fresh_db().await;
    let topic = topic_name();
    let outbox = Enqueuer::new(&db.schema);
    let mut c = client(&db).await;

    // tokio-postgres: one without a traceparent, one with the caller's own (odd case kept).
    let plain = msg(&topic, "ok");
    let callers = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let own = msg(&topic, "ok").with_header("traceparent", callers);
    // Inside a request span of the service: the create span is its child.
    let request = opentelemetry::global::tracer("test-service").start("POST /orders");
    let request_cx = opentelemetry::Context::current_with_span(request);
    let nested = msg(&topic, "ok");
    let tx = c.transaction().await.unwrap();
    outbox.enqueue(&tx, &plain).await.unwrap();
    outbox.enqueue(&tx, &own).await.unwrap();
    outbox
        .enqueue(&tx, &nested)
        .with_context(request_cx.clone())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let request_sc = request_cx.span().span_context().clone();
    request_cx.span().end();

    // sqlx: the same rule through the other driver.
    let pool = sqlx_pool(&db, 2).await;
    let via_sqlx = msg(&topic, "ok");
    let mut stx = pool.begin().await.unwrap();
    outbox.enqueue_sqlx(&mut *stx, &via_sqlx).await.unwrap();
    stx.commit().await.unwrap();

    let rows = stored(&db).await;
    let header = |m: &Message| {
        rows.iter()
            .find(|r| r.0 == m.message_id().to_string())
            .unwrap()
            .1
            .clone()
    };
    assert_eq!(
        header(&own).as_deref(),
        Some(callers),
        "the caller's header, byte for byte"
    );

    let creates: Vec<_> = spans_of(&topic)
        .into_iter()
        .filter(|s| s.name == format!("create {topic}"))
        .collect();
    assert_eq!(
        creates.len(),
        3,
        "one create span per message without a traceparent"
    );
    for m in [&plain, &nested, &via_sqlx] {
        let id = m.message_id().to_string();
        let s = creates
            .iter()
            .find(|s| attr(s, "messaging.message.id").as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no create span for {id}"));
        assert_eq!(s.span_kind, SpanKind::Producer);
        assert_eq!(
            attr(s, "messaging.operation.type").as_deref(),
            Some("create")
        );
        assert_eq!(attr(s, "messaging.system.name").as_deref(), Some("kafka"));
        assert_eq!(
            header(m),
            Some(tp(&s.span_context)),
            "the message carries its create span's context"
        );
        if m.message_id() == nested.message_id() {
            assert_eq!(
                s.parent_span_id,
                request_sc.span_id(),
                "child of the ambient span"
            );
            assert_eq!(s.span_context.trace_id(), request_sc.trace_id());
        } else {
            assert!(is_root(s));
        }
    }
    assert_eq!(
        creates[0].instrumentation_scope.schema_url(),
        Some(outbox::otel::SCHEMA_URL)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_sends_with_a_link_per_row_and_each_row_waits_from_created_at_to_its_ack() {
    exporter();
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 2).await;
    let oks: Vec<Message> = (0..5).map(|_| msg(&topic, "ok")).collect();
    enqueue_committed(&db, &oks).await;
    let relay = outbox::Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 5);
    let rows = stored(&db).await;
    let spans = spans_of(&topic);

    let sends: Vec<_> = spans
        .iter()
        .filter(|s| s.name == format!("send {topic}"))
        .collect();
    assert!(!sends.is_empty());
    let counted: i64 = sends
        .iter()
        .map(|s| {
            attr(s, "messaging.batch.message_count")
                .unwrap()
                .parse::<i64>()
                .unwrap()
        })
        .sum();
    assert_eq!(counted, 5, "every row counted in one send span");
    let linked: BTreeSet<String> = sends
        .iter()
        .flat_map(|s| s.links.links.iter().map(|l| tp(&l.span_context)))
        .collect();
    let created: BTreeSet<String> = rows.iter().map(|r| r.1.clone().unwrap()).collect();
    assert_eq!(linked, created, "one link per row, to its creation context");
    for s in &sends {
        assert_eq!(s.span_kind, SpanKind::Client);
        assert!(is_root(s));
        assert!(attr(s, "error.type").is_none());
    }

    let waits: Vec<_> = spans
        .iter()
        .filter(|s| s.name == format!("outbox wait {topic}"))
        .collect();
    assert_eq!(waits.len(), 5);
    for (id, traceparent, created_at) in &rows {
        let creation = traceparent.as_deref().unwrap();
        let w = waits
            .iter()
            .find(|w| tp(&w.span_context).split('-').nth(1) == creation.split('-').nth(1))
            .unwrap_or_else(|| panic!("no wait span in the trace of {id}"));
        assert_eq!(
            format!("{:016x}", w.parent_span_id),
            creation.split('-').nth(2).unwrap(),
            "a child of the creation context"
        );
        let start = w
            .start_time
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            (start - created_at).abs() < 0.002,
            "starts at created_at: {start} vs {created_at}"
        );
        assert!(w.end_time >= w.start_time);
        let to_send = &w.links.links[0].span_context;
        assert!(
            sends.iter().any(|s| same(&s.span_context, to_send)),
            "linked to the send span that published it"
        );
    }

    // A row the broker refuses (no such topic): the send span says why.
    let missing = topic_name();
    enqueue_committed(&db, &[msg(&missing, "ok")]).await;
    let _ = relay.run_once().await.unwrap();
    let refused = spans_of(&missing)
        .into_iter()
        .find(|s| s.name == format!("send {missing}"))
        .expect("a send span for the refused row");
    assert_eq!(
        attr(&refused, "error.type").as_deref(),
        Some("unknown_topic")
    );
    assert!(matches!(refused.status, Status::Error { .. }));
    assert!(
        !spans_of(&missing)
            .iter()
            .any(|s| s.name.starts_with("outbox wait")),
        "no wait span ends for a row that was not published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_batch_is_inside_its_kafka_transaction_span() {
    exporter();
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 2).await;
    let oks: Vec<Message> = (0..3).map(|_| msg(&topic, "ok")).collect();
    enqueue_committed(&db, &oks).await;
    let mut config = relay_config();
    let mut eo = outbox::ExactlyOnce::default();
    eo.progress_topic = format!("{topic}.progress");
    config.exactly_once = Some(eo);
    let relay = outbox::Relay::new(&db, &kafka(), config).unwrap();
    assert_eq!(drain(&relay).await, 3);
    let sends: Vec<_> = spans_of(&topic)
        .into_iter()
        .filter(|s| s.name == format!("send {topic}"))
        .collect();
    assert!(!sends.is_empty());
    let all = exporter().get_finished_spans().unwrap();
    for s in &sends {
        assert_eq!(attr(s, "outbox.transactional").as_deref(), Some("true"));
        let txn = all
            .iter()
            .find(|t| t.span_context.span_id() == s.parent_span_id)
            .expect("the send span's parent is exported");
        assert_eq!(txn.name, "kafka transaction");
        assert_eq!(
            attr(txn, "outbox.transaction.outcome").as_deref(),
            Some("commit")
        );
    }
}

/// Runs a `Journey` consumer with `config` until it handled `n` messages, then stops it.
async fn handle_all(db: &outbox::DbConfig, config: ConsumerConfig, n: u64) {
    let consumer = Consumer::new(db, &kafka(), config)
        .unwrap()
        .handler("journey", Journey);
    let stats = consumer.stats();
    let (stop, task) = run(consumer);
    wait_until(Duration::from_secs(60), "the messages handled", || async {
        ConsumerStats::get(&stats.handled) == n
    })
    .await;
    let _ = stop.send(());
    task.await.unwrap();
}

/// Starts `consumer` on a task; the returned closure stops it.
fn run(
    consumer: Consumer,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        consumer
            .run(async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_delivery_is_a_new_trace_linked_to_its_producer() {
    exporter();
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let m = msg(&topic, "ok");
    let c = client(&db).await;
    Enqueuer::new(&db.schema).enqueue(&c, &m).await.unwrap();
    let relay = outbox::Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);
    let config = ConsumerConfig::new(format!("it-{}", hex(6)), [topic.clone()]);
    assert_eq!(config.trace_parenting, TraceParenting::Link);
    handle_all(&db, config, 1).await;

    let creation = stored(&db).await[0].1.clone().unwrap();
    let p = spans_of(&topic)
        .into_iter()
        .find(|s| s.name == format!("process {topic}"))
        .expect("a process span");
    assert_eq!(p.span_kind, SpanKind::Consumer);
    assert!(is_root(&p), "a trace of its own");
    assert_ne!(
        tp(&p.span_context).split('-').nth(1),
        creation.split('-').nth(1)
    );
    assert_eq!(p.links.links.len(), 1);
    assert_eq!(tp(&p.links.links[0].span_context), creation);
    assert_eq!(attr(&p, "outbox.outcome").as_deref(), Some("handled"));
    assert_eq!(
        attr(&p, "messaging.message.id"),
        Some(m.message_id().to_string())
    );
    assert_eq!(attr(&p, "kafka.offset").as_deref(), Some("0"));
    assert_eq!(
        attr(&p, "messaging.destination.partition.id").as_deref(),
        Some("0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracestate_travels_with_its_traceparent_from_enqueue_to_the_relay_and_the_consumer() {
    // W3C trace context: a `traceparent`'s vendor entries (`tracestate`: a vendor's own ids,
    // a sampler's consistent-probability threshold) go wherever it goes. Dropped, the
    // relay's and the consumer's spans lost them.
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    exporter();
    // Random ids in hex (`hex` gives any lowercase alphanumerics).
    let ids = || {
        (
            format!("{:032x}", fastrand::u128(1..)),
            format!("{:016x}", fastrand::u64(1..)),
        )
    };
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let state = "vendor=a1b2,other=c3";
    // 1. The service's own context carries the state: the create span inherits it and the
    //    message gets both headers.
    let (trace, span) = ids();
    let ambient = SpanContext::new(
        TraceId::from_hex(&trace).unwrap(),
        SpanId::from_hex(&span).unwrap(),
        TraceFlags::SAMPLED,
        true,
        state.parse::<TraceState>().unwrap(),
    );
    let inherited = msg(&topic, "ok");
    // 2. The caller propagates by hand: both headers kept byte for byte.
    let (trace, span) = ids();
    let callers_tp = format!("00-{trace}-{span}-01");
    let by_hand = msg(&topic, "ok")
        .with_header("traceparent", &callers_tp)
        .with_header("tracestate", state);
    // 2b. A `tracestate` without its `traceparent`: it belongs to no context, and the
    //     generated one (no entries) does not take it.
    let orphan = msg(&topic, "ok").with_header("tracestate", "stray=1");
    // 3. A state that is not W3C: dropped, the traceparent still used.
    let (trace, span) = ids();
    let bad_tp = format!("00-{trace}-{span}-01");
    let bad = msg(&topic, "ok")
        .with_header("traceparent", &bad_tp)
        .with_header("tracestate", "=,no key");
    let mut c = client(&db).await;
    let tx = c.transaction().await.unwrap();
    let outbox = Enqueuer::new(&db.schema);
    outbox
        .enqueue(&tx, &inherited)
        .with_context(opentelemetry::Context::new().with_remote_span_context(ambient))
        .await
        .unwrap();
    outbox.enqueue(&tx, &by_hand).await.unwrap();
    outbox.enqueue(&tx, &bad).await.unwrap();
    outbox.enqueue(&tx, &orphan).await.unwrap();
    tx.commit().await.unwrap();
    let headers: Vec<(String, Option<String>, Option<String>)> = c
        .query(
            "SELECT headers->>'message_id', headers->>'traceparent', headers->>'tracestate' \
               FROM outbox ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(headers[0].2.as_deref(), Some(state), "inherited at create");
    assert_eq!(
        (headers[1].1.as_deref(), headers[1].2.as_deref()),
        (Some(callers_tp.as_str()), Some(state)),
        "the caller's, byte for byte"
    );
    assert!(headers[3].1.is_some(), "the orphan's traceparent generated");
    assert_eq!(
        headers[3].2, None,
        "a tracestate without its traceparent dropped"
    );
    let headers = &headers[..3];

    let relay = outbox::Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 4);
    let config = ConsumerConfig::new(format!("it-{}", hex(6)), [topic.clone()]);
    handle_all(&db, config, 4).await;

    let spans = spans_of(&topic);
    let trace_of = |tp: &str| tp.split('-').nth(1).unwrap().to_owned();
    for (id, traceparent, _) in headers {
        let creation = traceparent.as_deref().unwrap();
        let want = if creation == bad_tp { "" } else { state };
        // The relay's wait span is a child of the creation context: it inherits the state.
        let wait = spans
            .iter()
            .find(|s| {
                s.name == format!("outbox wait {topic}")
                    && format!("{:032x}", s.span_context.trace_id()) == trace_of(creation)
            })
            .unwrap_or_else(|| panic!("no wait span for {id}"));
        assert_eq!(
            wait.span_context.trace_state().header(),
            want,
            "wait of {id}"
        );
        // The send span's link and the consumer's link to the producer carry it.
        let linked = |s: &&opentelemetry_sdk::trace::SpanData| {
            s.links
                .links
                .iter()
                .find(|l| tp(&l.span_context) == creation)
                .map(|l| l.span_context.trace_state().header())
        };
        let send_link = spans
            .iter()
            .filter(|s| s.name == format!("send {topic}"))
            .find_map(|s| linked(&s))
            .unwrap_or_else(|| panic!("no send link for {id}"));
        assert_eq!(send_link, want, "send link of {id}");
        let process_link = spans
            .iter()
            .filter(|s| s.name == format!("process {topic}"))
            .find_map(|s| linked(&s))
            .unwrap_or_else(|| panic!("no process link for {id}"));
        assert_eq!(process_link, want, "process link of {id}");
    }
}

/// The same span (a link's context is remote, the span's own is not).
fn same(a: &opentelemetry::trace::SpanContext, b: &opentelemetry::trace::SpanContext) -> bool {
    a.trace_id() == b.trace_id() && a.span_id() == b.span_id()
}

/// One span's shape for the golden file: kind, name (the test's topic and group replaced),
/// attribute keys, and the values of the low-cardinality ones.
fn shape(s: &opentelemetry_sdk::trace::SpanData, topic: &str, group: &str) -> String {
    const VALUES: [&str; 7] = [
        "messaging.system.name",
        "messaging.operation.name",
        "messaging.operation.type",
        "outbox.outcome",
        "outbox.forward",
        "error.type",
        "outbox.link",
    ];
    let name = s.name.replace(group, "{group}").replace(topic, "{topic}");
    let mut keys: Vec<String> = s
        .attributes
        .iter()
        .map(|kv| {
            let k = kv.key.as_str();
            if VALUES.contains(&k) {
                format!("{k}={}", kv.value.as_str())
            } else {
                k.to_owned()
            }
        })
        .collect();
    keys.sort();
    let mut links: Vec<String> = s
        .links
        .links
        .iter()
        .map(|l| {
            l.attributes
                .iter()
                .map(|kv| match kv.key.as_str() {
                    "outbox.link" => format!("outbox.link={}", kv.value.as_str()),
                    k => k.to_owned(),
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    links.sort();
    links.dedup();
    format!(
        "{:?} {name:?} [{}] links:[{}]",
        s.span_kind,
        keys.join(" "),
        links.join("; ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_journey_with_a_retry_a_dead_letter_and_a_replay_is_one_trace_and_matches_the_golden_file(
) {
    exporter();
    let db = fresh_db().await;
    let topic = topic_name();
    let group = format!("it-{}", hex(6));
    create_topic_family(&topic, 1, &[&format!("{group}.retry-1s")]).await;
    let (ok, flaky, poison) = (
        msg(&topic, "ok"),
        msg(&topic, "flaky"),
        msg(&topic, "poison"),
    );
    enqueue_committed(&db, &[ok.clone(), flaky.clone()]).await;
    // The poison is enqueued in a request whose context carries a vendor's `tracestate`
    // (sampled): its create span inherits it, and its entries reach every span of its trace,
    // the replay's too.
    {
        use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId};
        let request = SpanContext::new(
            TraceId::from_hex(&format!("{:032x}", fastrand::u128(1..))).unwrap(),
            SpanId::from_hex(&format!("{:016x}", fastrand::u64(1..))).unwrap(),
            TraceFlags::SAMPLED,
            true,
            "vendor=p1".parse().unwrap(),
        );
        let c = client(&db).await;
        Enqueuer::new(&db.schema)
            .enqueue(&c, &poison)
            .with_context(opentelemetry::Context::new().with_remote_span_context(request))
            .await
            .unwrap();
    }
    let relay = outbox::Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 3);

    let mut config = ConsumerConfig::new(group.clone(), [topic.clone()]);
    config.trace_parenting = TraceParenting::Parent;
    config.retry = RetryStrategy::Topics {
        delays: vec![Duration::from_secs(1)],
    };
    let consumer = Consumer::new(&db, &kafka(), config)
        .unwrap()
        .handler("journey", Journey);
    let stats = consumer.stats();
    let (stop, task) = run(consumer);
    wait_until(
        Duration::from_secs(60),
        "ok and flaky handled, poison dead",
        || async {
            ConsumerStats::get(&stats.handled) == 2 && ConsumerStats::get(&stats.dead_lettered) == 1
        },
    )
    .await;

    // The poison's fix is deployed; its letter is archived and replayed.
    FIXED.lock().unwrap().push(poison.message_id().to_string());
    archive_once(&db, vec![format!("{topic}.dlq")]).await;
    let dlq = Dlq::new(&db);
    let f = Filter {
        topic: Some(topic.clone()),
        ..Filter::default()
    };
    let mut o = ReplayOptions::default();
    o.canary = 0;
    o.confirm_kinds = true;
    o.actor = "tester".into();
    let job = dlq.create_job(&f, &o).await.unwrap();
    dlq.run_job(&kafka(), job.id, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        "the replayed poison handled",
        || async { ConsumerStats::get(&stats.handled) == 3 },
    )
    .await;
    let _ = stop.send(());
    task.await.unwrap();

    let rows = stored(&db).await;
    let spans = spans_of(&topic);
    let trace_of = |m: &Message| {
        let creation = rows
            .iter()
            .find(|r| r.0 == m.message_id().to_string())
            .unwrap()
            .1
            .clone()
            .unwrap();
        let trace = creation.split('-').nth(1).unwrap().to_owned();
        let mut in_trace: Vec<_> = spans
            .iter()
            .filter(|s| format!("{:032x}", s.span_context.trace_id()) == trace)
            .cloned()
            .collect();
        in_trace.sort_by_key(|s| s.start_time);
        in_trace
    };
    let named = |spans: &[opentelemetry_sdk::trace::SpanData], name: String| {
        spans
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect::<Vec<_>>()
    };
    let retry_topic = format!("{topic}.{group}.retry-1s");

    // The flaky message: create → wait → process (retried) → send to the retry topic →
    // process on the retry topic (handled), linked back to the first delivery.
    let t = trace_of(&flaky);
    let create = named(&t, format!("create {topic}")).remove(0);
    assert_eq!(named(&t, format!("outbox wait {topic}")).len(), 1);
    let first = named(&t, format!("process {topic}")).remove(0);
    assert_eq!(attr(&first, "outbox.outcome").as_deref(), Some("retried"));
    assert_eq!(
        first.parent_span_id,
        create.span_context.span_id(),
        "parent mode"
    );
    let hop = named(&t, format!("send {retry_topic}")).remove(0);
    assert_eq!(hop.parent_span_id, first.span_context.span_id());
    assert_eq!(attr(&hop, "outbox.forward").as_deref(), Some("retry"));
    let second = named(&t, format!("process {retry_topic}")).remove(0);
    assert_eq!(attr(&second, "outbox.outcome").as_deref(), Some("handled"));
    assert_eq!(attr(&second, "outbox.retry.hop").as_deref(), Some("1"));
    assert!(
        second
            .links
            .links
            .iter()
            .any(|l| same(&l.span_context, &first.span_context)),
        "the retry's delivery links back to the first"
    );

    // The poison: process (dead letter, permanent) → send to the DLQ → replay (child of its
    // creation, linked to the delivery that dead-lettered it) → process (handled), linked
    // to the replay.
    let t = trace_of(&poison);
    let create = named(&t, format!("create {topic}")).remove(0);
    let deliveries = named(&t, format!("process {topic}"));
    assert_eq!(deliveries.len(), 2, "{t:#?}");
    let dead = &deliveries[0];
    assert_eq!(
        attr(dead, "outbox.outcome").as_deref(),
        Some("dead_lettered")
    );
    assert_eq!(attr(dead, "error.type").as_deref(), Some("permanent"));
    let letter = named(&t, format!("send {topic}.dlq")).remove(0);
    assert_eq!(letter.parent_span_id, dead.span_context.span_id());
    assert_eq!(
        attr(&letter, "outbox.forward").as_deref(),
        Some("dead_letter")
    );
    let replay = named(&t, format!("replay {topic}")).remove(0);
    assert_eq!(replay.parent_span_id, create.span_context.span_id());
    assert!(replay
        .links
        .links
        .iter()
        .any(|l| same(&l.span_context, &dead.span_context)));
    let comeback = &deliveries[1];
    assert_eq!(attr(comeback, "outbox.outcome").as_deref(), Some("handled"));
    for s in [dead, &replay, comeback] {
        assert_eq!(
            s.span_context.trace_state().header(),
            "vendor=p1",
            "{} keeps the poison's tracestate",
            s.name
        );
    }
    assert!(comeback
        .links
        .links
        .iter()
        .any(|l| same(&l.span_context, &replay.span_context)));

    // The golden file: every span of the journey by name, kind and attributes.
    let mut all: BTreeSet<String> = spans.iter().map(|s| shape(s, &topic, &group)).collect();
    let commits: HashSet<String> = exporter()
        .get_finished_spans()
        .unwrap()
        .iter()
        .filter(|s| {
            s.name == "commit" && attr(s, "messaging.consumer.group.name") == Some(group.clone())
        })
        .map(|s| shape(s, &topic, &group))
        .collect();
    assert!(!commits.is_empty(), "the offsets' commit has a span");
    all.extend(commits);
    let got: String = all.into_iter().map(|l| l + "\n").collect();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otel/golden.txt");
    if std::env::var("OUTBOX_BLESS_OTEL").is_ok() {
        std::fs::write(path, &got).unwrap();
    }
    let want = std::fs::read_to_string(path).unwrap();
    assert_eq!(
        got, want,
        "the spans differ from tests/otel/golden.txt (OUTBOX_BLESS_OTEL=1 to accept a deliberate change)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_delivery_and_its_drain_after_the_breaker_closes_are_linked() {
    exporter();
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let m = msg(&topic, "down");
    let c = client(&db).await;
    Enqueuer::new(&db.schema).enqueue(&c, &m).await.unwrap();
    let relay = outbox::Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);
    let mut config = ConsumerConfig::new(format!("it-{}", hex(6)), [topic.clone()]);
    config.trace_parenting = TraceParenting::Parent;
    config.breaker = Some({
        let mut b = outbox::consumer::BreakerConfig::default();
        b.check_interval = Duration::from_secs(1);
        b.open_for = Duration::from_millis(1500);
        b.attempts = 2;
        b.retry_delay = Duration::from_millis(100);
        b
    });
    let consumer = Consumer::new(&db, &kafka(), config)
        .unwrap()
        .handler("journey", Journey);
    let (stop, task) = run(consumer);
    let parked = || {
        spans_of(&topic).into_iter().find(|s| {
            s.name == format!("process {topic}")
                && attr(s, "outbox.outcome").as_deref() == Some("parked")
        })
    };
    wait_until(Duration::from_secs(60), "the message parked", || async {
        parked().is_some()
    })
    .await;
    DOWN.store(false, std::sync::atomic::Ordering::SeqCst);
    let drained = || {
        spans_of(&topic).into_iter().find(|s| {
            attr(s, "outbox.drain").as_deref() == Some("true")
                && attr(s, "outbox.outcome").as_deref() == Some("handled")
        })
    };
    wait_until(
        Duration::from_secs(90),
        "the parked letter drained",
        || async { drained().is_some() },
    )
    .await;
    let _ = stop.send(());
    task.await.unwrap();

    let parked = parked().unwrap();
    assert_eq!(attr(&parked, "error.type").as_deref(), Some("unavailable"));
    assert_eq!(
        parked.events.events.len(),
        1,
        "one in-place retry before the breaker opened"
    );
    let spans = spans_of(&topic);
    let park = spans
        .iter()
        .find(|s| s.name == format!("send {topic}.dlq"))
        .expect("the park's send span");
    assert_eq!(attr(park, "outbox.forward").as_deref(), Some("park"));
    assert_eq!(park.parent_span_id, parked.span_context.span_id());
    let drained = &drained().unwrap();
    assert_eq!(
        drained.span_context.trace_id(),
        parked.span_context.trace_id()
    );
    assert!(
        drained
            .links
            .links
            .iter()
            .any(|l| same(&l.span_context, &parked.span_context)),
        "the drained delivery links back to the parked one"
    );
}
