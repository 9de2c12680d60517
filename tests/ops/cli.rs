//! The `outbox` binary: migrate, status, requeue, cleanup, config errors, SIGTERM.

use std::collections::HashSet;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use outbox::Relay;
use outbox_testkit::*;

fn outbox_cmd(db: &outbox::DbConfig) -> Command {
    outbox_command(db)
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("spawn outbox")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Everything migrations create, as text, to compare before and after a second run.
async fn catalog(c: &tokio_postgres::Client, schema: &str) -> String {
    let q = "SELECT string_agg(x, E'\\n' ORDER BY x) FROM (
        SELECT table_name || '.' || column_name || ':' || data_type || ':' || coalesce(column_default, '') || ':' || is_nullable AS x
          FROM information_schema.columns WHERE table_schema = $1
        UNION ALL SELECT indexname || ':' || indexdef FROM pg_indexes WHERE schemaname = $1
        UNION ALL SELECT conname || ':' || pg_get_constraintdef(oid) FROM pg_constraint
         WHERE connamespace = $1::regnamespace
        UNION ALL SELECT tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = $1::regnamespace AND NOT t.tgisinternal
        UNION ALL SELECT 'history:' || version || ':' || name || ':' || applied_on
          FROM refinery_schema_history) s";
    c.batch_execute(&format!("SET search_path TO \"{schema}\""))
        .await
        .unwrap();
    c.query_one(q, &[&schema]).await.unwrap().get(0)
}

#[tokio::test]
async fn migrate_ring_moves_a_schema_with_a_backlog_once_and_refuses_bad_flags() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute(
        "INSERT INTO outbox (topic, message_key, payload) VALUES ('t.a', 'k', '{}'), ('t.a', 'k', '{}');
         UPDATE outbox SET status = 'failed', last_error = 'refused' WHERE id = (SELECT min(id) FROM outbox)",
    )
    .await
    .unwrap();
    let bad = run(outbox_cmd(&db).args(["migrate", "--ring", "--attempts", "0"]));
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    for wait in ["0s", "2h", "9999999999999s"] {
        let bad = run(outbox_cmd(&db).args(["migrate", "--ring", "--lock-wait", wait]));
        assert_eq!(bad.status.code(), Some(2), "{wait}: {}", text(&bad));
        assert!(
            text(&bad).contains("must be from 1ms to 1m"),
            "{}",
            text(&bad)
        );
    }
    // Not a duration at all: clap's usage error, exit 2.
    let long = "9".repeat(5000);
    for wait in ["abc", "-1s", "1s; DROP TABLE outbox", long.as_str()] {
        let flag = format!("--lock-wait={wait}");
        let bad = run(outbox_cmd(&db).args(["migrate", "--ring", flag.as_str()]));
        assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
        assert!(text(&bad).contains("--lock-wait"), "{}", text(&bad));
    }
    assert_eq!(
        texts(
            &c,
            "SELECT relkind::text FROM pg_class WHERE oid = 'outbox'::regclass"
        )
        .await,
        ["r"],
        "a refused command changes nothing"
    );
    // A transaction holding the table: every try waits its 100 ms and gives up, nothing moves.
    let mut holder = client(&db).await;
    let hold = holder.transaction().await.unwrap();
    hold.batch_execute("LOCK TABLE outbox IN ROW EXCLUSIVE MODE")
        .await
        .unwrap();
    let busy = run(outbox_cmd(&db).args([
        "migrate",
        "--ring",
        "--lock-wait",
        "100ms",
        "--attempts",
        "2",
    ]));
    assert_eq!(busy.status.code(), Some(1), "{}", text(&busy));
    assert!(text(&busy).contains("stayed locked"), "{}", text(&busy));
    hold.rollback().await.unwrap();
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await,
        2,
        "still on the table, both rows unsent"
    );

    let moved = run(outbox_cmd(&db).args(["migrate", "--ring"]));
    assert!(moved.status.success(), "{}", text(&moved));
    assert!(
        text(&moved).contains("moved onto ring storage (2 unsent rows carried over"),
        "{}",
        text(&moved)
    );
    let again = run(outbox_cmd(&db).args(["migrate", "--ring"]));
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("is on ring storage"),
        "{}",
        text(&again)
    );
    // Seed 002's view of the carried rows, unchanged.
    assert_eq!(
        texts(
            &c,
            "SELECT status || ':' || coalesce(last_error, '') FROM outbox ORDER BY id"
        )
        .await,
        ["failed:refused", "pending:"]
    );
    // The operator's verbs work on the ring as on the table: `requeue --failed` puts the
    // failed row back to pending, and `status` counts both rows pending.
    let requeued = run(outbox_cmd(&db).args(["requeue", "--failed"]));
    assert!(requeued.status.success(), "{}", text(&requeued));
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'pending'").await,
        2,
        "{}",
        text(&requeued)
    );
    let status = run(outbox_cmd(&db).args(["status", "--json"]));
    assert!(status.status.success(), "{}", text(&status));
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["storage"]["layout"], "ring", "{v}");
}

