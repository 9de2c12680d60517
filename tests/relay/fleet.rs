//! One relay for many outboxes (`outbox::fleet`): three schemas of one database and a schema
//! of a second database published by one fleet, the registry changed while it runs, two names
//! for one outbox, a name for a database the relay was not given, a small tenant behind a
//! large backlog, and an idle tenant that polls seldom.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use outbox::fleet::{Fleet, FleetConfig, Tenant};
use outbox::DbConfig;
use outbox_testkit::*;

/// A second database on the dev server (created once; each test uses its own schemas in it).
async fn second_database() -> DbConfig {
    let name = "outbox_fleet_shard2";
    let c = outbox::connect(&DbConfig::new(&database_url(), "public").unwrap())
        .await
        .unwrap();
    let exists = count(
        &c,
        &format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'"),
    )
    .await;
    if exists == 0 {
        // Parallel tests may race to create it: one wins, the others see it exists.
        if let Err(e) = c.batch_execute(&format!("CREATE DATABASE {name}")).await {
            assert!(
                e.to_string().contains("already exists") || e.code().is_some(),
                "{e}"
            );
        }
    }
    let url = database_url();
    let base = url.rsplit_once('/').unwrap().0;
    let db = DbConfig::new(&format!("{base}/{name}"), &format!("t_{}", hex(12))).unwrap();
    outbox::migrate(&db).await.unwrap();
    db
}

fn tenant(name: &str, db: &DbConfig, database: &str) -> Tenant {
    let mut t = Tenant::new(name, db.schema.clone()).unwrap();
    t.database = database.to_owned();
    t
}

fn fleet_config(databases: BTreeMap<String, DbConfig>) -> FleetConfig {
    let mut c = FleetConfig::default();
    c.databases = databases;
    c.relay = relay_config();
    c
}

/// Stops a fleet started with `tokio::spawn(fleet.run(stop…))`: it ends within a minute, without
/// an error.
async fn stop_fleet(
    stop: tokio_util::sync::CancellationToken,
    run: tokio::task::JoinHandle<Result<(), outbox::fleet::FleetError>>,
) {
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the fleet stops on shutdown")
        .unwrap()
        .unwrap();
}

