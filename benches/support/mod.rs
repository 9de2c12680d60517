//! Shared by the benchmarks: services from env (loopback defaults), fresh schema and topics,
//! and one JSON line per result. Each bench runs full size under `cargo bench` (which passes
//! `--bench`) and a tiny smoke size otherwise, so `cargo test --all-targets` keeps them alive.
#![allow(dead_code)]

use std::time::Duration;

#[allow(unused_imports)] // each bench uses some of them
pub use outbox_testkit::{bootstrap, create_topic, database_url, hex as rand_name, outbox_bin};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

/// True under `cargo bench`; false under `cargo test` (smoke size).
pub fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// `name` from the environment as a number, else `default`.
pub fn param(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub async fn fresh_db() -> outbox::DbConfig {
    let db = outbox::DbConfig::new(&database_url(), &format!("bench_{}", rand_name(10))).unwrap();
    outbox::migrate(&db)
        .await
        .expect("migrate: are dev/up.sh services running?");
    db
}

pub async fn drop_schema(db: &outbox::DbConfig) {
    let c = outbox::connect(db).await.unwrap();
    c.batch_execute(&format!("DROP SCHEMA {} CASCADE", db.schema.quoted()))
        .await
        .unwrap();
}

/// Kafka settings; extra librdkafka properties from `KAFKA_PROPERTIES` (`name=value;…`).
pub fn kafka() -> outbox::KafkaConfig {
    let mut k = outbox::KafkaConfig::new(&bootstrap()).unwrap();
    for pair in std::env::var("KAFKA_PROPERTIES")
        .unwrap_or_default()
        .split(';')
        .filter(|p| !p.is_empty())
    {
        k.set_from_pair(pair).unwrap();
    }
    k
}

pub async fn delete_topic(name: &str) {
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let _ = admin.delete_topics(&[name], &AdminOptions::new()).await;
}

/// Inserts `rows` pending rows server-side: ≈200-byte JSON payloads, `keys` distinct keys,
/// the four standard headers.
pub async fn fill_outbox(db: &outbox::DbConfig, topic: &str, rows: usize, keys: usize) {
    fill_outbox_stats(db, topic, rows, keys, true).await;
}

/// [`fill_outbox`]; with `analyze = false` the table is never analyzed (autovacuum off for
/// it): the planner knows nothing of the backlog, as after a bulk import or a relay outage.
pub async fn fill_outbox_stats(
    db: &outbox::DbConfig,
    topic: &str,
    rows: usize,
    keys: usize,
    analyze: bool,
) {
    fill_outbox_traced(db, topic, rows, keys, analyze, None).await;
}

/// [`fill_outbox_stats`], each row carrying a `traceparent` (rows written by a traced
/// service) whose sampled flag is set on a `sampled` fraction of them, when `sampled` is given.
pub async fn fill_outbox_traced(
    db: &outbox::DbConfig,
    topic: &str,
    rows: usize,
    keys: usize,
    analyze: bool,
    sampled: Option<f64>,
) {
    let traced = match sampled {
        Some(r) => format!(
            ", 'traceparent', '00-' || md5(g::text || random()::text) || '-' \
               || substr(md5(random()::text), 1, 16) || '-' \
               || CASE WHEN random() < {r} THEN '01' ELSE '00' END"
        ),
        None => String::new(),
    };
    let c = outbox::connect(db).await.unwrap();
    if !analyze {
        c.batch_execute(&format!(
            "ALTER TABLE {}.outbox SET (autovacuum_enabled = false)",
            db.schema.quoted()
        ))
        .await
        .unwrap();
    }
    insert_rows(&c, &db.schema.quoted(), topic, 0, rows, keys, &traced).await;
    if analyze {
        // On ring storage `outbox` is a view: the rows are in the ring.
        let ring: bool = c
            .query_one(
                "SELECT relkind = 'v' FROM pg_class WHERE oid = to_regclass($1)",
                &[&format!("{}.outbox", db.schema.quoted())],
            )
            .await
            .unwrap()
            .get(0);
        let table = if ring { "outbox_ring" } else { "outbox" };
        c.batch_execute(&format!("ANALYZE {}.{table}", db.schema.quoted()))
            .await
            .unwrap();
    }
}

/// Inserts `rows` outbox rows for `topic` into `schema` (quoted) on `c` (a client or an open
/// transaction), their order numbers from `first`, spread over `keys` keys; `traced` is the
/// extra headers' SQL (see [`fill_outbox_traced`]).
pub async fn insert_rows(
    c: &impl tokio_postgres::GenericClient,
    schema: &str,
    topic: &str,
    first: usize,
    rows: usize,
    keys: usize,
    traced: &str,
) {
    let chunk = 50_000;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        c.execute(
            &format!(
                "INSERT INTO {s}.outbox (topic, message_key, headers, payload)
                 SELECT $1, 'key-' || (g % $3), jsonb_build_object('message_type', 'order_created',
                        'entity_id', 'key-' || (g % $3), 'message_id', {s}.outbox_uuidv7()::text,
                        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'){traced}),
                        jsonb_build_object('order_number', 'A-' || g, 'customer', 'customer-' || (g % 977),
                                           'total_cents', g * 7 % 100000, 'currency', 'EUR',
                                           'note', repeat('x', 90))
                   FROM generate_series($2::bigint, $2::bigint + $4::bigint - 1) g",
                s = schema,
            ),
            &[&topic, &((first + done) as i64), &(keys as i64), &(n as i64)],
        )
        .await
        .unwrap();
        done += n;
    }
}

pub fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// Prints one JSON line: `{"bench": name, "params": …, "results": …, "git": …, "smoke": …}`.
pub fn emit(name: &str, params: serde_json::Value, results: serde_json::Value) {
    let line = serde_json::json!({
        "bench": name,
        "params": params,
        "results": results,
        "git": git_commit(),
        "smoke": !full(),
    });
    println!("{line}");
}

/// Percentile of sorted samples (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `v` (the mean of the middle two for an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub const MINUTE: Duration = Duration::from_secs(60);

pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// Creates a 6-partition topic whose record timestamps are the broker's append time
/// (`LogAppendTime`), so a reader learns when the broker accepted each record.
pub async fn create_append_time_topic(name: &str, extra: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let mut t = NewTopic::new(name, 6, TopicReplication::Fixed(1))
        .set("message.timestamp.type", "LogAppendTime");
    for (k, v) in extra {
        t = t.set(k, v);
    }
    admin
        .create_topics(&[t], &AdminOptions::new())
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
}

/// Reads a 6-partition topic from the start on a thread until stopped, recording for each
/// `message_id` header (receive time in µs, broker append time in ms).
pub struct Receiver {
    pub seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (i64, i64)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Receiver {
    pub fn start(topic: &str) -> Self {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::{Headers, Message};
        let seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (i64, i64)>>> =
            Default::default();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (seen, stop, topic) = (seen.clone(), stop.clone(), topic.to_owned());
            std::thread::spawn(move || {
                let c: BaseConsumer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", bootstrap())
                    .set("group.id", format!("bench-{}", rand_name(6)))
                    .set("enable.auto.commit", "false")
                    .set("fetch.wait.max.ms", "5")
                    .create()
                    .unwrap();
                let mut tpl = rdkafka::TopicPartitionList::new();
                for p in 0..6 {
                    tpl.add_partition_offset(&topic, p, rdkafka::Offset::Beginning)
                        .unwrap();
                }
                c.assign(&tpl).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                        let at = now_us();
                        let id = m.headers().and_then(|h| {
                            h.iter().find(|h| h.key == "message_id").and_then(|h| {
                                h.value.map(|v| String::from_utf8_lossy(v).into_owned())
                            })
                        });
                        if let Some(id) = id {
                            seen.lock()
                                .unwrap()
                                .insert(id, (at, m.timestamp().to_millis().unwrap_or(0)));
                        }
                    }
                }
            })
        };
        Self { seen, stop, thread }
    }

    /// Waits (up to `within`) until `n` records were seen.
    pub async fn wait_for(&self, n: usize, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        while self.seen.lock().unwrap().len() < n && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn stop(self) -> std::collections::HashMap<String, (i64, i64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap();
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// The registry the benches use (`SCHEMA_REGISTRY_URL`, as `dev/env.sh` sets it).
pub fn registry_url() -> String {
    std::env::var("SCHEMA_REGISTRY_URL")
        .unwrap_or_else(|_| "http://127.0.0.1:18081/apis/ccompat/v7".into())
}

/// The payload format a bench publishes in: plain JSON, or one with a schema.
pub const FORMATS: [outbox::schemas::Format; 3] = [
    outbox::schemas::Format::Json,
    outbox::schemas::Format::Avro,
    outbox::schemas::Format::Protobuf,
];

/// Registers the schema of [`fill_outbox`]'s payloads under `<topic>-value` in `format`, and
/// returns the schemas to hand to a relay or consumer (`None` for plain JSON).
pub async fn bench_schemas(
    topic: &str,
    format: outbox::schemas::Format,
) -> Option<outbox::schemas::Schemas> {
    use outbox::schemas::{
        Format, RegistryClient, SchemaConfig, Schemas, SubjectNaming, TopicSchema,
    };
    let text = match format {
        Format::Json => return None,
        Format::Avro => r#"{"type": "record", "name": "OrderCreated", "namespace": "bench",
            "fields": [{"name": "order_number", "type": "string"}, {"name": "customer", "type": "string"},
                       {"name": "total_cents", "type": "long"}, {"name": "currency", "type": "string"},
                       {"name": "note", "type": "string"}]}"#,
        Format::Protobuf => "syntax = \"proto3\"; package bench;
            message OrderCreated { string order_number = 1; string customer = 2; int64 total_cents = 3;
                                   string currency = 4; string note = 5; }",
        Format::JsonSchema => r#"{"type": "object", "required": ["order_number", "total_cents"],
            "properties": {"order_number": {"type": "string"}, "total_cents": {"type": "integer"}}}"#,
    };
    let url = registry_url();
    RegistryClient::new(&url)
        .unwrap()
        .register(&format!("{topic}-value"), format, text)
        .await
        .expect("the schema registry (dev/registry.sh) is up");
    let mut c = SchemaConfig::from_topics_toml(&url, "").unwrap();
    c.topics.insert(
        topic.to_owned(),
        TopicSchema {
            format,
            naming: SubjectNaming::Topic,
        },
    );
    Some(Schemas::new(c).unwrap())
}

