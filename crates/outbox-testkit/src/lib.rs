#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

#[cfg(feature = "relay")]
use outbox::RelayConfig;
use outbox::{DbConfig, KafkaConfig};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

mod enqueued;
#[cfg(feature = "relay")]
mod relayed;

#[cfg(feature = "sqlx")]
pub use enqueued::enqueued_sqlx;
pub use enqueued::{enqueued, only, Enqueued};
/// The handler harness (no broker): [`outbox::consumer::Consumer::harness`].
#[cfg(feature = "consumer")]
pub use outbox::consumer::{Harness, Verdict, Written};
#[cfg(feature = "relay")]
pub use relayed::relay_once;

/// `DATABASE_URL`, or the dev Postgres on loopback.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://outbox:outbox@127.0.0.1:5432/outbox".into())
}

/// `KAFKA_BOOTSTRAP_SERVERS`, or the dev broker on loopback.
pub fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// The schema registry's Confluent-compatible API (`SCHEMA_REGISTRY_URL`, as `dev/env.sh`
/// sets it; `dev/registry.sh` serves it).
pub fn registry_url() -> String {
    std::env::var("SCHEMA_REGISTRY_URL")
        .unwrap_or_else(|_| "http://127.0.0.1:18081/apis/ccompat/v7".into())
}

/// `n` random lowercase alphanumerics, for unique schema, topic and group names.
pub fn hex(n: usize) -> String {
    (0..n)
        .map(|_| fastrand::alphanumeric().to_ascii_lowercase())
        .collect()
}

/// A fresh, migrated schema.
pub async fn fresh_db() -> DbConfig {
    let db = DbConfig::new(&database_url(), &format!("t_{}", hex(12))).unwrap();
    outbox::migrate(&db)
        .await
        .expect("migrate (is dev/postgres.sh start running?)");
    db
}

/// A client with `search_path` set to the test schema.
pub async fn client(db: &DbConfig) -> tokio_postgres::Client {
    let c = outbox::connect(db).await.unwrap();
    c.batch_execute(&format!("SET search_path TO {}", db.schema.quoted()))
        .await
        .unwrap();
    c
}

#[cfg(feature = "sqlx")]
/// An sqlx pool of at most `max` connections whose `search_path` is the test schema, then
/// `public` (what a service's pool looks like when its tables live next to the outbox's).
pub async fn sqlx_pool(db: &DbConfig, max: u32) -> sqlx::PgPool {
    use std::str::FromStr as _;
    let opts = sqlx::postgres::PgConnectOptions::from_str(&database_url())
        .expect("DATABASE_URL")
        .options([("search_path", format!("{},public", db.schema.quoted()))]);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .connect_with(opts)
        .await
        .expect("sqlx pool (is dev/postgres.sh start running?)")
}

/// Kafka settings for the dev broker.
pub fn kafka() -> KafkaConfig {
    KafkaConfig::new(&bootstrap()).unwrap()
}

/// A topic name no other test uses: `it.<random>.created`.
pub fn topic_name() -> String {
    format!("it.{}.created", hex(10))
}

/// Creates `name` with `partitions` partitions (replication 1).
pub async fn create_topic(name: &str, partitions: i32) {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap());
    let admin: AdminClient<DefaultClientContext> = cfg.create().unwrap();
    let res = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("create topic (is dev/kafka.sh start running?)");
    for r in res {
        r.expect("topic created");
    }
}

#[cfg(feature = "relay")]
/// A relay config for tests: quick polling, no cleanup schedule.
pub fn relay_config() -> RelayConfig {
    {
        let mut c = RelayConfig::default();
        c.poll_interval = Duration::from_millis(50);
        c.delivery_timeout = Duration::from_secs(20);
        c.shutdown_timeout = Duration::from_secs(10);
        c.cleanup = {
            let mut cc = outbox::CleanupConfig::default();
            cc.interval = None;
            cc
        };
        c
    }
}

