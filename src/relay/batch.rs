//! A claimed batch: its rows (borrowed from the Postgres rows), the fate of each send, the
//! open claim transaction that keeps them locked, and where the next claim may start.

use std::collections::HashSet;

use deadpool_postgres::Pool;

use super::*;

/// One claimed row. The text columns stay in the row as Postgres sent it and are borrowed
/// from there (2,000 rows a batch: four allocations and copies per row saved).
pub(super) struct Row {
    pub(super) id: i64,
    /// `created_at` as Unix seconds, for the commit→ack histogram.
    pub(super) created: f64,
    /// The claim's row: `topic`, `message_key`, `headers`, `payload` at 1 – 4.
    pub(super) raw: tokio_postgres::Row,
    /// Ring storage: the row was read from the retry table, not from the ring.
    pub(super) retry: bool,
}

impl Row {
    pub(super) fn topic(&self) -> &str {
        self.raw.get(1)
    }

    pub(super) fn key(&self) -> Option<&str> {
        self.raw.get(2)
    }

    pub(super) fn headers(&self) -> &str {
        self.raw.get(3)
    }

    /// `None` for a tombstone (published with a null value).
    pub(super) fn payload(&self) -> Option<&str> {
        self.raw.get(4)
    }

    /// The ordering lane of its key (the claim's own expression, column 6).
    pub(super) fn lane(&self) -> i32 {
        self.raw.get(6)
    }
}

/// How one row's send ended.
pub(crate) enum Fate {
    Sent,
    /// Refused for good: the row is backed off with this error; the reason labels the metric.
    Refused(String, RefusalReason),
    /// Not delivered, through no fault of the row (broker unavailable, purged): stays pending.
    Deferred(String),
    /// Not sent because an earlier row of the same key failed in this batch: it stays pending
    /// and waits behind that row (per-key order).
    HeldBack,
    /// Not handed to Kafka because the topic's schema registry is unreachable: stays pending
    /// with its attempts, its key held back behind it.
    #[cfg_attr(not(feature = "schemas"), allow(dead_code))]
    Waiting(String),
}

/// A claimed batch whose transaction is still open: its rows stay locked (other relays and this
/// relay's next claims skip them) until [`Relay::settle`] commits.
pub(crate) struct Claimed {
    pub(super) tx: OpenTx,
    pub(super) rows: Vec<Row>,
    pub(super) begin: self::floor::Begin,
    pub(super) lanes: Vec<i32>,
    /// Keys with an earlier pending row outside this claim: their rows are not sent.
    pub(super) waiting: HashSet<String>,
    /// The most rows the claim could take (a claim this full leaves more behind).
    pub(super) limit: usize,
    /// Ring storage: where each lane was read from and how far, and the rows parked behind a
    /// retry row of their key (`ring.rs`). `None` for today's table.
    pub(super) ring: Option<super::ring::RingRead>,
}

impl Claimed {
    /// Rows claimed.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// What the next claim may skip, if this batch is full (see [`Ahead`]).
    pub(crate) fn ahead(&self, batch_size: usize) -> Option<Ahead> {
        if let Some(read) = &self.ring {
            return read.ahead();
        }
        let last = self.rows.last()?;
        (self.rows.len() >= batch_size).then_some(Ahead {
            scan_from: self.begin.scan_from,
            next: last.id.saturating_add(1),
        })
    }

    /// For each key of the batch, its highest id (what the next claim must start after).
    pub(crate) fn last_of_keys(&self) -> impl Iterator<Item = (&str, i64)> {
        self.rows.iter().filter_map(|r| r.key().map(|k| (k, r.id)))
    }

    /// Rows that can be sent (their key is not waiting on an earlier row).
    pub(crate) fn sendable(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| !r.key().is_some_and(|k| self.waiting.contains(k)))
            .count()
    }

    /// Keys whose row did not reach Kafka in this batch (`fates` in row order): later rows of
    /// those keys must wait.
    pub(crate) fn unsent_keys<'a>(
        &'a self,
        fates: &'a [Fate],
    ) -> impl Iterator<Item = String> + 'a {
        self.rows
            .iter()
            .zip(fates)
            .filter(|(_, f)| !matches!(f, Fate::Sent))
            .filter_map(|(r, _)| r.key().map(str::to_owned))
            .chain(
                self.ring
                    .iter()
                    .flat_map(super::ring::RingRead::parked_keys),
            )
    }
}

/// The newest batch in flight, when it was full, for the next claim: if the floor has only
/// moved forward since that batch was claimed from it, and the last settle left no row waiting
/// at the floor ([`Begin::clean`](self::floor::Begin)), the next claim starts just past that
/// batch instead of stepping over its locked rows one by one (`SKIP LOCKED` still has to look
/// at each: measured, it doubled the claim's cost). Forward is the usual case, not the
/// exception: with two batches in flight the one before settles, and moves the floor, just
/// before the next claim. Only where the claim starts moves: the per-key check and the floor
/// probe still start at the floor, and that is what keeps it safe. A row the skipped stretch
/// still holds (locked elsewhere, not due, committed late, or left by a batch that rolled
/// back) is pending to the floor probe, which reads without `SKIP LOCKED`: the floor stops at
/// it (no longer clean), and every claim from then on starts at the floor until it moves
/// freely again; meanwhile the per-key check keeps later rows of its key back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ahead {
    /// The floor that batch was claimed from.
    pub scan_from: i64,
    /// One past its last row.
    pub next: i64,
}

/// A transaction on a pooled connection, owned rather than borrowed so that one claim can stay
/// open while the relay claims the next batch on another connection. Dropped unfinished (an
/// error, a cancelled pass) it closes its connection instead of returning it to the pool, so
/// the server rolls the transaction back.
pub(crate) struct OpenTx(Option<deadpool_postgres::Object>);

impl OpenTx {
    /// A connection whose transaction the caller opens by sending `BEGIN` (pipelined with the
    /// transaction's first statement, one round trip instead of two).
    pub(super) async fn connect(pool: &Pool) -> Result<Self, RelayError> {
        Ok(Self(Some(pool.get().await?)))
    }

    pub(super) fn client(&self) -> &deadpool_postgres::Object {
        self.0
            .as_ref()
            .expect("transaction is open until commit or drop")
    }

    /// The transaction ended with a `COMMIT` the caller sent (pipelined behind its last
    /// statements): the connection goes back to the pool.
    pub(super) fn committed(mut self) {
        self.0 = None;
    }
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(deadpool_postgres::Object::take(conn));
        }
    }
}
