//! A 3-broker KRaft cluster (RF 3, min.insync.replicas=2; `dev/kafka-cluster.sh`): one broker
//! is SIGKILLed mid-run, publishing with acks=all continues, and nothing is lost.
//!
//! A binary of its own, like `faults.rs`: it starts and kills brokers that other tests'
//! timings should not share the machine with.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use outbox_testkit::*;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};

/// One test at a time: each starts the cluster, kills a broker and stops it.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const CLUSTER: &str = "127.0.0.1:19092,127.0.0.1:19192,127.0.0.1:19292";

fn cluster(args: &[&str]) {
    let script = format!("{}/dev/kafka-cluster.sh", env!("CARGO_MANIFEST_DIR"));
    assert!(
        Command::new("bash")
            .arg(script)
            .args(args)
            .status()
            .unwrap()
            .success(),
        "kafka-cluster.sh {args:?}"
    );
}

/// `topic` on the cluster: 6 partitions, RF 3, `min.insync.replicas=2`.
async fn create_cluster_topic(topic: &str) {
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", CLUSTER)
        .create()
        .unwrap();
    admin
        .create_topics(
            &[NewTopic::new(topic, 6, TopicReplication::Fixed(3)).set("min.insync.replicas", "2")],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_mid_run_loses_nothing_and_publishing_continues() {
    let _serial = SERIAL.lock().await;
    cluster(&["start"]);
    let db = fresh_db().await;
    let topic = topic_name();
    create_cluster_topic(&topic).await;

    let kafka = outbox::KafkaConfig::new(CLUSTER).unwrap();
    let relay = outbox::Relay::new(&db, &kafka, relay_config()).unwrap();
    let running = spawn_relay(relay);
    let writer = {
        let (db, topic) = (db.clone(), topic.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..100 {
                ids.extend(enqueue_n(&db, &topic, 100, 500, 100).await);
                tokio::time::sleep(Duration::from_millis(80)).await;
            }
            ids
        })
    };
    let c = client(&db).await;
    let sent = || async { count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await };
    wait_until(Duration::from_secs(30), "publishing", || async {
        sent().await >= 2000
    })
    .await;

    cluster(&["kill", "2"]);
    let killed_at = Instant::now();
    let at_kill = sent().await;
    wait_until(
        Duration::from_secs(30),
        "publishing continues without broker 2",
        || async { sent().await >= at_kill + 2000 },
    )
    .await;
    let resumed_after = killed_at.elapsed();

    let ids = writer.await.unwrap();
    wait_until(Duration::from_secs(60), "every row sent", || async {
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await == 0
    })
    .await;
    running.stop().await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE attempts > 0").await,
        0,
        "no row refused"
    );

    let recs = read_all_from(CLUSTER, &topic).await;
    let got: HashSet<String> = recs.iter().map(Record::message_id).collect();
    let lost = ids.iter().filter(|i| !got.contains(*i)).count();
    eprintln!(
        "cluster: {} messages, broker 2 killed after {at_kill} sent, {} more sent within {resumed_after:?}, {} records, {lost} lost",
        ids.len(),
        2000,
        recs.len()
    );
    assert_eq!(lost, 0);
    cluster(&["stop"]); // frees ~1.5 GB for the rest of the suite
}

/// Exactly-once on the 3-broker cluster with one broker SIGKILLed mid-run (possibly the
/// transaction coordinator of some slots, or the leader of the progress partitions): each row
/// once to a `read_committed` reader, nothing lost, per-key order kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_with_a_broker_killed_mid_run() {
    let _serial = SERIAL.lock().await;
    cluster(&["start"]);
    let db = fresh_db().await;
    let topic = topic_name();
    create_cluster_topic(&topic).await;
    let kafka = outbox::KafkaConfig::new(CLUSTER).unwrap();
    let cfg = {
        let mut c = relay_config();
        c.delivery_timeout = Duration::from_secs(10);
        let mut eo = outbox::ExactlyOnce::default();
        eo.progress_topic = format!("{topic}.progress");
        eo.transaction_timeout = Duration::from_secs(15);
        c.exactly_once = Some(eo);
        c
    };
    let running = spawn_relay(outbox::Relay::new(&db, &kafka, cfg).unwrap());
    let writer = {
        let (db, topic) = (db.clone(), topic.clone());
        tokio::spawn(async move {
            let mut c = client(&db).await;
            let enq = outbox::Enqueuer::new(&db.schema);
            let mut ids = Vec::new();
            for round in 0..60 {
                let tx = c.transaction().await.unwrap();
                let msgs: Vec<outbox::Message> = (0..100)
                    .map(|i| {
                        let seq = round * 100 + i;
                        outbox::Message::new(
                            &topic,
                            "it_event",
                            format!("k{}", seq % 300),
                            serde_json::json!({"seq": seq}),
                        )
                    })
                    .collect();
                ids.extend(msgs.iter().map(|m| m.message_id().to_string()));
                enq.enqueue_batch(&tx, &msgs).await.unwrap();
                tx.commit().await.unwrap();
                tokio::time::sleep(Duration::from_millis(80)).await;
            }
            ids
        })
    };
    let c = client(&db).await;
    let sent = || async { count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await };
    wait_until(Duration::from_secs(60), "publishing", || async {
        sent().await >= 1000
    })
    .await;
    cluster(&["kill", "2"]);
    let at_kill = sent().await;
    wait_until(
        Duration::from_secs(60),
        "publishing continues without broker 2",
        || async { sent().await >= at_kill + 1000 },
    )
    .await;
    let ids: HashSet<String> = writer.await.unwrap().into_iter().collect();
    wait_until(Duration::from_secs(120), "every row sent", || async {
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await == 0
    })
    .await;
    running.stop().await;
    let d = delivery(CLUSTER, &topic, &ids).await;
    eprintln!("exactly-once, cluster, broker 2 killed after {at_kill} sent: {d:?}");
    assert_eq!(d.records, ids.len(), "{d:?}");
    assert!(d.exactly_once(), "{d:?}");
    cluster(&["stop"]);
}