#[tokio::test]
async fn migrate_twice_is_a_no_op_and_creates_the_seed_schema() {
    let schema = format!("m_{}", hex(10));
    let db = outbox::DbConfig::new(&database_url(), &schema).unwrap();
    let first = run(outbox_cmd(&db).arg("migrate"));
    assert!(first.status.success(), "{}", text(&first));
    assert!(text(&first).contains("applied V1__outbox"));
    let c = outbox::connect(&db).await.unwrap();
    let before = catalog(&c, &schema).await;
    let second = run(outbox_cmd(&db).arg("migrate"));
    assert!(second.status.success(), "{}", text(&second));
    assert!(text(&second).contains("up to date"), "{}", text(&second));
    assert_eq!(
        before,
        catalog(&c, &schema).await,
        "second migrate changed the schema"
    );

    // Seed 002's table, constraint and indexes, exactly.
    for expected in [
        "outbox.id:bigint::NO",
        "outbox.headers:jsonb:'{}'::jsonb:NO",
        "outbox.status:text:'pending'::text:NO",
        "outbox.attempts:integer:0:NO",
        "outbox.available_at:timestamp with time zone:now():NO",
        "outbox.sent_at:timestamp with time zone::YES",
        "outbox_status_check:CHECK ((status = ANY (ARRAY['pending'::text, 'sent'::text, 'failed'::text])))",
        "WHERE (status = 'pending'::text)",
        "outbox_pending_idx:CREATE INDEX outbox_pending_idx ON",
        "processed_messages_pkey:PRIMARY KEY (consumer_group, topic, message_id)",
        "processed_messages_processed_at_idx:CREATE INDEX",
        "processed_messages.processed_at:timestamp with time zone:now():NO",
    ] {
        assert!(before.contains(expected), "missing {expected:?} in\n{before}");
    }
    let cols = count(&c, &format!("SELECT count(*) FROM information_schema.columns WHERE table_schema = '{schema}' AND table_name = 'outbox'")).await;
    assert_eq!(cols, 11, "outbox has exactly seed 002's columns");

    // Concurrent migrations of a new schema serialise on the advisory lock.
    let schema2 = format!("m_{}", hex(10));
    let db2 = outbox::DbConfig::new(&database_url(), &schema2).unwrap();
    let (a, b) = tokio::join!(outbox::migrate(&db2), outbox::migrate(&db2));
    let applied = a.unwrap().applied.len() + b.unwrap().applied.len();
    assert_eq!(applied, outbox::embedded_migrations().len());
}

