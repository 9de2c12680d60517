//! The consumer's defaults as they were published before they became associated constants of
//! the types they configure; kept, deprecated, so services that name them keep compiling.

use std::time::Duration;

use super::{BreakerConfig, ConsumerConfig, RetryStrategy};

/// Moved: [`BreakerConfig::DEFAULT_CHECK_INTERVAL`].
#[deprecated(since = "0.2.0", note = "use `BreakerConfig::DEFAULT_CHECK_INTERVAL`")]
pub const DEFAULT_BREAKER_CHECK_INTERVAL: Duration = BreakerConfig::DEFAULT_CHECK_INTERVAL;
/// Moved: [`BreakerConfig::DEFAULT_OPEN_FOR`].
#[deprecated(since = "0.2.0", note = "use `BreakerConfig::DEFAULT_OPEN_FOR`")]
pub const DEFAULT_OPEN_FOR: Duration = BreakerConfig::DEFAULT_OPEN_FOR;
/// Moved: [`ConsumerConfig::DEFAULT_PAUSE_AFTER`].
#[deprecated(since = "0.2.0", note = "use `ConsumerConfig::DEFAULT_PAUSE_AFTER`")]
pub const DEFAULT_PAUSE_AFTER: Duration = ConsumerConfig::DEFAULT_PAUSE_AFTER;
/// Moved: [`ConsumerConfig::DEFAULT_COMMIT_GROUP`].
#[deprecated(since = "0.2.0", note = "use `ConsumerConfig::DEFAULT_COMMIT_GROUP`")]
pub const DEFAULT_COMMIT_GROUP: usize = ConsumerConfig::DEFAULT_COMMIT_GROUP;
/// Moved: [`ConsumerConfig::DEFAULT_CONCURRENCY`].
#[deprecated(since = "0.2.0", note = "use `ConsumerConfig::DEFAULT_CONCURRENCY`")]
pub const DEFAULT_CONCURRENCY: usize = ConsumerConfig::DEFAULT_CONCURRENCY;
/// Moved: [`ConsumerConfig::DEFAULT_MAX_BUFFERED`].
#[deprecated(since = "0.2.0", note = "use `ConsumerConfig::DEFAULT_MAX_BUFFERED`")]
pub const DEFAULT_MAX_BUFFERED: usize = ConsumerConfig::DEFAULT_MAX_BUFFERED;
/// Moved: [`ConsumerConfig::DEFAULT_SESSION_TIMEOUT`].
#[deprecated(
    since = "0.2.0",
    note = "use `ConsumerConfig::DEFAULT_SESSION_TIMEOUT`"
)]
pub const DEFAULT_SESSION_TIMEOUT: Duration = ConsumerConfig::DEFAULT_SESSION_TIMEOUT;
/// Moved: [`ConsumerConfig::DEFAULT_TRANSACTIONS`].
#[deprecated(since = "0.2.0", note = "use `ConsumerConfig::DEFAULT_TRANSACTIONS`")]
pub const DEFAULT_TRANSACTIONS: usize = ConsumerConfig::DEFAULT_TRANSACTIONS;
/// Moved: [`ConsumerConfig::MAX_COMMIT_GROUP`].
#[deprecated(since = "0.2.0", note = "use `ConsumerConfig::MAX_COMMIT_GROUP`")]
pub const MAX_COMMIT_GROUP: usize = ConsumerConfig::MAX_COMMIT_GROUP;
/// Moved: [`RetryStrategy::DEFAULT_IN_PLACE_ATTEMPTS`].
#[deprecated(
    since = "0.2.0",
    note = "use `RetryStrategy::DEFAULT_IN_PLACE_ATTEMPTS`"
)]
pub const DEFAULT_IN_PLACE_ATTEMPTS: u32 = RetryStrategy::DEFAULT_IN_PLACE_ATTEMPTS;
/// Moved: [`RetryStrategy::DEFAULT_IN_PLACE_BASE`].
#[deprecated(since = "0.2.0", note = "use `RetryStrategy::DEFAULT_IN_PLACE_BASE`")]
pub const DEFAULT_IN_PLACE_BASE: Duration = RetryStrategy::DEFAULT_IN_PLACE_BASE;
/// Moved: [`RetryStrategy::DEFAULT_IN_PLACE_MAX`].
#[deprecated(since = "0.2.0", note = "use `RetryStrategy::DEFAULT_IN_PLACE_MAX`")]
pub const DEFAULT_IN_PLACE_MAX: Duration = RetryStrategy::DEFAULT_IN_PLACE_MAX;