fn payload_seqs(records: &[Record]) -> Vec<i64> {
    records
        .iter()
        .map(|r| r.json()["seq"].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fleet_publishes_many_schemas_and_databases_and_follows_its_registry() {
    let control = fresh_db().await;
    let (s1, s2, s3) = (fresh_db().await, fresh_db().await, fresh_db().await);
    let shard = second_database().await;
    let topics: Vec<String> = (0..5).map(|_| topic_name()).collect();
    for t in &topics {
        create_topic(t, 3).await;
    }
    for t in [
        tenant("acme", &s1, "default"),
        // Another name for acme's outbox: one drainer, each row published once.
        tenant("acme-eu", &s1, "default"),
        tenant("globex", &s2, "default"),
        tenant("initech", &s3, "default"),
        tenant("umbrella", &shard, "shard2"),
        // A database this relay was not given: skipped (logged once), the others unaffected.
        tenant("hooli", &s3, "elsewhere"),
    ] {
        outbox::fleet::put_tenant(&control, &t).await.unwrap();
    }
    let fleet = Fleet::new(
        &control,
        &kafka(),
        fleet_config(BTreeMap::from([("shard2".to_owned(), shard.clone())])),
    )
    .unwrap();
    let view = fleet.view();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(fleet.run(stop.clone().cancelled_owned()));

    for (db, topic) in [
        (&s1, &topics[0]),
        (&s2, &topics[1]),
        (&s3, &topics[2]),
        (&shard, &topics[3]),
    ] {
        enqueue_n(db, topic, 200, 20, 10).await;
    }
    for topic in &topics[..4] {
        wait_until(
            Duration::from_secs(60),
            "each tenant's 200 rows published",
            || async { topic_len(topic).await >= 200 },
        )
        .await;
    }
    for (topic, tenant) in topics[..4]
        .iter()
        .zip(["acme", "globex", "initech", "umbrella"])
    {
        let records = read_all(topic).await;
        let seqs = payload_seqs(&records);
        let distinct: HashSet<_> = seqs.iter().collect();
        assert_eq!(records.len(), 200, "{topic}: each row once");
        assert_eq!(distinct.len(), 200, "{topic}");
        // Each record names the tenant whose outbox it came from (x-tenant).
        assert!(
            records
                .iter()
                .all(|r| r.headers.get("x-tenant").map(String::as_str) == Some(tenant)),
            "{topic}: not all from {tenant}"
        );
    }
    let drainers = view.drainers();
    assert_eq!(drainers.len(), 4, "{drainers:?}");
    assert_eq!(drainers[0].tenants, ["acme", "acme-eu"]);
    assert!(drainers
        .iter()
        .all(|d| !d.tenants.contains(&"hooli".to_owned())));
    assert!(drainers
        .iter()
        .any(|d| d.database == "shard2" && d.schema == shard.schema));

    // A tenant added while it runs publishes within seconds (the registry notifies).
    let s4 = fresh_db().await;
    outbox::fleet::put_tenant(&control, &tenant("soylent", &s4, "default"))
        .await
        .unwrap();
    enqueue_n(&s4, &topics[4], 50, 5, 5).await;
    wait_until(
        Duration::from_secs(30),
        "the new tenant published",
        || async { topic_len(&topics[4]).await >= 50 },
    )
    .await;

    // Disabled and removed tenants stop: their relays finish and nothing more is claimed.
    let mut globex = tenant("globex", &s2, "default");
    globex.enabled = false;
    outbox::fleet::put_tenant(&control, &globex).await.unwrap();
    assert!(outbox::fleet::remove_tenant(&control, "initech")
        .await
        .unwrap());
    assert!(!outbox::fleet::remove_tenant(&control, "initech")
        .await
        .unwrap());
    wait_until(
        Duration::from_secs(30),
        "globex and initech stopped",
        || async {
            let d = view.drainers();
            d.len() == 3
                && d.iter()
                    .all(|d| d.schema != s2.schema && d.schema != s3.schema)
        },
    )
    .await;
    // Rows written to them now stay pending, while a tenant still listed keeps publishing:
    // its rows, enqueued after theirs, arriving is the clock.
    enqueue_n(&s2, &topics[1], 10, 2, 10).await;
    enqueue_n(&s3, &topics[2], 10, 2, 10).await;
    enqueue_n(&s4, &topics[4], 10, 2, 10).await;
    wait_until(
        Duration::from_secs(30),
        "soylent's later rows published",
        || async { topic_len(&topics[4]).await >= 60 },
    )
    .await;
    // A pass of the stopped relays would have taken well under the time the rows above took.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(topic_len(&topics[1]).await, 200);
    assert_eq!(topic_len(&topics[2]).await, 200);
    for db in [&s2, &s3] {
        let c = client(db).await;
        assert_eq!(
            count(&c, "SELECT count(*) FROM outbox WHERE status = 'pending'").await,
            10
        );
    }

    stop_fleet(stop, run).await;
}

/// One pass at a time, a batch per pass: a tenant with 100 rows registered behind one with a
/// 100,000-row backlog is drained within two scheduling rounds — the big tenant gets at most
/// two passes between the small one's relay appearing and its last row published — while most
/// of the backlog still waits: the gate is fair over tenants, not rows (`relay/gate.rs`'s unit
/// tests pin the order it grants passes in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_tenant_is_drained_within_two_rounds_while_a_large_backlog_still_waits() {
    const BIG: i64 = 100_000;
    let control = fresh_db().await;
    let (big, small) = (fresh_db().await, fresh_db().await);
    let (big_topic, small_topic) = (topic_name(), topic_name());
    create_topic(&big_topic, 3).await;
    create_topic(&small_topic, 3).await;
    enqueue_n(&big, &big_topic, BIG as usize, 100, 1000).await;
    outbox::fleet::put_tenant(&control, &tenant("big", &big, "default"))
        .await
        .unwrap();
    let mut config = fleet_config(BTreeMap::new());
    config.passes = 1;
    config.quantum = 1;
    config.relay.batch_size = 1000;
    // No pass without a reason (a notification, more to do): every pass the small tenant
    // has is one it needed, so its passes count its rounds.
    config.relay.poll_interval = Duration::from_secs(120);
    config.relay.sweep_interval = Duration::from_secs(120);
    let fleet = Fleet::new(&control, &kafka(), config).unwrap();
    let view = fleet.view();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(fleet.run(stop.clone().cancelled_owned()));
    wait_until(
        Duration::from_secs(30),
        "the big tenant publishing",
        || async { topic_len(&big_topic).await >= 2000 },
    )
    .await;
    enqueue_n(&small, &small_topic, 100, 10, 100).await;
    outbox::fleet::put_tenant(&control, &tenant("small", &small, "default"))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "the small tenant drained",
        || async { topic_len(&small_topic).await >= 100 },
    )
    .await;
    // Its 100 rows are one batch: one or two passes drain them (two rounds). Each of its
    // passes waits for at most the big tenant's pass then running; its first, measured here,
    // did.
    let small_drainer = view
        .drainers()
        .into_iter()
        .find(|d| d.schema == small.schema)
        .unwrap();
    assert!(small_drainer.passes <= 2, "{small_drainer:?}");
    let (asked, granted) = small_drainer.first_pass.unwrap();
    let between = granted.unwrap() - asked;
    assert!(
        between <= 1,
        "the big tenant had {between} passes while the small one waited (two rounds: at most the one running)"
    );
    // Without the quantum the big tenant's pass would hold the only permit until its whole
    // backlog was drained.
    let published_big = topic_len(&big_topic).await;
    assert!(
        published_big < BIG / 2,
        "the small tenant waited for {published_big} of the big one's rows"
    );
    // And the big one goes on to the end.
    wait_until(
        Duration::from_secs(180),
        "the big backlog drained",
        || async { topic_len(&big_topic).await >= BIG },
    )
    .await;
    stop_fleet(stop, run).await;
}

