//! A message's journey at volume: `/api/trace`'s searches over an outbox of ROWS rows (most of
//! them sent, as a week of traffic leaves them) and as many processed marks in 4 groups, with
//! fresh statistics. Each search is timed over PICKS lookups and printed as a ratio to a
//! primary-key lookup of one outbox row on the same connection (the floor of any lookup), so
//! the figure means the same on a busy machine. Also printed: the search as it was before
//! (message id, key and body value in one sequential scan with `jsonb_path_exists`), once.
//!
//! `cargo bench --bench trace` (env: ROWS=10000000, PICKS=20).

#[path = "support/mod.rs"]
mod support;

use std::time::Instant;

use outbox::journey::{self, Search};
use support::*;

async fn timed<F, Fut>(picks: usize, mut f: F) -> (f64, f64)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut ms = Vec::with_capacity(picks);
    for i in 0..picks {
        let t = Instant::now();
        f(i).await;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    (percentile(&ms, 50.0), percentile(&ms, 100.0))
}

#[tokio::main]
async fn main() {
    let rows = param("ROWS", if full() { 10_000_000 } else { 20_000 });
    let picks = param("PICKS", if full() { 20 } else { 3 });
    let db = fresh_db().await;
    let c = outbox::connect(&db).await.unwrap();
    let s = db.schema.quoted();
    let fill = Instant::now();
    // Message ids in id order, as UUIDv7s are; a body with a customer's e-mail.
    c.batch_execute(&format!(
        "INSERT INTO {s}.outbox (topic, message_key, headers, payload, status, attempts, sent_at)
           SELECT 'bench.trace', 'cust-' || g,
                  jsonb_build_object('message_type', 'order_created',
                                     'message_id', lpad(to_hex(g), 8, '0') || '-0000-7000-8000-000000000000'),
                  jsonb_build_object('order', g, 'email', 'user' || g || '@example.com', 'pad', repeat('x', 100)),
                  'sent', 1, now()
             FROM generate_series(1, {rows}) g;
         INSERT INTO {s}.processed_messages (consumer_group, topic, message_id)
           SELECT 'group-' || (g % 4), 'bench.trace', lpad(to_hex(g), 8, '0') || '-0000-7000-8000-000000000000'
             FROM generate_series(1, {rows}) g;"
    ))
    .await
    .unwrap();
    for t in ["outbox", "processed_messages"] {
        c.batch_execute(&format!("VACUUM ANALYZE {s}.{t}"))
            .await
            .unwrap();
    }
    let fill_secs = fill.elapsed().as_secs_f64();
    c.batch_execute("SET statement_timeout = '60s'")
        .await
        .unwrap();
    let pick = |i: usize| ((i * 7919 + 1) % rows) + 1;
    let mid = |i: usize| format!("{:08x}-0000-7000-8000-000000000000", pick(i));
    // The floor: one row by its primary key.
    let floor = timed(picks, |i| {
        let c = &c;
        let q = format!("SELECT * FROM {s}.outbox WHERE id = $1");
        async move {
            c.query_one(&q, &[&(pick(i) as i64)]).await.unwrap();
        }
    })
    .await;
    let by_id = timed(picks, |i| {
        let (c, db) = (&c, &db);
        async move {
            let j = journey::trace_on(c, db, &mid(i), Search::Ids)
                .await
                .unwrap();
            assert_eq!(j.len(), 1);
            assert_eq!(j[0].handled.len(), 1, "the mark of one group");
        }
    })
    .await;
    // An operator's key search: the newest rows only (CONTENT_WINDOW), by the primary key.
    let newest = |i: usize| rows - (i % 1000);
    let by_key = timed(picks, |i| {
        let (c, db) = (&c, &db);
        async move {
            let j = journey::trace_on(c, db, &format!("cust-{}", newest(i)), Search::Content)
                .await
                .unwrap();
            assert_eq!(j.len(), 1);
        }
    })
    .await;
    let by_body = timed(picks, |i| {
        let (c, db) = (&c, &db);
        async move {
            let j = journey::trace_on(
                c,
                db,
                &format!("user{}@example.com", newest(i)),
                Search::Content,
            )
            .await
            .unwrap();
            assert_eq!(j.len(), 1);
        }
    })
    .await;
    // Before: every search read the whole outbox (one run; it is the slow one).
    let before = timed(1, |i| {
        let c = &c;
        let q = format!(
            "SELECT o.id FROM {s}.outbox o
              WHERE o.headers->>'message_id' = $1 OR o.message_key = $1
                 OR jsonb_path_exists(o.payload, '$.** ? (@ == $v)', jsonb_build_object('v', $1::text))
              ORDER BY o.id DESC LIMIT 20"
        );
        async move {
            c.query(&q, &[&format!("user{}@example.com", pick(i))])
                .await
                .unwrap();
        }
    })
    .await;
    let ratio = |x: (f64, f64)| round2(x.0 / floor.0.max(0.001));
    emit(
        "trace",
        serde_json::json!({"outbox_rows": rows, "marks": rows, "groups": 4, "picks": picks,
                           "content_window": journey::CONTENT_WINDOW}),
        serde_json::json!({
            "fill_seconds": round2(fill_secs),
            "pk_lookup_ms_p50": round2(floor.0),
            "by_message_id_ms_p50": round2(by_id.0), "by_message_id_ms_max": round2(by_id.1),
            "by_message_id_vs_pk": ratio(by_id),
            "by_key_ms_p50": round2(by_key.0), "by_key_vs_pk": ratio(by_key),
            "by_body_value_ms_p50": round2(by_body.0), "by_body_value_vs_pk": ratio(by_body),
            "before_full_scan_ms": round2(before.0), "before_vs_pk": ratio(before),
        }),
    );
    drop_schema(&db).await;
}