#[tokio::test]
async fn status_requeue_and_their_errors() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute(
        "INSERT INTO outbox (topic, payload, status, attempts, last_error) VALUES
           ('a.b', '{}', 'failed', 10, 'topic does not exist'),
           ('a.b', '{}', 'failed', 10, 'topic does not exist'),
           ('a.b', '{}', 'failed', 10, 'message too large'),
           ('a.b', '{}', 'sent', 1, NULL),
           ('a.b', '{}', 'pending', 0, NULL)",
    )
    .await
    .unwrap();
    let o = run(outbox_cmd(&db).args(["status", "--json"]));
    assert!(o.status.success(), "{}", text(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        s["failed_by_error"][0]["last_error"],
        "topic does not exist"
    );
    assert_eq!(s["failed_by_error"][0]["count"], 2);
    assert!(s["oldest_pending_age_secs"].as_f64().unwrap() >= 0.0);
    let o = run(outbox_cmd(&db).arg("status"));
    let t = text(&o);
    assert!(
        t.contains("failed") && t.contains("message too large") && t.contains("oldest pending age"),
        "{t}"
    );

    let id: i64 = c
        .query_one(
            "SELECT min(id) FROM outbox WHERE last_error = 'message too large'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let o = run(outbox_cmd(&db).args(["requeue", "--id", &id.to_string()]));
    assert!(
        o.status.success() && text(&o).contains("requeued 1"),
        "{}",
        text(&o)
    );
    let row = c
        .query_one(
            "SELECT status, attempts, available_at <= now() FROM outbox WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, &str>(0),
            row.get::<_, i32>(1),
            row.get::<_, bool>(2)
        ),
        ("pending", 0, true)
    );

    // Requeueing a row that is not failed is refused with a clear message and exit != 0.
    let o = run(outbox_cmd(&db).args(["requeue", "--id", &id.to_string()]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no failed row with id"), "{}", text(&o));

    let o = run(outbox_cmd(&db).args(["requeue", "--failed"]));
    assert!(
        o.status.success() && text(&o).contains("requeued 2"),
        "{}",
        text(&o)
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'failed'").await,
        0
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await,
        1
    );
    // Each requeue that changed rows is audited, marked as coming from the CLI, with the ids;
    // the refused one is not.
    assert_eq!(
        texts(
            &c,
            "SELECT via || ' ' || count || ' ' || array_length(dead_letter_ids, 1) FROM dlq_audit
              WHERE action = 'requeue' ORDER BY id"
        )
        .await,
        ["outbox-cli 1 1", "outbox-cli 2 2"]
    );
    let o = run(outbox_cmd(&db).args(["dlq", "audit"]));
    assert!(
        text(&o).contains(" cli ") && text(&o).contains("requeue"),
        "{}",
        text(&o)
    );

    let o = run(outbox_cmd(&db).arg("requeue"));
    assert_eq!(
        o.status.code(),
        Some(2),
        "requeue needs --failed or --id: {}",
        text(&o)
    );
}

#[tokio::test]
async fn cleanup_deletes_only_rows_past_retention_in_bounded_batches() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute(
        "INSERT INTO outbox (topic, payload, status, created_at, sent_at)
           SELECT 'a.b', '{}', 'sent', now() - interval '9 days', now() - interval '8 days' FROM generate_series(1, 7);
         INSERT INTO outbox (topic, payload, status, created_at, sent_at) VALUES
           ('a.b', '{\"keep\":\"recent sent\"}', 'sent', now() - interval '9 days', now() - interval '6 days');
         INSERT INTO outbox (topic, payload, status, created_at) VALUES
           ('a.b', '{\"keep\":\"old pending\"}', 'pending', now() - interval '30 days'),
           ('a.b', '{\"keep\":\"old failed\"}', 'failed', now() - interval '30 days');
         INSERT INTO processed_messages (consumer_group, topic, message_id, processed_at)
           SELECT 'g', 'a.b', 'old-' || i, now() - interval '36 days' FROM generate_series(1, 5) i;
         INSERT INTO processed_messages (consumer_group, topic, message_id, processed_at) VALUES
           ('g', 'a.b', 'recent', now() - interval '34 days');
         INSERT INTO dead_letters (dlq_topic, \"partition\", \"offset\", original_topic, failed_at, archived_at, status, error) VALUES
           ('a.b.dlq', 0, 1, 'a.b', now(), now() - interval '31 days', 'replayed', 'old replayed'),
           ('a.b.dlq', 0, 2, 'a.b', now(), now() - interval '31 days', 'dropped', 'old dropped'),
           ('a.b.dlq', 0, 3, 'a.b', now(), now() - interval '31 days', 'new', 'old new'),
           ('a.b.dlq', 0, 4, 'a.b', now(), now() - interval '29 days', 'replayed', 'recent replayed'),
           ('a.b.dlq', 0, 5, 'a.b', now(), now() - interval '31 days', 'replayed', 'old, in a paused job');
         INSERT INTO dlq_audit (actor, action, filter, count) VALUES ('t', 'replay', '{}', 1);
         INSERT INTO dlq_replay_jobs (created_by, audit_id, filter, rate, canary, canary_wait_ms, max_refail, status)
           VALUES ('t', (SELECT max(id) FROM dlq_audit), '{}', 10, 0, 0, 0.1, 'paused');
         INSERT INTO dlq_replay_items (job_id, dead_letter_id, seq, state)
           SELECT (SELECT max(id) FROM dlq_replay_jobs), id, 1, 'sent' FROM dead_letters WHERE \"offset\" = 5;",
    )
    .await
    .unwrap();
    let o = run(outbox_cmd(&db).args(["cleanup", "--cleanup-batch-size", "3"]));
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    // 7 sent rows in batches of 3 → 3 statements; 5 marks → 2; dead-lettered records → 1;
    // settled dead letters → 1.
    assert!(
        t.contains(
            "deleted 7 sent outbox row(s), 5 processed_messages row(s) and 2 settled dead letter(s) in 7 statement(s)"
        ),
        "{t}"
    );
    // Settled letters past 30 days are purged and audited; new ones are never purged.
    let left: Vec<String> = c
        .query("SELECT error FROM dead_letters ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["old new", "recent replayed", "old, in a paused job"]);
    assert_eq!(
        count(
            &c,
            "SELECT count FROM dlq_audit WHERE action = 'archive-purge' AND actor = 'cleanup'"
        )
        .await,
        2
    );
    let kept: Vec<String> = c
        .query("SELECT payload->>'keep' FROM outbox ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kept, ["recent sent", "old pending", "old failed"]);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM processed_messages WHERE message_id = 'recent'"
        )
        .await,
        1
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM processed_messages").await,
        1
    );

    // Retention is configurable.
    let o = run(outbox_cmd(&db).args([
        "cleanup",
        "--sent-retention",
        "5d",
        "--processed-retention",
        "1d",
    ]));
    assert!(
        text(&o).contains("deleted 1 sent outbox row(s), 1 processed_messages"),
        "{}",
        text(&o)
    );
}

#[tokio::test]
async fn relay_runs_cleanup_on_its_schedule() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute(
        "INSERT INTO outbox (topic, payload, status, sent_at) VALUES ('a.b', '{}', 'sent', now() - interval '8 days');
         INSERT INTO processed_messages (consumer_group, topic, message_id, processed_at) VALUES ('g', 't', 'x', now() - interval '36 days');",
    )
    .await
    .unwrap();
    let cfg = {
        let mut c = relay_config();
        c.cleanup = {
            let mut cc = outbox::CleanupConfig::default();
            cc.interval = Some(Duration::from_millis(200));
            cc
        };
        c
    };
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    wait_until(Duration::from_secs(10), "scheduled cleanup", || async {
        count(
            &c,
            "SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM processed_messages)",
        )
        .await
            == 0
    })
    .await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
}

#[tokio::test]
async fn invalid_configuration_is_refused_with_a_clear_message_and_exit_2() {
    let db = fresh_db().await;
    // (arguments, environment, expected text in the error)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["migrate", "--schema", "x\"; drop table outbox; --"],
            vec![],
            "invalid schema name",
        ),
        (
            vec!["status"],
            vec![("DATABASE_URL", "postgres://u:sekrit@h:notaport/db")],
            "invalid DATABASE_URL",
        ),
        (vec!["status"], vec![("DATABASE_URL", "")], "DATABASE_URL"),
        (
            vec!["relay"],
            vec![("KAFKA_BOOTSTRAP_SERVERS", "")],
            "KAFKA_BOOTSTRAP_SERVERS",
        ),
        (
            vec!["relay"],
            vec![("KAFKA_BOOTSTRAP_SERVERS", "nohostport")],
            "not host:port",
        ),
        (vec!["relay", "--batch-size", "0"], vec![], "batch size"),
        (
            vec!["relay", "--batch-size", "many"],
            vec![],
            "invalid value",
        ),
        (vec!["relay", "--max-attempts", "0"], vec![], "max attempts"),
        (
            vec!["relay", "--poll-interval", "soon"],
            vec![],
            "invalid value",
        ),
        (
            vec!["relay", "--cleanup-interval", "0s"],
            vec![],
            "greater than zero",
        ),
        (
            vec!["relay", "--sweep-interval", "0s"],
            vec![],
            "sweep interval",
        ),
        (
            vec!["relay", "--long-transaction", "100ms"],
            vec![],
            "long transaction",
        ),
        (vec!["relay", "-X", "acks=1"], vec![], "acks=all"),
        (
            vec!["relay", "-X", "enable.idempotence=false"],
            vec![],
            "enable.idempotence=true",
        ),
        (
            vec!["relay", "-X", "no.such.property=sekrit"],
            vec![],
            "no.such.property",
        ),
        (vec!["relay", "-X", "novalue"], vec![], "name=value"),
        (
            vec!["cleanup", "--cleanup-batch-size", "0"],
            vec![],
            "at least 1",
        ),
        (vec!["bogus-verb"], vec![], "unrecognized subcommand"),
    ];
    for (args, envs, expect) in cases {
        let mut cmd = outbox_cmd(&db);
        cmd.args(&args);
        for (k, v) in &envs {
            cmd.env(k, v);
        }
        let o = run(&mut cmd);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?} {envs:?}: {t}");
        assert!(t.contains(expect), "{args:?}: expected {expect:?} in {t}");
        assert!(!t.contains("sekrit"), "secret echoed: {t}");
        assert!(!t.contains("panicked"), "{t}");
    }
    // Unreachable Postgres for a one-shot command: exit 1 with a message, no panic.
    let o = run(outbox_cmd(&db).arg("status").env(
        "DATABASE_URL",
        "postgres://outbox:sekrit@127.0.0.1:1/outbox",
    ));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("status failed") && !text(&o).contains("sekrit"),
        "{}",
        text(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_backlog_exits_0_leaves_nothing_locked_and_a_new_relay_finishes() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let ids = enqueue_n(&db, &topic, 30_000, 100, 2000).await;
    let c = client(&db).await;

    let child = outbox_cmd(&db)
        .args(["relay", "--batch-size", "200", "--cleanup-interval", "off"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "relay makes progress", || async {
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await >= 1000
    })
    .await;
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(
        log.contains("SIGTERM received") && log.contains("relay stopped"),
        "{log}"
    );

    let sent_at_stop = count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await;
    assert!(
        sent_at_stop < 30_000,
        "stopped mid-backlog ({sent_at_stop} sent)"
    );
    // No row left locked: every pending row can be locked right now.
    let mut c2 = client(&db).await;
    let tx = c2.transaction().await.unwrap();
    let pending: i64 = tx
        .query_one("SELECT count(*) FROM outbox WHERE status = 'pending'", &[])
        .await
        .unwrap()
        .get(0);
    let lockable = tx
        .query(
            "SELECT id FROM outbox WHERE status = 'pending' FOR UPDATE SKIP LOCKED",
            &[],
        )
        .await
        .unwrap()
        .len() as i64;
    assert_eq!(pending, lockable);
    tx.rollback().await.unwrap();

    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    drain(&relay).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await,
        30_000
    );
    let got: HashSet<String> = read_all(&topic)
        .await
        .iter()
        .map(Record::message_id)
        .collect();
    assert_eq!(
        got,
        ids.into_iter().collect::<HashSet<_>>(),
        "every message reached Kafka"
    );
}

