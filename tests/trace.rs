//! Trace context end to end: `examples/order_service` enqueues an order with a W3C
//! `traceparent`; the relay publishes it; the consumer's `outbox.handle` span names that trace
//! and that parent (captured here by a test subscriber layer).
//!
//! A binary of its own: the capturing subscriber is process-wide, and spans of other tests
//! running beside it would land in it.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::consumer::{BoxFuture, Consumer, ConsumerConfig, Delivered, Handler, HandlerError};
use outbox_testkit::*;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Span>>>);

/// A span's name and fields.
type Span = (String, HashMap<String, String>);

struct Fields<'a>(&'a mut HashMap<String, String>);
impl Visit for Fields<'_> {
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        self.0.insert(
            f.name().to_owned(),
            format!("{v:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.insert(f.name().to_owned(), v.to_owned());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: Context<'_, S>,
    ) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_owned(), fields));
    }
}

struct Charge;
impl Handler for Charge {
    fn handle<'a>(
        &'a self,
        _m: &'a Delivered,
        _tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_enqueued_by_order_service_is_the_parent_of_the_handler_span() {
    let spans = Spans::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
        .unwrap();
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;

    let out = Command::new(example_binary("order_service"))
        .arg("1")
        .env("DATABASE_URL", database_url())
        .env("OUTBOX_SCHEMA", db.schema.name())
        .env("ORDER_TOPIC", &topic)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tp = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("traceparent="))
        .expect("order_service prints the traceparent")
        .to_owned();
    let parts: Vec<&str> = tp.split('-').collect();
    let (trace_id, parent_id) = (parts[1].to_owned(), parts[2].to_owned());

    let relay = outbox::Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);
    let back = read_all(&topic).await;
    assert_eq!(
        back[0].headers["traceparent"], tp,
        "carried to Kafka as written"
    );

    let consumer = Consumer::new(
        &db,
        &kafka(),
        ConsumerConfig::new(format!("it-{}", hex(6)), [topic.clone()]),
    )
    .unwrap()
    .handler("order_created", Charge);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(Duration::from_secs(60), "the order handled", || async {
        outbox::consumer::ConsumerStats::get(&stats.handled) == 1
    })
    .await;
    let _ = stop.send(());
    task.await.unwrap().unwrap();

    let handle = spans
        .0
        .lock()
        .unwrap()
        .iter()
        .find(|(name, f)| name == "outbox.handle" && f.get("topic") == Some(&topic))
        .cloned()
        .expect("an outbox.handle span");
    assert_eq!(handle.1.get("trace_id"), Some(&trace_id), "{handle:?}");
    assert_eq!(handle.1.get("parent_id"), Some(&parent_id), "{handle:?}");
}
