//! Exactly-once publication (`outbox relay --exactly-once`): a crash at every dangerous point,
//! a SIGKILL loop on a steady stream with two relays handing slots back and forth, and a
//! frozen relay whose slots move and which then wakes up (a zombie). An independent
//! `read_committed` reader counts duplicates, lost rows and per-key order breaks; the same
//! crash without exactly-once shows the duplicates it prevents.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outbox::{Message, Relay};
use outbox_testkit::*;

/// Enqueues `n` rows over `keys` keys, `per_tx` per transaction, numbered from `from` (the
/// per-key order check reads `seq`).
async fn enqueue(
    db: &outbox::DbConfig,
    topic: &str,
    from: usize,
    n: usize,
    keys: usize,
) -> Vec<String> {
    let mut c = client(db).await;
    let enq = outbox::Enqueuer::new(&db.schema);
    let mut ids = Vec::with_capacity(n);
    for chunk in (from..from + n).collect::<Vec<_>>().chunks(100) {
        let tx = c.transaction().await.unwrap();
        let msgs: Vec<Message> = chunk
            .iter()
            .map(|seq| {
                Message::new(
                    topic,
                    "it_event",
                    format!("k{}", seq % keys),
                    serde_json::json!({"seq": seq, "pad": "x".repeat(100)}),
                )
            })
            .collect();
        ids.extend(msgs.iter().map(|m| m.message_id().to_string()));
        enq.enqueue_batch(&tx, &msgs).await.unwrap();
        tx.commit().await.unwrap();
    }
    ids
}

struct Setup {
    db: outbox::DbConfig,
    topic: String,
    progress: String,
    c: tokio_postgres::Client,
}

async fn setup() -> Setup {
    setup_on(false).await
}

/// [`setup`], on ring storage when `ring` (`outbox::storage::use_ring`).
async fn setup_on(ring: bool) -> Setup {
    let db = fresh_db().await;
    if ring {
        outbox::storage::use_ring(&db, outbox::storage::MoveOptions::default())
            .await
            .unwrap();
    }
    let topic = topic_name();
    create_topic(&topic, 4).await;
    let c = client(&db).await;
    Setup {
        progress: format!("{topic}.progress"),
        db,
        topic,
        c,
    }
}

/// A relay process; `exactly_once` adds the flag; `crash_at` sets `OUTBOX_CRASH_AT`;
/// `name` its Postgres application_name (so a test can cut its sessions).
fn relay(s: &Setup, exactly_once: bool, crash_at: Option<&str>, name: &str) -> Kill {
    relay_with_metrics(s, exactly_once, crash_at, name, None)
}

/// [`relay`], serving `/metrics` on `metrics` when given.
fn relay_with_metrics(
    s: &Setup,
    exactly_once: bool,
    crash_at: Option<&str>,
    name: &str,
    metrics: Option<u16>,
) -> Kill {
    Kill(
        relay_command(s, exactly_once, crash_at, name, metrics)
            .spawn()
            .unwrap(),
    )
}

