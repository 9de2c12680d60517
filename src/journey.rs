//! `outbox trace`: one message's journey across the whole system — the outbox row (status,
//! attempts, errors, when sent), each consumer group's outcome (processed mark or dead letter,
//! with where it failed and how often), every replay and drop with its audit row. Found by
//! message id, by key (entity id), or by a business id anywhere in the body.

use std::time::SystemTime;

use serde::Serialize;

use crate::config::DbConfig;
use crate::sql::{dead_letters, marks, outbox, render, replay_jobs};

/// At most this many messages per search.
pub const MAX_TRACED: i64 = 20;
/// A content search (by key or body value) reads at most this many of the newest outbox rows,
/// so its cost does not grow with the outbox; a search by message id covers every row.
pub const CONTENT_WINDOW: i64 = 200_000;
/// The longest query accepted, in characters.
pub const MAX_QUERY: usize = 1000;

/// What a search may match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Search {
    /// Identifiers only: a message id or a dead letter's `#id`. Reveals no contents (a
    /// viewer's search).
    Ids,
    /// Also keys and string values in bodies, among the newest [`CONTENT_WINDOW`] rows (an
    /// operator's search: a body search answers "does any message hold this value?").
    Content,
}

/// Whether `query` names a message id (a UUID) or a dead letter (`#42`): what [`Search::Ids`]
/// takes.
pub fn is_id_query(query: &str) -> bool {
    let q = query.trim();
    uuid::Uuid::parse_str(q).is_ok()
        || q.strip_prefix('#')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// One outbox row of a message.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxStep {
    /// Outbox id.
    pub id: i64,
    /// Topic it goes to.
    pub topic: String,
    /// Kafka key (`None` in a viewer's answer, with `key_redacted`).
    pub key: Option<String>,
    /// The key was taken out of this answer (a viewer's: keys are contents).
    pub key_redacted: bool,
    /// `message_type`.
    pub message_type: Option<String>,
    /// `pending`, `sent` or `failed`.
    pub status: String,
    /// Produce attempts.
    pub attempts: i32,
    /// The last produce error.
    pub last_error: Option<String>,
    /// Committed at (RFC 3339).
    pub created_at: String,
    /// Acknowledged by Kafka at (RFC 3339).
    pub sent_at: Option<String>,
    /// A tombstone (no body).
    pub tombstone: bool,
}

/// A group handled the message: its processed mark.
#[derive(Debug, Clone, Serialize)]
pub struct HandledStep {
    /// The consumer group.
    pub group: String,
    /// The topic it was read from.
    pub topic: String,
    /// When (RFC 3339).
    pub at: String,
}

/// A dead letter of the message, as archived.
#[derive(Debug, Clone, Serialize)]
pub struct LetterStep {
    /// Archive id.
    pub id: i64,
    /// The group that gave up.
    pub group: Option<String>,
    /// `x-error-kind`.
    pub kind: Option<String>,
    /// The error.
    pub error: Option<String>,
    /// Handler calls made.
    pub attempts: Option<i32>,
    /// Times dead-lettered before.
    pub dlq_retries: i32,
    /// `new`, `replayed` or `dropped`.
    pub status: String,
    /// Why (a drop's reason, `drain`, `restored: …`).
    pub status_reason: Option<String>,
    /// Dead-lettered at (RFC 3339).
    pub failed_at: String,
    /// Where the dead letter is: topic, partition, offset.
    pub dlq: (String, i32, i64),
    /// Where the message was when it failed: topic, partition, offset (when known).
    pub original: (String, Option<i32>, Option<i64>),
    /// The replay job and letter it is a comeback of.
    pub comeback_of: Option<(i64, i64)>,
}

/// A replay of one of the message's letters.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayStep {
    /// The job.
    pub job: i64,
    /// The letter it sent.
    pub letter: i64,
    /// `pending`, `sent`, `failed` or `skipped`.
    pub state: String,
    /// Sent at (RFC 3339).
    pub sent_at: Option<String>,
    /// The letter it came back as, if it did.
    pub came_back_as: Option<i64>,
    /// The job's status.
    pub job_status: String,
    /// Who made the job.
    pub by: String,
}

