//! Replay's safety net: a replayed letter that fails again is seen — whatever its headers, for
//! every selection size, also after the job ended — and the alert on it fires.

use std::process::{Output, Stdio};
use std::time::Duration;

use outbox::consumer::{Consumer, ConsumerConfig, Delivered, HandlerError, RetryStrategy};
use outbox::dlq::Dlq;
use outbox_testkit::*;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

async fn scrape(port: u16) -> String {
    let r = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await;
    match r {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

fn came_back(metrics: &str, topic: &str) -> f64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("outbox_dlq_replay_came_back_total{")
                && l.contains(&format!("topic=\"{topic}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The billing handler, still broken: every order fails for good.
async fn still_broken(
    _m: &Delivered,
    _tx: &tokio_postgres::Transaction<'_>,
) -> Result<(), HandlerError> {
    Err(HandlerError::permanent("charges table missing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_before_the_fix_sees_every_comeback_after_the_job_too_and_the_alert_fires() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let dlq_topic = format!("{topic}.dlq");
    // 8 letters of a small group, written by a producer that sets no message id: nothing to
    // match a comeback by except what the replay itself puts on the record.
    for i in 0..8 {
        let body = serde_json::to_vec(&serde_json::json!({ "order": i })).unwrap();
        produce(
            &dlq_topic,
            Some(format!("order-{i}").as_bytes()),
            &[
                ("message_type", b"order_created".as_slice()),
                ("x-original-topic", topic.as_bytes()),
                ("x-consumer-group", b"billing"),
                ("x-error", b"charges table missing"),
                ("x-error-kind", b"permanent"),
                ("x-failed-at", b"2026-11-30T08:00:00Z"),
            ],
            Some(&body),
        )
        .await;
    }
    let port = free_port();
    let _archiver = Kill(
        outbox_command(&db)
            .args([
                "dlq",
                "archive",
                "--topic",
                &dlq_topic,
                "--archive-group",
                &format!("it-arch-{}", hex(6)),
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(
        Duration::from_secs(30),
        "the 8 letters archived",
        || async { count(&c, "SELECT count(*) FROM dead_letters").await == 8 },
    )
    .await;
    let before = came_back(&scrape(port).await, &topic);

    // Replay before the fix, without a canary: the job ends before any comeback, because the
    // consumer that sends them back starts only after it (one running during the job could
    // fail a letter and have it archived before the job's last check: the job would stop
    // instead of completing).
    let o = outbox_command(&db)
        .args([
            "dlq",
            "replay",
            "--topic",
            &topic,
            "--canary",
            "0",
            "--rate",
            "100",
            "--actor",
            "oncall",
            "--confirm-kinds",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let dlq = Dlq::new(&db);
    let job = dlq.jobs(1).await.unwrap().remove(0);
    assert_eq!(
        (job.sent, format!("{:?}", job.status)),
        (8, "Completed".into()),
        "{job:?}"
    );

    // The consumer is not fixed yet: whatever was replayed fails again (its new group reads
    // the topic from the start).
    let mut cfg = ConsumerConfig::new(format!("billing-{}", hex(6)), [&topic]);
    cfg.retry = RetryStrategy::InPlace {
        attempts: 1,
        base: Duration::from_millis(10),
        max: Duration::from_millis(10),
    };
    let consumer = Consumer::new(&db, &kafka(), cfg)
        .unwrap()
        .handler("order_created", still_broken);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));

    // Every letter comes back (decode errors now: the replayed records have no message id)
    // and each is matched to its job and letter after the job ended.
    wait_until(
        Duration::from_secs(60),
        "8 comebacks counted on the job",
        || async { dlq.job(job.id).await.unwrap().came_back == 8 },
    )
    .await;
    let matched = count(
        &c,
        &format!(
            "SELECT count(*) FROM dead_letters d JOIN dlq_replay_items i
               ON i.came_back_id = d.id AND i.dead_letter_id = d.replay_of
              WHERE i.job_id = {} AND d.replay_job = {}",
            job.id, job.id
        ),
    )
    .await;
    assert_eq!(
        matched, 8,
        "each comeback names the job and the letter it replays"
    );
    wait_until(
        Duration::from_secs(20),
        "the archiver's counter",
        || async { came_back(&scrape(port).await, &topic) - before >= 8.0 },
    )
    .await;
    let after = came_back(&scrape(port).await, &topic);

    // The alert rule, evaluated by promtool on the scraped values (before, then after).
    let dir = std::env::temp_dir().join(format!("comeback-{}", hex(6)));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = std::fs::canonicalize(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/prometheus/alerts.yml"
    ))
    .unwrap();
    let test = format!(
        "rule_files: [{rules}]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n      - series: 'outbox_dlq_replay_came_back_total{{topic=\"{topic}\"}}'\n        values: '{before}x5 {after}x10'\n    alert_rule_test:\n      - eval_time: 8m\n        alertname: OutboxReplayComingBack\n        exp_alerts:\n          - exp_labels: {{severity: warning, topic: \"{topic}\"}}\n            exp_annotations:\n              summary: \"Replayed dead letters of {topic} are coming back\"\n              description: \"{n} replayed letter(s) of {topic} were dead-lettered again in the last 15 minutes: the fix did not hold (replay before the fix?).\"\n              runbook: \"docs/DEAD_LETTERS.md#runbook-the-dlq-alert-fired--what-now\"\n",
        rules = rules.display(),
        n = after - before
    );
    let file = dir.join("t.yml");
    std::fs::write(&file, test).unwrap();
    let p = std::process::Command::new("promtool")
        .args(["test", "rules", file.to_str().unwrap()])
        .output()
        .unwrap();
    let out = text(&p);
    // promtool compares annotations only when given; the labels must match.
    assert!(p.status.success() && out.contains("SUCCESS"), "{out}");
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A letter as the billing consumer dead-letters it.
fn letter_headers<'a>(topic: &'a str, extra: &[(&'a str, &'a [u8])]) -> Vec<(&'a str, &'a [u8])> {
    let mut h: Vec<(&str, &[u8])> = vec![
        ("message_type", b"order_created".as_slice()),
        ("x-original-topic", topic.as_bytes()),
        ("x-consumer-group", b"billing"),
        ("x-error", b"charges table missing"),
        ("x-error-kind", b"permanent"),
    ];
    h.extend_from_slice(extra);
    h
}

fn fast_replay(actor: &str, canary: u32) -> outbox::dlq::ReplayOptions {
    let mut o = outbox::dlq::ReplayOptions::default();
    o.canary = canary;
    o.canary_wait = Duration::from_secs(20);
    o.rate = 1000.0;
    o.confirm_kinds = true;
    o.actor = actor.into();
    o
}

fn of_topic(topic: &str) -> outbox::dlq::Filter {
    outbox::dlq::Filter {
        topic: Some(topic.to_owned()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comeback_filed_before_its_item_is_marked_sent_is_counted_on_the_job() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let dlq_topic = format!("{topic}.dlq");
    for i in 0..4 {
        let body = serde_json::to_vec(&serde_json::json!({ "order": i })).unwrap();
        produce(
            &dlq_topic,
            Some(b"k"),
            &letter_headers(&topic, &[]),
            Some(&body),
        )
        .await;
    }
    archive_once(&db, vec![dlq_topic.clone()]).await;
    let dlq = Dlq::new(&db);
    let job = dlq
        .create_job(&of_topic(&topic), &fast_replay("oncall", 0))
        .await
        .unwrap();
    // The consumer failed each replayed record again and the archiver filed it before the
    // runner's mark of the item committed (a fast consumer and archiver do): the letters
    // carry the job and letter they replay, their items are still pending.
    let ids: Vec<i64> = c
        .query("SELECT id FROM dead_letters ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let job_id = job.id.to_string();
    for id in &ids {
        let of = id.to_string();
        let extra: [(&str, &[u8]); 2] = [
            ("x-replay-job", job_id.as_bytes()),
            ("x-replay-of", of.as_bytes()),
        ];
        produce(
            &dlq_topic,
            Some(b"k"),
            &letter_headers(&topic, &extra),
            Some(b"{}"),
        )
        .await;
    }
    archive_once(&db, vec![dlq_topic.clone()]).await;
    assert_eq!(
        dlq.job(job.id).await.unwrap().came_back,
        4,
        "each comeback counted while its item is pending"
    );
    // Sent and marked afterwards: still 4, each named once.
    dlq.run_job(&kafka(), job.id, &Default::default(), &mut |_| {})
        .await
        .unwrap();
    let j = dlq.job(job.id).await.unwrap();
    assert_eq!((j.sent, j.came_back), (4, 4), "{j:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_fast_consumer_and_archiver_every_comeback_is_counted_and_the_canary_stops_the_replay(
) {
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let dlq_topic = format!("{topic}.dlq");
    // The consumer, still broken, fails every replayed record at once; the archiver files
    // each dead letter within its batch linger.
    let mut cfg = ConsumerConfig::new(format!("billing-{}", hex(6)), [&topic]);
    cfg.retry = RetryStrategy::InPlace {
        attempts: 1,
        base: Duration::from_millis(1),
        max: Duration::from_millis(1),
    };
    let consumer = Consumer::new(&db, &kafka(), cfg)
        .unwrap()
        .handler("order_created", still_broken);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    let archiver = outbox::dlq::Archiver::new(&db, &kafka(), vec![dlq_topic.clone()])
        .unwrap()
        .group(&format!("it-arch-{}", hex(6)));
    let (stop_archiver, archiver_stopped) = tokio::sync::oneshot::channel::<()>();
    let archiving = tokio::spawn(async move {
        archiver
            .run(async move {
                let _ = archiver_stopped.await;
            })
            .await
    });
    let dlq = Dlq::new(&db);
    // Round after round of a replay before the fix: every letter comes back, and the job
    // counts each one, whoever won the race between the runner's mark and the archive.
    let rounds = 6;
    for round in 0..rounds {
        let before = count(&c, "SELECT count(*) FROM dead_letters").await;
        for i in 0..8 {
            let body =
                serde_json::to_vec(&serde_json::json!({ "round": round, "order": i })).unwrap();
            produce(
                &dlq_topic,
                Some(b"k"),
                &letter_headers(&topic, &[]),
                Some(&body),
            )
            .await;
        }
        wait_until(
            Duration::from_secs(30),
            "the round's letters archived",
            || async { count(&c, "SELECT count(*) FROM dead_letters").await == before + 8 },
        )
        .await;
        let mut f = of_topic(&topic);
        f.status = Some(outbox::dlq::Status::New);
        f.ids = c
            .query(
                "SELECT id FROM dead_letters WHERE replay_job IS NULL AND status = 'new' ORDER BY id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let job = dlq.create_job(&f, &fast_replay("oncall", 0)).await.unwrap();
        dlq.run_job(&kafka(), job.id, &Default::default(), &mut |_| {})
            .await
            .unwrap();
        let filed = format!(
            "SELECT count(*) FROM dead_letters WHERE replay_job = {}",
            job.id
        );
        wait_until(
            Duration::from_secs(60),
            "the round's comebacks filed",
            || async { count(&c, &filed).await == 8 },
        )
        .await;
        let j = dlq.job(job.id).await.unwrap();
        assert_eq!((j.sent, j.came_back), (8, 8), "round {round}: {j:?}");
    }
    // A canary in the same setting: its first letters come back and it stops the replay.
    for i in 0..8 {
        let body = serde_json::to_vec(&serde_json::json!({ "canary": i })).unwrap();
        produce(
            &dlq_topic,
            Some(b"k"),
            &letter_headers(&topic, &[]),
            Some(&body),
        )
        .await;
    }
    let mut f = of_topic(&topic);
    wait_until(Duration::from_secs(30), "the canary round's letters", || async {
        count(&c, "SELECT count(*) FROM dead_letters WHERE convert_from(body, 'UTF8') LIKE '%canary%'").await == 8
    })
    .await;
    f.ids = c
        .query(
            "SELECT id FROM dead_letters WHERE convert_from(body, 'UTF8') LIKE '%canary%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let job = dlq.create_job(&f, &fast_replay("oncall", 2)).await.unwrap();
    let outcome = dlq
        .run_job(&kafka(), job.id, &Default::default(), &mut |_| {})
        .await
        .unwrap();
    assert!(
        matches!(outcome, outbox::dlq::RunOutcome::Paused(ref why) if why.contains("canary")),
        "{outcome:?}"
    );
    assert_eq!(
        dlq.job(job.id).await.unwrap().sent,
        2,
        "only the canary went"
    );
    stop.send(()).unwrap();
    consuming.await.unwrap().unwrap();
    stop_archiver.send(()).unwrap();
    archiving.await.unwrap().unwrap();
}
