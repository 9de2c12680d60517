//! The console's replay job page, edit and retry, and the words, times and phone layout of its
//! views, walked in headless Chromium at 1400 px and 390 px as on-call would; screenshots go
//! to `target/screenshots/`.

use std::time::Duration;

use fantoccini::{Client, Locator};
use outbox_testkit::*;

use crate::browser::{
    click, click_in, confirm_enabled, open_console, shot, sign_in, wait_text, TOKEN, VIEWER_TOKEN,
};
use crate::jobs::{comes_back, letters};

/// At phone width: the page is no wider than the screen and `css` (an action) lies within it.
async fn fits_phone(c: &Client, css: &str) {
    let f = c
        .execute(
            "const e = document.querySelector(arguments[0]);
             if (!e) return [-1, -1, -1, -1];
             e.scrollIntoView({block: 'center'});
             const r = e.getBoundingClientRect();
             return [r.left, r.right, window.innerWidth, document.documentElement.scrollWidth - window.innerWidth];",
            vec![css.into()],
        )
        .await
        .unwrap();
    let f: Vec<f64> = f
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(
        f[0] >= 0.0 && f[1] <= f[2] && f[3] <= 1.0,
        "{css} is not on a phone's screen: {f:?}"
    );
}

/// The strings a page script returns.
async fn strings(c: &Client, script: &str) -> Vec<String> {
    c.execute(script, vec![])
        .await
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

async fn phone(c: &Client) {
    c.set_window_size(390, 844).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
}

async fn desktop(c: &Client) {
    c.set_window_size(1400, 1000).await.unwrap();
}

async fn enabled(c: &Client, id: &str) -> bool {
    c.find(Locator::Id(id))
        .await
        .unwrap()
        .is_enabled()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_canary_recommends_cancel_and_a_poison_letter_is_edited_and_retried() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    letters(&db, &topic, 6, "permanent", b"{\"order\":\"A\"}").await;
    // The poison letter: a producer cut its body; no consumer fix will make it valid.
    let poison_mid = format!("poison-{}", hex(6));
    produce(
        &format!("{topic}.dlq"),
        Some(b"order-9"),
        &[
            ("message_id", poison_mid.as_bytes()),
            ("x-original-topic", topic.as_bytes()),
            ("x-consumer-group", b"billing"),
            ("x-error", b"body is not valid JSON: EOF while parsing"),
            ("x-error-kind", b"decode"),
        ],
        Some(b"{\"order\":\"A-9\",\"total_"),
    )
    .await;
    archive_once(&db, vec![format!("{topic}.dlq")]).await;
    let pg = client(&db).await;
    let poison: i64 = pg
        .query_one(
            "SELECT id FROM dead_letters WHERE message_id = $1",
            &[&poison_mid],
        )
        .await
        .unwrap()
        .get(0);
    let console = open_console(&db).await;
    let (c, base) = (&console.c, console.base.clone());
    let result = async {
        sign_in(&console, TOKEN).await;
        // The confirmation is written for the selection: count, group, cause, topic, the
        // canary; its button waits for the tick.
        click_in(
            c,
            "#groups tr",
            "customer <n> not found",
            Locator::Css("button.replay-group"),
        )
        .await;
        wait_text(c, "#replay-says", &format!(
            "6 letters dead-lettered by billing, cause “customer <n> not found”, will be sent back to {topic}.")).await;
        wait_text(
            c,
            "#replay-canary-says",
            "the first letter goes alone, then the job waits 30 s",
        )
        .await;
        wait_text(
            c,
            "#replay-risk-kinds",
            "6 permanent letters: the handler refused them",
        )
        .await;
        assert!(!confirm_enabled(c).await, "confirmable before the tick");
        click(c, Locator::Id("replay-confirm-kinds")).await;
        assert!(confirm_enabled(c).await);
        shot(c, "replay-confirmation-written").await;
        click(c, Locator::Id("modal-confirm")).await;
        wait_text(c, "#job-title", "Replay job #").await;
        let job: i64 = pg
            .query_one("SELECT max(id) FROM dlq_replay_jobs", &[])
            .await
            .unwrap()
            .get(0);

        // The canary letter fails again (a consumer without the fix): the job pauses and its
        // page advises cancelling, first and in words.
        wait_until(Duration::from_secs(30), "the canary sent", || async {
            topic_len(&topic).await >= 1
        })
        .await;
        let canary = read_all(&topic).await;
        comes_back(&db, &topic, &canary[0]).await;
        wait_text(
            c,
            "#canary-advice",
            "The canary failed: 1 of 1 replayed letters came back to the DLQ",
        )
        .await;
        let cancel = wait_text(
            c,
            "#canary-advice button.job-cancel",
            "Cancel (recommended)",
        )
        .await;
        assert!(cancel
            .attr("class")
            .await
            .unwrap()
            .unwrap_or_default()
            .contains("primary"));
        wait_text(c, "#canary-advice button.job-resume", "Resume anyway").await;
        wait_text(c, "#job-selection", &format!(
            "new letters of topic {topic} dead-lettered by group billing with the cause “customer <n> not found”")).await;
        wait_text(c, "#job-timeline tr[data-status=paused]", "canary: 1 of 1").await;
        wait_text(c, "#job-timeline tr[data-status=paused]", "+").await;
        wait_text(c, "#job-items tr[data-state=sent] a.comeback", "#").await;
        wait_text(c, "#job-counts", "6 letters: 1 sent, 5 pending").await;
        shot(c, "job-canary-failed").await;
        phone(c).await;
        fits_phone(c, "#canary-advice button.job-cancel").await;
        shot(c, "job-canary-failed-phone").await;
        desktop(c).await;

        // Cancel asks for a reason, and the audit says it in words, linked to the job.
        click(c, Locator::Css("#canary-advice button.job-cancel")).await;
        wait_text(c, "#job-action-says", "The 5 unsent letters stay new").await;
        assert!(!confirm_enabled(c).await, "cancel without a reason");
        c.find(Locator::Id("job-reason"))
            .await
            .unwrap()
            .send_keys("the fix is not deployed yet")
            .await
            .unwrap();
        assert!(confirm_enabled(c).await);
        click(c, Locator::Id("modal-confirm")).await;
        wait_text(
            c,
            "#job-status",
            "cancelled — cancelled by admin: the fix is not deployed yet",
        )
        .await;
        wait_text(
            c,
            "#job-timeline tr[data-status=cancelled]",
            "the fix is not deployed yet",
        )
        .await;
        c.goto(&format!("{base}/#/audit")).await.unwrap();
        let row = wait_text(
            c,
            "#audit tr[data-action=job-cancel]",
            &format!("cancelled job #{job} (5 unsent letters stay new)"),
        )
        .await;
        assert!(row
            .text()
            .await
            .unwrap()
            .contains("the fix is not deployed yet"));
        let href = row
            .find(Locator::Css("a.job-link"))
            .await
            .unwrap()
            .attr("href")
            .await
            .unwrap();
        assert_eq!(href.as_deref(), Some(&*format!("#/job/{job}")));
        wait_text(
            c,
            "#audit tr[data-action=replay]",
            &format!("replayed 6 letters (new letters of topic {topic}"),
        )
        .await;
        shot(c, "audit-in-words").await;

        // Edit and retry the poison letter: the original beside the editor, JSON checked as
        // typed, sent as a new message naming the original.
        c.goto(&format!("{base}/#/message/{poison}")).await.unwrap();
        // The view renders after the navigation: wait for it before clicking in it.
        wait_text(c, "#message-title", &format!("Dead letter #{poison}")).await;
        wait_text(c, "#edit-one", "Edit and retry").await;
        click(c, Locator::Id("edit-one")).await;
        wait_text(
            c,
            "#edit-title",
            &format!("Edit and retry dead letter #{poison}"),
        )
        .await;
        wait_text(c, "#edit-original", "{\"order\":\"A-9\",\"total_").await;
        let body = c.find(Locator::Id("edit-body")).await.unwrap();
        wait_text(c, "#edit-body-error", "Not valid JSON").await;
        c.find(Locator::Id("edit-reason"))
            .await
            .unwrap()
            .send_keys("the producer cut the body; rebuilt from order A-9")
            .await
            .unwrap();
        assert!(!enabled(c, "edit-send").await, "invalid JSON can be sent");
        body.clear().await.unwrap();
        body.send_keys("{\"order\":\"A-9\",\"total_cents\":900}")
            .await
            .unwrap();
        wait_until(
            Duration::from_secs(5),
            "the send button enabled",
            || async { enabled(c, "edit-send").await },
        )
        .await;
        assert_eq!(
            c.find(Locator::Id("edit-body-error"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            ""
        );
        shot(c, "edit-and-retry").await;
        phone(c).await;
        fits_phone(c, "#edit-send").await;
        shot(c, "edit-and-retry-phone").await;
        desktop(c).await;
        click(c, Locator::Id("edit-send")).await;
        wait_text(c, "#job-status", "completed").await;
        wait_text(c, "#job-items tr .pill", "edited").await;
        wait_text(
            c,
            "#job-selection",
            &format!("letter #{poison} with its body edited, sent as the new message"),
        )
        .await;
        let out = read_all(&topic).await;
        let edited = out
            .iter()
            .find(|r| r.headers.get("x-edited-from") == Some(&poison_mid))
            .expect("the edited message");
        assert_eq!(edited.payload, b"{\"order\":\"A-9\",\"total_cents\":900}");
        assert_ne!(edited.message_id(), poison_mid);

        // The letter's journey as one timeline, in time order, with durations.
        c.goto(&format!("{base}/#/trace?q=%23{poison}"))
            .await
            .unwrap();
        wait_text(
            c,
            ".timeline tr[data-step=dead-lettered]",
            "body is not valid JSON",
        )
        .await;
        wait_text(
            c,
            ".timeline tr[data-step=replayed]",
            &format!("sent letter #{poison}"),
        )
        .await;
        wait_text(c, ".timeline tr[data-step=audit]", "edit-retry by admin").await;
        let order = strings(
            c,
            "return [...document.querySelectorAll('.timeline tr[data-step]')].map(r => r.dataset.step);",
        )
        .await;
        let at = |s: &str| order.iter().position(|x| x == s).unwrap();
        assert!(
            at("dead-lettered") < at("audit") && at("audit") < at("replayed"),
            "{order:?}"
        );
        wait_text(c, ".timeline td", "+").await;
        shot(c, "trace-timeline").await;
        phone(c).await;
        fits_phone(c, ".timeline").await;
        shot(c, "trace-timeline-phone").await;
        desktop(c).await;
    };
    result.await;
    console.c.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_says_lag_backlog_and_throughput_filters_in_place_and_keeps_actions_on_a_phone()
{
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    letters(&db, &topic, 3, "transient-exhausted", b"{}").await;
    let pg = client(&db).await;
    pg.execute(
        "INSERT INTO outbox_instances (kind, name, instance, state) VALUES
           ('consumer', 'billing', 'pod-a:1', jsonb_build_object('mode', 'normal', 'handled', 100,
              'lag', jsonb_build_object($1::text || '/0', 7, $1::text || '.retry-5s/0', 5),
              'lag_secs', jsonb_build_object($1::text || '/0', 42, $1::text || '.retry-5s/0', 3)))",
        &[&topic],
    )
    .await
    .unwrap();
    // A job nobody runs yet: the jobs view offers its actions.
    let dlq = outbox::dlq::Dlq::new(&db);
    let mut opts = outbox::dlq::ReplayOptions::default();
    opts.canary = 0;
    opts.actor = "admin".into();
    let job = dlq
        .create_job(
            &outbox::dlq::Filter {
                topic: Some(topic.clone()),
                ..Default::default()
            },
            &opts,
        )
        .await
        .unwrap();
    let console = open_console(&db).await;
    let (c, base) = (&console.c, console.base.clone());
    let result = async {
        sign_in(&console, TOKEN).await;
        // Lag in messages and seconds, the retry backlog apart, throughput from two refreshes.
        c.goto(&format!("{base}/#/system?show=consumers"))
            .await
            .unwrap();
        wait_text(
            c,
            "[data-stats=billing] .stat-lag",
            "Lag 7 messages, the oldest waiting up to 42 s",
        )
        .await;
        wait_text(
            c,
            "[data-stats=billing] .stat-backlog",
            "retry backlog 5 messages",
        )
        .await;
        wait_text(c, "[data-stats=billing] .stat-rate", "measuring").await;
        pg.execute("UPDATE outbox_instances SET state = jsonb_set(state, '{handled}', '160'), seen_at = now()", &[])
            .await
            .unwrap();
        let rate = wait_text(c, "[data-stats=billing] .stat-rate", "msg/s")
            .await
            .text()
            .await
            .unwrap();
        let n: f64 = rate
            .trim_start_matches("throughput ")
            .trim_end_matches(" msg/s")
            .parse()
            .unwrap();
        assert!(n > 0.0 && n <= 60.0, "{rate}");
        shot(c, "system-lag-throughput").await;

        // A filter the server refuses is said beside the form, which keeps what was typed.
        c.goto(&format!("{base}/#/messages?since=yesterdayish"))
            .await
            .unwrap();
        wait_text(c, "#filter-error", "This filter does not work").await;
        let kept = c
            .find(Locator::Css("#filters input[name=since]"))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap();
        assert_eq!(kept.as_deref(), Some("yesterdayish"));
        shot(c, "filter-error").await;
        // Plurals and one time format.
        c.goto(&format!(
            "{base}/#/messages?error_contains=customer%201%20not"
        ))
        .await
        .unwrap();
        wait_text(c, "#match-count", "1 letter matches.").await;
        let times = strings(
            c,
            "return [...document.querySelectorAll('#messages time')].map(t => t.textContent);",
        )
        .await;
        let shape =
            regex::Regex::new(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+ (s|min|h|d) ago\)$").unwrap();
        assert!(
            !times.is_empty() && times.iter().all(|t| shape.is_match(t)),
            "{times:?}"
        );

        // On a phone, the group's and the job's actions are on screen, no sideways scroll.
        phone(c).await;
        c.goto(&format!("{base}/#/")).await.unwrap();
        wait_text(c, "#groups tr", "customer <n> not found").await;
        fits_phone(c, "#groups button.replay-group").await;
        shot(c, "groups-actions-phone").await;
        c.goto(&format!("{base}/#/jobs")).await.unwrap();
        wait_text(c, &format!("#jobs tr[data-job='{}']", job.id), "pending").await;
        fits_phone(
            c,
            &format!("#jobs tr[data-job='{}'] button.job-cancel", job.id),
        )
        .await;
        shot(c, "jobs-actions-phone").await;
        c.goto(&format!("{base}/#/system?show=consumers"))
            .await
            .unwrap();
        wait_text(c, "[data-stats=billing] .stat-lag", "Lag 7 messages").await;
        fits_phone(c, "[data-stats=billing]").await;
        shot(c, "system-lag-phone").await;
        desktop(c).await;
    };
    result.await;
    console.c.clone().close().await.unwrap();
}

/// Refuses an event whose body says `poison`.
async fn refuse_poison(
    m: &outbox::consumer::Delivered,
    _tx: &tokio_postgres::Transaction<'_>,
) -> Result<(), outbox::consumer::HandlerError> {
    if m.json()["poison"].as_bool() == Some(true) {
        return Err(outbox::consumer::HandlerError::permanent(
            "rule 7 rejects the event",
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_shows_its_head_and_what_waits_and_dropping_the_head_lets_them_go() {
    use outbox::consumer::{Consumer, ConsumerConfig, RetryStrategy, StrictOrder};
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let group = format!("ledger-{}", hex(4));
    let mut cfg = ConsumerConfig::new(&group, [&topic]);
    cfg.retry = RetryStrategy::InPlace {
        attempts: 1,
        base: Duration::from_millis(10),
        max: Duration::from_millis(10),
    };
    let mut strict = StrictOrder::new([&topic]);
    strict.check_interval = Duration::from_millis(200);
    cfg.strict_order = Some(strict);
    let metrics_port = free_port();
    cfg.metrics_addr = Some(format!("127.0.0.1:{metrics_port}").parse().unwrap());
    let consumer = Consumer::new(&db, &kafka(), cfg)
        .unwrap()
        .handler("it_event", refuse_poison);
    let stats = consumer.stats();
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    let run = tokio::spawn(async move { consumer.run(async move { s.cancelled().await }).await });
    let ids: Vec<String> = (0..4).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    for (i, (key, poison)) in [
        ("acct-7", true),
        ("acct-7", false),
        ("acct-7", false),
        ("acct-8", false),
    ]
    .iter()
    .enumerate()
    {
        produce_event(
            &topic,
            key,
            "it_event",
            &ids[i],
            &serde_json::json!({ "poison": poison }),
        )
        .await;
    }
    let pg = client(&db).await;
    wait_until(
        Duration::from_secs(60),
        "acct-7 held behind its refused event",
        || async { count(&pg, "SELECT count(*) FROM consumer_held").await == 2 },
    )
    .await;
    // The gauges say one key held, two messages behind it, and how old the hold is.
    let labels = [("topic", topic.as_str()), ("group", group.as_str())];
    wait_until(Duration::from_secs(30), "the hold gauges", || async {
        let m = crate::observability::scrape(metrics_port).await;
        let v = |n| crate::observability::value(&m, n, &labels);
        v("outbox_consumer_held_keys") == Some(1.0)
            && v("outbox_consumer_held_messages") == Some(2.0)
            && v("outbox_consumer_oldest_hold_seconds").is_some_and(|s| s > 0.0)
    })
    .await;
    archive_once(&db, vec![format!("{topic}.dlq")]).await;
    // The CLI's trace says where a held message waits, and what its head holds.
    let o = outbox_command(&db)
        .args(["trace", &ids[1]])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(&format!("held     by {group}"))
            && out.contains(&format!("behind {}", ids[0])),
        "{out}"
    );
    let o = outbox_command(&db)
        .args(["trace", &ids[0]])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("2 message(s) wait behind it"), "{out}");

    let console = open_console(&db).await;
    let (c, base) = (&console.c, console.base.clone());
    let result = async {
        // A viewer sees the hold, not the key (keys are contents).
        sign_in(&console, VIEWER_TOKEN).await;
        wait_text(c, "#holds tr.hold", &group).await;
        wait_text(c, "#holds .key", "(hidden)").await;
        wait_text(c, "#holds .waiting", "2").await;
        click(c, Locator::Id("sign-out")).await;
        wait_text(c, "#login-error", "Signed out.").await;
        sign_in(&console, TOKEN).await;
        wait_text(c, "#holds .key", "acct-7").await;
        shot(c, "held-keys").await;
        // The trace timeline shows the wait.
        c.goto(&format!("{base}/#/trace")).await.unwrap();
        let q = c.wait().for_element(Locator::Id("trace-q")).await.unwrap();
        q.send_keys(&ids[1]).await.unwrap();
        click(c, Locator::Css("#trace-form button")).await;
        wait_text(
            c,
            ".timeline tr[data-step=held]",
            &format!("{group} behind {}", ids[0]),
        )
        .await;
        // The operator decides the refused event is obsolete: drops the head from its page.
        c.goto(&format!("{base}/#/")).await.unwrap();
        wait_text(c, "#holds a.head", "#").await;
        click(c, Locator::Css("#holds a.head")).await;
        wait_text(c, "#drop-one", "Drop").await;
        click(c, Locator::Id("drop-one")).await;
        c.wait()
            .for_element(Locator::Id("drop-reason"))
            .await
            .unwrap()
            .send_keys("obsolete: the account was closed")
            .await
            .unwrap();
        click(c, Locator::Id("modal-confirm")).await;
        wait_until(Duration::from_secs(30), "the hold released", || async {
            count(&pg, "SELECT count(*) FROM consumer_holds").await == 0
        })
        .await;
        c.goto(&format!("{base}/#/audit")).await.unwrap();
        c.goto(&format!("{base}/#/")).await.unwrap();
        wait_text(c, "#no-holds", "No key is held.").await;
    };
    result.await;
    console.c.clone().close().await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "the held events handled",
        || async { outbox::consumer::ConsumerStats::get(&stats.handled) == 3 },
    )
    .await;
    wait_until(Duration::from_secs(30), "the gauges back to 0", || async {
        let m = crate::observability::scrape(metrics_port).await;
        crate::observability::value(&m, "outbox_consumer_held_keys", &labels) == Some(0.0)
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_letters_passed_by_newer_events_asks_to_confirm_the_order() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let ids = letters(&db, &topic, 3, "transient-exhausted", b"{}").await;
    // The group (not in strict order) handled newer events of two of these keys since.
    let pg = client(&db).await;
    for (i, id) in ids.iter().enumerate().take(2) {
        pg.execute(
            "INSERT INTO consumer_passed (consumer_group, topic, message_key, message_id, newer_handled_at)
             VALUES ('billing', $1, $2, $3, now())",
            &[&topic, &format!("key-{i}").into_bytes(), id],
        )
        .await
        .unwrap();
    }
    let console = open_console(&db).await;
    let c = &console.c;
    let result = async {
        sign_in(&console, TOKEN).await;
        click_in(
            c,
            "#groups tr",
            "customer <n> not found",
            Locator::Css("button.replay-group"),
        )
        .await;
        wait_text(
            c,
            "#replay-risk-order",
            "2 letters (#1 #2) have newer messages of their key already handled by their group",
        )
        .await;
        assert!(!confirm_enabled(c).await, "confirmable before the tick");
        click(c, Locator::Id("replay-confirm-order")).await;
        assert!(confirm_enabled(c).await);
        shot(c, "replay-confirm-order").await;
        click(c, Locator::Id("modal-confirm")).await;
        wait_text(c, "#job-title", "Replay job #").await;
    };
    result.await;
    console.c.clone().close().await.unwrap();
    let recorded: serde_json::Value = pg
        .query_one("SELECT filter FROM dlq_replay_jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded["confirm_order"], true);
    assert_eq!(recorded["passed_by_newer"], 2);
}

/// A fleet's dead letters by tenant (their `x-tenant` header): the dead-letter page has a
/// table of tenants with their new letters, its "list" opens the letters of that tenant with
/// the tenant in the filter, and `/metrics` has `outbox_dlq_tenant_messages` per tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_by_tenant_are_counted_listed_and_exported() {
    let db = fresh_db().await;
    let topic = topic_name();
    let c = client(&db).await;
    for (i, tenant) in ["acme", "globex", "acme", "acme"].iter().enumerate() {
        c.execute(
            "INSERT INTO dead_letters (dlq_topic, \"partition\", \"offset\", original_topic, message_id, headers, failed_at)
             VALUES ($1, 0, $2, $3, $4, jsonb_build_array(jsonb_build_object('name', 'x-tenant', 'value', $5::text)), now())",
            &[&format!("{topic}.dlq"), &(i as i64), &topic, &format!("m-{i}"), tenant],
        )
        .await
        .unwrap();
    }
    let console = open_console(&db).await;
    let c = &console.c;
    sign_in(&console, TOKEN).await;
    let acme = wait_text(c, "#tenants tr.tenant", "acme").await;
    assert_eq!(
        acme.find(Locator::Css(".new"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "3"
    );
    let globex = wait_text(c, "#tenants tr.tenant", "globex").await;
    assert_eq!(
        globex
            .find(Locator::Css(".new"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "1"
    );
    shot(c, "dlq-by-tenant").await;
    click_in(c, "#tenants tr.tenant", "acme", Locator::LinkText("list")).await;
    wait_text(c, "#match-count", "3 letters match").await;
    let filter = c
        .find(Locator::Css("#filters input[name=tenant]"))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap();
    assert_eq!(filter.as_deref(), Some("acme"));
    let tenants: Vec<String> = {
        let mut v = Vec::new();
        for e in c
            .find_all(Locator::Css("#messages td.tenant"))
            .await
            .unwrap()
        {
            v.push(e.text().await.unwrap());
        }
        v
    };
    assert_eq!(tenants, ["acme", "acme", "acme"]);

    let metrics = format!("{}/metrics", console.base);
    wait_until(Duration::from_secs(30), "the tenant DLQ series", || async {
        let body = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        body.lines().any(|l| {
            l.starts_with("outbox_dlq_tenant_messages{")
                && l.contains("tenant=\"acme\"")
                && l.contains("status=\"new\"")
                && l.ends_with(" 3")
        }) && body.lines().any(|l| {
            l.starts_with("outbox_dlq_tenant_messages{")
                && l.contains("tenant=\"globex\"")
                && l.contains("status=\"new\"")
                && l.ends_with(" 1")
        })
    })
    .await;
}
