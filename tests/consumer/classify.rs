//! Postgres errors classified by rule, each provoked against the real server: what a retry can
//! fix is transient, what it would only repeat is permanent (a handler's bug must never be
//! retried as if it were an outage, nor count against a dependency's breaker).

use outbox::consumer::HandlerError;
use outbox_testkit::*;

/// One row of the table: the case, how to provoke it, and the class it must get.
struct Case {
    name: &'static str,
    transient: bool,
    unavailable: bool,
    sqlstate: Option<&'static str>,
}

fn check(case: &Case, e: tokio_postgres::Error) {
    assert_eq!(
        e.code().map(|c| c.code()),
        case.sqlstate,
        "{}: provoked {e:?}",
        case.name
    );
    assert_eq!(
        outbox::classify::postgres_is_transient(&e),
        case.transient,
        "{}: transient? ({e})",
        case.name
    );
    assert_eq!(
        outbox::classify::postgres_is_unavailable(&e),
        case.unavailable,
        "{}: unavailable? ({e})",
        case.name
    );
    let h = HandlerError::from(e);
    assert_eq!(h.is_transient(), case.transient, "{}: {h}", case.name);
    assert_eq!(
        h.is_database_unavailable(),
        case.unavailable,
        "{}: {h}",
        case.name
    );
}

const fn case(
    name: &'static str,
    sqlstate: Option<&'static str>,
    transient: bool,
    unavailable: bool,
) -> Case {
    Case {
        name,
        transient,
        unavailable,
        sqlstate,
    }
}

async fn setup() -> (outbox::DbConfig, tokio_postgres::Client) {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute(
        "CREATE TABLE k (id int PRIMARY KEY, v int NOT NULL CHECK (v >= 0));
         INSERT INTO k VALUES (1, 1), (2, 2);",
    )
    .await
    .unwrap();
    (db, c)
}

#[tokio::test]
async fn permanent_errors_are_the_ones_a_retry_would_repeat() {
    let (_db, c) = setup().await;
    let rows = [
        (
            case("unique violation", Some("23505"), false, false),
            "INSERT INTO k VALUES (1, 5)",
        ),
        (
            case("not-null violation", Some("23502"), false, false),
            "INSERT INTO k VALUES (3, NULL)",
        ),
        (
            case("check violation", Some("23514"), false, false),
            "INSERT INTO k VALUES (4, -1)",
        ),
        (
            case("invalid text representation", Some("22P02"), false, false),
            "SELECT 'x'::int",
        ),
        (
            case("division by zero", Some("22012"), false, false),
            "SELECT 1 / 0",
        ),
        (
            case("undefined column", Some("42703"), false, false),
            "SELECT nope FROM k",
        ),
    ];
    for (case, sql) in rows {
        let e = c.execute(sql, &[]).await.unwrap_err();
        check(&case, e);
    }
    // A column read as the wrong Rust type: no SQLSTATE, but a conversion error underneath.
    let row = c.query_one("SELECT 'text'::text", &[]).await.unwrap();
    let e = row.try_get::<_, i32>(0).unwrap_err();
    check(&case("column conversion", None, false, false), e);
}

#[tokio::test]
async fn serialization_failures_deadlocks_and_timeouts_are_transient() {
    let (db, mut a) = setup().await;
    let mut b = client(&db).await;

    // Serialization failure: two serializable transactions that each read what the other
    // writes; the second to commit loses.
    let ta = a
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::Serializable)
        .start()
        .await
        .unwrap();
    let tb = b
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::Serializable)
        .start()
        .await
        .unwrap();
    ta.query("SELECT sum(v) FROM k", &[]).await.unwrap();
    tb.query("SELECT sum(v) FROM k", &[]).await.unwrap();
    ta.execute("UPDATE k SET v = v + 1 WHERE id = 1", &[])
        .await
        .unwrap();
    tb.execute("UPDATE k SET v = v + 1 WHERE id = 2", &[])
        .await
        .unwrap();
    ta.commit().await.unwrap();
    let e = tb.commit().await.unwrap_err();
    check(
        &case("serialization failure", Some("40001"), true, false),
        e,
    );

    // Deadlock: opposite lock order; the server picks one victim (after deadlock_timeout).
    let ta = a.transaction().await.unwrap();
    let tb = b.transaction().await.unwrap();
    ta.batch_execute("SET LOCAL deadlock_timeout = '100ms'")
        .await
        .unwrap();
    tb.batch_execute("SET LOCAL deadlock_timeout = '100ms'")
        .await
        .unwrap();
    ta.execute("UPDATE k SET v = v WHERE id = 1", &[])
        .await
        .unwrap();
    tb.execute("UPDATE k SET v = v WHERE id = 2", &[])
        .await
        .unwrap();
    let (ra, rb) = tokio::join!(
        ta.execute("UPDATE k SET v = v WHERE id = 2", &[]),
        tb.execute("UPDATE k SET v = v WHERE id = 1", &[]),
    );
    let e = match (ra, rb) {
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
        other => panic!("exactly one victim expected: {other:?}"),
    };
    check(&case("deadlock", Some("40P01"), true, false), e);
    drop((ta, tb));

    // Statement timeout and lock not available.
    let e = a
        .batch_execute("SET statement_timeout = '50ms'; SELECT pg_sleep(2)")
        .await
        .unwrap_err();
    check(&case("statement timeout", Some("57014"), true, false), e);
    a.batch_execute("SET statement_timeout = 0").await.unwrap();
    let ta = a.transaction().await.unwrap();
    ta.execute("SELECT 1 FROM k WHERE id = 1 FOR UPDATE", &[])
        .await
        .unwrap();
    let e = b
        .execute("SELECT 1 FROM k WHERE id = 1 FOR UPDATE NOWAIT", &[])
        .await
        .unwrap_err();
    check(&case("lock not available", Some("55P03"), true, false), e);
    ta.rollback().await.unwrap();
}