/// An audited operator action on the message's letters.
#[derive(Debug, Clone, Serialize)]
pub struct AuditStep {
    /// Audit id.
    pub id: i64,
    /// When (RFC 3339).
    pub at: String,
    /// Who.
    pub actor: String,
    /// From where (`outbox-cli`, `outbox-admin`, …).
    pub via: String,
    /// `replay`, `drop`, `restore`, …
    pub action: String,
    /// Letters in the action.
    pub count: i64,
    /// The reason given, or the job.
    pub reason: Option<String>,
}

/// Strict per-key order: the message waits behind its key's failed head, or is that head.
#[derive(Debug, Clone, Serialize)]
pub struct HoldStep {
    /// The consumer group.
    pub group: String,
    /// The (original) topic.
    pub topic: String,
    /// `held` (it waits behind `head`) or `head` (its key's later messages wait for it).
    pub role: String,
    /// The message its key waits for.
    pub head: Option<String>,
    /// Since when: it arrived (`held`), or the head failed (`head`).
    pub since: String,
    /// For a head: how many messages wait behind it.
    pub waiting: i64,
}

/// Everything known about one message.
#[derive(Debug, Clone, Serialize)]
pub struct MessageJourney {
    /// The message id (`None` for dead letters that carry none).
    pub message_id: Option<String>,
    /// Its outbox rows (one; more only when rows were inserted by hand with the same id).
    pub outbox: Vec<OutboxStep>,
    /// Each group that handled it.
    pub handled: Vec<HandledStep>,
    /// Each time a group dead-lettered it.
    pub dead_letters: Vec<LetterStep>,
    /// Replays of those letters.
    pub replays: Vec<ReplayStep>,
    /// Operator actions on those letters.
    pub audit: Vec<AuditStep>,
    /// Strict order: where it waits behind its key's head, or holds its key.
    pub holds: Vec<HoldStep>,
}

fn ts(t: SystemTime) -> String {
    crate::message::rfc3339(t)
}

fn outbox_step(r: &tokio_postgres::Row) -> OutboxStep {
    OutboxStep {
        id: r.get(0),
        topic: r.get(1),
        key: r.get(2),
        key_redacted: false,
        message_type: r.get(4),
        status: r.get(5),
        attempts: r.get(6),
        last_error: r.get(7),
        created_at: ts(r.get(8)),
        sent_at: r.get::<_, Option<SystemTime>>(9).map(ts),
        tombstone: r.get(10),
    }
}

impl MessageJourney {
    /// Takes the keys out (for a viewer's answer).
    pub fn redact_keys(&mut self) {
        for o in &mut self.outbox {
            if o.key.take().is_some() {
                o.key_redacted = true;
            }
        }
    }
}

/// Finds the messages `query` names — a message id, a key (entity id), a dead letter's archive
/// id (`#42`), or a string value anywhere in a body (`A-1024`, at least 3 characters) — and
/// returns each one's journey, newest first, at most [`MAX_TRACED`]. A content search as
/// [`Search::Content`] describes.
///
/// # Errors
/// The Postgres error.
pub async fn trace(
    db: &DbConfig,
    query: &str,
) -> Result<Vec<MessageJourney>, tokio_postgres::Error> {
    if query.trim().is_empty() {
        return Ok(Vec::new());
    }
    let c = crate::db::connect(db).await?;
    trace_on(&c, db, query, Search::Content).await
}