/// The command [`relay_with_metrics`] spawns (its log on this test's standard error).
fn relay_command(
    s: &Setup,
    exactly_once: bool,
    crash_at: Option<&str>,
    name: &str,
    metrics: Option<u16>,
) -> Command {
    let mut c = Command::new(outbox_bin());
    if let Some(port) = metrics {
        c.args(["relay", "--metrics-addr", &format!("127.0.0.1:{port}")]);
    } else {
        c.arg("relay");
    }
    c.args([
        "--batch-size",
        "200",
        "--cleanup-interval",
        "off",
        "--rebalance-interval",
        "300ms",
        "--poll-interval",
        "50ms",
    ]);
    if exactly_once {
        c.args([
            "--exactly-once",
            "--progress-topic",
            &s.progress,
            "--transaction-timeout",
            "10s",
            "--delivery-timeout",
            "8s",
        ]);
    }
    c.env(
        "DATABASE_URL",
        format!("{}?application_name={name}", database_url()),
    )
    .env("OUTBOX_SCHEMA", s.db.schema.name())
    .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
    .env(
        "RUST_LOG",
        std::env::var("RELAY_LOG").unwrap_or_else(|_| "warn".into()),
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    if let Some(p) = crash_at {
        c.env("OUTBOX_CRASH_AT", p);
    }
    c
}

async fn pending(s: &Setup) -> i64 {
    count(&s.c, "SELECT count(*) FROM outbox WHERE status = 'pending'").await
}

async fn all_sent(s: &Setup, within: Duration) {
    wait_until(within, "every row sent", || async { pending(s).await == 0 }).await;
}

/// A relay that dies at `point` on its 3rd batch, then a clean one that finishes the job.
async fn crash_at(point: &str, exactly_once: bool) -> Delivery {
    crash_at_on(point, exactly_once, false).await
}

/// [`crash_at`], on ring storage when `ring`.
async fn crash_at_on(point: &str, exactly_once: bool, ring: bool) -> Delivery {
    let s = setup_on(ring).await;
    let ids: HashSet<String> = enqueue(&s.db, &s.topic, 0, 1500, 12)
        .await
        .into_iter()
        .collect();
    let mut doomed = relay(&s, exactly_once, Some(&format!("{point}:3")), "doomed");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = doomed.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the relay never reached {point}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        status.signal(),
        Some(6),
        "{point}: aborted at the crash point ({status})"
    );
    assert!(pending(&s).await > 0, "{point}: died with work left");
    let port = free_port();
    let _clean = relay_with_metrics(&s, exactly_once, None, "clean", Some(port));
    all_sent(&s, Duration::from_secs(90)).await;
    if exactly_once {
        let m = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let value = |series: &str| -> f64 {
            m.lines()
                .find(|l| l.starts_with(series))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        assert_eq!(value("outbox_relay_exactly_once"), 1.0, "{m}");
        assert!(
            value("outbox_relay_transactions_committed_total") >= 1.0,
            "{m}"
        );
        let recovered = value("outbox_relay_slot_recoveries_total{outcome=\"marked\"}");
        if point == "after_commit" {
            // The doomed relay's last transaction was committed in Kafka and never marked:
            // the new owner marked it from the progress record instead of sending it again.
            assert!(recovered >= 1.0, "{m}");
        }
        eprintln!("{point}: recoveries that marked rows: {recovered}");
    }
    let counts = delivery(&bootstrap(), &s.topic, &ids).await;
    eprintln!("crash at {point} (exactly-once {exactly_once}): {counts:?}");
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_dangerous_point_duplicates_nothing_and_loses_nothing() {
    for point in [
        "after_produce",
        "before_commit",
        "during_commit",
        "after_commit",
    ] {
        let counts = crash_at(point, true).await;
        assert_eq!(counts.records, 1500, "{point}: {counts:?}");
        assert!(counts.exactly_once(), "{point}: {counts:?}");
    }
}

/// On ring storage (no row lock, no `sent` mark: the lanes' cursors move): the same crashes.
/// After a crash between the Kafka commit and the settle, recovery moves the cursors past the
/// progress record's rows instead of publishing them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_ring_storage_a_crash_at_every_dangerous_point_duplicates_nothing_and_loses_nothing() {
    for point in [
        "after_produce",
        "before_commit",
        "during_commit",
        "after_commit",
    ] {
        let counts = crash_at_on(point, true, true).await;
        assert_eq!(counts.records, 1500, "{point}: {counts:?}");
        assert!(counts.exactly_once(), "{point}: {counts:?}");
    }
}

/// The same crash after the broker's ack, without exactly-once: the batch is published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_exactly_once_the_same_crash_duplicates_the_batch() {
    let counts = crash_at("after_produce", false).await;
    assert_eq!(counts.lost, 0);
    assert!(counts.duplicates > 0, "at-least-once re-sends: {counts:?}");
}

/// Two relays on a steady stream, one of them SIGKILLed every 1–2 s and restarted: slots move
/// between them at every restart (handover with fencing), and nothing is duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkills_and_handovers_on_a_steady_stream_duplicate_nothing() {
    sigkills_and_handovers(false).await;
}

/// The same on ring storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_ring_storage_sigkills_and_handovers_on_a_steady_stream_duplicate_nothing() {
    sigkills_and_handovers(true).await;
}