/// One record read back from Kafka.
#[derive(Debug, Clone)]
pub struct Record {
    /// Topic read.
    pub topic: String,
    /// Partition read.
    pub partition: i32,
    /// Offset read.
    pub offset: i64,
    /// The key.
    pub key: Option<Vec<u8>>,
    /// The UTF-8 headers by name (the last value of a repeated name).
    pub headers: BTreeMap<String, String>,
    /// Every header in order, values as bytes.
    pub raw_headers: Vec<(String, Option<Vec<u8>>)>,
    /// The value.
    pub payload: Vec<u8>,
    /// The record's timestamp.
    pub timestamp_ms: Option<i64>,
}

impl Record {
    /// The value parsed as JSON (panics when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).unwrap()
    }
    /// The `message_id` header.
    pub fn message_id(&self) -> String {
        self.headers.get("message_id").cloned().unwrap_or_default()
    }
}

fn consumer() -> BaseConsumer {
    consumer_on(&bootstrap())
}

fn consumer_on(servers: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", format!("it-reader-{}", hex(8)))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .unwrap()
}

/// Total messages in the topic (sum of high watermarks).
pub async fn topic_len(topic: &str) -> i64 {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let c = consumer();
        let md = c
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .unwrap();
        let mut n = 0;
        for p in md.topics()[0].partitions() {
            let (lo, hi) = c
                .fetch_watermarks(&topic, p.id(), Duration::from_secs(10))
                .unwrap();
            n += hi - lo;
        }
        n
    })
    .await
    .unwrap()
}

/// A topic's record count (sum of high watermarks) read on one client kept open, for looking
/// often: [`topic_len`] opens a client per call, which costs the broker a connection and the
/// caller a client's threads each time (50 looks a second are measurable in a bench).
pub struct TopicCounter {
    consumer: std::sync::Arc<BaseConsumer>,
    topic: String,
    partitions: Vec<i32>,
}

impl TopicCounter {
    /// A counter of `topic` (which must exist).
    pub async fn new(topic: &str) -> Self {
        let t = topic.to_owned();
        let (consumer, partitions) = tokio::task::spawn_blocking(move || {
            let c = consumer();
            let md = c.fetch_metadata(Some(&t), Duration::from_secs(10)).unwrap();
            let partitions = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
            (c, partitions)
        })
        .await
        .unwrap();
        Self {
            consumer: std::sync::Arc::new(consumer),
            topic: topic.to_owned(),
            partitions,
        }
    }

    /// Total records in the topic now.
    pub async fn records(&self) -> i64 {
        let (c, topic, partitions) = (
            self.consumer.clone(),
            self.topic.clone(),
            self.partitions.clone(),
        );
        tokio::task::spawn_blocking(move || {
            partitions
                .iter()
                .map(|p| {
                    let (lo, hi) = c
                        .fetch_watermarks(&topic, *p, Duration::from_secs(10))
                        .unwrap();
                    hi - lo
                })
                .sum()
        })
        .await
        .unwrap()
    }
}

/// Every record currently in the topic (up to the high watermarks read at the start).
pub async fn read_all(topic: &str) -> Vec<Record> {
    read_all_from(&bootstrap(), topic).await
}

/// As [`read_all`], from another cluster.
pub async fn read_all_from(servers: &str, topic: &str) -> Vec<Record> {
    let topic = topic.to_owned();
    let servers = servers.to_owned();
    tokio::task::spawn_blocking(move || {
        let c = consumer_on(&servers);
        let md = c
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        let mut remaining = BTreeMap::new();
        for p in md.topics()[0].partitions() {
            let (lo, hi) = c
                .fetch_watermarks(&topic, p.id(), Duration::from_secs(10))
                .unwrap();
            if hi > lo {
                tpl.add_partition_offset(&topic, p.id(), Offset::Offset(lo))
                    .unwrap();
                remaining.insert(p.id(), hi);
            }
        }
        let mut out = Vec::new();
        if remaining.is_empty() {
            return out;
        }
        c.assign(&tpl).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !remaining.is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out reading {topic}"
            );
            let Some(m) = c.poll(Duration::from_millis(200)) else {
                continue;
            };
            // Errors here are client events (e.g. a dead broker of the cluster test refusing
            // connections), not lost records: keep reading until the watermarks or the deadline.
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("read_all: {e} (continuing)");
                    continue;
                }
            };
            out.push(record_of(&m));
            if let Some(hi) = remaining.get(&m.partition()) {
                if m.offset() + 1 >= *hi {
                    remaining.remove(&m.partition());
                }
            }
        }
        out
    })
    .await
    .unwrap()
}