#[tokio::test]
async fn topics_apply_creates_chain_then_reports_drift_and_fixes_only_when_asked() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    let db = fresh_db().await;
    let base = topic_name();
    let dir = std::env::temp_dir().join(format!("topics-{}", hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("topics.toml");
    std::fs::write(
        &file,
        format!("[defaults]\npartitions = 2\ngroups = [\"billing-service\"]\n[[topic]]\nname = \"{base}\"\n"),
    )
    .unwrap();
    let f = file.to_str().unwrap();

    let o = run(outbox_cmd(&db).args(["topics", "apply", f]));
    assert!(o.status.success(), "{}", text(&o));
    for suffix in [
        "",
        ".billing-service.retry-5s",
        ".billing-service.retry-30s",
        ".billing-service.retry-5m",
        ".dlq",
    ] {
        assert!(
            text(&o).contains(&format!("created   {base}{suffix}\n")),
            "{}",
            text(&o)
        );
    }
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let dlq = format!("{base}.dlq");
    let cfg = admin
        .describe_configs([&ResourceSpecifier::Topic(&dlq)], &AdminOptions::new())
        .await
        .unwrap();
    let retention = cfg[0]
        .as_ref()
        .unwrap()
        .get("retention.ms")
        .unwrap()
        .value
        .clone()
        .unwrap();
    assert_eq!(retention, "2592000000", "DLQ keeps 30 days");

    let o = run(outbox_cmd(&db).args(["topics", "apply", f]));
    assert!(
        o.status.success() && text(&o).contains(&format!("ok        {base}\n")),
        "{}",
        text(&o)
    );

    // Grown in the file: drift, exit 1, nothing changed; then --fix grows it.
    std::fs::write(
        &file,
        format!("[[topic]]\nname = \"{base}\"\npartitions = 4\nretry_delays = []\n"),
    )
    .unwrap();
    let o = run(outbox_cmd(&db).args(["topics", "apply", f]));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "DRIFT     {base}: partitions is 2 on the broker, 4 in the file"
        )) && text(&o).contains("--fix"),
        "{}",
        text(&o)
    );
    let o = run(outbox_cmd(&db).args(["topics", "apply", "--fix", f]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("fixed     {base}: partitions 2 -> 4")),
        "{}",
        text(&o)
    );
    // Never shrinks, even with --fix.
    std::fs::write(
        &file,
        format!("[[topic]]\nname = \"{base}\"\npartitions = 1\nretry_delays = []\n"),
    )
    .unwrap();
    let o = run(outbox_cmd(&db).args(["topics", "apply", "--fix", f]));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("partitions is 4 on the broker, 1 in the file (not fixable"),
        "{}",
        text(&o)
    );

    // A topic family created by hand with the broker's defaults (RF 1, 7-day DLQ) and one
    // override of its own, against a file asking for RF 3 and a 60-day DLQ.
    let hand = topic_name();
    create_topic(&hand, 1).await;
    create_topic(&format!("{hand}.dlq"), 1).await;
    let own = rdkafka::admin::AlterConfig::new(ResourceSpecifier::Topic(&hand))
        .set("max.message.bytes", "2000000");
    admin
        .alter_configs([&own], &AdminOptions::new())
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
    std::fs::write(
        &file,
        format!(
            "[defaults]\npartitions = 1\nreplication_factor = 3\ndlq_replication_factor = 1\n\
             dlq_retention = \"60d\"\nretry_delays = []\n[[topic]]\nname = \"{hand}\"\n"
        ),
    )
    .unwrap();
    let o = run(outbox_cmd(&db).args(["topics", "apply", f]));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    for line in [
        format!(
            "DRIFT     {hand}: replication.factor is 1 on the broker, 3 in the file (not fixable"
        ),
        format!("DRIFT     {hand}: min.insync.replicas is 1 on the broker, 2 in the file"),
        format!(
            "DRIFT     {hand}.dlq: retention.ms is 604800000 on the broker, 5184000000 in the file"
        ),
    ] {
        assert!(text(&o).contains(&line), "{line:?} missing:\n{}", text(&o));
    }
    let o = run(outbox_cmd(&db).args(["topics", "apply", "--fix", f]));
    assert_eq!(o.status.code(), Some(1), "RF cannot be fixed: {}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "fixed     {hand}.dlq: retention.ms 604800000 -> 5184000000"
        )) && text(&o).contains(&format!("fixed     {hand}: min.insync.replicas 1 -> 2")),
        "{}",
        text(&o)
    );
    let described = admin
        .describe_configs(
            [
                &ResourceSpecifier::Topic(&hand),
                &ResourceSpecifier::Topic(&format!("{hand}.dlq")),
            ],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    let value = |i: usize, k: &str| {
        described[i]
            .as_ref()
            .unwrap()
            .get(k)
            .unwrap()
            .value
            .clone()
            .unwrap()
    };
    assert_eq!(value(1, "retention.ms"), "5184000000");
    assert_eq!(
        value(0, "max.message.bytes"),
        "2000000",
        "the topic's own override was kept"
    );
    // Only the replication factor is left; the DLQ now matches.
    let o = run(outbox_cmd(&db).args(["topics", "apply", f]));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("ok        {hand}.dlq\n"))
            && !text(&o).contains("retention.ms is"),
        "{}",
        text(&o)
    );

    std::fs::write(&file, "[[topic]]\nname = \"bad name\"\n").unwrap();
    let o = run(outbox_cmd(&db).args(["topics", "apply", f]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("invalid topic name"), "{}", text(&o));
}