async fn sigkills_and_handovers(ring: bool) {
    let s = setup_on(ring).await;
    let writer = {
        let (db, topic) = (s.db.clone(), s.topic.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for round in 0..40 {
                ids.extend(enqueue(&db, &topic, round * 150, 150, 24).await);
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            ids
        })
    };
    let mut relays = [relay(&s, true, None, "r0"), relay(&s, true, None, "r1")];
    let mut kills = 0;
    while !writer.is_finished() {
        tokio::time::sleep(Duration::from_millis(1000 + fastrand::u64(0..1000))).await;
        let victim = fastrand::usize(0..2);
        relays[victim] = relay(&s, true, None, &format!("r{victim}")); // the old one: SIGKILL
        kills += 1;
    }
    let ids: HashSet<String> = writer.await.unwrap().into_iter().collect();
    all_sent(&s, Duration::from_secs(120)).await;
    let counts = delivery(&bootstrap(), &s.topic, &ids).await;
    eprintln!("{kills} SIGKILLs on a steady stream (ring storage: {ring}): {counts:?}");
    assert!(kills >= 3, "{kills}");
    assert_eq!(counts.records, ids.len(), "{counts:?}");
    assert!(counts.exactly_once(), "{counts:?}");
}

/// A relay frozen (SIGSTOP) while it publishes; its Postgres sessions die (as a network
/// partition would end them), the other relay takes its slots and fences it; then it wakes
/// (SIGCONT) with its transaction still open: it cannot commit, and nothing is duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_relay_that_wakes_after_its_slots_moved_publishes_nothing_twice() {
    let s = setup().await;
    let mut ids: HashSet<String> = enqueue(&s.db, &s.topic, 0, 4000, 16)
        .await
        .into_iter()
        .collect();
    let zombie = relay(&s, true, None, "zombie");
    wait_until(Duration::from_secs(60), "the zombie publishing", || async {
        pending(&s).await < 3500
    })
    .await;
    let pid = zombie.0.id().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    s.c.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'zombie'",
        &[],
    )
    .await
    .unwrap();
    ids.extend(enqueue(&s.db, &s.topic, 4000, 1000, 16).await);
    let _heir = relay(&s, true, None, "heir");
    all_sent(&s, Duration::from_secs(120)).await;
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    // Awake: whatever it had in flight is fenced; give it time to try.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = delivery(&bootstrap(), &s.topic, &ids).await;
    eprintln!("zombie: {counts:?}");
    assert_eq!(counts.records, ids.len(), "{counts:?}");
    assert!(counts.exactly_once(), "{counts:?}");
    assert_eq!(pending(&s).await, 0);
    drop(zombie);
}