/// A format's name in a bench's JSON line.
pub fn format_name(format: outbox::schemas::Format) -> &'static str {
    match format {
        outbox::schemas::Format::Json => "json",
        outbox::schemas::Format::Avro => "avro",
        outbox::schemas::Format::Protobuf => "protobuf",
        outbox::schemas::Format::JsonSchema => "json-schema",
    }
}

/// Tracing for the cost benches: spans exported over OTLP/HTTP to the dev Jaeger
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`, default `http://127.0.0.1:14318`) with a parent-based
/// ratio sampler at `ratio`, or no provider at all (`None`: tracing compiled in, off).
pub fn tracing_at(ratio: Option<f64>) -> Option<outbox_otlp::Guard> {
    let Some(r) = ratio else {
        opentelemetry::global::set_tracer_provider(
            opentelemetry::trace::noop::NoopTracerProvider::new(),
        );
        outbox::otel::refresh();
        return None;
    };
    if std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").is_err() {
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:14318");
    }
    std::env::set_var("OTEL_SERVICE_NAME", "outbox-bench");
    std::env::set_var("OTEL_TRACES_SAMPLER", "parentbased_traceidratio");
    std::env::set_var("OTEL_TRACES_SAMPLER_ARG", r.to_string());
    let g = outbox_otlp::init("outbox-bench").expect("OTLP export");
    assert!(g.is_exporting());
    Some(g)
}

