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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_mid_run_loses_nothing_and_publishing_continues() {
    cluster(&["start"]);
    let db = fresh_db().await;
    let topic = topic_name();
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", CLUSTER)
        .create()
        .unwrap();
    admin
        .create_topics(
            &[
                NewTopic::new(&topic, 6, TopicReplication::Fixed(3))
                    .set("min.insync.replicas", "2"),
            ],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();

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
