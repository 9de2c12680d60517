//! The inbox: `processed_messages` as a dedupe record written in the handler's transaction.

use tokio_postgres::GenericClient;

use crate::schema::Schema;

/// Dedupe for idempotent handlers (the inbox: a processed mark in the handler's own transaction), usable without the consumer runtime.
///
/// Call [`Inbox::mark`] first inside the transaction that applies the message's business
/// change: it inserts `(consumer_group, topic, message_id)` with `ON CONFLICT DO NOTHING`.
/// `true` means first delivery: do the work and commit both. `false` means a duplicate: do
/// nothing. A rollback removes the mark with the work, so "marked but not done" cannot happen.
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
/// let inbox = outbox::consumer::Inbox::new(&outbox::Schema::default(), "billing-service");
/// let tx = client.transaction().await?;
/// if inbox.mark(&tx, "orders.created", "01a2…").await? {
///     tx.execute("UPDATE accounts SET balance = balance - 15 WHERE id = 7", &[]).await?;
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Inbox {
    insert: String,
    seen: String,
    insert_many: String,
    delete: String,
    group: String,
}

/// What [`Inbox`]-guarded handling did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxOutcome {
    /// First delivery: the handler ran and its transaction committed.
    Processed,
    /// Already processed by this group: skipped without side effects.
    Duplicate,
}

impl Inbox {
    /// An inbox for `group` over `schema.processed_messages`.
    pub fn new(schema: &Schema, group: impl Into<String>) -> Self {
        Self {
            insert: crate::sql::render(crate::sql::marks::MARK, schema),
            seen: crate::sql::render(crate::sql::marks::SEEN, schema),
            insert_many: crate::sql::render(crate::sql::marks::MARK_MANY, schema),
            delete: crate::sql::render(crate::sql::marks::UNMARK, schema),
            group: group.into(),
        }
    }

    /// Removes a mark made earlier in the caller's transaction (a commit group whose message
    /// failed after the group's marks were written).
    pub(crate) async fn unmark<C: GenericClient>(
        &self,
        tx: &C,
        topic: &str,
        message_id: &str,
    ) -> Result<(), tokio_postgres::Error> {
        tx.execute(&self.delete, &[&self.group, &topic, &message_id])
            .await?;
        Ok(())
    }

    /// The single-message insert (`$1` group, `$2` topic, `$3` message id; a row back means a
    /// first delivery), for callers that prepare it once per connection.
    pub(crate) fn insert_sql(&self) -> &str {
        &self.insert
    }

    /// The mark lookup (`$1` group, `$2` topics, `$3` message ids; the pairs processed back).
    pub(crate) fn seen_sql(&self) -> &str {
        &self.seen
    }

    /// The consumer group this inbox records for.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Records the message in the caller's transaction. Returns `true` on first delivery,
    /// `false` for a duplicate.
    ///
    /// # Errors
    /// The Postgres error; the caller's transaction is then aborted.
    pub async fn mark<C: GenericClient>(
        &self,
        tx: &C,
        topic: &str,
        message_id: &str,
    ) -> Result<bool, tokio_postgres::Error> {
        Ok(tx
            .query_opt(&self.insert, &[&self.group, &topic, &message_id])
            .await?
            .is_some())
    }

    /// Records many `(topic, message_id)` pairs with one statement; returns the pairs that were
    /// new (first deliveries). A pair repeated within the call counts once.
    ///
    /// # Errors
    /// The Postgres error; the caller's transaction is then aborted.
    pub async fn mark_many<C: GenericClient>(
        &self,
        tx: &C,
        items: &[(&str, &str)],
    ) -> Result<std::collections::HashSet<(String, String)>, tokio_postgres::Error> {
        let topics: Vec<&str> = items.iter().map(|(t, _)| *t).collect();
        let ids: Vec<&str> = items.iter().map(|(_, m)| *m).collect();
        let rows = tx
            .query(&self.insert_many, &[&self.group, &topics, &ids])
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// As [`Inbox::mark`], in an sqlx transaction (`&mut *tx`).
    ///
    /// # Errors
    /// The sqlx error; the caller's transaction is then aborted.
    #[cfg(feature = "sqlx")]
    pub async fn mark_sqlx(
        &self,
        tx: &mut sqlx::PgConnection,
        topic: &str,
        message_id: &str,
    ) -> Result<bool, sqlx::Error> {
        Ok(sqlx::query(&self.insert)
            .bind(&self.group)
            .bind(topic)
            .bind(message_id)
            .fetch_optional(tx)
            .await?
            .is_some())
    }

    /// As [`Inbox::mark_many`], in an sqlx transaction.
    ///
    /// # Errors
    /// The sqlx error; the caller's transaction is then aborted.
    #[cfg(feature = "sqlx")]
    pub async fn mark_many_sqlx(
        &self,
        tx: &mut sqlx::PgConnection,
        items: &[(&str, &str)],
    ) -> Result<std::collections::HashSet<(String, String)>, sqlx::Error> {
        use sqlx::Row as _;
        let topics: Vec<&str> = items.iter().map(|(t, _)| *t).collect();
        let ids: Vec<&str> = items.iter().map(|(_, m)| *m).collect();
        let rows = sqlx::query(&self.insert_many)
            .bind(&self.group)
            .bind(topics)
            .bind(ids)
            .fetch_all(tx)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// As `unmark`, in an sqlx transaction.
    #[cfg(feature = "sqlx")]
    pub(crate) async fn unmark_sqlx(
        &self,
        tx: &mut sqlx::PgConnection,
        topic: &str,
        message_id: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&self.delete)
            .bind(&self.group)
            .bind(topic)
            .bind(message_id)
            .execute(tx)
            .await?;
        Ok(())
    }
}