#[test]
fn log_format_json_writes_one_json_object_per_line() {
    use std::io::{BufRead, BufReader};
    let db = outbox::DbConfig::new(&database_url(), "public").unwrap();
    let mut child = outbox_cmd(&db)
        .args([
            "--log-format",
            "json",
            "admin",
            "--listen",
            "127.0.0.1:0",
            "--insecure-no-auth",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    for l in [first, second] {
        let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{l}"
        );
    }
}

#[tokio::test]
async fn a_reader_that_closes_the_pipe_ends_the_command_quietly() {
    // `outbox status | head -1`: the reader is gone before the command writes (here: the pipe
    // is closed before the command has even connected). The command must end with exit 0,
    // never a panic (exit 101) or an error message.
    let db = fresh_db().await;
    for args in [vec!["status"], vec!["dlq", "summary"], vec!["dlq", "audit"]] {
        let mut child = outbox_cmd(&db)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
    }
    // The reader's leaving does not change the command's verdict: a requeue of a row that is
    // not failed still exits 2 after its result line went nowhere.
    let mut child = outbox_cmd(&db)
        .args(["requeue", "--id", "999999"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no failed row with id 999999"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_sent_republishes_one_topic_in_audited_batches_after_a_count() {
    let db = fresh_db().await;
    let (lost, other) = (topic_name(), topic_name());
    create_topic(&lost, 2).await;
    create_topic(&other, 1).await;
    let ids = enqueue_n(&db, &lost, 30, 5, 10).await;
    enqueue_n(&db, &other, 5, 5, 5).await;
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    drain(&relay).await;
    let c = client(&db).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await,
        35
    );

    // The broker lost `lost`; first a count.
    let o = run(outbox_cmd(&db).args(["requeue", "--sent", "--topic", &lost, "--dry-run"]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("30 sent row(s) of {lost} selected"))
            && text(&o).contains("dry run: nothing changed"),
        "{}",
        text(&o)
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'pending'").await,
        0
    );
    // A window in the future selects nothing.
    let o = run(outbox_cmd(&db).args([
        "requeue",
        "--sent",
        "--topic",
        &lost,
        "--since",
        "2999-01-01T00:00:00Z",
    ]));
    assert!(
        o.status.success() && text(&o).contains("0 sent row(s)"),
        "{}",
        text(&o)
    );

    let o = run(outbox_cmd(&db).args([
        "requeue", "--sent", "--topic", &lost, "--batch", "7", "--actor", "oncall",
    ]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("requeued 30 sent row(s) in 5 batch(es)"),
        "{}",
        text(&o)
    );
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM outbox WHERE status = 'pending' AND topic = '{lost}'")
        )
        .await,
        30
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM dlq_audit WHERE action = 'requeue-sent' AND actor = 'oncall'"
        )
        .await,
        5,
        "each batch audited"
    );
    assert_eq!(
        count(
            &c,
            "SELECT sum(count)::bigint FROM dlq_audit WHERE action = 'requeue-sent'"
        )
        .await,
        30
    );
    // A running relay hears the rewind notification; this one is driven by hand.
    assert!(relay.sweep().await.unwrap().is_some());
    drain(&relay).await;
    let records = read_all(&lost).await;
    assert_eq!(records.len(), 60, "every row published a second time");
    let mut second: Vec<String> = records[..]
        .iter()
        .map(|r| r.message_id().to_owned())
        .collect();
    second.sort();
    second.dedup();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(second, expected, "same message ids: the inbox absorbs them");
    assert_eq!(read_all(&other).await.len(), 5, "other topics untouched");

    for bad in [
        vec!["requeue", "--sent"],
        vec![
            "requeue",
            "--sent",
            "--topic",
            &lost,
            "--since",
            "yesterday-ish",
        ],
        vec!["requeue", "--sent", "--topic", "bad topic"],
        vec!["requeue", "--failed", "--sent", "--topic", &lost],
    ] {
        let o = run(outbox_cmd(&db).args(&bad));
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", text(&o));
    }
}

