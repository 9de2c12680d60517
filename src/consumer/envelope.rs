//! The data every stage of the consumer passes along — a record on its way (`Envelope`), its
//! lane, how its processing ended (`Fate`), a task's outcome (`Done`) — in a leaf module, so
//! the poll loop, the processing and the breaker's drain share it without depending on each
//! other.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::handler::{Delivered, HandlerError};
use super::inbox::InboxOutcome;
use super::record::{Origin, Raw};

/// A topic and partition.
pub(crate) type Tp = (String, i32);

/// What orders a lane: a record's key, or (for a keyless record) its own offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum LaneId {
    Key(Vec<u8>),
    Offset(i64),
}
/// One lane: per-key order within a partition.
pub(super) type LaneKey = (String, i32, LaneId);

/// A record on its way through the consumer.
pub(super) struct Envelope {
    pub(super) raw: Raw,
    pub(super) epoch: u64,
    pub(super) due: Option<Instant>,
    pub(super) origin: Origin,
    /// Decoded before dispatch: a decode error never reaches a handler or spends retries.
    pub(super) decoded: Result<Delivered, String>,
    /// A parked letter of this group, read from a DLQ topic during a drain.
    pub(super) drain: bool,
}

/// How processing of one message ended.
#[derive(Clone, Copy)]
pub(super) enum Fate {
    /// Handled, duplicate, skipped, or parked behind the breaker with the broker's ack.
    Final,
    /// Final too: left the main path with the broker's ack, to a retry topic or the DLQ. In
    /// strict order its key is held behind it (`holds.rs`).
    Left(Left),
    /// Given up at shutdown: not final, the offset stays before it.
    Abandoned,
}

/// Where a message that left the main path went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Left {
    /// Forwarded to a retry topic: it comes back.
    Retrying,
    /// Dead-lettered, of this kind: it comes back only if replayed.
    Dead(crate::wire::DeadLetterKind),
}

impl Fate {
    /// The offset may move past the message.
    pub(super) fn is_final(self) -> bool {
        !matches!(self, Self::Abandoned)
    }
}

/// The outcome of one task (one message, or a batch of messages from different lanes).
pub(super) struct Done {
    pub(super) items: Vec<DoneItem>,
    /// The task held a transaction slot.
    pub(super) tx: bool,
}

/// One message of a task's outcome.
pub(super) struct DoneItem {
    pub(super) lane: LaneKey,
    pub(super) tp: Tp,
    pub(super) offset: i64,
    pub(super) epoch: u64,
    pub(super) fate: Fate,
    /// The record's timestamp (ms), for the lag-in-seconds gauge.
    pub(super) timestamp_ms: Option<i64>,
}

/// What one try of a handler in its transaction gave (a panic is the `Err`).
pub(super) type Tried = std::thread::Result<Result<InboxOutcome, HandlerError>>;

/// What became of one member of a commit group.
pub(super) enum InGroup {
    Processed,
    Duplicate,
    /// Its handler failed or panicked: processed alone, this try counting as its first.
    Failed(Tried),
    /// Not tried (the group failed, or it is not a per-message handler's): processed alone.
    Alone,
}

/// Milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