/// In-process: `run_once` in exactly-once mode publishes, the progress topic gets one record
/// per slot batch naming exactly the ids of that batch, and a second relay on the same
/// schema (a new owner) recovers cleanly.
#[tokio::test]
async fn each_batch_writes_a_progress_record_naming_its_ids() {
    let s = setup().await;
    let ids = enqueue(&s.db, &s.topic, 0, 300, 16).await;
    let mut config = relay_config();
    let mut eo = outbox::ExactlyOnce::default();
    eo.progress_topic = s.progress.clone();
    config.exactly_once = Some(eo);
    config.batch_size = 100;
    let relay = Relay::new(&s.db, &kafka(), config.clone()).unwrap();
    assert_eq!(drain(&relay).await, 300);
    let counts = delivery(&bootstrap(), &s.topic, &ids.iter().cloned().collect()).await;
    assert!(counts.exactly_once() && counts.records == 300, "{counts:?}");
    // Read once the data is (the commit markers of the progress records went out with it).
    let progress = read_committed(&s.progress).await;
    assert!(!progress.is_empty());
    let mut named: Vec<i64> = progress
        .iter()
        .flat_map(|r| {
            r.json()["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    named.sort_unstable();
    let rows: Vec<i64> =
        s.c.query("SELECT id FROM outbox ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
    assert_eq!(
        named, rows,
        "every published id named once across the progress records"
    );
    for r in &progress {
        let slot = r.json()["slot"].as_i64().unwrap() as i32;
        assert_eq!(r.partition, slot, "slot k's records in partition k");
    }
    drop(relay);
    // A new owner: fences, recovers (nothing to mark), publishes what comes next.
    let more = enqueue(&s.db, &s.topic, 300, 50, 16).await;
    let heir = Relay::new(&s.db, &kafka(), config).unwrap();
    assert_eq!(drain(&heir).await, 50);
    let all: HashSet<String> = ids.into_iter().chain(more).collect();
    let counts = delivery(&bootstrap(), &s.topic, &all).await;
    assert!(counts.exactly_once() && counts.records == 350, "{counts:?}");
}

/// A new owner's recovery on ring storage while a service's transaction is open. Recovery
/// once listed every open writer as passed, whether or not a cursor moved past its rows; once
/// it committed, its rows were read as usual and the sweep copied them again: each published
/// twice. Only the rows a recovery steps over while their writer is open go to the sweep.
#[tokio::test]
async fn on_ring_storage_a_writer_open_during_a_recovery_is_published_once() {
    let s = setup_on(true).await;
    let mut ids: HashSet<String> = enqueue(&s.db, &s.topic, 0, 100, 16)
        .await
        .into_iter()
        .collect();
    let mut config = relay_config();
    let mut eo = outbox::ExactlyOnce::default();
    eo.progress_topic = s.progress.clone();
    config.exactly_once = Some(eo);
    let first = Relay::new(&s.db, &kafka(), config.clone()).unwrap();
    assert_eq!(drain(&first).await, 100);
    drop(first);
    // A service's transaction, open while the next owner takes the slots over.
    let mut w = client(&s.db).await;
    let open = w.transaction().await.unwrap();
    let msgs: Vec<Message> = (100..116)
        .map(|seq| {
            Message::new(
                &s.topic,
                "it_event",
                format!("k{}", seq % 16),
                serde_json::json!({ "seq": seq }),
            )
        })
        .collect();
    ids.extend(msgs.iter().map(|m| m.message_id().to_string()));
    outbox::Enqueuer::new(&s.db.schema)
        .enqueue_batch(&open, &msgs)
        .await
        .unwrap();
    let heir = Relay::new(&s.db, &kafka(), config).unwrap();
    heir.run_once().await.unwrap();
    open.commit().await.unwrap();
    assert_eq!(drain(&heir).await, 16);
    heir.sweep().await.unwrap();
    drain(&heir).await;
    let counts = delivery(&bootstrap(), &s.topic, &ids).await;
    assert_eq!(counts.records, 116, "{counts:?}");
    assert!(counts.exactly_once(), "{counts:?}");
}

/// What an operator reads: an exactly-once relay that takes its slots over (fencing, reading
/// each progress partition to its end) and publishes a backlog logs no warning. Reading a
/// progress partition to its end once logged a `PartitionEOF` warning per slot at every start.
#[tokio::test]
async fn a_clean_start_and_drain_logs_no_warning() {
    let s = setup().await;
    enqueue(&s.db, &s.topic, 0, 300, 16).await;
    let log = std::env::temp_dir().join(format!("outbox-relay-{}.log", s.db.schema.name()));
    let mut c = relay_command(&s, true, None, "eo-quiet", None);
    c.env("RUST_LOG", "warn")
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    let r = Kill(c.spawn().unwrap());
    all_sent(&s, Duration::from_secs(60)).await;
    // A second owner of the same slots (a restart): recovery reads the records just written.
    drop(r);
    enqueue(&s.db, &s.topic, 300, 50, 16).await;
    let mut c = relay_command(&s, true, None, "eo-quiet", None);
    c.env("RUST_LOG", "warn").stderr(Stdio::from(
        std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
    ));
    let r = Kill(c.spawn().unwrap());
    all_sent(&s, Duration::from_secs(60)).await;
    drop(r);
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    // librdkafka's own retry of the producer id while the broker's transaction coordinator
    // is still loading (a fresh cluster, or other exactly-once tests starting at the same
    // moment) is the broker warming up, not this relay: it retries and goes on.
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN"))
        .filter(|l| !(l.contains("librdkafka: GETPID:") && l.ends_with(": retrying")))
        .collect();
    assert!(warnings.is_empty(), "warnings logged: {warnings:#?}");
}

/// A large batch size and a backlog all in one slot (its keys' lanes), with ids as large as a
/// table with years of history has: a progress record names its batch's ids and, while their
/// marks are unconfirmed, the previous batch's. Two claims of 50,000 rows would name 100,000
/// thirteen-digit ids (1.4 MB, over the producer's 1 MB `message.max.bytes`); the backlog
/// must still drain, every record within one message, with no transaction aborted for a
/// record too large (an aborted batch goes again as the first of the next pass).
#[tokio::test]
async fn a_one_slot_backlog_with_a_large_batch_size_drains() {
    let s = setup().await;
    s.c.batch_execute("ALTER TABLE outbox ALTER COLUMN id RESTART WITH 1000000000000")
        .await
        .unwrap();
    // Twenty keys whose lanes (the claim's own expression) are all in slot 0.
    let n: i64 = 150_000;
    s.c.execute(
        "WITH keys AS (
             SELECT array_agg(k) AS k FROM (
                 SELECT 'key-' || i AS k FROM generate_series(1, 10000) i
                  WHERE (hashtext('key-' || i) & 63) / $3 = 0 LIMIT 20) c)
         INSERT INTO outbox (topic, message_key, headers, payload)
         SELECT $1, keys.k[1 + g % 20], jsonb_build_object('message_type', 'it_event',
                'message_id', outbox_uuidv7()::text),
                jsonb_build_object('seq', g)
           FROM generate_series(0, $2::bigint - 1) g, keys
          ORDER BY g",
        &[
            &s.topic,
            &n,
            &(outbox::testing::LANES / outbox::ExactlyOnce::SLOTS),
        ],
    )
    .await
    .unwrap();
    let mut config = relay_config();
    let mut eo = outbox::ExactlyOnce::default();
    eo.progress_topic = s.progress.clone();
    config.exactly_once = Some(eo);
    config.batch_size = 10_000;
    let relay = Relay::new(&s.db, &kafka(), config).unwrap();
    let sent = tokio::time::timeout(Duration::from_secs(240), drain(&relay))
        .await
        .expect("the backlog drains");
    assert_eq!(sent as i64, n);
    // The first record names its own batch only; a later one that names two batches (its own
    // and the one before, unmarked yet) committed: no record was too large to send, so no
    // transaction was aborted for it and the pipeline kept two batches in flight.
    let records: Vec<(usize, usize)> = read_committed(&s.progress)
        .await
        .iter()
        .map(|r| (r.json()["ids"].as_array().unwrap().len(), r.payload.len()))
        .collect();
    let first = records[0].0;
    assert!(
        records.iter().any(|(ids, _)| *ids > first),
        "no record named two batches: {records:?}"
    );
    assert!(
        records.iter().all(|(_, bytes)| *bytes < 1_000_000),
        "{records:?}"
    );
}

/// A trickle through `Relay::run`, each row committed on its own, with rows refused by the
/// producer (injected): a refused row aborts its slot's transaction and is backed off, and its
/// key's later rows wait for it. A `read_committed` reader: every row once, in per-key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_with_refused_rows_is_published_once_in_per_key_order() {
    trickle_with_refusals(false).await;
}

/// The same on ring storage: refused rows back off in the retry table, their keys behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_ring_storage_a_trickle_with_refused_rows_is_published_once_in_per_key_order() {
    trickle_with_refusals(true).await;
}

async fn trickle_with_refusals(ring: bool) {
    let s = setup_on(ring).await;
    let mut config = relay_config();
    let mut eo = outbox::ExactlyOnce::default();
    eo.progress_topic = s.progress.clone();
    config.exactly_once = Some(eo);
    config.max_attempts = 1000;
    // A refused row aborts its slot's whole transaction (the others go again): small batches
    // keep a transaction's chance of carrying an injected refusal low, as real refusals are
    // rare (one poison row, backed off), not a share of every send.
    config.batch_size = 10;
    let relay = Relay::new(&s.db, &kafka(), config).unwrap();
    outbox::testing::inject_refusals(&relay, 0.01);
    let injected = outbox::testing::injected_refusals(&relay);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    let mut ids = HashSet::new();
    let mut c = client(&s.db).await;
    let enq = outbox::Enqueuer::new(&s.db.schema);
    let mut tick = tokio::time::interval(Duration::from_millis(4));
    for seq in 0..1500 {
        tick.tick().await;
        let m = Message::new(
            &s.topic,
            "it_event",
            format!("k{}", seq % 6),
            serde_json::json!({"seq": seq}),
        );
        ids.insert(m.message_id().to_string());
        let tx = c.transaction().await.unwrap();
        enq.enqueue(&tx, &m).await.unwrap();
        tx.commit().await.unwrap();
    }
    all_sent(&s, Duration::from_secs(120)).await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    // Counted where they are injected: on the ring, whether a refused row goes through the
    // retry table or is read again with its aborted slot depends on the batch (a row of its
    // lane before it whose slot aborted keeps the lane where it is), so the retry table's
    // inserts are no count of refusals.
    let backed_off = injected.load(std::sync::atomic::Ordering::Relaxed);
    assert!(backed_off >= 5, "refusals exercised: {backed_off}");
    let counts = delivery(&bootstrap(), &s.topic, &ids).await;
    eprintln!("trickle with {backed_off} refused rows: {counts:?}");
    assert_eq!(counts.records, ids.len(), "{counts:?}");
    assert!(counts.exactly_once(), "{counts:?}");
}