/// An idle tenant's relay looks at its outbox only every `idle_poll` (here far longer than
/// the test), woken at once by notifications, so hundreds of idle tenants do not keep
/// Postgres busy. A row backed off (not due yet) sends no notification when it becomes due:
/// the relay that saw it keeps its short poll until it went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tenant_polls_seldom_yet_a_backed_off_row_goes_when_due() {
    let control = fresh_db().await;
    let t = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    outbox::fleet::put_tenant(&control, &tenant("acme", &t, "default"))
        .await
        .unwrap();
    let mut config = fleet_config(BTreeMap::new());
    config.idle_poll = Duration::from_secs(600);
    config.relay.sweep_interval = Duration::from_secs(600);
    let fleet = Fleet::new(&control, &kafka(), config).unwrap();
    let view = fleet.view();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(fleet.run(stop.clone().cancelled_owned()));
    // A notification wakes it at once.
    enqueue_n(&t, &topic, 10, 10, 10).await;
    wait_until(
        Duration::from_secs(30),
        "the first rows published",
        || async { topic_len(&topic).await >= 10 },
    )
    .await;
    let passes = || {
        let v = view.clone();
        async move {
            v.drainers()
                .into_iter()
                .find(|d| d.tenants == ["acme"])
                .map_or(0, |d| d.passes)
        }
    };
    // Idle now: over two seconds a relay polling at its `poll_interval` (50 ms here) would
    // have made dozens of passes. (A window, not a wait: what is shown is that nothing runs.)
    let before = passes().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = passes().await - before;
    assert!(idle <= 1, "{idle} passes while idle");
    // A row backed off for 2 s (as a refused produce leaves it): its INSERT notifies, the
    // claim finds it not due, and the relay polls until it is.
    let mut c = outbox::connect(&t).await.unwrap();
    let tx = c.transaction().await.unwrap();
    let m = outbox::Message::new(&topic, "it_event", "late", serde_json::json!({"seq": 10}));
    outbox::Enqueuer::new(&t.schema)
        .enqueue(&tx, &m)
        .await
        .unwrap();
    tx.execute(
        &format!(
            "UPDATE {}.outbox SET available_at = now() + interval '2 seconds' WHERE status = 'pending'",
            t.schema
        ),
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "the backed-off row published when due",
        || async { topic_len(&topic).await >= 11 },
    )
    .await;
    stop_fleet(stop, run).await;
}