#[tokio::test]
async fn message_data_never_drives_the_terminal_and_head_1_ends_the_listing_quietly() {
    let db = fresh_db().await;
    let c = client(&db).await;
    // A hostile producer's letter: escape sequences in key, header, error and body, and enough
    // letters that `dlq list` writes more than `head -1` reads.
    c.execute(
        "INSERT INTO dead_letters (dlq_topic, \"partition\", \"offset\", original_topic, message_key,
                                   body, headers, error, failed_at)
         SELECT 'a.b.dlq', 0, g, 'a.b', convert_to(E'k\\x1b[2J', 'UTF8'),
                convert_to(E'{\"x\":\"\\x1b]0;owned\\x07\"}', 'UTF8'),
                jsonb_build_array(jsonb_build_object('name', 'x-evil', 'value', E'\\x1b[31mred')),
                E'boom \\x1b[2J here', now()
           FROM generate_series(1, 3000) g",
        &[],
    )
    .await
    .unwrap();
    let id: i64 = c
        .query_one("SELECT min(id) FROM dead_letters", &[])
        .await
        .unwrap()
        .get(0);
    for args in [
        vec!["dlq".to_owned(), "show".to_owned(), id.to_string()],
        vec![
            "dlq".to_owned(),
            "list".to_owned(),
            "--limit".to_owned(),
            "5".to_owned(),
        ],
        vec!["dlq".to_owned(), "summary".to_owned()],
    ] {
        let o = run(outbox_cmd(&db).args(&args));
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(
            !o.stdout.contains(&0x1b) && !o.stdout.contains(&0x07),
            "{args:?} printed raw control characters"
        );
        if args[1] == "show" {
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                out.contains("\\x1b[2J") && out.contains("\\x1b[31mred"),
                "{out}"
            );
        }
    }
    // Sorted both ways, each paged with --past-id (the hint on stderr says which).
    let ids_of = |o: &std::process::Output| -> Vec<i64> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
            .collect()
    };
    let newest = run(outbox_cmd(&db).args(["dlq", "list", "--limit", "2"]));
    let oldest = run(outbox_cmd(&db).args(["dlq", "list", "--limit", "2", "--oldest-first"]));
    assert_eq!(ids_of(&oldest), [id, id + 1], "{}", text(&oldest));
    assert_eq!(ids_of(&newest), [id + 2999, id + 2998], "{}", text(&newest));
    assert!(text(&oldest).contains(&format!("more: add --past-id {}", id + 1)));
    let next = run(outbox_cmd(&db)
        .args(["dlq", "list", "--limit", "2", "--oldest-first", "--past-id"])
        .arg((id + 1).to_string()));
    assert_eq!(ids_of(&next), [id + 2, id + 3], "{}", text(&next));
    // `outbox dlq list --limit 3000 | head -1`: the reader leaves mid-listing.
    let mut child = outbox_cmd(&db)
        .args(["dlq", "list", "--limit", "3000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Read;
        let mut first = [0u8; 64];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
    }
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        matches!(o.status.code(), Some(0) | Some(141)) && !err.contains("panicked"),
        "{:?}: {err}",
        o.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_and_an_archiver_stopped_cleanly_show_stopped_at_once_not_alive() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&format!("{topic}.dlq"), 1).await;
    let spawn = |args: &[&str]| {
        outbox_cmd(&db)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let dlq_topic = format!("{topic}.dlq");
    let mut relay = spawn(&["relay"]);
    let mut archiver = spawn(&["dlq", "archive", "--topic", &dlq_topic]);
    wait_until(Duration::from_secs(30), "both alive", || async {
        outbox::instances::overview(&db).await.is_ok_and(|o| {
            ["relay", "archiver"]
                .iter()
                .all(|k| o.instances.iter().any(|i| i.kind == *k && i.alive))
        })
    })
    .await;
    for p in [&relay, &archiver] {
        let o = Command::new("kill")
            .args(["-TERM", &p.id().to_string()])
            .output()
            .unwrap();
        assert!(o.status.success());
    }
    assert!(relay.wait().unwrap().success());
    assert!(archiver.wait().unwrap().success());
    // At once, not when the heartbeat ages out (30 s): stopped, not alive, not "gone".
    let o = outbox::instances::overview(&db).await.unwrap();
    for kind in ["relay", "archiver"] {
        let i = o.instances.iter().find(|i| i.kind == kind).unwrap();
        assert!(i.stopped && !i.alive, "{kind}: {i:?}");
    }
    assert!(o.archiver.late, "a stopped archiver archives nothing");
    let relays = outbox::verdict::verdicts(&o)
        .into_iter()
        .find(|v| v.tile == "relays")
        .unwrap();
    assert_eq!(relays.level, outbox::verdict::Level::Warn, "{relays:?}");
}