/// Moves `group`'s committed offsets of `topic`'s partitions `0..partitions` back to 0 — what
/// a consumer that died before committing leaves — so the group's next consumer redelivers
/// everything it had handled.
pub async fn rewind_group(group: &str, topic: &str, partitions: i32) {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&topic, p, Offset::Offset(0))
                .unwrap();
        }
        c.commit(&tpl, rdkafka::consumer::CommitMode::Sync).unwrap();
    })
    .await
    .unwrap();
}

/// Every record a `read_committed` consumer sees in the topic, read to the end of each
/// partition: records of aborted (or still open) Kafka transactions are not among them.
pub async fn read_committed(topic: &str) -> Vec<Record> {
    read_committed_from(&bootstrap(), topic).await
}

/// What a `read_committed` reader found in a topic, against the message ids enqueued.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    /// Records read.
    pub records: usize,
    /// Records beyond the first of their `message_id`.
    pub duplicates: usize,
    /// Enqueued ids never read.
    pub lost: usize,
    /// Records of a key (in its partition) whose body `seq` is not above the one before.
    pub order_breaks: usize,
}

impl Delivery {
    /// No duplicate, nothing lost, no order break.
    pub fn exactly_once(&self) -> bool {
        self.duplicates == 0 && self.lost == 0 && self.order_breaks == 0
    }
}

/// Reads `topic` on `servers` `read_committed` and counts [`Delivery`] against `ids` (bodies
/// carry a `seq` that grows per key, as the tests' writers enqueue them). A transaction's
/// commit returns to its producer once the broker has logged it, before its commit markers
/// reach the partitions; until they do, a `read_committed` reader stops short of its records.
/// So an id missing is looked for again, for up to 30 s: one that is really lost stays lost.
pub async fn delivery(
    servers: &str,
    topic: &str,
    ids: &std::collections::HashSet<String>,
) -> Delivery {
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(30);
    let mut first_lost = None;
    loop {
        let d = delivery_now(servers, topic, ids).await;
        if d.lost == 0 || tokio::time::Instant::now() >= deadline {
            if let (Some(n), 0) = (first_lost, d.lost) {
                eprintln!(
                    "delivery: {n} ids were not readable yet; all were {} ms later",
                    started.elapsed().as_millis()
                );
            }
            return d;
        }
        first_lost.get_or_insert(d.lost);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// [`delivery`] as a `read_committed` reader sees it now.
async fn delivery_now(
    servers: &str,
    topic: &str,
    ids: &std::collections::HashSet<String>,
) -> Delivery {
    let recs = read_committed_from(servers, topic).await;
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut last: std::collections::HashMap<(i32, Vec<u8>), i64> = std::collections::HashMap::new();
    let mut order_breaks = 0;
    for r in &recs {
        *seen.entry(r.message_id()).or_default() += 1;
        if let Some(seq) = r.json()["seq"].as_i64() {
            let k = (r.partition, r.key.clone().unwrap_or_default());
            if last.insert(k, seq).is_some_and(|prev| seq <= prev) {
                order_breaks += 1;
            }
        }
    }
    Delivery {
        records: recs.len(),
        duplicates: recs.len() - seen.len(),
        lost: ids.iter().filter(|i| !seen.contains_key(*i)).count(),
        order_breaks,
    }
}

/// As [`read_committed`], from another cluster.
pub async fn read_committed_from(servers: &str, topic: &str) -> Vec<Record> {
    let topic = topic.to_owned();
    let servers = servers.to_owned();
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &servers)
            .set("group.id", format!("it-committed-{}", hex(8)))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .create()
            .unwrap();
        let md = c
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        let mut open = std::collections::BTreeSet::new();
        for p in md.topics()[0].partitions() {
            tpl.add_partition_offset(&topic, p.id(), Offset::Beginning)
                .unwrap();
            open.insert(p.id());
        }
        c.assign(&tpl).unwrap();
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !open.is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out reading {topic} read_committed (an open transaction holds it?)"
            );
            match c.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => out.push(record_of(&m)),
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                    open.remove(&p);
                }
                Some(Err(e)) => eprintln!("read_committed: {e} (continuing)"),
                None => {}
            }
        }
        out
    })
    .await
    .unwrap()
}

