//! The dashboard as a person uses it, in headless Chromium (Debian's `chromium` driven through
//! `chromedriver` by fantoccini): sign in with a token, see the DLQ grouped by cause with its
//! count, open a message, replay it with the confirmation, watch the job finish — and the
//! message is on its original topic. Screenshots of the main views go to
//! `target/screenshots/` (`docs/dashboard.png` in the README is one of them).

use std::process::{Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use outbox_testkit::*;

pub(crate) const TOKEN: &str = "browser-test-token-0123456789";
pub(crate) const VIEWER_TOKEN: &str = "browser-viewer-token-987654321";

pub(crate) async fn shot(c: &Client, name: &str) {
    let dir = format!("{}/target/screenshots", env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(&dir).unwrap();
    let png = c.screenshot().await.unwrap();
    std::fs::write(format!("{dir}/{name}.png"), png).unwrap();
}

/// Clicks the element `at` finds. The dashboard re-renders its views on each refresh, so an
/// element found just before one is gone by the click (stale): it is found again.
pub(crate) async fn click(c: &Client, at: Locator<'_>) {
    retry_stale(&format!("{at:?}"), || async {
        c.find(at).await?.click().await.map(drop)
    })
    .await;
}

/// Clicks `inner` within the element `css` whose text contains `text`, found again when a
/// refresh re-rendered it in between (see [`click`]).
pub(crate) async fn click_in(c: &Client, css: &str, text: &str, inner: Locator<'_>) {
    retry_stale(&format!("{inner:?} in {css} {text:?}"), || async {
        wait_text(c, css, text)
            .await
            .find(inner)
            .await?
            .click()
            .await
            .map(drop)
    })
    .await;
}

/// Runs `click` again while it fails on a stale element, for up to 10 s; any other error
/// fails the test.
async fn retry_stale<F, Fut>(what: &str, mut click: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), fantoccini::error::CmdError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match click().await {
            Ok(()) => return,
            // Re-rendered since it was found, or covered for a moment (a layout still
            // settling at phone width): find it again.
            Err(e)
                if (e.is_stale_element_reference() || e.to_string().contains("intercepted"))
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot click {what}: {e}"),
        }
    }
}