/// `outbox tenants` keeps a fleet's registry, and `outbox relay --tenants` publishes every
/// registered outbox from one process, with one `tenant` series per outbox on /metrics, and
/// stops on SIGTERM. Two tenants of one topic look it up on the cluster once between them. Bad registry input exits 2 naming the field; a `--database` without `=`
/// exits 2 without echoing what it was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_verbs_keep_the_registry_and_one_relay_publishes_every_tenant() {
    let control = fresh_db().await;
    let (a, b, h) = (fresh_db().await, fresh_db().await, fresh_db().await);
    let (ta, tb) = (topic_name(), topic_name());
    create_topic(&ta, 3).await;
    create_topic(&tb, 3).await;
    let tenants = |args: &[&str]| run(outbox_cmd(&control).arg("tenants").args(args));
    for (name, db) in [("acme", &a), ("globex", &b), ("hooli", &h)] {
        let o = tenants(&[
            "add",
            name,
            "--tenant-schema",
            db.schema.name(),
            "--weight",
            "2",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let list = tenants(&["list"]);
    assert_eq!(list.status.code(), Some(0), "{}", text(&list));
    let listed = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(
        listed.contains("acme") && listed.contains("globex") && listed.contains("hooli"),
        "{listed}"
    );
    assert!(listed.contains("weight 2"), "{listed}");
    for (args, says) in [
        (
            vec!["add", "bad name", "--tenant-schema", "x"],
            "tenant \"bad name\"",
        ),
        (
            vec!["add", "t1", "--tenant-schema", "Bad-Schema"],
            "invalid schema name",
        ),
        (
            vec![
                "add",
                "t1",
                "--tenant-schema",
                "x",
                "--database",
                "postgres://u:p@h/db",
            ],
            "not a URL",
        ),
        (
            vec!["add", "t1", "--tenant-schema", "x", "--weight", "0"],
            "weight 0",
        ),
        (vec!["disable", "nobody"], "no tenant \"nobody\""),
        (vec!["remove", "nobody"], "no tenant \"nobody\""),
    ] {
        let o = tenants(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains(":p@"), "{}", text(&o));
    }
    let o = run(outbox_cmd(&control).args([
        "relay",
        "--tenants",
        "--database",
        "postgres://u:secret@h/db",
    ]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!text(&o).contains("secret"), "{}", text(&o));

    enqueue_n(&a, &ta, 100, 10, 10).await;
    enqueue_n(&b, &tb, 100, 10, 10).await;
    // hooli publishes to acme's topic.
    enqueue_n(&h, &ta, 100, 10, 10).await;
    let port = free_port();
    let child = outbox_cmd(&control)
        .args([
            "relay",
            "--tenants",
            "--cleanup-interval",
            "off",
            "--tenant-labels",
            "1",
            // One pass at a time: no two tenants look a topic up at the same moment, so the
            // count of lookups below is exact.
            "--fleet-passes",
            "1",
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for (t, n) in [(&ta, 200), (&tb, 100)] {
        wait_until(Duration::from_secs(60), "each tenant published", || async {
            topic_len(t).await >= n
        })
        .await;
    }
    // The gauges are refreshed at start, then every 15 s. With one tenant label: acme (the
    // first) has its own series; globex is counted under "other" and has none of its own.
    wait_until(
        Duration::from_secs(30),
        "acme's series and other's",
        || async {
            let body = tokio::task::spawn_blocking(move || {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
                use std::io::{Read, Write};
                s.write_all(
                    b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                )
                .ok()?;
                let mut b = String::new();
                s.read_to_string(&mut b).ok()?;
                Some(b)
            })
            .await
            .unwrap()
            .unwrap_or_default();
            let series = |t: &str| {
                body.lines().any(|l| {
                    l.starts_with("outbox_rows{")
                        && l.contains("status=\"pending\"")
                        && l.contains(&format!("tenant=\"{t}\""))
                })
            };
            assert!(!series("globex"), "a label past the cap:\n{body}");
            if !(series("acme") && series("other")) {
                return false;
            }
            // Three tenants, two topics, everything published: each topic was looked up on
            // the cluster once, acme's for acme and hooli together.
            let lookups = body
                .lines()
                .find(|l| l.starts_with("outbox_topic_lookups_total"))
                .and_then(|l| l.split_whitespace().last());
            assert_eq!(lookups, Some("2"), "{body}");
            true
        },
    )
    .await;
    // Disabled from the CLI while it runs: the relay stops publishing it.
    let o = tenants(&["disable", "globex"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = tenants(&["list", "--json"]);
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[1]["enabled"], false);
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("fleet stopped"), "{log}");
    for gone in ["acme", "hooli"] {
        let o = tenants(&["remove", gone]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }

    // `migrate --tenants`: a tenant added before its schema exists is migrated with the
    // others; one naming a database not given fails alone, and the exit code says so.
    let fresh_schema = format!("t_{}", hex(12));
    let o = tenants(&["add", "initech", "--tenant-schema", &fresh_schema]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = run(outbox_cmd(&control).args(["migrate", "--tenants"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("tenant globex") && t.contains("up to date"),
        "{t}"
    );
    assert!(
        t.contains("tenant initech") && t.contains("migrations applied"),
        "{t}"
    );
    let c = client(&control).await;
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM information_schema.tables WHERE table_schema = '{fresh_schema}' AND table_name = 'outbox_tenants'")
        )
        .await,
        1
    );
    let o = tenants(&[
        "add",
        "umbrella",
        "--tenant-schema",
        &fresh_schema,
        "--database",
        "shard9",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = run(outbox_cmd(&control).args(["migrate", "--tenants"]));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("database shard9 not given"),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains("1 of 3 tenants not migrated: umbrella"),
        "{}",
        text(&o)
    );
}

/// `status`, `cleanup` and `migrate` act on every tenant of the registry (`--tenants`) or one
/// (`--tenant NAME`), each in its own outbox; `dlq list --tenant` selects a tenant's letters
/// (the archive records the `x-tenant` header). An unknown tenant exits 1 naming it, a bad
/// name or a `--database` without a tenant selection exits 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_cleanup_migrate_and_dlq_list_act_on_all_tenants_or_one() {
    let control = fresh_db().await;
    let (a, b) = (fresh_db().await, fresh_db().await);
    let topic = topic_name();
    for (name, db) in [("acme", &a), ("globex", &b)] {
        let o = run(outbox_cmd(&control).args([
            "tenants",
            "add",
            name,
            "--tenant-schema",
            db.schema.name(),
        ]));
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    enqueue_n(&a, &topic, 5, 5, 5).await;
    enqueue_n(&b, &topic, 3, 3, 3).await;

    let o = run(outbox_cmd(&control).args(["status", "--tenants", "--json"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pending = |t: &serde_json::Value| {
        t["status"]["counts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["status"] == "pending")
            .map_or(0, |c| c["count"].as_i64().unwrap())
    };
    let tenants = doc["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 2, "{doc}");
    assert_eq!(
        (tenants[0]["tenant"].as_str(), pending(&tenants[0])),
        (Some("acme"), 5)
    );
    assert_eq!(
        (tenants[1]["tenant"].as_str(), pending(&tenants[1])),
        (Some("globex"), 3)
    );
    let o = run(outbox_cmd(&control).args(["status", "--tenant", "globex"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("== tenant globex (default."), "{t}");
    assert!(!t.contains("acme"), "{t}");

    // Cleanup of one tenant: acme's old sent rows go, globex's stay.
    for db in [&a, &b] {
        client(db)
            .await
            .batch_execute(
                "UPDATE outbox SET status = 'sent', sent_at = now() - interval '30 days'",
            )
            .await
            .unwrap();
    }
    let o = run(outbox_cmd(&control).args(["cleanup", "--tenant", "acme"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("tenant acme (default.")
            && text(&o).contains("deleted 5 sent outbox row(s)"),
        "{}",
        text(&o)
    );
    assert_eq!(
        count(&client(&a).await, "SELECT count(*) FROM outbox").await,
        0
    );
    assert_eq!(
        count(&client(&b).await, "SELECT count(*) FROM outbox").await,
        3
    );
    let o = run(outbox_cmd(&control).args(["cleanup", "--tenants"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("tenant globex (default."), "{}", text(&o));
    assert_eq!(
        count(&client(&b).await, "SELECT count(*) FROM outbox").await,
        0
    );

    let o = run(outbox_cmd(&control).args(["migrate", "--tenant", "globex"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("tenant globex") && !text(&o).contains("tenant acme"),
        "{}",
        text(&o)
    );

    // Refusals: an unknown tenant (1), a bad name or a stray --database (2, no URL shown).
    for (args, code, says) in [
        (
            vec!["status", "--tenant", "nobody"],
            1,
            "tenant nobody is not in the registry",
        ),
        (
            vec!["cleanup", "--tenant", "nobody"],
            1,
            "tenant nobody is not in the registry",
        ),
        (
            vec!["status", "--tenant", "bad name"],
            2,
            "tenant \"bad name\"",
        ),
        (
            vec!["status", "--database", "x=postgres://u:secret@h/db"],
            2,
            "--database needs --tenants",
        ),
        (
            vec!["migrate", "--tenants", "--ring"],
            2,
            "--ring acts on one schema",
        ),
    ] {
        let o = run(outbox_cmd(&control).args(&args));
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains("secret"), "{}", text(&o));
    }

    // Dead letters by tenant: the archive reads x-tenant from the letter's headers.
    let c = client(&control).await;
    for (i, tenant) in ["acme", "globex", "acme"].iter().enumerate() {
        c.execute(
            "INSERT INTO dead_letters (dlq_topic, \"partition\", \"offset\", original_topic, headers, failed_at)
             VALUES ($1, 0, $2, $3, jsonb_build_array(jsonb_build_object('name', 'x-tenant', 'value', $4::text)), now())",
            &[&format!("{topic}.dlq"), &(i as i64), &topic, tenant],
        )
        .await
        .unwrap();
    }
    let o = run(outbox_cmd(&control).args(["dlq", "list", "--tenant", "acme", "--json"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r["tenant"] == "acme"), "{rows:?}");
}
