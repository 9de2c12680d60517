//! Schemas as a team runs them, against the real registry (`dev/registry.sh`: Apicurio's
//! Confluent-compatible API) and the real broker: the contract checked in the producing
//! transaction, the relay encoding Avro, Protobuf and JSON Schema in the Confluent wire
//! format, the consumer decoding them, and a registry that goes down and comes back.

mod cli;
mod contract;
mod edit;
mod interop;
mod outage;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::consumer::{Consumer, ConsumerConfig, Delivered, Handler, HandlerError};
use outbox::schemas::{Format, SchemaConfig, Schemas, SubjectNaming, TopicSchema};
use outbox_testkit::*;

/// Schemas for `topics` (each with its format, subject `<topic>-value`) at `url`.
pub fn schemas_for(url: &str, topics: &[(&str, Format)]) -> Schemas {
    let mut c = SchemaConfig::from_topics_toml(url, "").unwrap();
    for (t, f) in topics {
        c.topics.insert(
            (*t).to_owned(),
            TopicSchema {
                format: *f,
                naming: SubjectNaming::Topic,
            },
        );
    }
    Schemas::new(c).unwrap()
}

/// What a handler saw: (message_id, body, schema id).
pub type Seen = Arc<Mutex<Vec<(String, serde_json::Value, Option<u32>)>>>;

/// A handler that records what it is given.
pub struct Recorder(pub Seen);

impl Handler for Recorder {
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        _tx: &'a tokio_postgres::Transaction<'a>,
    ) -> futures::future::BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.0
                .lock()
                .unwrap()
                .push((msg.message_id.clone(), msg.body.clone(), msg.schema_id));
            Ok(())
        })
    }
}

/// Runs a consumer of `topic` (handler for `message_type`) until `stop` fires.
#[allow(clippy::type_complexity)]
pub fn run_consumer(
    db: &outbox::DbConfig,
    topic: &str,
    message_type: &str,
    schemas: Option<Schemas>,
) -> (
    Seen,
    Arc<outbox::consumer::ConsumerStats>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), outbox::consumer::ConsumerError>>,
) {
    let seen: Seen = Arc::default();
    let mut cfg = ConsumerConfig::new(format!("it-schemas-{}", hex(6)), [topic]);
    cfg.schemas = schemas;
    let consumer = Consumer::new(db, &kafka(), cfg)
        .unwrap()
        .handler(message_type, Recorder(seen.clone()));
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    (seen, stats, stop, h)
}

/// Waits for `n` handled messages.
pub async fn handled(stats: &outbox::consumer::ConsumerStats, n: u64) {
    wait_until(Duration::from_secs(60), "messages handled", || async {
        stats.handled.load(std::sync::atomic::Ordering::Relaxed) >= n
    })
    .await;
}

/// Runs a consumer of `topic` until `n` records were dead-lettered as undecodable, none
/// handled; the letters on `<topic>.dlq`.
pub async fn undecodable(
    db: &outbox::DbConfig,
    topic: &str,
    schemas: Option<Schemas>,
    n: u64,
) -> Vec<Record> {
    let (seen, stats, stop, h) = run_consumer(db, topic, "order_created", schemas);
    wait_until(
        Duration::from_secs(60),
        "records dead-lettered as undecodable",
        || async {
            stats
                .decode_errors
                .load(std::sync::atomic::Ordering::Relaxed)
                == n
        },
    )
    .await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert!(seen.lock().unwrap().is_empty(), "none handled");
    let letters = read_all(&format!("{topic}.dlq")).await;
    assert_eq!(letters.len() as u64, n);
    letters
}
