//! The relay's hot statements use the partial indexes, so their cost follows the queue, not the
//! number of sent rows kept for retention. Plans are printed for BENCHMARKS.md
//! (`cargo test --test plans -- --nocapture`).

mod common;

use common::*;

async fn explain(
    c: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> String {
    let rows = c.query(&format!("EXPLAIN {sql}"), params).await.unwrap();
    // Literal id arrays make lines huge; shorten them for reading.
    rows.iter()
        .map(|r| {
            let l: String = r.get(0);
            if l.len() > 160 {
                format!("{}…", l.chars().take(160).collect::<String>())
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn claim_mark_and_cleanup_use_indexes_not_table_scans() {
    let db = fresh_db().await;
    let c = client(&db).await;
    // 200,000 sent rows kept for retention, 2,000 pending: the shape of a healthy outbox.
    c.batch_execute(
        "INSERT INTO outbox (topic, message_key, payload, status, sent_at)
           SELECT 'a.b', 'k' || (g % 100), '{}', 'sent', now() - interval '1 day' FROM generate_series(1, 200000) g;
         INSERT INTO outbox (topic, message_key, payload) SELECT 'a.b', 'k' || (g % 100), '{}' FROM generate_series(1, 2000) g;
         INSERT INTO processed_messages (consumer_group, topic, message_id, processed_at)
           SELECT 'g', 'a.b', 'm' || g, now() - interval '1 day' FROM generate_series(1, 100000) g;
         ANALYZE outbox; ANALYZE processed_messages;",
    )
    .await
    .unwrap();
    let stmts: std::collections::HashMap<_, _> =
        outbox::hot_statements(&db.schema).into_iter().collect();
    let ids: Vec<i64> = (200_001..202_001).collect();
    let errs: Vec<String> = ids.iter().map(|_| "e".to_string()).collect();
    let keys: Vec<String> = (0..100).map(|k| format!("k{k}")).collect();
    let lanes: Vec<i32> = (0..outbox::LANES).collect();
    let plans = [
        (
            "claim",
            explain(&c, &stmts["claim"], &[&2000i64, &lanes]).await,
            "outbox_pending_id_idx",
        ),
        (
            "first_pending",
            explain(&c, &stmts["first_pending"], &[&keys]).await,
            "outbox_pending_key_idx",
        ),
        (
            "mark_sent",
            explain(&c, &stmts["mark_sent"], &[&ids]).await,
            "outbox_pkey",
        ),
        (
            "mark_failed",
            explain(&c, &stmts["mark_failed"], &[&ids, &errs, &10i32]).await,
            "outbox_pkey",
        ),
        (
            "cleanup_outbox",
            explain(
                &c,
                &stmts["cleanup_outbox"],
                &[&(7.0 * 86400.0), &5000i64, &0i64],
            )
            .await,
            "outbox_pkey",
        ),
        (
            "cleanup_processed",
            explain(
                &c,
                &stmts["cleanup_processed"],
                &[&(14.0 * 86400.0), &5000i64],
            )
            .await,
            "processed_messages_processed_at_idx",
        ),
    ];
    for (name, plan, index) in &plans {
        println!("--- {name}\n{plan}\n");
        assert!(plan.contains(index), "{name} does not use {index}:\n{plan}");
    }
    // The claim never scans the table or the sent rows; its "earlier row backed off" check reads
    // a pending-only index (the planner picks the seed's (available_at, id) index for the few
    // not-yet-due rows, or the per-key index).
    assert!(!plans[0].1.contains("Seq Scan"), "{}", plans[0].1);
    assert!(
        plans[0].1.contains("outbox_pending_idx") || plans[0].1.contains("outbox_pending_key_idx"),
        "{}",
        plans[0].1
    );
}
