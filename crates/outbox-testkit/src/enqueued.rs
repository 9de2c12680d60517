//! What a transaction enqueued, read back from the outbox table — inside that transaction
//! too, before it commits.

use std::collections::BTreeMap;

use outbox::Schema;

/// One outbox row, as a test reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueued {
    /// The row id (enqueue order).
    pub id: i64,
    /// The topic it will be published to.
    pub topic: String,
    /// The `message_type` header.
    pub message_type: String,
    /// The key (the entity id), if any.
    pub key: Option<String>,
    /// The JSON body (`None` for a tombstone).
    pub body: Option<serde_json::Value>,
    /// Every header (`message_id`, `timestamp`, `traceparent`, …).
    pub headers: BTreeMap<String, String>,
    /// `pending`, `sent` or `failed`.
    pub status: String,
}

impl Enqueued {
    /// The `message_id` header.
    pub fn message_id(&self) -> &str {
        self.headers.get("message_id").map_or("", String::as_str)
    }
}

fn select(schema: &Schema) -> String {
    format!(
        "SELECT id, topic, message_key, headers, payload, status FROM {}.outbox ORDER BY id",
        schema.quoted()
    )
}

fn headers_of(v: serde_json::Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Every row of `schema`'s outbox that `client` can see — a transaction sees its own
/// uncommitted rows — in enqueue order.
///
/// # Panics
/// When the query fails (no outbox in `schema`).
pub async fn enqueued<C: tokio_postgres::GenericClient>(
    client: &C,
    schema: &Schema,
) -> Vec<Enqueued> {
    client
        .query(&select(schema), &[])
        .await
        .expect("reading the outbox (migrated?)")
        .iter()
        .map(|r| row(r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

/// One row from its columns (whichever driver read them).
fn row(
    id: i64,
    topic: String,
    key: Option<String>,
    headers: serde_json::Value,
    body: Option<serde_json::Value>,
    status: String,
) -> Enqueued {
    let headers = headers_of(headers);
    Enqueued {
        id,
        topic,
        message_type: headers.get("message_type").cloned().unwrap_or_default(),
        key,
        body,
        headers,
        status,
    }
}

#[cfg(feature = "sqlx")]
/// As [`enqueued`], through sqlx (`&mut *tx`, a connection or a pool).
///
/// # Panics
/// When the query fails.
pub async fn enqueued_sqlx<'c, E>(executor: E, schema: &Schema) -> Vec<Enqueued>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    use sqlx::Row as _;
    sqlx::query(&select(schema))
        .fetch_all(executor)
        .await
        .expect("reading the outbox (migrated?)")
        .iter()
        .map(|r| row(r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

/// The one row of `rows` with `topic` and `message_type`.
///
/// # Panics
/// With every row listed, when there is none or more than one.
pub fn only<'a>(rows: &'a [Enqueued], topic: &str, message_type: &str) -> &'a Enqueued {
    let matching: Vec<&Enqueued> = rows
        .iter()
        .filter(|r| r.topic == topic && r.message_type == message_type)
        .collect();
    match matching.as_slice() {
        [one] => one,
        _ => {
            panic!(
            "expected exactly one {message_type:?} on {topic:?}, found {}; the outbox holds:\n{}",
            matching.len(),
            rows.iter()
                .map(|r| format!(
                    "  #{} {} {} key={:?} body={}",
                    r.id,
                    r.topic,
                    r.message_type,
                    r.key,
                    r.body.as_ref().map_or_else(|| "(tombstone)".into(), ToString::to_string)
                ))
                .collect::<Vec<_>>()
                .join("\n")
        )
        }
    }
}
