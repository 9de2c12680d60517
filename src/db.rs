//! Postgres connections: a pool for statements and single connections for LISTEN and migrations.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};

use crate::config::DbConfig;

/// How long a caller waits for a pooled connection (including connecting) before the pass fails
/// and the caller backs off: an unreachable Postgres must surface as an error, not a hang.
const POOL_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a connection pool. Connections are made lazily, so this succeeds while Postgres is down.
///
/// # Errors
/// Only when the pool cannot be configured (never for an unreachable server).
pub(crate) fn pool(db: &DbConfig) -> Result<Pool, deadpool_postgres::BuildError> {
    let mgr = Manager::from_config(
        db.pg.clone(),
        db.tls.clone(),
        // `Fast` recycling skips a round trip per checkout; a broken connection is detected by
        // `is_closed()` and the failing statement, and the caller retries with backoff.
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr)
        .max_size(db.pool_size.max(1))
        .runtime(Runtime::Tokio1)
        // The session used last goes out first: a few hot sessions do the work, with their
        // catalog entries, prepared statements and pages of shared memory already mapped.
        .queue_mode(QueueMode::Lifo)
        .wait_timeout(Some(POOL_TIMEOUT))
        .create_timeout(Some(POOL_TIMEOUT))
        .recycle_timeout(Some(POOL_TIMEOUT))
        .build()
}

/// Opens one connection and drives it on a background task.
///
/// # Errors
/// The connection error from tokio-postgres.
pub async fn connect(db: &DbConfig) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = db.pg.connect(db.tls.clone()).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "postgres connection closed");
        }
    });
    Ok(client)
}
