//! The relay run once over a test's outbox, into real topics, and what it sent read back.

use std::collections::HashSet;

use outbox::{DbConfig, KafkaConfig};

use crate::{drain, read_all_from, relay_config, Record};

/// Publishes every due row of `db`'s outbox (one relay, passes until nothing is due) and
/// returns the records it sent, read back from their topics, in topic and offset order.
/// The topics must exist (see [`crate::create_topic`]).
///
/// # Panics
/// When the relay cannot be built or a pass fails, or a topic cannot be read.
pub async fn relay_once(db: &DbConfig, kafka: &KafkaConfig) -> Vec<Record> {
    let c = outbox::connect(db).await.expect("connect");
    let due = c
        .query(
            &format!(
                "SELECT topic, headers->>'message_id' FROM {}.outbox \
                  WHERE status = 'pending' AND available_at <= now() ORDER BY id",
                db.schema.quoted()
            ),
            &[],
        )
        .await
        .expect("reading the outbox (migrated?)");
    let ids: HashSet<String> = due.iter().map(|r| r.get(1)).collect();
    let mut topics: Vec<String> = due.iter().map(|r| r.get(0)).collect();
    topics.sort();
    topics.dedup();
    let relay = outbox::Relay::new(db, kafka, relay_config()).expect("relay");
    drain(&relay).await;
    let mut out = Vec::new();
    for t in topics {
        let mut recs: Vec<Record> = read_all_from(&kafka.bootstrap_servers, &t)
            .await
            .into_iter()
            .filter(|r| ids.contains(&r.message_id()))
            .collect();
        recs.sort_by_key(|r| (r.partition, r.offset));
        out.extend(recs);
    }
    out
}
