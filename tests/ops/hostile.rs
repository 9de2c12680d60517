//! Hostile input, probed the way a stranger and a careless operator would: every admin route a
//! viewer or nobody can reach, with hostile values (durations, NUL bytes, duplicate keys,
//! oversize names, foreign Host headers, trickling sockets), every CLI verb with a misspelt
//! secret property, a hostile schema registry on loopback, and letters whose headers lie. Each
//! test is named after the behaviour it holds; docs/RELIABILITY.md's "Hostile input" table lists
//! them with the probe each replaced.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use outbox_testkit::*;

const SECRET: &str = "S3cretXYZ-do-not-print";
const VIEWER: &str = "hostile-viewer-token-aaaa";
const OPERATOR: &str = "hostile-operator-token-bbbb";

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a command to its end; one still running after a minute (a server that should have
/// refused to start) is killed and fails the test.
fn run(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn outbox");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("still running after 60 s: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// One raw HTTP/1.1 exchange (the test chooses every header, Host included): status and body.
fn raw(port: u16, request: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    if s.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (status, body)
}

fn get(port: u16, path: &str, token: Option<&str>, host: &str) -> (u16, String) {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    raw(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"),
    )
}

fn post(port: u16, path: &str, token: &str, body: &str) -> (u16, String) {
    raw(
        port,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

struct Admin {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Drop for Admin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Admin {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// TCP connections process `pid` holds to Postgres (its own sockets, from /proc).
fn postgres_connections_of(pid: u32) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut n = 0;
    for table in ["tcp", "tcp6"] {
        let t = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in t.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // remote address ends in :1538 (5432), state 01 (established), our inode.
            if f.len() > 9 && f[2].ends_with(":1538") && f[3] == "01" && inodes.contains(f[9]) {
                n += 1;
            }
        }
    }
    n
}

/// An admin server with a viewer and an operator, a secret among its Kafka properties, and
/// the given extra flags; its log goes to a file.
async fn admin(db: &outbox::DbConfig, extra: &[&str]) -> Admin {
    let dir = std::env::temp_dir().join(format!("outbox-hostile-{}", hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "vera viewer {}\nolga operator {}\n",
            outbox::admin::token_hash(VIEWER),
            outbox::admin::token_hash(OPERATOR)
        ),
    )
    .unwrap();
    let log = dir.join("admin.log");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "admin",
        "--listen",
        &listen,
        "--tokens-file",
        tokens.to_str().unwrap(),
        "-X",
    ];
    let secret_prop = format!("sasl.password={SECRET}");
    args.push(&secret_prop);
    args.extend_from_slice(extra);
    let child = outbox_command(db)
        .args(&args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let a = Admin { child, port, log };
    wait_until(Duration::from_secs(30), "admin listening", || async {
        tokio::task::spawn_blocking(move || get(port, "/healthz", None, "127.0.0.1").0 == 200)
            .await
            .unwrap()
    })
    .await;
    a
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[test]
fn a_misspelt_kafka_property_refuses_to_start_every_verb_and_its_value_is_never_printed() {
    let db = outbox::DbConfig::new(&database_url(), "public").unwrap();
    let prop = format!("sasl.passwrd={SECRET}");
    let topics = std::env::temp_dir().join(format!("hostile-topics-{}.toml", hex(6)));
    std::fs::write(&topics, "[[topic]]\nname = \"hostile.probe\"\n").unwrap();
    let topics = topics.to_str().unwrap().to_owned();
    for verb in [
        vec!["admin", "--insecure-no-auth", "--listen", "127.0.0.1:0"],
        vec!["relay"],
        vec!["topics", "apply", &topics],
        vec!["dlq", "archive", "--once", "--topic", "hostile.probe.dlq"],
        vec!["dlq", "replay", "--id", "1"],
    ] {
        let o = run(outbox_command(&db).args(&verb).args(["-X", &prop]));
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{verb:?}: {t}");
        assert!(
            t.contains("sasl.passwrd"),
            "{verb:?} names the property: {t}"
        );
        assert!(!t.contains(SECRET), "{verb:?} printed the secret: {t}");
    }
    // A property librdkafka takes, refused by the broker later: the value is never printed
    // either (the broker here speaks PLAINTEXT; the client insists on SASL).
    let o = run(outbox_command(&db).args([
        "topics",
        "apply",
        &topics,
        "-X",
        "security.protocol=SASL_PLAINTEXT",
        "-X",
        "sasl.mechanism=PLAIN",
        "-X",
        "sasl.username=u",
        "-X",
        &format!("sasl.password={SECRET}"),
    ]));
    // Refused by the broker (not by the argument parser, which would prove nothing).
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!text(&o).contains(SECRET), "{}", text(&o));
    // No `=`: there is no telling a name from a pasted secret.
    let o = run(outbox_command(&db).args(["relay", "-X", SECRET]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!text(&o).contains(SECRET), "{}", text(&o));
}

/// `--kafka-properties-file` (OUTBOX_KAFKA_PROPERTIES_FILE): how the Helm chart hands a
/// mounted Secret's SASL credentials to every verb without putting them on a command line.
#[test]
fn a_kafka_properties_file_is_applied_refused_by_line_and_never_echoed() {
    let db = outbox::DbConfig::new(&database_url(), "public").unwrap();
    let dir = std::env::temp_dir().join(format!("hostile-props-{}", hex(6)));
    std::fs::create_dir_all(&dir).unwrap();
    let topics = dir.join("topics.toml");
    std::fs::write(
        &topics,
        format!("[[topic]]\nname = \"hostile.props.{}\"\n", hex(6)),
    )
    .unwrap();
    let topics = topics.to_str().unwrap().to_owned();
    let file = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let apply = |props: &str, extra: &[&str]| {
        run(outbox_command(&db)
            .args(["topics", "apply", &topics])
            .env("OUTBOX_KAFKA_PROPERTIES_FILE", props)
            .args(extra))
    };
    // A misspelt property: refused before any connection, naming the file, line and property.
    let typo = file(
        "typo.properties",
        &format!("# the cluster's credentials\n\nsasl.username=u\nsasl.passwrd={SECRET}\n"),
    );
    let o = apply(&typo, &[]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("sasl.passwrd"), "names the property: {t}");
    assert!(!t.contains(SECRET), "printed the secret: {t}");
    // A line without `=` is refused by its line number, and what it holds is not shown.
    let pasted = file("pasted.properties", &format!("client.id=x\n{SECRET}\n"));
    let o = apply(&pasted, &[]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("line 2"), "names the line: {t}");
    assert!(!t.contains(SECRET), "printed the secret: {t}");
    // A missing file is a usage error too.
    let o = apply(dir.join("absent").to_str().unwrap(), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // The file is applied: SASL against this PLAINTEXT broker fails, and the password is never
    // printed; `-X` on the command line wins over the file, and then the same call succeeds.
    let sasl = file(
        "sasl.properties",
        &format!(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password={SECRET}\n"
        ),
    );
    let o = apply(&sasl, &[]);
    let t = text(&o);
    assert_ne!(
        o.status.code(),
        Some(0),
        "SASL to a PLAINTEXT broker succeeded: {t}"
    );
    assert!(!t.contains(SECRET), "printed the secret: {t}");
    let o = apply(&sasl, &["-X", "security.protocol=PLAINTEXT"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains(SECRET), "{}", text(&o));
}

#[test]
fn configuration_errors_exit_2_and_hash_token_hashes_what_the_server_compares() {
    let db = outbox::DbConfig::new(&database_url(), "public").unwrap();
    for (what, args, env) in [
        (
            "bootstrap",
            vec!["topics", "apply", "/nonexistent.toml"],
            ("KAFKA_BOOTSTRAP_SERVERS", "nonsense"),
        ),
        (
            "database url",
            vec!["status"],
            ("DATABASE_URL", "postgres://u:pw@127.0.0.1:notaport/db"),
        ),
        (
            "registry url",
            vec!["schemas", "check", "."],
            ("SCHEMA_REGISTRY_URL", "ftp://user:hunter2@h/x"),
        ),
        (
            "tokens",
            vec!["admin", "--tokens-file", "/nonexistent"],
            ("X", ""),
        ),
        (
            "archive topics",
            vec!["dlq", "archive", "--once"],
            ("X", ""),
        ),
        (
            "no connections",
            vec!["admin", "--insecure-no-auth", "--max-connections", "0"],
            ("X", ""),
        ),
        (
            "absurd connections",
            vec![
                "admin",
                "--insecure-no-auth",
                "--max-connections",
                "18446744073709551615",
            ],
            ("X", ""),
        ),
        (
            "zero header timeout",
            vec!["admin", "--insecure-no-auth", "--header-timeout", "0s"],
            ("X", ""),
        ),
        (
            "absurd idle timeout",
            vec!["admin", "--insecure-no-auth", "--idle-timeout", "10000y"],
            ("X", ""),
        ),
        (
            "malformed topics file",
            vec!["dlq", "archive", "--once", "--topics-file", "/etc/hostname"],
            ("X", ""),
        ),
        (
            "archive topics file",
            vec!["dlq", "archive", "--once", "--topics-file", "/nonexistent"],
            ("X", ""),
        ),
        (
            "no connection for a peer",
            vec![
                "admin",
                "--insecure-no-auth",
                "--max-connections-per-peer",
                "0",
            ],
            ("X", ""),
        ),
        (
            "a peer's share above the cap",
            vec![
                "admin",
                "--insecure-no-auth",
                "--max-connections",
                "10",
                "--max-connections-per-peer",
                "11",
            ],
            ("X", ""),
        ),
        (
            "absurd marks retention",
            vec!["dlq", "replay", "--id", "1", "--marks-retention", "10000y"],
            ("X", ""),
        ),
        (
            "zero marks retention",
            vec!["dlq", "replay", "--id", "1", "--marks-retention", "0s"],
            ("X", ""),
        ),
    ] {
        let o = run(outbox_command(&db).args(&args).env(env.0, env.1));
        assert_eq!(o.status.code(), Some(2), "{what}: {}", text(&o));
        assert!(!text(&o).contains("hunter2"), "{what}: {}", text(&o));
    }
    let hash = |input: &str| {
        let mut c = outbox_command(&db)
            .arg("hash-token")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        c.wait_with_output().unwrap()
    };
    let short = hash("abc\n");
    assert_eq!(short.status.code(), Some(2), "{}", text(&short));
    assert!(text(&short).contains("at least 16"), "{}", text(&short));
    let padded = hash("  a-long-enough-token-1234  \n");
    assert!(padded.status.success(), "{}", text(&padded));
    assert_eq!(
        String::from_utf8_lossy(&padded.stdout).trim(),
        outbox::admin::token_hash("a-long-enough-token-1234")
    );
}

/// A registry on loopback that answers as `mode` says and records each request's headers.
fn hostile_registry(mode: &'static str) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = vec![0u8; 64 * 1024];
            let n = c.read(&mut buf).unwrap_or(0);
            s2.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = match mode {
                "html404" => c.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: 22\r\nConnection: close\r\n\r\n<h1>no such page</h1>\n",
                ),
                "huge" => {
                    // 300 MB announced, streamed until the client hangs up.
                    let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 314572800\r\nConnection: close\r\n\r\n{\"schema\":\"");
                    let chunk = vec![b'x'; 1 << 20];
                    for _ in 0..300 {
                        if c.write_all(&chunk).is_err() {
                            break;
                        }
                    }
                    Ok(())
                }
                _ => {
                    // A 5xx whose text would clear a terminal, 10 MB long.
                    let mut body = b"\x1b[2J\x1b]0;owned\x07".to_vec();
                    body.extend(std::iter::repeat_n(b'y', 10 << 20));
                    let _ = c.write_all(
                        format!(
                            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .as_bytes(),
                    );
                    c.write_all(&body)
                }
            };
        }
    });
    (port, seen)
}

#[test]
fn a_registry_that_is_not_one_fails_the_gate_and_its_answers_are_capped_and_inert() {
    let db = outbox::DbConfig::new(&database_url(), "public").unwrap();
    let dir = std::env::temp_dir().join(format!("hostile-schemas-{}", hex(6)));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("orders.created-value.json"),
        r#"{"type": "object", "properties": {"id": {"type": "string"}}}"#,
    )
    .unwrap();
    let check = |port: u16, userinfo: &str| {
        run(outbox_command(&db)
            .args(["schemas", "check", dir.to_str().unwrap()])
            .env(
                "SCHEMA_REGISTRY_URL",
                format!("http://{userinfo}127.0.0.1:{port}/apis/ccompat/v7"),
            ))
    };
    // A 404 that is not the registry's "no such subject": a wrong URL fails the gate.
    let (port, seen) = hostile_registry("html404");
    let o = check(port, "alice:pa%24%24w0rd@");
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("40401"), "{}", text(&o));
    // Credentials in the URL are Basic auth (base64 of alice:pa$$w0rd), never printed.
    let req = seen.lock().unwrap().join("\n").to_ascii_lowercase();
    assert!(
        req.contains("authorization: basic ywxpy2u6cgekjhcwcmq="),
        "{req}"
    );
    assert!(
        !text(&o).contains("pa$$w0rd") && !text(&o).contains("pa%24%24w0rd"),
        "{}",
        text(&o)
    );
    // An answer without end is cut at the cap.
    let (port, _) = hostile_registry("huge");
    let started = Instant::now();
    let o = check(port, "");
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("larger than 4 MiB"), "{}", text(&o));
    assert!(started.elapsed() < Duration::from_secs(30));
    // A 5xx's text is quoted short, its control characters shown, not obeyed.
    let (port, _) = hostile_registry("5xx");
    let o = check(port, "");
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(!t.contains('\u{1b}') && !t.contains('\u{7}'), "{t:?}");
    assert!(t.len() < 4000, "{} bytes of error", t.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_leaks_no_secret_costs_no_connection_and_refuses_foreign_hosts() {
    let db = fresh_db().await;
    let a = admin(&db, &["--allowed-host", "outbox-admin.internal"]).await;
    let port = a.port;
    let (code, body) = blocking(move || get(port, "/readyz", None, "127.0.0.1")).await;
    assert!(code == 200 || code == 503, "{code} {body}");
    assert!(body.contains("\"postgres\":\"ok\""), "{body}");
    assert!(!body.contains(SECRET), "{body}");
    // DNS rebinding: a page whose name now points here reads nothing, on any route.
    for path in ["/readyz", "/healthz", "/metrics", "/", "/api/whoami"] {
        let (code, body) = blocking(move || get(port, path, Some(VIEWER), "evil.example:80")).await;
        assert_eq!(code, 403, "{path}: {body}");
    }
    for host in ["localhost", "10.0.0.7:8080", "Outbox-Admin.Internal:8080"] {
        let (code, _) = blocking(move || get(port, "/healthz", None, host)).await;
        assert_eq!(code, 200, "{host}");
    }
    // 40 concurrent readiness calls open no connection: the answer comes from the last look.
    // The server's Postgres sockets are sampled all through the calls (a connection per call
    // would be open while its call runs, and gone after).
    // The server's own start-up work (the first gauge refresh, the pools' first connections)
    // may still be opening connections: take the count once it has held for two seconds.
    let pid = a.child.id();
    // The server's periodic work (gauges, job polls) may open a connection of its own while
    // the calls run (CI saw 3 → 5 once): a burst that saw more than before is measured again,
    // up to three times. Readiness that opened a connection per call would fail all three.
    let mut tries = Vec::new();
    for _ in 0..3 {
        let before = blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let (mut n, mut since) = (postgres_connections_of(pid), Instant::now());
            while since.elapsed() < Duration::from_secs(2) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
                let now = postgres_connections_of(pid);
                if now != n {
                    (n, since) = (now, Instant::now());
                }
            }
            n
        })
        .await;
        let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let sampler = {
            let sampling = sampling.clone();
            std::thread::spawn(move || {
                let mut most = 0;
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    most = most.max(postgres_connections_of(pid));
                    std::thread::sleep(Duration::from_millis(2));
                }
                most
            })
        };
        let calls: Vec<_> = (0..40)
            .map(|_| tokio::task::spawn_blocking(move || get(port, "/readyz", None, "127.0.0.1").0))
            .collect();
        for c in calls {
            let code = c.await.unwrap();
            assert!(code == 200 || code == 503, "{code}");
        }
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        let most = sampler.join().unwrap();
        assert!(before >= 1, "the prober keeps a connection");
        tries.push((before, most));
        if most <= before {
            break;
        }
    }
    assert!(
        tries.iter().any(|(before, most)| most <= before),
        "connections (before, during the calls) in each try: {tries:?}"
    );
    assert!(!a.log().contains(SECRET), "{}", a.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_and_idle_sockets_are_closed_and_connections_are_capped() {
    let db = fresh_db().await;
    let a = admin(
        &db,
        &[
            "--max-connections",
            "20",
            "--max-connections-per-peer",
            "20",
            "--header-timeout",
            "5s",
            "--idle-timeout",
            "20s",
        ],
    )
    .await;
    let port = a.port;
    // Sockets that send half a request line and stop, opened one by one until the server
    // closes one as it accepts it: then exactly 20 are held (the cap). (A slot of the
    // start-up check's connections may free late, so the first refusal is not always the 21st
    // socket; the count held when one is refused always is the cap.)
    let (trickling, first_refused) = blocking(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        for n in 0..40 {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHo");
            std::thread::sleep(Duration::from_millis(50));
            s.set_nonblocking(true).unwrap();
            let open = matches!(s.peek(&mut [0u8; 1]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            s.set_nonblocking(false).unwrap();
            if !open {
                return (held, Some(n));
            }
            held.push(s);
        }
        (held, None)
    })
    .await;
    assert!(first_refused.is_some(), "40 trickling sockets held: no cap");
    assert_eq!(trickling.len(), 20, "sockets held when one was refused");
    let refused = blocking(move || get(port, "/healthz", None, "127.0.0.1")).await;
    assert_eq!(
        refused.0, 0,
        "a connection past the cap was served: {refused:?}"
    );
    // Each trickling socket is let go by the header timeout: EOF, a reset, or hyper's 408.
    let started = Instant::now();
    let closed = blocking(move || {
        trickling
            .into_iter()
            .filter(|s| {
                let mut s = s;
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut b = [0u8; 64];
                match s.read(&mut b) {
                    Ok(0) => true,
                    Ok(n) => String::from_utf8_lossy(&b[..n]).starts_with("HTTP/1.1 408"),
                    Err(e) => !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ),
                }
            })
            .count()
    })
    .await;
    assert_eq!(closed, 20, "sockets let go by the header timeout");
    assert!(started.elapsed() < Duration::from_secs(25));
    // Served again once they are gone.
    wait_until(Duration::from_secs(15), "served again", || async move {
        blocking(move || get(port, "/healthz", None, "127.0.0.1").0 == 200).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_by_the_idle_timeout() {
    let db = fresh_db().await;
    // The idle timeout shorter than the header timeout: only the idle watchdog can close it.
    let a = admin(&db, &["--header-timeout", "60s", "--idle-timeout", "2s"]).await;
    let port = a.port;
    let (held, answer) = blocking(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let t = Instant::now();
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
        (t.elapsed(), String::from_utf8_lossy(&all).into_owned())
    })
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        held < Duration::from_secs(15),
        "an idle kept-alive connection held for {held:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_ids_statuses_and_errors_never_contents() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let msg = outbox::Message::new(
        "orders.created",
        "order_created",
        "cust-4242",
        serde_json::json!({"email": "alice@example.com", "total_cents": 100}),
    );
    let id = msg.message_id().to_string();
    outbox::enqueue(&c, &msg).await.unwrap();
    let a = admin(&db, &[]).await;
    let port = a.port;
    // Content and key searches are an operator's; a viewer gets 403, not an oracle.
    for q in ["alice@example.com", "alice@example.co", "cust-4242"] {
        let path = format!("/api/trace?q={}", q.replace('@', "%40"));
        let (code, body) = blocking(move || get(port, &path, Some(VIEWER), "127.0.0.1")).await;
        assert_eq!(code, 403, "{q}: {body}");
        assert!(!body.contains("cust-4242") || q == "cust-4242", "{body}");
    }
    // By message id: the journey, without the key.
    let path = format!("/api/trace?q={id}");
    let (code, body) = blocking(move || get(port, &path, Some(VIEWER), "127.0.0.1")).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let row = &v["messages"][0]["outbox"][0];
    assert_eq!(row["key"], serde_json::Value::Null, "{body}");
    assert_eq!(row["key_redacted"], true, "{body}");
    assert!(
        !body.contains("cust-4242") && !body.contains("alice"),
        "{body}"
    );
    // An operator searches contents: an exact value finds it, a near one does not.
    let found = |q: &'static str| async move {
        let path = format!("/api/trace?q={}", q.replace('@', "%40"));
        let (code, body) = blocking(move || get(port, &path, Some(OPERATOR), "127.0.0.1")).await;
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["messages"].as_array().unwrap().len()
    };
    assert_eq!(found("alice@example.com").await, 1);
    assert_eq!(found("alice@example.co").await, 0);
    assert_eq!(found("cust-4242").await, 1);
    // Over-long and NUL-carrying queries are refused as input, not as an outage.
    let long = format!("/api/trace?q={}", "a".repeat(1001));
    let (code, _) = blocking(move || get(port, &long, Some(OPERATOR), "127.0.0.1")).await;
    assert_eq!(code, 400);
    let (code, body) =
        blocking(move || get(port, "/api/trace?q=a%00b", Some(OPERATOR), "127.0.0.1")).await;
    assert_eq!(code, 400, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_get_a_clear_4xx_never_a_panic_and_confirmations_hold() {
    let db = fresh_db().await;
    let a = admin(&db, &[]).await;
    let port = a.port;
    // Instants before 1970: answered (the beginning), not a closed connection.
    for since in ["99999999h", "10000y"] {
        let path = format!("/api/dlq/messages?since={since}");
        let (code, body) = blocking(move || get(port, &path, Some(VIEWER), "127.0.0.1")).await;
        assert_eq!(code, 200, "since={since}: {body}");
    }
    // The tenant filter: NUL and over-long values are a 400 that does not echo them whole; a
    // tenant without letters lists nothing; a viewer may list, not replay by it.
    for (q, want) in [
        ("tenant=a%00b".to_owned(), 400),
        (format!("tenant={}", "t".repeat(5_000)), 400),
        ("tenant=nobody".to_owned(), 200),
    ] {
        let path = format!("/api/dlq/messages?{q}");
        let (code, body) = blocking(move || get(port, &path, Some(VIEWER), "127.0.0.1")).await;
        assert_eq!(code, want, "{}: {body}", &q[..q.len().min(40)]);
        assert!(body.len() < 2_000, "{} bytes answered", body.len());
    }
    let (code, _) = blocking(move || {
        post(
            port,
            "/api/dlq/replay",
            VIEWER,
            r#"{"tenant": "acme", "dry_run": true}"#,
        )
    })
    .await;
    assert_eq!(code, 403);
    let p = |path: &'static str, body: String| async move {
        blocking(move || post(port, path, OPERATOR, &body)).await
    };
    let (code, body) = p(
        "/api/dlq/drop",
        r#"{"since": "10000y", "reason": "probe"}"#.into(),
    )
    .await;
    assert!((200..500).contains(&code), "{code} {body}");
    let (code, body) = p(
        "/api/dlq/replay",
        r#"{"since": "10000y", "dry_run": true}"#.into(),
    )
    .await;
    assert!((200..500).contains(&code), "{code} {body}");
    // A rate no schedule can pace.
    let (code, body) = p("/api/dlq/replay", r#"{"ids": [1], "rate": 1e-300}"#.into()).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("rate"), "{body}");
    // A request field cannot stand in for accept_duplicates.
    let (code, body) = p(
        "/api/dlq/replay",
        r#"{"ids": [1], "marks_retention_secs": 999999999, "dry_run": true}"#.into(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("accept_duplicates"), "{body}");
    // Duplicate keys: one body, one meaning.
    let (code, body) = p(
        "/api/dlq/drop",
        r#"{"ids": [1], "ids": [2], "reason": "x"}"#.into(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("\\\"ids\\\" appears twice"), "{body}");
    // NUL in a reason or a name: bad input, not "db error".
    let (code, body) = p(
        "/api/breakers/open",
        r#"{"group": "g", "dependency": "d", "reason": "a\u0000b"}"#.into(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    // A name longer than any group can be.
    let long = "n".repeat(60_000);
    let (code, body) = p(
        "/api/breakers/open",
        format!(r#"{{"group": "{long}", "dependency": "d", "reason": "probe"}}"#),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    // Text that would forge a log line or drive a terminal is logged as one inert line.
    let (code, body) = p(
        "/api/breakers/open",
        r#"{"group": "g-forge", "dependency": "d", "reason": "x\u001b[2Jy\nINFO forged line", "confirm": true}"#
            .into(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    wait_until(
        Duration::from_secs(10),
        "the breaker's log line",
        || async { a.log().contains("g-forge") },
    )
    .await;
    let log = a.log();
    let line = log.lines().find(|l| l.contains("g-forge")).unwrap();
    assert!(line.contains("\\nINFO forged line"), "{line}");
    assert!(!log.contains('\u{1b}'), "{log:?}");
    assert!(!log.lines().any(|l| l.starts_with("INFO forged")), "{log}");
    // Still alive, no panic logged.
    assert_eq!(
        blocking(move || get(port, "/healthz", None, "127.0.0.1"))
            .await
            .0,
        200
    );
    assert!(!a.log().contains("panicked"), "{}", a.log());
}

#[tokio::test]
async fn the_cli_takes_instants_before_1970_without_panicking() {
    let db = fresh_db().await;
    for args in [
        vec!["dlq", "list", "--since", "10000y"],
        vec!["dlq", "list", "--since", "99999999h", "--json"],
    ] {
        let o = run(outbox_command(&db).args(&args));
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
    }
    let o = run(outbox_command(&db).args([
        "dlq",
        "replay",
        "--since",
        "10000y",
        "--rate",
        "1e-300",
        "--dry-run",
    ]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archiver_reads_only_its_deployments_topics_and_trusts_no_header() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let (ours, theirs) = (topic_name(), topic_name());
    create_topic(&format!("{ours}.dlq"), 1).await;
    create_topic(&format!("{theirs}.dlq"), 1).await;
    // Ours: a letter whose headers lie about everything they can.
    let kind = format!("kind-{}", hex(6));
    produce(
        &format!("{ours}.dlq"),
        Some(b"k"),
        &[
            ("x-original-topic", b"someone.elses.topic"),
            ("x-consumer-group", b"g\nforged"),
            ("x-error-kind", kind.as_bytes()),
            ("x-error", b"boom"),
            ("x-first-failed-at", b"1970-01-01T00:00:00Z"),
            ("x-failed-at", b"2999-01-01T00:00:00Z"),
        ],
        Some(b"{}"),
    )
    .await;
    produce(&format!("{theirs}.dlq"), Some(b"k"), &[], Some(b"{}")).await;
    let file = std::env::temp_dir().join(format!("hostile-archive-{}.toml", hex(6)));
    // A second topic of ours whose DLQ has another suffix: its origin comes from the file,
    // never from the header.
    let custom = topic_name();
    create_topic(&format!("{custom}.dead"), 1).await;
    produce(
        &format!("{custom}.dead"),
        Some(b"k"),
        &[
            ("x-original-topic", b"someone.elses.topic"),
            ("x-error", b"boom"),
        ],
        Some(b"{}"),
    )
    .await;
    std::fs::write(
        &file,
        format!(
            "[[topic]]\nname = \"{ours}\"\n[[topic]]\nname = \"{custom}\"\ndlq_suffix = \"dead\"\n"
        ),
    )
    .unwrap();
    let o = run(outbox_command(&db).args([
        "dlq",
        "archive",
        "--once",
        "--topics-file",
        file.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("archived=2"), "{}", text(&o));
    let custom_origin = c
        .query_one(
            "SELECT original_topic FROM dead_letters WHERE dlq_topic = $1",
            &[&format!("{custom}.dead")],
        )
        .await
        .unwrap()
        .get::<_, String>(0);
    assert_eq!(custom_origin, custom, "the file names the origin");
    let rows = c
        .query(
            "SELECT original_topic, consumer_group, error_kind, \
                    extract(epoch FROM now() - first_failed_at)::float8, \
                    extract(epoch FROM failed_at - now())::float8 FROM dead_letters \
              WHERE dlq_topic = $1",
            &[&format!("{ours}.dlq")],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        count(&c, "SELECT count(*) FROM dead_letters").await,
        2,
        "only our topics are archived"
    );
    let r = &rows[0];
    assert_eq!(
        r.get::<_, String>(0),
        ours,
        "the DLQ topic names the origin"
    );
    assert_eq!(
        r.get::<_, Option<String>>(1),
        None,
        "a group name with a newline"
    );
    assert_eq!(r.get::<_, Option<String>>(2).as_deref(), Some("unknown"));
    assert!(r.get::<_, f64>(4) <= 1.0, "failed_at in the future");
    // The oldest-age gauge counts from archiving, whatever `x-first-failed-at` says (1970
    // would pin it at 56 years); the kind label is a known one.
    let a = admin(&db, &[]).await;
    let port = a.port;
    let series = format!("outbox_dlq_oldest_age_seconds{{topic=\"{ours}\"}}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (age, metrics) = loop {
        let (_, m) = blocking(move || get(port, "/metrics", None, "127.0.0.1")).await;
        let age = m
            .lines()
            .find(|l| l.starts_with(&series))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        if age.is_some() || Instant::now() > deadline {
            break (age, m);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!metrics.contains(&kind), "a producer's kind became a label");
    assert!(age.expect("the gauge") < 3600.0, "oldest age {age:?}");
    // Their topic's offsets were not touched, under our deployment's group.
    let group = outbox::dlq::Archiver::default_group(&db);
    assert!(
        group.ends_with(&format!(".{}", db.schema.name())),
        "{group}"
    );
    assert_eq!(committed(&group, &format!("{theirs}.dlq"), 0).await, None);
    assert!(committed(&group, &format!("{ours}.dlq"), 0).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_opened_by_hand_names_a_group_and_dependency_that_exist() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.execute(
        "INSERT INTO outbox_instances (kind, name, instance, state) VALUES
           ('consumer', 'billing', 'pod-a:1', '{\"mode\": \"normal\", \"dependencies\": [\"payments-api\"]}'),
           ('consumer', 'billing', 'pod-b:1', '{\"mode\": \"normal\", \"dependencies\": [\"payments-api\", \"ledger\"]}')",
        &[],
    )
    .await
    .unwrap();
    let a = admin(&db, &[]).await;
    let port = a.port;
    let open = |body: &'static str| async move {
        blocking(move || post(port, "/api/breakers/open", OPERATOR, body)).await
    };
    // A misspelt group or a dependency the group never calls: refused, naming what exists.
    let (code, body) =
        open(r#"{"group": "biling-servce", "dependency": "payments-api", "reason": "outage"}"#)
            .await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("billing"), "{body}");
    let (code, body) =
        open(r#"{"group": "billing", "dependency": "loyalty-api", "reason": "outage"}"#).await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("ledger, payments-api"), "{body}");
    assert_eq!(count(&c, "SELECT count(*) FROM circuit_breakers").await, 0);
    // What the replicas declare opens; so does anything else, confirmed, and it says so.
    let (code, body) =
        open(r#"{"group": "billing", "dependency": "ledger", "reason": "outage"}"#).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = open(
        r#"{"group": "billing", "dependency": "loyalty-api", "reason": "outage", "confirm": true}"#,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let o = outbox::instances::overview(&db).await.unwrap();
    let rows: Vec<(String, Option<String>, Option<String>)> = o
        .outbox
        .open_breakers
        .iter()
        .map(|b| (b.dependency.clone(), b.opened_by.clone(), b.reason.clone()))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter().all(|r| r.1.as_deref() == Some("operator olga")),
        "{rows:?}"
    );
    let loyalty = rows.iter().find(|r| r.0 == "loyalty-api").unwrap();
    assert!(
        loyalty.2.as_deref().unwrap_or("").contains("confirmed"),
        "{loyalty:?}"
    );
}

/// The sidecars' `/metrics` listeners answer the loopback, an IP and the names they are told,
/// nothing else: a page whose name was rebound to the port (DNS rebinding) reads no topic or
/// group name off it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecars_metrics_listeners_refuse_foreign_hosts() {
    let db = fresh_db().await;
    let topics = std::env::temp_dir().join(format!("hostile-topics-{}.toml", hex(6)));
    std::fs::write(&topics, "[[topic]]\nname = \"hostile.metrics\"\n").unwrap();
    for verb in [
        vec!["relay".to_owned()],
        vec![
            "dlq".to_owned(),
            "archive".to_owned(),
            "--topics-file".to_owned(),
            topics.to_str().unwrap().to_owned(),
        ],
    ] {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut child = outbox_command(&db)
            .args(&verb)
            .args([
                "--metrics-addr",
                &addr,
                "--metrics-allowed-host",
                "prometheus-target.internal",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until(Duration::from_secs(30), "metrics listening", || async {
            tokio::task::spawn_blocking(move || get(port, "/metrics", None, "127.0.0.1").0 == 200)
                .await
                .unwrap()
        })
        .await;
        for host in [
            format!("127.0.0.1:{port}"),
            "localhost".to_owned(),
            "Prometheus-Target.Internal:9187".to_owned(),
        ] {
            let (code, body) = blocking(move || get(port, "/metrics", None, &host)).await;
            assert_eq!(code, 200, "{verb:?}");
            assert!(body.contains("outbox_up"), "{verb:?}: {body}");
        }
        // A 10,000-character name is refused like any other (or by hyper's header limit).
        let huge: &'static str = Box::leak("h".repeat(10_000).into_boxed_str());
        for host in ["evil.example", "evil.example:80", "127.0.0.1.nip.io", huge] {
            let (code, body) = blocking(move || get(port, "/metrics", None, host)).await;
            assert!(
                code == 403 || (host.len() > 1000 && code == 431),
                "{verb:?} {}: {code} {body}",
                &host[..host.len().min(40)]
            );
            assert!(!body.contains("outbox_"), "{verb:?}: {body}");
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    // The flag without a listener is a mistake the command says, not one it ignores.
    let o = run(outbox_command(&db).args(["relay", "--metrics-allowed-host", "x.internal"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// A secret holding a quote and a backslash, refused by librdkafka: printed neither as it is
/// nor escaped (`Debug`, JSON, percent-encoded), by any verb.
#[test]
fn a_secret_with_quotes_and_backslashes_is_never_printed_escaped() {
    let db = outbox::DbConfig::new(&database_url(), "public").unwrap();
    let secret = r#"Qu"o\te-S3cret"#;
    let forms = [
        secret.to_owned(),
        secret.escape_debug().to_string(),
        serde_json::to_string(secret)
            .unwrap()
            .trim_matches('"')
            .to_owned(),
        "Qu%22o%5Cte-S3cret".to_owned(),
    ];
    for verb in [vec!["relay"], vec!["topics", "apply", "/nonexistent.toml"]] {
        let o = run(outbox_command(&db)
            .args(&verb)
            .args(["-X", &format!("sasl.passwrd={secret}")]));
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{verb:?}: {t}");
        for f in &forms {
            assert!(!t.contains(f.as_str()), "{verb:?} printed {f:?}: {t}");
        }
        assert!(!t.contains("S3cret"), "{verb:?}: {t}");
    }
}

/// One address holds at most its share of the connection cap: a client that opens socket after
/// socket is refused past `--max-connections-per-peer`, and another address is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_take_every_connection_slot() {
    let db = fresh_db().await;
    let a = admin(
        &db,
        &["--max-connections", "20", "--max-connections-per-peer", "5"],
    )
    .await;
    let target: std::net::SocketAddr = format!("127.0.0.1:{}", a.port).parse().unwrap();
    // Connections from 127.0.0.2 that send half a request line and stop, until the server
    // closes one as it accepts it.
    let mut held = Vec::new();
    let mut refused_at = None;
    for n in 0..20 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut s = sock.connect(target).await.unwrap();
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHo").await;
        let mut b = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await {
            Err(_) => held.push(s), // still open, waiting for the rest of the request
            Ok(_) => {
                refused_at = Some(n);
                break;
            }
        }
    }
    assert_eq!(
        refused_at,
        Some(5),
        "sockets from one address held before a refusal"
    );
    // Another address is served while the first holds its share.
    let served = {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.3:0".parse().unwrap()).unwrap();
        let mut s = sock.connect(target).await.unwrap();
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    };
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    drop(held);
}

/// The fleet's flags and `outbox tenants` given absurd, huge and control-character input, a
/// URL with a password where a name belongs, and a role without rights on the registry: each
/// exits with a message, never a panic, and no password reaches the output.
#[tokio::test]
async fn fleet_flags_and_tenant_verbs_refuse_hostile_input_without_echoing_secrets() {
    let control = fresh_db().await;
    let run_cli = |args: &[&str]| run(outbox_command(&control).args(args));
    let huge = "t".repeat(100_000);
    let url_with_secret = format!("postgres://u:{SECRET}@127.0.0.1:1/db");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            owned(&["relay", "--tenants", "--connection-budget", "0"]),
            "connection budget 0",
        ),
        (
            owned(&[
                "relay",
                "--tenants",
                "--connection-budget",
                "99999999999999999999999",
            ]),
            "connection-budget",
        ),
        (
            owned(&["relay", "--tenants", "--fleet-passes", "0"]),
            "at least 1",
        ),
        (
            owned(&["relay", "--tenants", "--fleet-quantum", "0"]),
            "at least 1",
        ),
        (
            owned(&["relay", "--tenants", "--fleet-passes", "-3"]),
            "unexpected argument",
        ),
        (
            owned(&["relay", "--tenants", "--fleet-idle-poll", "nonsense"]),
            "--fleet-idle-poll",
        ),
        (
            owned(&[
                "relay",
                "--tenants",
                "--fleet-idle-poll",
                "99999999999999999999999h",
            ]),
            "--fleet-idle-poll",
        ),
        (
            vec![
                "relay".into(),
                "--tenants".into(),
                "--database".into(),
                format!("Bad-Name={url_with_secret}"),
            ],
            "database \"Bad-Name\"",
        ),
        (
            vec![
                "relay".into(),
                "--tenants".into(),
                "--database".into(),
                format!("default={url_with_secret}"),
            ],
            "control database",
        ),
        (
            vec![
                "relay".into(),
                "--tenants".into(),
                "--database".into(),
                url_with_secret.clone(),
            ],
            "NAME=URL",
        ),
        (
            vec![
                "relay".into(),
                "--tenants".into(),
                "--database".into(),
                format!("x=postgres://u:{SECRET}@[::1"),
            ],
            "database x",
        ),
        (
            vec![
                "tenants".into(),
                "add".into(),
                huge.clone(),
                "--tenant-schema".into(),
                "s".into(),
            ],
            "1 to 63",
        ),
        (
            owned(&[
                "tenants",
                "add",
                "bell\u{7}\u{1b}[2J",
                "--tenant-schema",
                "s",
            ]),
            "1 to 63",
        ),
        (
            owned(&[
                "tenants",
                "add",
                "t",
                "--tenant-schema",
                "s",
                "--weight",
                "4294967296",
            ]),
            "weight",
        ),
        (
            owned(&[
                "tenants",
                "add",
                "t",
                "--tenant-schema",
                "s",
                "--weight",
                "101",
            ]),
            "weight 101",
        ),
        (
            vec![
                "tenants".into(),
                "add".into(),
                "t".into(),
                "--tenant-schema".into(),
                huge.clone(),
            ],
            "invalid schema name",
        ),
        (
            vec![
                "tenants".into(),
                "add".into(),
                "t".into(),
                "--tenant-schema".into(),
                "s".into(),
                "--database".into(),
                url_with_secret.clone(),
            ],
            "not a URL",
        ),
        (
            vec!["tenants".into(), "disable".into(), huge.clone()],
            "(100000 bytes)",
        ),
        (
            vec![
                "migrate".into(),
                "--tenants".into(),
                "--database".into(),
                url_with_secret.clone(),
            ],
            "NAME=URL",
        ),
        // --tenants / --tenant on status, cleanup and migrate; --tenant on dlq selections.
        (owned(&["status", "--tenant", &huge]), "1 to 63"),
        (
            owned(&["cleanup", "--tenant", "bell\u{7}\u{1b}[2J"]),
            "1 to 63",
        ),
        (
            owned(&["status", "--tenants", "--tenant", "acme"]),
            "cannot be used with",
        ),
        (
            owned(&["cleanup", "--tenants", "--database", &url_with_secret]),
            "NAME=URL",
        ),
        (
            owned(&["status", "--database", &format!("x={url_with_secret}")]),
            "--database needs --tenants",
        ),
        (
            owned(&["dlq", "list", "--tenant", &huge]),
            "1 to 1000 characters",
        ),
    ];
    for (args, says) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run_cli(&args);
        let t = text(&o);
        let shown: String = args
            .iter()
            .map(|a| &a[..a.len().min(40)])
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(
            o.status.code(),
            Some(2),
            "{shown}: {}",
            &t[..t.len().min(2000)]
        );
        assert!(
            t.contains(says),
            "{shown}: wanted {says:?} in {}",
            &t[..t.len().min(2000)]
        );
        assert!(!t.contains(SECRET), "{shown} printed the secret: {t}");
        assert!(!t.contains("panicked"), "{shown}: {t}");
        assert!(
            !t.contains('\u{1b}'),
            "{shown}: an escape reached the terminal"
        );
        assert!(t.len() < 10_000, "{shown}: {} bytes of output", t.len());
    }
    // The registry refuses rows written around the CLI: control characters, a URL.
    let c = client(&control).await;
    for (tenant, database) in [
        ("a\u{1}b", "default"),
        ("ok", "postgres://u:p@h/db"),
        ("", "default"),
    ] {
        let e = c
            .execute(
                "INSERT INTO outbox_tenants (tenant, database, schema) VALUES ($1, $2, 's')",
                &[&tenant, &database],
            )
            .await;
        assert!(e.is_err(), "{tenant:?} {database:?} was stored");
    }
    // A role without rights on the registry: a clear error, exit 1, its password not shown.
    let role = format!("r_{}", hex(8));
    c.batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD '{SECRET}'"))
        .await
        .unwrap();
    let url = database_url();
    let (_, rest) = url.split_once("://").unwrap();
    let host = rest.split_once('@').unwrap().1;
    let o = run(outbox_command(&control)
        .env("DATABASE_URL", format!("postgres://{role}:{SECRET}@{host}"))
        .args(["tenants", "list"]));
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("permission denied"), "{t}");
    assert!(!t.contains(SECRET), "{t}");
    c.batch_execute(&format!("DROP ROLE {role}")).await.unwrap();
}

/// Owned arguments, for a table of command lines some of whose words are built.
fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}
