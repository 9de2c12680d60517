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

    // The consumer is not fixed yet: whatever is replayed fails again.
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

    // Replay before the fix, without a canary, fast: the job ends before any comeback.
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
        "rule_files: [{rules}]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n      - series: 'outbox_dlq_replay_came_back_total{{topic=\"{topic}\"}}'\n        values: '{before}x5 {after}x10'\n    alert_rule_test:\n      - eval_time: 8m\n        alertname: OutboxReplayComingBack\n        exp_alerts:\n          - exp_labels: {{severity: warning, topic: \"{topic}\"}}\n            exp_annotations:\n              summary: \"Replayed dead letters of {topic} are coming back\"\n              description: \"{n} replayed letter(s) of {topic} were dead-lettered again in the last 15 minutes: the fix did not hold (replay before the fix?).\"\n              runbook: \"README.md#runbook-the-dlq-alert-fired--what-now\"\n",
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