/// Two `outbox relay --tenants` processes over one registry of three tenants, under writes;
/// one is killed with SIGKILL mid-run. The survivor takes its lanes: every committed row is
/// published, at least once; resent only within the dead process's in-flight window
/// (at-least-once), and in exactly-once mode not once more for a `read_committed` reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_relay_killed_mid_run_loses_nothing_and_resends_only_its_in_flight_rows() {
    for exactly_once in [false, true] {
        fleet_kill_run(exactly_once).await;
    }
}

async fn fleet_kill_run(exactly_once: bool) {
    use std::process::Stdio;
    let control = fresh_db().await;
    let schemas = [fresh_db().await, fresh_db().await, fresh_db().await];
    let topic = topic_name();
    create_topic(&topic, 6).await;
    for (i, db) in schemas.iter().enumerate() {
        outbox::fleet::put_tenant(&control, &tenant(&format!("t{i}"), db, "default"))
            .await
            .unwrap();
    }
    let suffix = hex(8);
    let spawn = || {
        let mut c = outbox_command(&control);
        c.args([
            "relay",
            "--tenants",
            "--cleanup-interval",
            "off",
            "--batch-size",
            "50",
        ]);
        if exactly_once {
            c.args([
                "--exactly-once",
                "--progress-topic",
                &format!("it.progress.{suffix}"),
                "--transactional-id-prefix",
                &format!("it-{suffix}"),
            ]);
        }
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut victim, mut survivor) = (spawn(), spawn());
    // Writers: 10 rows per transaction into each tenant, until told to stop.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writers: Vec<_> = schemas
        .iter()
        .map(|db| {
            let (db, topic, stop) = (db.clone(), topic.clone(), stop_rx.clone());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                while !*stop.borrow() {
                    ids.extend(enqueue_n(&db, &topic, 10, 5, 10).await);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                ids
            })
        })
        .collect();
    wait_until(
        Duration::from_secs(60),
        "both relays publishing",
        || async { topic_len(&topic).await >= 600 },
    )
    .await;
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    let at_kill = topic_len(&topic).await;
    wait_until(
        Duration::from_secs(60),
        "the survivor publishing on",
        || async { topic_len(&topic).await >= at_kill + 600 },
    )
    .await;
    stop_tx.send(true).unwrap();
    let mut ids = Vec::new();
    for w in writers {
        ids.extend(w.await.unwrap());
    }
    for db in &schemas {
        let c = client(db).await;
        wait_until(Duration::from_secs(90), "every row sent", || async {
            count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await == 0
        })
        .await;
    }
    survivor.kill().unwrap();
    survivor.wait().unwrap();
    let records = if exactly_once {
        read_committed(&topic).await
    } else {
        read_all(&topic).await
    };
    let got: HashSet<String> = records.iter().map(Record::message_id).collect();
    let missing = ids.iter().filter(|id| !got.contains(*id)).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} rows never published",
        ids.len()
    );
    let resent = records.len() - got.len();
    eprintln!(
        "exactly_once={exactly_once}: {} rows, {} records, {resent} resent",
        ids.len(),
        records.len()
    );
    if exactly_once {
        assert_eq!(resent, 0, "a read_committed reader saw a row twice");
    } else {
        // At most what the dead process had in flight: per tenant, its pipeline's batches.
        let window = 3 * 50 * outbox::RelayConfig::DEFAULT_IN_FLIGHT_BATCHES.max(1) * 2;
        assert!(
            resent <= window,
            "{resent} resent, more than the in-flight window {window}"
        );
    }
}