/// [`trace`] over a connection the caller holds (with its own statement timeout), matching
/// what `search` allows.
///
/// # Errors
/// The Postgres error.
pub async fn trace_on(
    c: &tokio_postgres::Client,
    db: &DbConfig,
    query: &str,
    search: Search,
) -> Result<Vec<MessageJourney>, tokio_postgres::Error> {
    let q = query.trim();
    if q.is_empty() {
        return Ok(Vec::new());
    }
    let content = search == Search::Content;
    let s = |t: &str| render(t, &db.schema);
    let letter_id: Option<i64> = q.strip_prefix('#').and_then(|n| n.parse().ok());
    let found = c
        .query(
            &s(outbox::JOURNEY_FIND),
            &[
                &q,
                &content,
                &MAX_TRACED,
                &CONTENT_WINDOW,
                &(q.chars().count() >= 3),
            ],
        )
        .await?;
    let mut ids: Vec<String> = found.iter().filter_map(|r| r.get(3)).collect();
    ids.push(q.to_owned());
    let key = content.then(|| q.as_bytes().to_vec());
    let mut letters_by = c
        .query(&s(dead_letters::JOURNEY_LETTERS), &[&ids, &key, &letter_id])
        .await?;
    let before = ids.len();
    for r in &letters_by {
        if let Some(id) = r.get::<_, Option<String>>(1) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    // `#letter` names one letter: its journey is its message's, every letter of it included
    // (the first failure, the comebacks), found by the message id the letter carries.
    if letter_id.is_some() && ids.len() > before {
        letters_by = c
            .query(&s(dead_letters::JOURNEY_LETTERS), &[&ids, &key, &letter_id])
            .await?;
    }
    let marks_by = c.query(&s(marks::JOURNEY_MARKS), &[&ids]).await?;
    // Message ids that exist somewhere (the raw query is only a candidate).
    let mut known: Vec<Option<String>> = Vec::new();
    let mut add = |id: Option<String>| {
        if !known.contains(&id) {
            known.push(id);
        }
    };
    for r in &found {
        add(r.get(3));
    }
    for r in &letters_by {
        add(r.get(1));
    }
    for r in &marks_by {
        add(Some(r.get(2)));
    }
    // A message held in strict order may be nowhere else yet (produced by another service,
    // neither handled nor dead-lettered).
    let holds_by = c.query(&s(crate::sql::holds::TRACE), &[&ids]).await?;
    for r in &holds_by {
        add(r.get(6));
    }
    known.truncate(MAX_TRACED as usize);
    let named: Vec<String> = known.iter().flatten().cloned().collect();
    let rows = c.query(&s(outbox::JOURNEY_ROWS), &[&named]).await?;
    let mut out = Vec::with_capacity(known.len());
    for id in known {
        let letters: Vec<LetterStep> = letters_by
            .iter()
            .filter(|r| r.get::<_, Option<String>>(1) == id)
            .map(|r| LetterStep {
                id: r.get(0),
                group: r.get(2),
                kind: r.get(3),
                error: r.get(4),
                attempts: r.get(5),
                dlq_retries: r.get(6),
                status: r.get(7),
                status_reason: r.get(8),
                failed_at: ts(r.get(9)),
                dlq: (r.get(10), r.get(11), r.get(12)),
                original: (r.get(13), r.get(14), r.get(15)),
                comeback_of: r.get::<_, Option<i64>>(16).zip(r.get::<_, Option<i64>>(17)),
            })
            .collect();
        let letter_ids: Vec<i64> = letters.iter().map(|l| l.id).collect();
        let replays = c
            .query(&s(replay_jobs::JOURNEY_REPLAYS), &[&letter_ids])
            .await?
            .iter()
            .map(|r| ReplayStep {
                job: r.get(0),
                letter: r.get(1),
                state: r.get(2),
                sent_at: r.get::<_, Option<SystemTime>>(3).map(ts),
                came_back_as: r.get(4),
                job_status: r.get(5),
                by: r.get(6),
            })
            .collect();
        let audit = c
            .query(&s(dead_letters::JOURNEY_AUDIT), &[&letter_ids])
            .await?
            .iter()
            .map(|r| AuditStep {
                id: r.get(0),
                at: ts(r.get(1)),
                actor: r.get(2),
                via: r.get(3),
                action: r.get(4),
                count: r.get(5),
                reason: r.get(6),
            })
            .collect();
        let holds = holds_by
            .iter()
            .filter(|r| r.get::<_, Option<String>>(6) == id)
            .map(|r| HoldStep {
                group: r.get(0),
                topic: r.get(1),
                role: r.get(2),
                head: r.get(3),
                since: ts(r.get(4)),
                waiting: r.get(5),
            })
            .collect();
        out.push(MessageJourney {
            holds,
            outbox: rows
                .iter()
                .filter(|r| r.get::<_, Option<String>>(3) == id)
                .map(outbox_step)
                .collect(),
            handled: marks_by
                .iter()
                .filter(|r| id.as_deref() == Some(r.get::<_, &str>(2)))
                .map(|r| HandledStep {
                    group: r.get(0),
                    topic: r.get(1),
                    at: ts(r.get(3)),
                })
                .collect(),
            message_id: id,
            dead_letters: letters,
            replays,
            audit,
        });
    }
    Ok(out)
}