/// Waits until `css` matches an element whose text contains `text`.
pub(crate) async fn wait_text(c: &Client, css: &str, text: &str) -> fantoccini::elements::Element {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(els) = c.find_all(Locator::Css(css)).await {
            for e in els {
                if e.text().await.is_ok_and(|t| t.contains(text)) {
                    return e;
                }
            }
        }
        if tokio::time::Instant::now() > deadline {
            let body = c.source().await.unwrap_or_default();
            panic!("no {css} containing {text:?}; page:\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The admin server with an admin and a viewer token, and a headless Chromium session.
pub(crate) struct Console {
    pub(crate) c: Client,
    pub(crate) base: String,
    _admin: Kill,
    _driver: Kill,
    tokens: std::path::PathBuf,
}

impl Drop for Console {
    fn drop(&mut self) {
        // The tokens file is the test's own: nothing of a run stays in the temp directory.
        let _ = std::fs::remove_file(&self.tokens);
    }
}

pub(crate) async fn open_console(db: &outbox::DbConfig) -> Console {
    let port = free_port();
    let tokens = std::env::temp_dir().join(format!("browser-tokens-{}", hex(6)));
    std::fs::write(
        &tokens,
        format!(
            "admin admin {}\nvera viewer {}\n",
            outbox::admin::token_hash(TOKEN),
            outbox::admin::token_hash(VIEWER_TOKEN)
        ),
    )
    .unwrap();
    let admin = Kill(
        outbox_command(db)
            .args(["admin", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--tokens-file")
            .arg(&tokens)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let driver_port = free_port();
    let driver = Kill(
        Command::new("chromedriver")
            .arg(format!("--port={driver_port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; dev/up.sh installs it)"),
    );
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000"]
        }),
    );
    let mut client = None;
    for _ in 0..100 {
        match ClientBuilder::native()
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{driver_port}"))
            .await
        {
            Ok(c) => {
                client = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let c = client.expect("a chromedriver session");
    let base = format!("http://127.0.0.1:{port}");
    Console {
        c,
        base,
        _admin: admin,
        _driver: driver,
        tokens,
    }
}

/// Whether the dialog's confirm button can be clicked.
pub(crate) async fn confirm_enabled(c: &Client) -> bool {
    c.find(Locator::Id("modal-confirm"))
        .await
        .unwrap()
        .is_enabled()
        .await
        .unwrap()
}

/// Signs in with `token` on a fresh page.
pub(crate) async fn sign_in(console: &Console, token: &str) {
    let c = &console.c;
    c.goto(&format!("{}/", console.base)).await.unwrap();
    let field = c.wait().for_element(Locator::Id("token")).await.unwrap();
    field.send_keys(token).await.unwrap();
    click(c, Locator::Id("sign-in")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_dead_letter_group_opens_a_message_and_replays_it() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    // 12 letters of one cause, 3 of another.
    for i in 0..15 {
        let error = if i < 12 {
            format!("customer {} not found", 100 + i)
        } else {
            "schema v1 not supported".to_owned()
        };
        produce(
            &format!("{topic}.dlq"),
            Some(format!("order-{i}").as_bytes()),
            &[
                ("message_type", b"order_created"),
                ("message_id", format!("msg-{i}-{}", hex(6)).as_bytes()),
                ("x-original-topic", topic.as_bytes()),
                ("x-consumer-group", b"billing"),
                ("x-error", error.as_bytes()),
                ("x-error-kind", b"permanent"),
                ("x-failed-at", b"2026-11-30T08:00:00Z"),
            ],
            Some(format!("{{\"order\":\"A-{i}\",\"total_cents\":{}}}", 1000 + i).as_bytes()),
        )
        .await;
    }
    // And 2 letters another producer broke: they do not decode.
    let topic2 = topic_name();
    create_topic_family(&topic2, 1, &[]).await;
    for i in 0..2 {
        produce(
            &format!("{topic2}.dlq"),
            Some(format!("bad-{i}").as_bytes()),
            &[
                ("message_id", format!("bad-{i}-{}", hex(6)).as_bytes()),
                ("x-original-topic", topic2.as_bytes()),
                ("x-consumer-group", b"billing"),
                ("x-error", b"body is not valid JSON: EOF while parsing"),
                ("x-error-kind", b"decode"),
                ("x-failed-at", b"2026-11-30T09:00:00Z"),
            ],
            Some(b"{\"order\":"),
        )
        .await;
    }
    archive_once(&db, vec![format!("{topic}.dlq"), format!("{topic2}.dlq")]).await;

    let console = open_console(&db).await;
    let (c, base) = (&console.c, console.base.clone());

    // The rest of the system, as its heartbeats and breaker rows say: two billing replicas,
    // paused by an open breaker, 7 messages behind; no archiver has checked in.
    let pg = outbox_testkit::client(&db).await;
    pg.execute(
        "INSERT INTO outbox_instances (kind, name, instance, state) VALUES
           ('consumer', 'billing', 'pod-a:1', jsonb_build_object('mode', 'paused', 'paused_partitions', 2,
              'lag', jsonb_build_object($1::text || '/0', 4))),
           ('consumer', 'billing', 'pod-b:1', jsonb_build_object('mode', 'paused', 'paused_partitions', 1,
              'lag', jsonb_build_object($1::text || '/1', 3))),
           ('relay', 'relay', 'relay-0:1', '{}')",
        &[&topic],
    )
    .await
    .unwrap();
    pg.execute(
        "INSERT INTO circuit_breakers (consumer_group, name, open_until, opened_by, reason)
         VALUES ('billing', 'payments-api', now() + interval '10 minutes', 'pod-a:1', 'HTTP 503')",
        &[],
    )
    .await
    .unwrap();

    let result = async {
        // Sign in once.
        c.goto(&format!("{base}/")).await.unwrap();
        let token = c.wait().for_element(Locator::Id("token")).await.unwrap();
        shot(c, "login").await;
        token.send_keys(TOKEN).await.unwrap();
        click(c, Locator::Id("sign-in")).await;

        // The home view: dead letters grouped by cause, with their counts.
        let row = wait_text(c, "#groups tr", "customer <n> not found").await;
        assert_eq!(
            row.find(Locator::Css(".count"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "12"
        );
        wait_text(c, "#groups tr", "schema v1 not supported").await;
        wait_text(c, "#topics tr", &topic).await;
        // The overview on the same page: the missing archiver, the paused group, the breaker.
        wait_text(c, "#archiver-banner", "No DLQ archiver is running").await;
        let billing = wait_text(c, "#consumers tr", "billing").await;
        let line = billing.text().await.unwrap();
        assert!(line.contains("2") && line.contains("paused") && line.contains("7"), "{line}");
        wait_text(c, "#tile-relays", "1 alive").await;
        shot(c, "dead-letters-by-cause").await;
        // The dependency is back: an operator closes the breaker, with a reason.
        click(c, Locator::Css("#breakers .close-breaker")).await;
        c.find(Locator::Id("breaker-reason"))
            .await
            .unwrap()
            .send_keys("payments team confirms the API is back")
            .await
            .unwrap();
        click(c, Locator::Id("modal-confirm")).await;
        wait_text(c, "#flash-msg", "Breaker of payments-api for billing closed.").await;
        wait_text(c, "#tile-breakers", "all closed").await;
        let audit: String = pg
            .query_one(
                "SELECT action || ' by ' || actor || ' via ' || via FROM dlq_audit WHERE action LIKE 'breaker%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(audit, "breaker-close by admin via outbox-admin");
        // The page was drawn again: find the group's row anew.
        // Open the group's sample message.
        click_in(c, "#groups tr", "customer <n> not found", Locator::Css("a.sample")).await;
        let title = wait_text(c, "#message-title", "Dead letter #").await;
        let id: i64 = title
            .text()
            .await
            .unwrap()
            .trim_start_matches("Dead letter #")
            .parse()
            .unwrap();
        wait_text(c, "#facts td", "customer 100 not found").await;
        wait_text(c, "pre", "\"order\":\"A-0\"").await;
        shot(c, "message").await;

        // Replay it: the confirmation shows the dry-run count; no canary for one letter.
        click(c, Locator::Id("replay-one")).await;
        wait_text(c, "#replay-says", "1 letter dead-lettered by billing, cause “customer <n> not found”, will be sent back to").await;
        // A permanent letter: the dialog says why it is risky and wants it confirmed.
        wait_text(c, "#replay-risk-kinds", "1 permanent letter: the handler refused them").await;
        shot(c, "replay-confirmation").await;
        // The button is disabled until the risk is ticked.
        assert!(!confirm_enabled(c).await, "replay offered before the tick");
        click(c, Locator::Id("replay-confirm-kinds")).await;
        assert!(confirm_enabled(c).await, "replay not offered after the tick");
        click(c, Locator::Id("modal-confirm")).await;
        // The job's page follows the job to its end.
        wait_text(c, "#job-status", "completed").await;
        wait_text(c, "#flash-msg", "started").await;
        shot(c, "replay-jobs").await;

        // The message reached its original topic, byte for byte.
        let back = read_all(&topic).await;
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].key.as_deref(), Some(&b"order-0"[..]));
        assert_eq!(back[0].payload, b"{\"order\":\"A-0\",\"total_cents\":1000}");
        assert!(back[0].headers.contains_key("x-replayed-at"));

        // An operator dropped the schema letters too soon; the dashboard undoes it.
        let dlq = outbox::dlq::Dlq::new(&db);
        let f = outbox::dlq::Filter {
            error_contains: Some("schema v1".into()),
            ..Default::default()
        };
        let dropped = dlq
            .drop_letters(&f, false, "noise", "someone")
            .await
            .unwrap();
        assert_eq!(dropped.dropped, 3);
        c.goto(&format!(
            "{base}/#/messages?status=dropped&error_contains=schema%20v1"
        ))
        .await
        .unwrap();
        wait_text(c, "#messages tr", "schema v1 not supported").await;
        wait_text(c, "#match-count", "3 letters match").await;
        c.wait()
            .for_element(Locator::Id("restore-these"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.find(Locator::Id("restore-reason"))
            .await
            .unwrap()
            .send_keys("dropped by mistake; the v2 decoder ships today")
            .await
            .unwrap();
        shot(c, "restore-confirmation").await;
        click(c, Locator::Id("modal-confirm")).await;
        wait_text(c, "#flash-msg", "3 letters restored to new.").await;
        let back_to_new = dlq
            .list(
                &{
                    let mut f = f.clone();
                    f.status = Some(outbox::dlq::Status::New);
                    f
                },
                10,
                Default::default(),
                None,
            )
            .await
            .unwrap();
        assert_eq!(back_to_new.len(), 3, "the restored letters are new again");

        // The audit view names the token holder.
        c.goto(&format!("{base}/#/audit")).await.unwrap();
        wait_text(c, "#audit tr", "restore").await;
        let a = wait_text(c, "#audit tr", "replay").await;
        assert!(a.text().await.unwrap().contains("admin"));
        shot(c, "audit").await;
        c.goto(&format!("{base}/#/outbox")).await.unwrap();
        wait_text(c, "h2", "Outbox").await;
        shot(c, "outbox").await;

        // The journey of the replayed message: its dead letter, the replay, the audit row.
        let message_id = outbox::journey::trace(&db, &format!("#{id}"))
            .await
            .unwrap()[0]
            .message_id
            .clone()
            .unwrap();
        c.goto(&format!("{base}/#/trace")).await.unwrap();
        let q = c.wait().for_element(Locator::Id("trace-q")).await.unwrap();
        q.send_keys(&message_id).await.unwrap();
        click(c, Locator::Css("#trace-form button")).await;
        wait_text(c, ".journey h3", &message_id).await;
        wait_text(c, ".journey td", "customer 100 not found").await;
        wait_text(c, ".journey td", "replay by admin via outbox-admin").await;
        wait_text(c, ".journey td", "sent letter #").await;
        shot(c, "trace").await;
        // At phone width the page fits the screen (wide tables scroll inside their card).
        c.set_window_size(390, 844).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let overflow = c
            .execute(
                "return document.documentElement.scrollWidth - window.innerWidth;",
                vec![],
            )
            .await
            .unwrap();
        assert!(
            overflow.as_i64().unwrap_or(99) <= 1,
            "page wider than a phone: {overflow}"
        );
        shot(c, "trace-phone").await;
        c.set_window_size(1400, 1000).await.unwrap();

        // The decode group: replay is not its main button, and the dialog says why it would
        // fail again and refuses without the confirmation.
        c.goto(&format!("{base}/#/")).await.unwrap();
        click_in(c, "#groups tr", "body is not valid JSON", Locator::Css("button.replay-group")).await;
        wait_text(c, "#replay-risk-kinds", "2 decode letters: the bytes fail the same way again").await;
        assert!(!confirm_enabled(c).await, "a decode replay offered without the tick");
        shot(c, "replay-decode-refused").await;
        click(c, Locator::Id("modal-cancel")).await;
        // The home view and a message at phone width fit the screen.
        c.set_window_size(390, 844).await.unwrap();
        for (view, name) in [("#/", "overview-phone"), (&*format!("#/message/{id}"), "message-phone")] {
            c.goto(&format!("{base}/{view}")).await.unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
            let overflow = c
                .execute("return document.documentElement.scrollWidth - window.innerWidth;", vec![])
                .await
                .unwrap();
            assert!(overflow.as_i64().unwrap_or(99) <= 1, "{name} wider than a phone: {overflow}");
            shot(c, name).await;
        }
        c.set_window_size(1400, 1000).await.unwrap();

        // Sign out; a viewer sees where and why, never contents — and says so.
        click(c, Locator::Id("sign-out")).await;
        wait_text(c, "#login-error", "Signed out.").await;
        let token = c.find(Locator::Id("token")).await.unwrap();
        token.send_keys(VIEWER_TOKEN).await.unwrap();
        click(c, Locator::Id("sign-in")).await;
        wait_text(c, "#who", "vera (viewer)").await;
        c.goto(&format!("{base}/#/message/{id}")).await.unwrap();
        wait_text(c, "#headers td", "(redacted for your role)").await;
        let page = c.source().await.unwrap();
        assert!(
            !page.contains("undefined"),
            "a viewer's page shows 'undefined'"
        );
        assert!(
            c.find(Locator::Id("replay-one")).await.is_err(),
            "no replay button for a viewer"
        );
        shot(c, "message-viewer").await;
        id
    }
    .await;
    console.c.clone().close().await.unwrap();
    assert!(result > 0);
}

/// The tiles' details as an on-call engineer follows them: each relay and archiver with its
/// heartbeat, a consumer group's replicas and per-partition lag, a breaker opened and closed
/// from the page (audited); the message list sorted both ways and paged; the replay dialog at
/// phone width.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tiles_lead_to_every_process_partition_and_breaker_and_the_list_sorts() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    for i in 0..3 {
        produce(
            &format!("{topic}.dlq"),
            Some(format!("order-{i}").as_bytes()),
            &[
                ("message_id", format!("sort-{i}-{}", hex(6)).as_bytes()),
                ("x-original-topic", topic.as_bytes()),
                ("x-consumer-group", b"billing"),
                ("x-error", format!("letter number {i}").as_bytes()),
                ("x-error-kind", b"transient-exhausted"),
            ],
            Some(b"{}"),
        )
        .await;
    }
    archive_once(&db, vec![format!("{topic}.dlq")]).await;
    let pg = outbox_testkit::client(&db).await;
    pg.execute(
        "INSERT INTO outbox_instances (kind, name, instance, state, seen_at) VALUES
           ('consumer', 'billing', 'pod-a:1', jsonb_build_object('mode', 'normal', 'in_flight', 5,
              'dependencies', jsonb_build_array('payments-api'),
              'lag', jsonb_build_object($1::text || '/0', 4, $1::text || '/2', 9)), now()),
           ('consumer', 'billing', 'pod-b:1', jsonb_build_object('mode', 'normal',
              'lag', jsonb_build_object($1::text || '/1', 3)), now()),
           ('relay', 'relay', 'relay-0:1', '{\"claim_floor\": 42}', now()),
           ('archiver', 'dlq', 'arch-0:1', '{}', now() - interval '10 minutes')",
        &[&topic],
    )
    .await
    .unwrap();
    let console = open_console(&db).await;
    let (c, base) = (&console.c, console.base.clone());
    let result = async {
        sign_in(&console, TOKEN).await;
        // From the home strip into each tile's details.
        click_in(c, "#tile-relays", "1 alive", Locator::LinkText("details")).await;
        let relay = wait_text(c, "#relay-list tr", "relay-0:1").await;
        assert!(relay.text().await.unwrap().contains("claim_floor: 42"));
        let gone = wait_text(c, "#archiver-list tr", "arch-0:1").await;
        assert!(gone.text().await.unwrap().contains("gone, seen 10 min ago"));
        c.goto(&format!("{base}/#/")).await.unwrap();
        click_in(c, "#consumers tr", "billing", Locator::LinkText("billing")).await;
        let p2 = wait_text(c, "[data-group=billing] .lag tr", &format!("{topic}/2")).await;
        let line = p2.text().await.unwrap();
        assert!(line.contains('9') && line.contains("pod-a:1"), "{line}");
        let members = wait_text(c, "[data-group=billing] .members tr", "pod-a:1").await;
        assert!(members.text().await.unwrap().contains('5'), "in flight shown");
        // The partitions are listed in order, each once.
        let parts = c.find_all(Locator::Css("[data-group=billing] .lag tr")).await.unwrap();
        assert_eq!(parts.len(), 4, "a header and three partitions");
        shot(c, "system-consumers").await;

        // Open a breaker by hand from the breakers' details, then close it.
        c.goto(&format!("{base}/#/system?show=breakers")).await.unwrap();
        wait_text(c, "#no-breakers", "All closed.").await;
        click(c, Locator::Id("open-breaker")).await;
        // The group and dependency come from what the live replicas declare.
        c.wait()
            .for_element(Locator::Css("#open-group option[value=billing]"))
            .await
            .unwrap();
        click(c, Locator::Css("#open-group option[value=billing]")).await;
        click(c, Locator::Css("#open-dependency option[value=payments-api]")).await;
        c.find(Locator::Id("open-reason")).await.unwrap()
            .send_keys("payments team asked for a pause").await.unwrap();
        shot(c, "open-breaker-dialog").await;
        // At phone width the dialog and its button fit the screen.
        c.set_window_size(390, 844).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fit = c
            .execute(
                "const go = document.getElementById('modal-confirm').getBoundingClientRect();
                 return [go.left, go.right, window.innerWidth];",
                vec![],
            )
            .await
            .unwrap();
        let f: Vec<f64> = fit.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert!(f[0] >= 0.0 && f[1] <= f[2], "the breaker dialog's button is off a phone's screen: {f:?}");
        shot(c, "open-breaker-dialog-phone").await;
        c.set_window_size(1400, 1000).await.unwrap();
        click(c, Locator::Id("modal-confirm")).await;
        wait_text(c, "#flash-msg", "Breaker of payments-api for billing opened.").await;
        let b = wait_text(c, "#breaker-list tr", "payments-api").await;
        let row = b.text().await.unwrap();
        assert!(row.contains("payments team asked for a pause"), "{row}");
        assert!(row.contains("opened by operator admin"), "who opened it is shown: {row}");
        shot(c, "system-breakers").await;
        c.set_window_size(390, 844).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        shot(c, "system-breakers-phone").await;
        c.set_window_size(1400, 1000).await.unwrap();
        click_in(c, "#breaker-list tr", "payments-api", Locator::Css(".close-breaker")).await;
        c.find(Locator::Id("breaker-reason")).await.unwrap().send_keys("back").await.unwrap();
        click(c, Locator::Id("modal-confirm")).await;
        wait_text(c, "#no-breakers", "All closed.").await;
        let actions: Vec<String> = pg
            .query("SELECT action || ' by ' || actor || ' via ' || via FROM dlq_audit ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(actions, ["breaker-open by admin via outbox-admin", "breaker-close by admin via outbox-admin"]);

        // The message list, newest first, then sorted the other way and paged.
        let first_cell = |c: &Client| {
            let c = c.clone();
            async move {
                c.find(Locator::Css("#messages tr:nth-child(2) td")).await.unwrap().text().await.unwrap()
            }
        };
        let ids: Vec<i64> = pg
            .query("SELECT id FROM dead_letters ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        c.goto(&format!("{base}/#/messages?topic={topic}&limit=2")).await.unwrap();
        wait_text(c, "#match-count", "3 letters match; showing 2 per page, newest first.").await;
        assert_eq!(first_cell(c).await, format!("#{}", ids[2]));
        click(c, Locator::Id("sort-toggle")).await;
        wait_text(c, "#match-count", "oldest first").await;
        assert_eq!(first_cell(c).await, format!("#{}", ids[0]));
        click(c, Locator::Id("next-page")).await;
        wait_text(c, "#messages tr", &format!("#{}", ids[2])).await;
        let rows = c.find_all(Locator::Css("#messages tr")).await.unwrap();
        assert_eq!(rows.len(), 2, "the last page holds the newest letter alone");
        shot(c, "messages-oldest-first").await;

        // The replay dialog at phone width fits the screen, its buttons within reach.
        c.set_window_size(390, 844).await.unwrap();
        c.goto(&format!("{base}/#/messages?topic={topic}")).await.unwrap();
        wait_text(c, "#match-count", "3 letters match").await;
        retry_stale("Replay these", || async {
            wait_text(c, "button", "Replay these")
                .await
                .click()
                .await
                .map(drop)
        })
        .await;
        wait_text(c, "#replay-says", "3 letters dead-lettered by").await;
        let fit = c
            .execute(
                "const b = document.querySelector('#modal .box').getBoundingClientRect();
                 const go = document.getElementById('modal-confirm').getBoundingClientRect();
                 return [b.left, b.right, window.innerWidth, go.right, go.bottom, window.innerHeight,
                         document.documentElement.scrollWidth - window.innerWidth];",
                vec![],
            )
            .await
            .unwrap();
        let f: Vec<f64> = fit.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert!(f[0] >= 0.0 && f[1] <= f[2] && f[3] <= f[2] && f[4] <= f[5] && f[6] <= 1.0,
            "the replay dialog does not fit a phone: {f:?}");
        shot(c, "replay-dialog-phone").await;
        click(c, Locator::Id("modal-cancel")).await;
        c.goto(&format!("{base}/#/system")).await.unwrap();
        wait_text(c, "#relay-list tr", "relay-0:1").await;
        let overflow = c
            .execute("return document.documentElement.scrollWidth - window.innerWidth;", vec![])
            .await
            .unwrap();
        assert!(overflow.as_i64().unwrap_or(99) <= 1, "system view wider than a phone: {overflow}");
        shot(c, "system-phone").await;
        ids.len()
    }
    .await;
    console.c.clone().close().await.unwrap();
    assert_eq!(result, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_home_page_says_nothing_publishes_the_outbox_within_one_refresh_of_a_relay_dying() {
    let db = fresh_db().await;
    let pg = outbox_testkit::client(&db).await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let mut relay = Kill(
        outbox_command(&db)
            .args(["relay"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(Duration::from_secs(30), "the relay's heartbeat", || async {
        outbox::instances::overview(&db)
            .await
            .is_ok_and(|o| o.instances.iter().any(|i| i.kind == "relay" && i.alive))
    })
    .await;
    let console = open_console(&db).await;
    let (c, base) = (&console.c, console.base.clone());
    let result = async {
        sign_in(&console, TOKEN).await;
        c.goto(&format!("{base}/#/")).await.unwrap();
        wait_text(c, "#tile-relays", "1 alive").await;
        let tile = c.find(Locator::Id("tile-relays")).await.unwrap();
        assert!(tile
            .attr("class")
            .await
            .unwrap()
            .unwrap_or_default()
            .contains("ok"));
        assert!(
            c.find(Locator::Id("banner-relays")).await.is_err(),
            "no banner while one runs"
        );
        // The relay dies; rows keep arriving. The page is not reloaded: its own refresh
        // must say so within one refresh of the heartbeat going stale.
        relay.0.kill().unwrap();
        let _ = relay.0.wait();
        let killed = tokio::time::Instant::now();
        pg.batch_execute(&format!(
            "INSERT INTO outbox (topic, message_key, headers, payload)
               SELECT '{topic}', 'k' || g, '{{\"message_type\": \"t\"}}', '{{}}' FROM generate_series(1, 30) g"
        ))
        .await
        .unwrap();
        let limit = outbox::instances::ALIVE_WITHIN
            + outbox::instances::HEARTBEAT_EVERY
            + Duration::from_secs(5) // one refresh of the page
            + Duration::from_secs(3);
        let banner = loop {
            if let Ok(b) = c.find(Locator::Id("banner-relays")).await {
                if let Ok(t) = b.text().await {
                    break t;
                }
            }
            assert!(
                killed.elapsed() < limit,
                "no banner {:?} after the relay died",
                killed.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(
            banner.starts_with("Nothing is publishing the outbox: 30 rows waiting, oldest"),
            "{banner}"
        );
        let badge = c
            .find(Locator::Id("nav-badge"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(badge.contains("wrong"), "{badge}");
        let tile = c.find(Locator::Id("tile-relays")).await.unwrap();
        assert!(tile
            .attr("class")
            .await
            .unwrap()
            .unwrap_or_default()
            .contains("bad"));
        assert!(c
            .find(Locator::Id("updated"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .starts_with("updated "));
        shot(c, "relay-dead-banner").await;
        c.set_window_size(390, 844).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        shot(c, "relay-dead-banner-phone").await;
        c.set_window_size(1400, 1000).await.unwrap();
    };
    result.await;
    console.c.clone().close().await.unwrap();
}
