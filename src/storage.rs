//! Which storage a schema's outbox is on, and the move onto append-only ring storage
//! (issue 33, `docs/design/append-only-storage.md`).
//!
//! A schema starts on the `outbox` table. [`use_ring`] moves it onto the ring online: services
//! keep inserting (their INSERTs wait while the move holds the table, a few milliseconds plus
//! the carrying of the unsent rows) and relays keep publishing (a relay notices the view at its
//! next batch). Nothing a service or an operator writes changes: `outbox` is then a view with
//! the same columns.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::config::DbConfig;

/// A move onto ring storage that did not happen; nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// Postgres could not be reached or refused a statement (the move is rolled back).
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The table stayed held past every try: a transaction that wrote it is still open (or a
    /// relay's batch waits on Kafka). Nothing changed; try again, or find the holder in
    /// `pg_locks`.
    #[error(
        "the outbox table stayed locked by other transactions through {attempts} tries of \
         {lock_wait:?} each; nothing was changed"
    )]
    Busy {
        /// Tries made.
        attempts: u32,
        /// How long each try waited for the table.
        lock_wait: Duration,
    },
    /// [`MoveOptions::lock_wait`] is above [`MoveOptions::MAX_LOCK_WAIT`]: the services'
    /// INSERTs would queue behind a try that long. Nothing was done.
    #[error("lock wait {lock_wait:?} is above the {max:?} the move allows (services' INSERTs queue behind it)")]
    LockWaitTooLong {
        /// What was asked.
        lock_wait: Duration,
        /// [`MoveOptions::MAX_LOCK_WAIT`].
        max: Duration,
    },
}

/// What [`use_ring`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingMove {
    /// The schema was on the table and is now on the ring (false: it already was).
    pub moved: bool,
    /// Unsent rows (pending, backed off, failed) carried into the retry table with their ids,
    /// attempts, errors and due times.
    pub carried: u64,
    /// Tries it took (a try whose lock wait ran out changes nothing).
    pub attempts: u32,
}

/// How [`use_ring`] waits for the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MoveOptions {
    /// How long one try waits for the table. The services' INSERTs queue behind a waiting
    /// try, so keep it short.
    pub lock_wait: Duration,
    /// Tries before [`StorageError::Busy`].
    pub attempts: u32,
}

impl MoveOptions {
    /// Default [`MoveOptions::lock_wait`].
    pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(1);
    /// Default [`MoveOptions::attempts`].
    pub const DEFAULT_ATTEMPTS: u32 = 30;
    /// Largest [`MoveOptions::lock_wait`]: every INSERT of the services waits behind a try
    /// for as long as it waits.
    pub const MAX_LOCK_WAIT: Duration = Duration::from_secs(60);
}

impl Default for MoveOptions {
    fn default() -> Self {
        Self {
            lock_wait: Self::DEFAULT_LOCK_WAIT,
            attempts: Self::DEFAULT_ATTEMPTS,
        }
    }
}