fn record_of(m: &rdkafka::message::BorrowedMessage<'_>) -> Record {
    let mut headers = BTreeMap::new();
    let mut raw_headers = Vec::new();
    if let Some(h) = m.headers() {
        for hd in h.iter() {
            headers.insert(
                hd.key.to_owned(),
                String::from_utf8_lossy(hd.value.unwrap_or_default()).into_owned(),
            );
            raw_headers.push((hd.key.to_owned(), hd.value.map(<[u8]>::to_vec)));
        }
    }
    Record {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        headers,
        raw_headers,
        payload: m.payload().unwrap_or_default().to_vec(),
        timestamp_ms: m.timestamp().to_millis(),
    }
}

/// Polls `check` every 50 ms until it returns true or `within` passes (then panics with `what`).
pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(feature = "relay")]
/// Runs passes until nothing is due. A pass can find nothing while due rows exist when another
/// relay (e.g. one that just exited) still held the ordering lanes; then rebalance and retry.
pub async fn drain(relay: &outbox::Relay) -> usize {
    let mut sent = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let due = format!(
        "SELECT count(*) FROM {}.outbox WHERE status = 'pending' AND available_at <= now()",
        relay.schema().quoted()
    );
    loop {
        match relay.run_once().await.expect("relay pass") {
            outbox::Outcome::Published(r) => sent += r.sent,
            outbox::Outcome::Empty => {
                let c = outbox::testing::relay_pool(relay).get().await.unwrap();
                if c.query_one(&due, &[]).await.unwrap().get::<_, i64>(0) == 0 {
                    return sent;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "due rows left but no lanes to claim them"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                relay.rebalance().await;
            }
        }
    }
}

/// The first column of the one row of `sql`, as a count.
pub async fn count(c: &tokio_postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get::<_, i64>(0)
}

/// The first column of every row of `sql`, as text.
pub async fn texts(c: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    c.query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Enqueues `n` keyed messages (keys `k0..k{keys}`) with sequence numbers in their payload,
/// committed in transactions of `per_tx`. Returns their message ids in order.
pub async fn enqueue_n(
    db: &DbConfig,
    topic: &str,
    n: usize,
    keys: usize,
    per_tx: usize,
) -> Vec<String> {
    let mut c = client(db).await;
    let enq = outbox::Enqueuer::new(&db.schema);
    let mut ids = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let tx = c.transaction().await.unwrap();
        let msgs: Vec<_> = (i..(i + per_tx).min(n))
            .map(|seq| {
                outbox::Message::new(
                    topic,
                    "it_event",
                    format!("k{}", seq % keys),
                    serde_json::json!({"seq": seq, "pad": "x".repeat(150)}),
                )
            })
            .collect();
        ids.extend(msgs.iter().map(|m| m.message_id().to_string()));
        enq.enqueue_batch(&tx, &msgs).await.unwrap();
        tx.commit().await.unwrap();
        i += per_tx;
    }
    ids
}

/// Produces one record directly (bypassing the outbox), for duplicates and hostile input.
pub async fn produce(
    topic: &str,
    key: Option<&[u8]>,
    headers: &[(&str, &[u8])],
    payload: Option<&[u8]>,
) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    static PRODUCER: std::sync::OnceLock<FutureProducer> = std::sync::OnceLock::new();
    let p = PRODUCER.get_or_init(|| {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("linger.ms", "1")
            .create()
            .unwrap()
    });
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let mut rec: rdkafka::producer::FutureRecord<'_, [u8], [u8]> =
        FutureRecord::to(topic).headers(h);
    if let Some(k) = key {
        rec = rec.key(k);
    }
    if let Some(pl) = payload {
        rec = rec.payload(pl);
    }
    p.send(rec, Duration::from_secs(10)).await.expect("produce");
}