/// The tracing modes the cost benches compare: no provider, 1 % and 100 % sampling.
pub const TRACING_MODES: [(&str, Option<f64>); 3] =
    [("off", None), ("1%", Some(0.01)), ("100%", Some(1.0))];

/// Ends a mode of [`tracing_at`]: flushes (part of the mode's cost), says how many spans were
/// recorded and accepted, and leaves no provider installed.
pub fn tracing_off(guard: Option<outbox_otlp::Guard>) -> Option<serde_json::Value> {
    let spans = guard.map(|g| {
        let c = g.shutdown();
        serde_json::json!({"ended": c.ended, "exported": c.exported})
    });
    tracing_at(None);
    spans
}

/// CPU time (user + system) used so far by Postgres's processes, the Kafka broker (the JVM)
/// and this process (the relays), from `/proc` (zero where it cannot be read). `proxy` is a
/// bench's own to fill (`relay_drain.rs`: its delaying proxy's thread).
#[derive(Default)]
pub struct Cpu {
    pub postgres: f64,
    pub kafka: f64,
    pub relay: f64,
    pub proxy: f64,
    /// The tracing backend (dev/jaeger.sh), busy only while spans are exported.
    pub jaeger: f64,
    /// Every process of the machine (`/proc/stat`, busy time of all cores): Postgres's
    /// sessions that ended meanwhile are still in it.
    pub machine: f64,
    /// Wall-clock seconds (for differences).
    pub wall: f64,
}

impl Cpu {
    pub fn since(&self, before: &Cpu) -> Cpu {
        Cpu {
            postgres: self.postgres - before.postgres,
            kafka: self.kafka - before.kafka,
            relay: self.relay - before.relay,
            proxy: self.proxy - before.proxy,
            jaeger: self.jaeger - before.jaeger,
            machine: self.machine - before.machine,
            wall: self.wall - before.wall,
        }
    }
}

pub fn cpu_seconds() -> Cpu {
    // utime and stime are fields 14 and 15 of /proc/<pid>/stat, in clock ticks (100 per second
    // on Linux); the command name (field 2) is in parentheses and may hold spaces.
    let ticks = |stat: &str| -> Option<(String, f64)> {
        let (head, tail) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_owned();
        let f: Vec<&str> = tail.split_whitespace().collect();
        let t = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        Some((comm, t / 100.0))
    };
    let mut cpu = Cpu {
        wall: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        ..Cpu::default()
    };
    // The first line of /proc/stat: user nice system idle iowait irq softirq steal … in ticks.
    if let Some(line) = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().next().map(str::to_owned))
    {
        let f: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        if f.len() >= 8 {
            cpu.machine = (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / 100.0;
        }
    }
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Some((comm, secs)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| ticks(&s))
        else {
            continue;
        };
        if name == me {
            cpu.relay += secs;
        } else if comm == "postgres" {
            cpu.postgres += secs;
        } else if comm == "java" {
            cpu.kafka += secs;
        } else if comm.starts_with("jaeger") {
            cpu.jaeger += secs;
        }
    }
    cpu
}

/// A numeric field of `/proc/<pid>/status` (`pid`: a number or `self`), e.g. `VmRSS:` in KiB
/// or `Threads:`.
pub fn proc_status(pid: &str, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
