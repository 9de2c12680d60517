//! Names the crate root published before it kept only what a service uses (at most 30
//! items): defaults now live as associated constants of the types they configure, wire names
//! in [`crate::wire`], operator calls in [`crate::status`] and [`crate::republish`]. Kept,
//! deprecated, so services that name them keep compiling.

use std::time::Duration;

use crate::{republish, wire, CleanupConfig, DbConfig, Schema};
#[cfg(feature = "relay")]
use crate::{ExactlyOnce, Relay, RelayConfig};

/// Moved: [`outbox::CleanupConfig::DEFAULT_DLQ_RETENTION`](crate::CleanupConfig::DEFAULT_DLQ_RETENTION).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::CleanupConfig::DEFAULT_DLQ_RETENTION`"
)]
pub const DEFAULT_ARCHIVE_RETENTION: Duration = CleanupConfig::DEFAULT_DLQ_RETENTION;
/// Moved: [`outbox::CleanupConfig::DEFAULT_BATCH_SIZE`](crate::CleanupConfig::DEFAULT_BATCH_SIZE).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::CleanupConfig::DEFAULT_BATCH_SIZE`"
)]
pub const DEFAULT_CLEANUP_BATCH: usize = CleanupConfig::DEFAULT_BATCH_SIZE;
/// Moved: [`outbox::CleanupConfig::DEFAULT_INTERVAL`](crate::CleanupConfig::DEFAULT_INTERVAL).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::CleanupConfig::DEFAULT_INTERVAL`"
)]
pub const DEFAULT_CLEANUP_INTERVAL: Duration = CleanupConfig::DEFAULT_INTERVAL;
/// Moved: [`outbox::CleanupConfig::DEFAULT_PROCESSED_RETENTION`](crate::CleanupConfig::DEFAULT_PROCESSED_RETENTION).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::CleanupConfig::DEFAULT_PROCESSED_RETENTION`"
)]
pub const DEFAULT_PROCESSED_RETENTION: Duration = CleanupConfig::DEFAULT_PROCESSED_RETENTION;
/// Moved: [`outbox::CleanupConfig::DEFAULT_SENT_RETENTION`](crate::CleanupConfig::DEFAULT_SENT_RETENTION).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::CleanupConfig::DEFAULT_SENT_RETENTION`"
)]
pub const DEFAULT_SENT_RETENTION: Duration = CleanupConfig::DEFAULT_SENT_RETENTION;
/// Moved: [`outbox::DbConfig::DEFAULT_POOL_SIZE`](crate::DbConfig::DEFAULT_POOL_SIZE).
#[deprecated(since = "0.2.0", note = "use `outbox::DbConfig::DEFAULT_POOL_SIZE`")]
pub const DEFAULT_POOL_SIZE: usize = DbConfig::DEFAULT_POOL_SIZE;
/// Moved: [`outbox::Schema::DEFAULT_NAME`](crate::Schema::DEFAULT_NAME).
#[deprecated(since = "0.2.0", note = "use `outbox::Schema::DEFAULT_NAME`")]
pub const DEFAULT_SCHEMA: &str = Schema::DEFAULT_NAME;
/// Moved: [`outbox::republish::RequeueSent::DEFAULT_BATCH`](crate::republish::RequeueSent::DEFAULT_BATCH).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::republish::RequeueSent::DEFAULT_BATCH`"
)]
pub const DEFAULT_REQUEUE_BATCH: usize = republish::RequeueSent::DEFAULT_BATCH;
/// Moved: [`outbox::wire::HEADER_ENTITY_ID`](crate::wire::HEADER_ENTITY_ID).
#[deprecated(since = "0.2.0", note = "use `outbox::wire::HEADER_ENTITY_ID`")]
pub const HEADER_ENTITY_ID: &str = wire::HEADER_ENTITY_ID;
/// Moved: [`outbox::wire::HEADER_MESSAGE_ID`](crate::wire::HEADER_MESSAGE_ID).
#[deprecated(since = "0.2.0", note = "use `outbox::wire::HEADER_MESSAGE_ID`")]
pub const HEADER_MESSAGE_ID: &str = wire::HEADER_MESSAGE_ID;
/// Moved: [`outbox::wire::HEADER_MESSAGE_TYPE`](crate::wire::HEADER_MESSAGE_TYPE).
#[deprecated(since = "0.2.0", note = "use `outbox::wire::HEADER_MESSAGE_TYPE`")]
pub const HEADER_MESSAGE_TYPE: &str = wire::HEADER_MESSAGE_TYPE;
/// Moved: [`outbox::wire::HEADER_TIMESTAMP`](crate::wire::HEADER_TIMESTAMP).
#[deprecated(since = "0.2.0", note = "use `outbox::wire::HEADER_TIMESTAMP`")]
pub const HEADER_TIMESTAMP: &str = wire::HEADER_TIMESTAMP;
/// Moved: [`outbox::wire::STANDARD_HEADERS`](crate::wire::STANDARD_HEADERS).
#[deprecated(since = "0.2.0", note = "use `outbox::wire::STANDARD_HEADERS`")]
pub const STANDARD_HEADERS: [&str; 4] = wire::STANDARD_HEADERS;
/// Moved: [`outbox::wire::TOMBSTONE_TYPE`](crate::wire::TOMBSTONE_TYPE).
#[deprecated(since = "0.2.0", note = "use `outbox::wire::TOMBSTONE_TYPE`")]
pub const TOMBSTONE_TYPE: &str = wire::TOMBSTONE_TYPE;
/// Moved: [`outbox::wire::MAX_TOPIC_LEN`](crate::wire::MAX_TOPIC_LEN).
#[deprecated(since = "0.2.0", note = "use `outbox::wire::MAX_TOPIC_LEN`")]
pub const MAX_TOPIC_LEN: usize = wire::MAX_TOPIC_LEN;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::DEFAULT_BATCH_SIZE`](crate::RelayConfig::DEFAULT_BATCH_SIZE).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::DEFAULT_BATCH_SIZE`"
)]
pub const DEFAULT_BATCH_SIZE: usize = RelayConfig::DEFAULT_BATCH_SIZE;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::DEFAULT_DELIVERY_TIMEOUT`](crate::RelayConfig::DEFAULT_DELIVERY_TIMEOUT).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::DEFAULT_DELIVERY_TIMEOUT`"
)]
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = RelayConfig::DEFAULT_DELIVERY_TIMEOUT;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::DEFAULT_IN_FLIGHT_BATCHES`](crate::RelayConfig::DEFAULT_IN_FLIGHT_BATCHES).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::DEFAULT_IN_FLIGHT_BATCHES`"
)]
pub const DEFAULT_IN_FLIGHT_BATCHES: usize = RelayConfig::DEFAULT_IN_FLIGHT_BATCHES;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::DEFAULT_LONG_TRANSACTION`](crate::RelayConfig::DEFAULT_LONG_TRANSACTION).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::DEFAULT_LONG_TRANSACTION`"
)]
pub const DEFAULT_LONG_TRANSACTION: Duration = RelayConfig::DEFAULT_LONG_TRANSACTION;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::DEFAULT_MAX_ATTEMPTS`](crate::RelayConfig::DEFAULT_MAX_ATTEMPTS).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::DEFAULT_MAX_ATTEMPTS`"
)]
pub const DEFAULT_MAX_ATTEMPTS: i32 = RelayConfig::DEFAULT_MAX_ATTEMPTS;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::DEFAULT_POLL_INTERVAL`](crate::RelayConfig::DEFAULT_POLL_INTERVAL).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::DEFAULT_POLL_INTERVAL`"
)]
pub const DEFAULT_POLL_INTERVAL: Duration = RelayConfig::DEFAULT_POLL_INTERVAL;
#[cfg(feature = "relay")]
/// Moved: [`outbox::ExactlyOnce::DEFAULT_PROGRESS_TOPIC`](crate::ExactlyOnce::DEFAULT_PROGRESS_TOPIC).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::ExactlyOnce::DEFAULT_PROGRESS_TOPIC`"
)]
pub const DEFAULT_PROGRESS_TOPIC: &str = ExactlyOnce::DEFAULT_PROGRESS_TOPIC;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::DEFAULT_SHUTDOWN_TIMEOUT`](crate::RelayConfig::DEFAULT_SHUTDOWN_TIMEOUT).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::DEFAULT_SHUTDOWN_TIMEOUT`"
)]
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = RelayConfig::DEFAULT_SHUTDOWN_TIMEOUT;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::DEFAULT_SWEEP_INTERVAL`](crate::RelayConfig::DEFAULT_SWEEP_INTERVAL).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::DEFAULT_SWEEP_INTERVAL`"
)]
pub const DEFAULT_SWEEP_INTERVAL: Duration = RelayConfig::DEFAULT_SWEEP_INTERVAL;
#[cfg(feature = "relay")]
/// Moved: [`outbox::ExactlyOnce::DEFAULT_TRANSACTION_TIMEOUT`](crate::ExactlyOnce::DEFAULT_TRANSACTION_TIMEOUT).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::ExactlyOnce::DEFAULT_TRANSACTION_TIMEOUT`"
)]
pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = ExactlyOnce::DEFAULT_TRANSACTION_TIMEOUT;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::MAX_BATCH_SIZE`](crate::RelayConfig::MAX_BATCH_SIZE).
#[deprecated(since = "0.2.0", note = "use `outbox::RelayConfig::MAX_BATCH_SIZE`")]
pub const MAX_BATCH_SIZE: usize = RelayConfig::MAX_BATCH_SIZE;
#[cfg(feature = "relay")]
/// Moved: [`outbox::Relay::MAX_ERROR_LEN`](crate::Relay::MAX_ERROR_LEN).
#[deprecated(since = "0.2.0", note = "use `outbox::Relay::MAX_ERROR_LEN`")]
pub const MAX_ERROR_LEN: usize = Relay::MAX_ERROR_LEN;
#[cfg(feature = "relay")]
/// Moved: [`outbox::RelayConfig::MAX_IN_FLIGHT_BATCHES`](crate::RelayConfig::MAX_IN_FLIGHT_BATCHES).
#[deprecated(
    since = "0.2.0",
    note = "use `outbox::RelayConfig::MAX_IN_FLIGHT_BATCHES`"
)]
pub const MAX_IN_FLIGHT_BATCHES: usize = RelayConfig::MAX_IN_FLIGHT_BATCHES;
#[cfg(feature = "relay")]
/// Moved: [`outbox::ExactlyOnce::SLOTS`](crate::ExactlyOnce::SLOTS).
#[deprecated(since = "0.2.0", note = "use `outbox::ExactlyOnce::SLOTS`")]
pub const SLOTS: i32 = ExactlyOnce::SLOTS;
/// Moved: [`outbox::status::FailedGroup`](crate::status::FailedGroup)(crate::status::FailedGroup).
#[deprecated(since = "0.2.0", note = "use `outbox::status::FailedGroup`")]
pub type FailedGroup = crate::status::FailedGroup;
/// Moved: [`outbox::status::OpenBreakerRow`](crate::status::OpenBreakerRow)(crate::status::OpenBreakerRow).
#[deprecated(since = "0.2.0", note = "use `outbox::status::OpenBreakerRow`")]
pub type OpenBreakerRow = crate::status::OpenBreakerRow;
/// Moved: [`outbox::status::OutboxStatus`](crate::status::OutboxStatus)(crate::status::OutboxStatus).
#[deprecated(since = "0.2.0", note = "use `outbox::status::OutboxStatus`")]
pub type OutboxStatus = crate::status::OutboxStatus;
/// Moved: [`outbox::status::OverdueMarks`](crate::status::OverdueMarks)(crate::status::OverdueMarks).
#[deprecated(since = "0.2.0", note = "use `outbox::status::OverdueMarks`")]
pub type OverdueMarks = crate::status::OverdueMarks;
/// Moved: [`outbox::status::Requeue`](crate::status::Requeue)(crate::status::Requeue).
#[deprecated(since = "0.2.0", note = "use `outbox::status::Requeue`")]
pub type Requeue = crate::status::Requeue;
/// Moved: [`outbox::status::StatusCount`](crate::status::StatusCount)(crate::status::StatusCount).
#[deprecated(since = "0.2.0", note = "use `outbox::status::StatusCount`")]
pub type StatusCount = crate::status::StatusCount;
/// Moved: [`outbox::republish::RequeueError`](crate::republish::RequeueError)(republish::RequeueError).
#[deprecated(since = "0.2.0", note = "use `outbox::republish::RequeueError`")]
pub type RequeueError = republish::RequeueError;
/// Moved: [`outbox::republish::RequeueSent`](crate::republish::RequeueSent)(republish::RequeueSent).
#[deprecated(since = "0.2.0", note = "use `outbox::republish::RequeueSent`")]
pub type RequeueSent = republish::RequeueSent;
/// Moved: [`outbox::republish::RequeueSentReport`](crate::republish::RequeueSentReport)(republish::RequeueSentReport).
#[deprecated(since = "0.2.0", note = "use `outbox::republish::RequeueSentReport`")]
pub type RequeueSentReport = republish::RequeueSentReport;
/// Moved: [`outbox::wire::InvalidTopic`](crate::wire::InvalidTopic)(wire::InvalidTopic).
#[deprecated(since = "0.2.0", note = "use `outbox::wire::InvalidTopic`")]
pub type InvalidTopic = wire::InvalidTopic;

/// Moved: [`outbox::status::status`](crate::status::status)(crate::status::status()).
///
/// # Errors
/// As the moved function.
#[deprecated(since = "0.2.0", note = "use `outbox::status::status`")]
pub async fn status(db: &DbConfig) -> Result<crate::status::OutboxStatus, tokio_postgres::Error> {
    crate::status::status(db).await
}

/// Moved: [`outbox::status::status_with`](crate::status::status_with)(crate::status::status_with).
///
/// # Errors
/// As the moved function.
#[deprecated(since = "0.2.0", note = "use `outbox::status::status_with`")]
pub async fn status_with(
    db: &DbConfig,
    marks_retention: Duration,
) -> Result<crate::status::OutboxStatus, tokio_postgres::Error> {
    crate::status::status_with(db, marks_retention).await
}

/// Moved: [`outbox::status::requeue`](crate::status::requeue)(crate::status::requeue).
///
/// # Errors
/// As the moved function.
#[deprecated(since = "0.2.0", note = "use `outbox::status::requeue`")]
pub async fn requeue(
    db: &DbConfig,
    which: crate::status::Requeue,
) -> Result<u64, tokio_postgres::Error> {
    crate::status::requeue(db, which).await
}

/// Moved: [`outbox::status::requeue_by`](crate::status::requeue_by)(crate::status::requeue_by).
///
/// # Errors
/// As the moved function.
#[deprecated(since = "0.2.0", note = "use `outbox::status::requeue_by`")]
pub async fn requeue_by(
    db: &DbConfig,
    which: crate::status::Requeue,
    actor: &str,
) -> Result<u64, tokio_postgres::Error> {
    crate::status::requeue_by(db, which, actor).await
}

/// Moved: [`outbox::republish::count_sent`](crate::republish::count_sent)(republish::count_sent).
///
/// # Errors
/// As the moved function.
#[deprecated(since = "0.2.0", note = "use `outbox::republish::count_sent`")]
pub async fn count_sent(
    db: &DbConfig,
    which: &republish::RequeueSent,
) -> Result<u64, republish::RequeueError> {
    republish::count_sent(db, which).await
}

/// Moved: [`outbox::republish::requeue_sent`](crate::republish::requeue_sent)(republish::requeue_sent).
///
/// # Errors
/// As the moved function.
#[deprecated(since = "0.2.0", note = "use `outbox::republish::requeue_sent`")]
pub async fn requeue_sent(
    db: &DbConfig,
    which: &republish::RequeueSent,
    actor: &str,
) -> Result<republish::RequeueSentReport, republish::RequeueError> {
    republish::requeue_sent(db, which, actor).await
}

/// Moved: [`outbox::wire::validate_topic`](crate::wire::validate_topic)(wire::validate_topic).
///
/// # Errors
/// As the moved function.
#[deprecated(since = "0.2.0", note = "use `outbox::wire::validate_topic`")]
pub fn validate_topic(name: &str) -> Result<(), wire::InvalidTopic> {
    wire::validate_topic(name)
}