/// Produces a well-formed event with the four standard headers.
pub async fn produce_event(
    topic: &str,
    key: &str,
    message_type: &str,
    message_id: &str,
    body: &serde_json::Value,
) {
    let body = serde_json::to_vec(body).unwrap();
    produce(
        topic,
        Some(key.as_bytes()),
        &[
            ("message_type", message_type.as_bytes()),
            ("entity_id", key.as_bytes()),
            ("message_id", message_id.as_bytes()),
            ("timestamp", b"2026-01-15T12:34:56Z"),
        ],
        Some(&body),
    )
    .await;
}

/// The group's committed offset for one partition (None when nothing committed).
pub async fn committed(group: &str, topic: &str, partition: i32) -> Option<i64> {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&topic, partition);
        let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        match got.find_partition(&topic, partition).unwrap().offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }
    })
    .await
    .unwrap()
}

/// Creates `topic`, its `.dlq` and (for the given delays) its retry topics.
pub async fn create_topic_family(topic: &str, partitions: i32, retry_suffixes: &[&str]) {
    create_topic(topic, partitions).await;
    create_topic(&format!("{topic}.dlq"), partitions).await;
    for s in retry_suffixes {
        create_topic(&format!("{topic}.{s}"), partitions).await;
    }
}

#[cfg(feature = "relay")]
/// A relay running `run()` on a task until [`RunningRelay::stop`].
pub struct RunningRelay {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), outbox::RelayError>>,
}

#[cfg(feature = "relay")]
/// Starts `relay.run(..)` on a task.
pub fn spawn_relay(relay: outbox::Relay) -> RunningRelay {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    RunningRelay { stop, task }
}

#[cfg(feature = "relay")]
impl RunningRelay {
    /// Signals shutdown and waits for a clean exit.
    pub async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

/// The path of an example binary built next to the test binaries (`cargo build --examples`).
pub fn example_binary(name: &str) -> std::path::PathBuf {
    // target/<profile>/deps/<test> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} not built (run `cargo build --examples`)",
        p.display()
    );
    p
}

/// Runs the `outbox` binary with the test's database, schema and Kafka.
pub fn outbox_command(db: &outbox::DbConfig) -> std::process::Command {
    let mut c = std::process::Command::new(outbox_bin());
    c.env("DATABASE_URL", database_url())
        .env("OUTBOX_SCHEMA", db.schema.name())
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .env("RUST_LOG", "info");
    c
}

/// The `outbox` binary of this build (`crates/outbox-cli`), next to the test's own `deps/`
/// directory: `cargo test` builds it first, because that package has integration tests.
pub fn outbox_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current test binary");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = dir.join(format!("outbox{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p outbox-cli`",
        bin.display()
    );
    bin
}

/// A child process killed (and reaped) when the test lets go of it, however the test ends.
pub struct Kill(pub std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free at the moment of asking (for a server a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg(feature = "dlq")]
/// Archives what the DLQ `topics` hold now, once, with a fresh archiver group.
pub async fn archive_once(db: &DbConfig, topics: Vec<String>) -> outbox::dlq::ArchiveReport {
    outbox::dlq::Archiver::new(db, &kafka(), topics)
        .unwrap()
        .group(&format!("it-a-{}", hex(6)))
        .run_once(&mut |_, _| {})
        .await
        .unwrap()
}
