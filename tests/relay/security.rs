//! Transport security and secrets: Postgres over TLS (verify-full against the dev CA), Kafka
//! over SASL_SSL, and no password in any log line or error message of a full run.

use std::process::{Command, Stdio};
use std::time::Duration;

use outbox::{DbConfig, Relay};
use outbox_testkit::*;

const PG_PASSWORD: &str = "Pg-Pa55-q8x7w";
const KAFKA_USER: &str = "scanner";
const KAFKA_PASSWORD: &str = "scanner-Pa55-9f3k";

fn ca() -> String {
    format!("{}/dev/.state/tls/ca.pem", env!("CARGO_MANIFEST_DIR"))
}

fn sasl_bootstrap() -> String {
    std::env::var("KAFKA_SASL_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9094".into())
}

fn tls_url(extra: &str) -> String {
    let base = database_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{extra}")
}

async fn ssl_in_use(db: &DbConfig) -> bool {
    let c = outbox::connect(db).await.unwrap();
    c.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn postgres_over_tls_verify_full_and_a_wrong_ca_is_refused() {
    let schema = format!("s_{}", hex(10));
    let db = DbConfig::new(
        &tls_url(&format!("sslmode=verify-full&sslrootcert={}", ca())),
        &schema,
    )
    .unwrap();
    assert_eq!(db.tls_verify, outbox::TlsVerify::Full);
    outbox::migrate(&db).await.unwrap();
    assert!(ssl_in_use(&db).await, "the session is encrypted");

    // The whole path over TLS: enqueue, relay (pool + LISTEN connection), status.
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let mut c = outbox::connect(&db).await.unwrap();
    let tx = c.transaction().await.unwrap();
    outbox::Enqueuer::new(&db.schema)
        .enqueue(
            &tx,
            &outbox::Message::new(&topic, "t", "k", serde_json::json!({})),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);
    assert_eq!(outbox::status::status(&db).await.unwrap().count("sent"), 1);

    // sslmode=require encrypts without checking the certificate.
    let req = DbConfig::new(&tls_url("sslmode=require"), &schema).unwrap();
    assert!(ssl_in_use(&req).await);

    // A CA that did not sign the server certificate: verification really happens.
    let wrong = DbConfig::new(
        &tls_url("sslmode=verify-full&sslrootcert=/etc/ssl/certs/ssl-cert-snakeoil.pem"),
        &schema,
    );
    if let Ok(wrong) = wrong {
        let e = outbox::connect(&wrong)
            .await
            .expect_err("connection with an untrusted certificate must fail");
        let text = format!("{e:?}");
        assert!(text.contains("certificate verify failed"), "{text}");
    }
}

fn sasl_kafka(user: &str, password: &str) -> outbox::KafkaConfig {
    let mut k = outbox::KafkaConfig::new(&sasl_bootstrap()).unwrap();
    for p in [
        "security.protocol=SASL_SSL".to_owned(),
        "sasl.mechanisms=PLAIN".to_owned(),
        format!("sasl.username={user}"),
        format!("sasl.password={password}"),
        format!("ssl.ca.location={}", ca()),
    ] {
        k.set_from_pair(&p).unwrap();
    }
    k
}

#[tokio::test]
async fn kafka_over_sasl_ssl_publishes_and_bad_credentials_lose_nothing() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let ids = enqueue_n(&db, &topic, 20, 5, 20).await;

    // Wrong password: nothing is lost, rows stay pending (no attempt spent), no crash.
    let cfg = {
        let mut c = relay_config();
        c.delivery_timeout = Duration::from_secs(2);
        c
    };
    let bad = Relay::new(&db, &sasl_kafka(KAFKA_USER, "wrong-password"), cfg).unwrap();
    let outcome = bad.run_once().await.unwrap();
    let outbox::Outcome::Published(r) = outcome else {
        panic!("claimed nothing")
    };
    assert_eq!((r.sent, r.deferred), (0, 20), "{r:?}");
    let c = client(&db).await;
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM outbox WHERE status = 'pending' AND attempts = 0"
        )
        .await,
        20
    );

    drop(bad); // frees its ordering lanes, as a stopped relay does
    let good = Relay::new(&db, &sasl_kafka(KAFKA_USER, KAFKA_PASSWORD), relay_config()).unwrap();
    assert_eq!(drain(&good).await, 20);
    let got: std::collections::HashSet<String> = read_all(&topic)
        .await
        .iter()
        .map(Record::message_id)
        .collect();
    assert_eq!(got, ids.into_iter().collect());
}

fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_appears_in_any_log_line_or_error_of_a_full_run() {
    let admin = outbox::connect(&DbConfig::new(&database_url(), "public").unwrap())
        .await
        .unwrap();
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'scan_user') THEN
                 CREATE ROLE scan_user LOGIN SUPERUSER PASSWORD '{PG_PASSWORD}';
               END IF;
             END $$;"
        ))
        .await
        .unwrap();
    let pg = tokio_postgres::Config::from_str_url(&database_url());
    let url = format!(
        "postgres://scan_user:{PG_PASSWORD}@{}/{}?sslmode=verify-full&sslrootcert={}",
        pg.0,
        pg.1,
        ca()
    );
    let bad_url = format!(
        "postgres://scan_user:{PG_PASSWORD}-wrong@{}/{}?sslmode=require",
        pg.0, pg.1
    );
    let schema = format!("s_{}", hex(10));
    let topic = topic_name();
    let dir = std::env::temp_dir().join(format!("scan-{}", hex(6)));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("topics.toml"),
        format!("[[topic]]\nname = \"{topic}\"\npartitions = 2\n"),
    )
    .unwrap();
    let x = |p: &str| ["-X".to_owned(), p.to_owned()];
    let sasl: Vec<String> = [
        x("security.protocol=SASL_SSL"),
        x("sasl.mechanisms=PLAIN"),
        x(&format!("sasl.username={KAFKA_USER}")),
        x(&format!("sasl.password={KAFKA_PASSWORD}")),
        x(&format!("ssl.ca.location={}", ca())),
    ]
    .concat();
    let outbox_cmd = |args: &[String], db_url: &str| {
        let mut c = Command::new(outbox_testkit::outbox_bin());
        c.args(args)
            .env("DATABASE_URL", db_url)
            .env("OUTBOX_SCHEMA", &schema)
            .env("KAFKA_BOOTSTRAP_SERVERS", sasl_bootstrap())
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let mut log = String::new();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();

    let o = outbox_cmd(&s(&["migrate"]), &url).output().unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    log += &output_text(&o);
    let o = outbox_cmd(
        &[
            s(&["topics", "apply", dir.join("topics.toml").to_str().unwrap()]),
            sasl.clone(),
        ]
        .concat(),
        &url,
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    log += &output_text(&o);

    // Enqueue, then a relay over TLS + SASL_SSL with debug logging until everything is sent.
    let db = DbConfig::new(&url, &schema).unwrap();
    let ids = enqueue_n(&db, &topic, 200, 10, 50).await;
    let child = outbox_cmd(
        &[s(&["relay", "--cleanup-interval", "200ms"]), sasl.clone()].concat(),
        &url,
    )
    .spawn()
    .unwrap();
    let c = outbox::connect(&db).await.unwrap();
    let pending = format!("SELECT count(*) FROM \"{schema}\".outbox WHERE status <> 'sent'");
    wait_until(Duration::from_secs(30), "relay sent everything", || async {
        count(&c, &pending).await == 0
    })
    .await;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    log += &output_text(&o);
    let got: std::collections::HashSet<String> = read_all(&topic)
        .await
        .iter()
        .map(Record::message_id)
        .collect();
    assert!(ids.iter().all(|i| got.contains(i)));

    // Failure paths: wrong database password, wrong Kafka password, misspelt secret property.
    let o = outbox_cmd(&s(&["status"]), &bad_url).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    log += &output_text(&o);
    let bad_sasl: Vec<String> = sasl
        .iter()
        .map(|a| a.replace(KAFKA_PASSWORD, &format!("{KAFKA_PASSWORD}-wrong")))
        .collect();
    let mut child = outbox_cmd(
        &[s(&["relay", "--delivery-timeout", "1s"]), bad_sasl].concat(),
        &url,
    )
    .spawn()
    .unwrap();
    enqueue_n(&db, &topic, 5, 5, 5).await;
    tokio::time::sleep(Duration::from_secs(4)).await; // let it fail to authenticate and log it
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let o = tokio::task::spawn_blocking(move || {
        let _ = child.stdin.take();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let text = output_text(&o);
    assert!(
        text.to_lowercase().contains("authentication"),
        "the auth failure is reported: {text}"
    );
    log += &text;
    let o = outbox_cmd(
        &[
            s(&["relay"]),
            x(&format!("sasl.pasword={KAFKA_PASSWORD}")).to_vec(),
        ]
        .concat(),
        &url,
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(2));
    log += &output_text(&o);

    assert!(log.len() > 1000, "the scan saw real output");
    for secret in [PG_PASSWORD, KAFKA_PASSWORD] {
        assert!(
            !log.contains(secret),
            "secret {secret} leaked:\n{}",
            log.lines()
                .filter(|l| l.contains(secret))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

trait UrlParts {
    fn from_str_url(url: &str) -> (String, String);
}
impl UrlParts for tokio_postgres::Config {
    /// host:port and dbname of the test database URL.
    fn from_str_url(url: &str) -> (String, String) {
        let cfg: tokio_postgres::Config = url.parse().unwrap();
        let host = match &cfg.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[allow(unreachable_patterns)]
            _ => "127.0.0.1".into(),
        };
        (
            format!(
                "{host}:{}",
                cfg.get_ports().first().copied().unwrap_or(5432)
            ),
            cfg.get_dbname().unwrap_or("outbox").to_owned(),
        )
    }
}
