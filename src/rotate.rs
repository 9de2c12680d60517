//! Rotation of the append-only storage (`sql/ring.rs`, issue 33): what cleanup does on a
//! schema moved onto the ring, instead of deleting rows.
//!
//! The ring has eight leaves; new rows go to the current generation's. Every
//! `sent_retention / 6` the current generation moves to the next leaf, if that one is empty.
//! A leaf that is not current, whose newest row is older than `sent_retention`, and all of
//! whose rows the relays have read (its highest id below every lane's cursor) is TRUNCATEd.
//! So the ring holds at most `sent_retention` plus two periods of rows, and nothing is
//! vacuumed. Each run also swaps the lanes' cursor log's halves: the inactive half, each
//! lane's newest entry carried into the active one, is truncated and becomes the active one.
//!
//! Each step is one short transaction, so a `kill -9` at any point leaves the leaf either
//! whole or empty, and the generation moved or not: never a row lost. The reclaim waits at most
//! 50 ms for its lock and tries again at the next run when the relays' reads hold it; the
//! services' INSERTs never wait on it (they write the current leaf).

use std::time::Duration;

use crate::schema::Schema;
use crate::sql::ring as sql;

/// What one rotation did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Rotation {
    /// Leaves truncated.
    pub reclaimed: u64,
    /// Leaves whose lock was busy (relays reading): tried again next time.
    pub busy: u64,
    /// The current generation moved to the next leaf.
    pub advanced: bool,
    /// The cursor log's halves were swapped (its inactive half truncated).
    pub cursors_swapped: bool,
}

/// One rotation of `schema`'s ring, on `c`: reclaim what may go, then move the generation on
/// if its period is over.
pub(crate) async fn rotate(
    c: &mut tokio_postgres::Client,
    schema: &Schema,
    retention: Duration,
) -> Result<Rotation, tokio_postgres::Error> {
    let q = schema.quoted();
    let render = |t: &str, g: i16| t.replace("{s}", &q).replace("{g}", &g.to_string());
    let state = c.query_one(&render(&sql::rotation_state(), 0), &[]).await?;
    let current: i16 = state.get(0);
    let current_secs: f64 = state.get(1);
    let newest_ids: Vec<Option<i64>> = state.get(3);
    let newest_ages: Vec<Option<f64>> = state.get(4);
    let mut done = Rotation::default();
    let keep = retention.as_secs_f64();
    for g in 0..sql::LEAVES {
        let idx = usize::try_from(g).unwrap_or_default();
        let old_enough = newest_ages[idx].is_some_and(|age| age >= keep);
        if g == current || newest_ids[idx].is_none() || !old_enough {
            continue;
        }
        let tx = c.transaction().await?;
        if let Err(e) = tx.batch_execute(&render(sql::RECLAIM_LOCK, g)).await {
            if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
                done.busy += 1;
                continue;
            }
            return Err(e);
        }
        let settled: bool = tx
            .query_one(&render(sql::RECLAIM_CHECK, g), &[])
            .await?
            .get(0);
        crate::crash::point("rotate_locked");
        if settled {
            tx.batch_execute(&render(sql::RECLAIM, g)).await?;
            crate::crash::point("rotate_truncated");
            done.reclaimed += 1;
        }
        tx.commit().await?;
    }
    let period = keep / 6.0;
    if current_secs >= period {
        let next = (current + 1) % sql::LEAVES;
        let moved = c
            .query_opt(&render(sql::ADVANCE_GEN, next), &[&current])
            .await?;
        done.advanced = moved.is_some();
        crate::crash::point("rotate_advanced");
    }
    done.cursors_swapped = swap_cursor_halves(c, schema).await?;
    Ok(done)
}

/// The cursor log's swap (`sql::CURSOR_SWAP_LOCK`): the inactive half's newest entry per lane
/// is copied into the active half and the inactive half truncated, in one transaction (a
/// `kill -9` leaves it whole or swapped), then it becomes the active half. False when its lock
/// was busy: tried again next time (the log grows by one period meanwhile).
async fn swap_cursor_halves(
    c: &mut tokio_postgres::Client,
    schema: &Schema,
) -> Result<bool, tokio_postgres::Error> {
    let q = schema.quoted();
    let active: i16 = c
        .query_one(&sql::CURSOR_HALF.replace("{s}", &q), &[])
        .await?
        .get(0);
    let inactive = 1 - active;
    let render = |t: &str| {
        t.replace("{s}", &q)
            .replace("{a}", &active.to_string())
            .replace("{h}", &inactive.to_string())
    };
    let tx = c.transaction().await?;
    if let Err(e) = tx.batch_execute(&render(sql::CURSOR_SWAP_LOCK)).await {
        if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
            return Ok(false);
        }
        return Err(e);
    }
    tx.execute(&render(sql::CURSOR_CARRY), &[]).await?;
    tx.batch_execute(&render(sql::CURSOR_TRUNCATE)).await?;
    crate::crash::point("cursors_truncated");
    tx.commit().await?;
    c.execute(&render(sql::CURSOR_FLIP), &[]).await?;
    crate::crash::point("cursors_flipped");
    Ok(true)
}