#[tokio::test]
async fn too_many_connections_shutdown_and_connection_loss_are_transient() {
    let (_db, c) = setup().await;
    // Too many connections: a role allowed one connection, asked for a second.
    let role = format!("cl_{}", hex(8));
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT 1"
    ))
    .await
    .unwrap();
    let url = database_url();
    let (_, rest) = url.rsplit_once('@').expect("user@host in DATABASE_URL");
    let role_url = format!("postgres://{role}:pw@{rest}");
    let (first, conn) = tokio_postgres::connect(&role_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let first_conn = tokio::spawn(conn);
    let e = tokio_postgres::connect(&role_url, tokio_postgres::NoTls)
        .await
        .err()
        .expect("the second connection is refused");
    check(&case("too many connections", Some("53300"), true, false), e);
    drop(first);
    let _ = first_conn.await;

    // Admin shutdown: another session terminates ours; the next statement fails with 57P01,
    // and every one after it on a connection that is gone.
    let (victim, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    c.execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let e = victim.execute("SELECT 1", &[]).await.unwrap_err();
    if e.code().is_some() {
        check(&case("admin shutdown", Some("57P01"), true, true), e);
        let e = victim.execute("SELECT 1", &[]).await.unwrap_err();
        check(&case("connection lost", None, true, true), e);
    } else {
        // The termination notice can arrive before the statement is sent: then the
        // statement only sees the closed connection.
        check(&case("connection lost", None, true, true), e);
    }

    // Connection refused: nothing listens on the port.
    let e = tokio_postgres::connect(
        "postgres://outbox:outbox@127.0.0.1:1/outbox",
        tokio_postgres::NoTls,
    )
    .await
    .err()
    .expect("nothing listens on port 1");
    check(&case("connection refused", None, true, true), e);
    c.batch_execute(&format!("DROP ROLE {role}")).await.unwrap();
}

/// The same rule for sqlx errors (the sqlx driver and `outbox::sqlx::enqueue`): what a
/// retry would repeat is permanent, contention and timeouts are transient, an unreachable
/// server or a pool that cannot hand out a connection is "database unavailable".
#[tokio::test]
async fn sqlx_errors_follow_the_same_rule() {
    let (db, _c) = setup().await;
    let pool = sqlx_pool(&db, 2).await;
    let classify = |e: sqlx::Error| {
        let (t, u) = (
            outbox::classify::sqlx_is_transient(&e),
            outbox::classify::sqlx_is_unavailable(&e),
        );
        let h = HandlerError::from(e);
        assert_eq!(
            (h.is_transient(), h.is_database_unavailable()),
            (t, u),
            "{h}"
        );
        (t, u)
    };
    for (sql, what) in [
        ("INSERT INTO k VALUES (1, 5)", "unique violation"),
        ("INSERT INTO k VALUES (4, -1)", "check violation"),
        ("SELECT 1 / 0", "division by zero"),
        ("SELECT nope FROM k", "undefined column"),
    ] {
        let e = sqlx::query(sql).execute(&pool).await.unwrap_err();
        assert_eq!(classify(e), (false, false), "{what} is permanent");
    }
    // A column decoded as the wrong Rust type: a bug in the handler.
    let e = sqlx::query_scalar::<_, i32>("SELECT 'text'::text")
        .fetch_one(&pool)
        .await
        .unwrap_err();
    assert_eq!(classify(e), (false, false), "decode error is permanent");

    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql("SET statement_timeout = '50ms'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let e = sqlx::query("SELECT pg_sleep(2)")
        .execute(&mut *conn)
        .await
        .unwrap_err();
    assert_eq!(classify(e), (true, false), "statement timeout is transient");
    drop(conn.detach());
    // Another session holds row 1 locked.
    let lock = client(&db).await;
    lock.batch_execute("BEGIN; SELECT 1 FROM k WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    let e = sqlx::query("SELECT 1 FROM k WHERE id = 1 FOR UPDATE NOWAIT")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        classify(e),
        (true, false),
        "lock not available is transient"
    );
    drop(lock);

    // Nothing listens: refused (the pool's connect attempt fails) is unavailable.
    let dead = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(2))
        .connect_lazy("postgres://outbox:outbox@127.0.0.1:1/outbox")
        .unwrap();
    let e = sqlx::query("SELECT 1").execute(&dead).await.unwrap_err();
    assert_eq!(
        classify(e),
        (true, true),
        "an unreachable server is unavailable"
    );
}