/// Moves `db.schema` (migrated) onto ring storage, online; a no-op when it already is.
///
/// Under an `ACCESS EXCLUSIVE` lock on the table, taken within [`MoveOptions::lock_wait`] or
/// retried: the unsent rows are carried into the retry table (the relay sends them from there
/// in id order per key, and the rows written to the ring afterwards wait behind their key's),
/// the ring's ids start after every id the table used, the table becomes `outbox_legacy` (its
/// sent rows stay visible as sent until cleanup removes them past retention) and `outbox` the
/// view. Nothing is published twice: the lock waits for every relay batch in flight on the
/// table, the carried rows are marked sent in it (their state is the retry table's), and a
/// relay's claim on the table fails on the view, so it reads the ring from its next batch.
///
/// # Errors
/// [`StorageError::Postgres`] on a connection or SQL error; [`StorageError::Busy`] when the
/// table stayed held through every try; [`StorageError::LockWaitTooLong`] before anything
/// else. Either way nothing changed.
pub async fn use_ring(db: &DbConfig, options: MoveOptions) -> Result<RingMove, StorageError> {
    if options.lock_wait > MoveOptions::MAX_LOCK_WAIT {
        return Err(StorageError::LockWaitTooLong {
            lock_wait: options.lock_wait,
            max: MoveOptions::MAX_LOCK_WAIT,
        });
    }
    let client = crate::db::connect(db).await?;
    let on_ring = crate::sql::render(crate::sql::ring::LAYOUT, &db.schema);
    if client.query_one(&on_ring, &[]).await?.get::<_, bool>(0) {
        return Ok(RingMove {
            moved: false,
            carried: 0,
            attempts: 0,
        });
    }
    let call = crate::sql::render(crate::sql::ring::USE_RING, &db.schema);
    // Never 0: `lock_timeout = 0` would wait for ever.
    let wait = options
        .lock_wait
        .max(Duration::from_millis(1))
        .as_secs_f64();
    let attempts = options.attempts.max(1);
    for attempt in 1..=attempts {
        match client.query_one(&call, &[&wait]).await {
            Ok(row) => {
                // NULL: another mover got there first.
                let carried: Option<i64> = row.get(0);
                return Ok(RingMove {
                    moved: carried.is_some(),
                    carried: carried.map_or(0, |n| u64::try_from(n).unwrap_or_default()),
                    attempts: attempt,
                });
            }
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                tracing::info!(attempt, "the outbox table is held; trying the move again");
                // Let the queue behind the failed try drain before asking again.
                tokio::time::sleep(options.lock_wait.min(Duration::from_millis(500))).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StorageError::Busy {
        attempts,
        lock_wait: options.lock_wait,
    })
}

/// Which storage a schema's outbox is on and what it holds: `outbox status`, and the relay's
/// gauges (`outbox_storage_bytes`, `outbox_ring_*`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct StorageState {
    /// `"table"` (the `outbox` table) or `"ring"` (append-only, after [`use_ring`]).
    pub layout: String,
    /// Bytes on disk, indexes included: the table, or the ring's leaves, its retry table, its
    /// lanes and the table the schema moved from.
    pub bytes: i64,
    /// Ring only: the generation (leaf, 0–7) new rows go to.
    pub generation: Option<i16>,
    /// Ring only: leaves holding rows, the current one included, of 8. About 7 in steady
    /// state; 8 means the next leaf is not reclaimed and the generation cannot move on.
    pub generations: Option<u32>,
    /// Ring only: seconds since the newest row of the oldest leaf that is not current was
    /// written, i.e. how long it has been waiting; it is reclaimed once this passes
    /// `sent_retention` and the relays have read it. `None` when no such leaf holds rows.
    pub oldest_generation_age_secs: Option<f64>,
}

/// [`StorageState`] of `db.schema`.
///
/// # Errors
/// When Postgres cannot be reached or the schema is not migrated.
pub async fn state(db: &DbConfig) -> Result<StorageState, tokio_postgres::Error> {
    let client = crate::db::connect(db).await?;
    state_on(&client, &db.schema).await
}

/// [`state`] over a connection the caller holds.
pub(crate) async fn state_on(
    c: &tokio_postgres::Client,
    schema: &crate::schema::Schema,
) -> Result<StorageState, tokio_postgres::Error> {
    let row = c
        .query_one(&crate::sql::render(crate::sql::ring::STORAGE, schema), &[])
        .await?;
    let (ring, bytes): (bool, i64) = (row.get(0), row.get(1));
    if !ring {
        return Ok(StorageState {
            layout: "table".into(),
            bytes,
            generation: None,
            generations: None,
            oldest_generation_age_secs: None,
        });
    }
    let r = c
        .query_one(
            &crate::sql::render(&crate::sql::ring::rotation_state(), schema),
            &[],
        )
        .await?;
    let current: i16 = r.get(0);
    let newest: Vec<Option<i64>> = r.get(3);
    let ages: Vec<Option<f64>> = r.get(4);
    let in_use = newest.iter().filter(|id| id.is_some()).count();
    let oldest = (0..crate::sql::ring::LEAVES)
        .zip(&ages)
        .filter(|(g, _)| *g != current)
        .filter_map(|(_, age)| *age)
        .reduce(f64::max);
    Ok(StorageState {
        layout: "ring".into(),
        bytes,
        generation: Some(current),
        generations: Some(u32::try_from(in_use).unwrap_or(u32::MAX)),
        oldest_generation_age_secs: oldest,
    })
}