/// Writes each message into `ledger` (unqualified: the tenant's schema, by `search_path`) in
/// the handler's transaction, with the tenant it names.
async fn ledger_entry(
    msg: &outbox::consumer::Delivered,
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<(), outbox::consumer::HandlerError> {
    tx.execute(
        "INSERT INTO ledger (message_id, tenant) VALUES ($1, $2)",
        &[&msg.message_id, &msg.tenant()],
    )
    .await?;
    Ok(())
}

/// The consumer side of a fleet: each message's handler transaction and inbox mark run in its
/// tenant's database and schema (two schemas of one database and a schema of a second
/// database), a redelivery is deduped by the tenant's inbox, a message naming an unknown
/// tenant is dead-lettered with the reason and archived under its tenant, and once the tenant
/// is registered, a replay selected by tenant is handled in its database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_routes_each_tenants_messages_to_its_database_and_dead_letters_by_tenant() {
    use outbox::consumer::{Consumer, ConsumerConfig, TenantRouting};

    let control = fresh_db().await;
    let (s1, s2) = (fresh_db().await, fresh_db().await);
    let shard = second_database().await;
    let topic = topic_name();
    create_topic_family(&topic, 3, &[]).await;
    for db in [&control, &s1, &s2, &shard] {
        client(db)
            .await
            .batch_execute("CREATE TABLE ledger (message_id text PRIMARY KEY, tenant text)")
            .await
            .unwrap();
    }
    for t in [
        tenant("acme", &s1, "default"),
        tenant("globex", &s2, "default"),
        tenant("umbrella", &shard, "shard2"),
    ] {
        outbox::fleet::put_tenant(&control, &t).await.unwrap();
    }
    let databases = BTreeMap::from([("shard2".to_owned(), shard.clone())]);
    let fleet = Fleet::new(&control, &kafka(), fleet_config(databases.clone())).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(fleet.run(stop.clone().cancelled_owned()));

    let group = format!("g-{}", hex(6));
    let mut cfg = ConsumerConfig::new(&group, [&topic]);
    let mut routing = TenantRouting::default();
    routing.databases = databases;
    cfg.tenants = Some(routing);
    // Commit groups of several messages: each group stays within one tenant.
    cfg.concurrency = 2;
    cfg.transactions = 2;
    let consumer = Consumer::new(&control, &kafka(), cfg.clone())
        .unwrap()
        .handler("it_event", ledger_entry);
    let stats = consumer.stats();
    let (stop_consumer, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));

    let mut ids = BTreeMap::new();
    for (name, db) in [("acme", &s1), ("globex", &s2), ("umbrella", &shard)] {
        ids.insert(name, enqueue_n(db, &topic, 60, 6, 10).await);
    }
    // A row that names a tenant nobody registered (a service may set x-tenant itself).
    let ghost_id = {
        let mut c = client(&s1).await;
        let enq = outbox::Enqueuer::new(&s1.schema);
        let m = outbox::Message::new(&topic, "it_event", "k-ghost", serde_json::json!({"seq": 0}))
            .with_header("x-tenant", "ghost");
        let tx = c.transaction().await.unwrap();
        enq.enqueue_batch(&tx, std::slice::from_ref(&m))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        m.message_id().to_string()
    };
    let ledger = |db: DbConfig| async move {
        texts(
            &client(&db).await,
            "SELECT message_id || ' ' || coalesce(tenant, '') FROM ledger ORDER BY 1",
        )
        .await
    };
    wait_until(Duration::from_secs(90), "180 messages handled", || async {
        stats.handled.load(std::sync::atomic::Ordering::Relaxed) >= 180
    })
    .await;
    for (name, db) in [("acme", &s1), ("globex", &s2), ("umbrella", &shard)] {
        let mut want: Vec<String> = ids[name].iter().map(|i| format!("{i} {name}")).collect();
        want.sort();
        assert_eq!(ledger(db.clone()).await, want, "{name}'s ledger");
        let marks = count(
            &client(db).await,
            &format!("SELECT count(*) FROM processed_messages WHERE consumer_group = '{group}'"),
        )
        .await;
        assert_eq!(marks, 60, "{name}'s marks are in its own inbox");
    }
    // Nothing of theirs in the consumer's own database.
    let own = client(&control).await;
    assert!(ledger(control.clone()).await.is_empty());
    assert_eq!(
        count(&own, "SELECT count(*) FROM processed_messages").await,
        0
    );

    // A redelivery of an acme message is a duplicate in acme's inbox.
    let again = read_all(&topic)
        .await
        .into_iter()
        .find(|r| r.message_id() == ids["acme"][0])
        .unwrap();
    let headers: Vec<(&str, &[u8])> = again
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    let before = stats.duplicates.load(std::sync::atomic::Ordering::Relaxed);
    produce(&topic, again.key.as_deref(), &headers, Some(&again.payload)).await;
    wait_until(
        Duration::from_secs(60),
        "the redelivery deduped",
        || async { stats.duplicates.load(std::sync::atomic::Ordering::Relaxed) > before },
    )
    .await;
    assert_eq!(ledger(s1.clone()).await.len(), 60);

    // The ghost's message is dead-lettered, saying why, and archived under its tenant.
    let dlq_topic = format!("{topic}.dlq");
    wait_until(
        Duration::from_secs(60),
        "the ghost dead-lettered",
        || async { topic_len(&dlq_topic).await >= 1 },
    )
    .await;
    let letter = read_all(&dlq_topic).await.remove(0);
    assert!(
        letter.headers["x-error"].contains("tenant ghost is not in the registry"),
        "{:?}",
        letter.headers
    );
    archive_once(&control, vec![dlq_topic.clone()]).await;
    let dlq = outbox::dlq::Dlq::new(&control);
    let of_ghost = outbox::dlq::Filter {
        tenant: Some("ghost".into()),
        ..Default::default()
    };
    let listed = dlq
        .list(&of_ghost, 10, Default::default(), None)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].tenant.as_deref(), Some("ghost"));
    assert_eq!(listed[0].message_id.as_deref(), Some(ghost_id.as_str()));
    let of_acme = outbox::dlq::Filter {
        tenant: Some("acme".into()),
        ..Default::default()
    };
    assert!(dlq
        .list(&of_acme, 10, Default::default(), None)
        .await
        .unwrap()
        .is_empty());
    let summary = dlq.summary().await.unwrap();
    assert_eq!(summary.tenants.len(), 1, "{:?}", summary.tenants);
    assert_eq!(
        (summary.tenants[0].tenant.as_str(), summary.tenants[0].new),
        ("ghost", 1)
    );

    // Registered now (in globex's schema), its replay, selected by tenant, carries x-tenant
    // and is handled there.
    outbox::fleet::put_tenant(&control, &tenant("ghost", &s2, "default"))
        .await
        .unwrap();
    let mut opts = outbox::dlq::ReplayOptions::default();
    opts.canary = 0;
    opts.rate = 1000.0;
    opts.confirm_kinds = true;
    opts.actor = "oncall".into();
    let job = dlq.create_job(&of_ghost, &opts).await.unwrap();
    dlq.run_job(&kafka(), job.id, &Default::default(), &mut |_| {})
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        "the replay handled in globex's schema",
        || async {
            ledger(s2.clone())
                .await
                .contains(&format!("{ghost_id} ghost"))
        },
    )
    .await;

    stop_consumer.send(()).unwrap();
    consuming.await.unwrap().unwrap();
    stop_fleet(stop, run).await;
}
