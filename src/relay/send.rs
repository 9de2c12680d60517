//! Handing a claimed batch to librdkafka and gathering each row's fate: rows in id order,
//! a key held back behind its failed row, one wake-up when the last report is in.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};
use tracing::{debug, warn};

use super::*;

impl Relay {
    /// Produces every row of `claimed`, keeping them all in flight, and returns each row's fate
    /// in order. Rows of keys in `claimed.waiting` or `blocked` (keys whose earlier row failed
    /// in the batch before this one) are held back, and so are the later rows of any key whose
    /// row fails here before it leaves this process.
    pub(crate) async fn produce(&self, claimed: &Claimed, blocked: &HashSet<String>) -> Vec<Fate> {
        let producer = self.producer();
        let fates = self.produce_with(&producer, claimed, blocked).await;
        if let Some(fatal) = producer.client().fatal_error() {
            warn!(error = ?fatal, "kafka producer hit a fatal error: replacing it (unacked rows stay pending)");
            match producer_for(
                &self.kafka,
                self.config.delivery_timeout,
                &self.outages,
                &self.reports,
            ) {
                Ok(p) => *self.producer.write().expect("producer lock") = p,
                Err(e) => warn!(error = %e, "cannot recreate the producer; will retry next pass"),
            }
            // The last handle of the old producer joins its polling thread and flushes what it
            // purged (up to ~0.6 s): not on a runtime worker.
            drop(tokio::task::spawn_blocking(move || drop(producer)));
        }
        fates
    }

    /// [`Relay::produce`] with a given producer (a slot's transactional one in exactly-once
    /// mode, inside its open transaction).
    pub(crate) async fn produce_with(
        &self,
        producer: &RelayProducer,
        claimed: &Claimed,
        blocked: &HashSet<String>,
    ) -> Vec<Fate> {
        let rows: Vec<&Row> = claimed.rows.iter().collect();
        self.produce_rows(producer, &rows, &claimed.waiting, blocked, None, None)
            .await
            .0
    }

    /// Produces `rows` (in id order) with `producer`; keys in `waiting` or `blocked` are held
    /// back. Each row's fate, in order. With `last`, one more record goes out behind the rows,
    /// before any report is awaited (exactly-once: the progress record, naming `last.3` and
    /// the ids of the rows handed to librdkafka), and its fate comes back too. The batch's
    /// `send` spans are children of `span_parent` (the Kafka transaction's span).
    pub(super) async fn produce_rows(
        &self,
        producer: &RelayProducer,
        rows: &[&Row],
        waiting: &HashSet<String>,
        blocked: &HashSet<String>,
        last: Option<(&str, i32, &str, &[i64])>,
        span_parent: Option<&crate::otel::Span>,
    ) -> (Vec<Fate>, Option<Fate>) {
        if rows.is_empty() {
            return (Vec::new(), None);
        }
        metrics::histogram!(crate::metrics::OUTBOX_BATCH_SIZE).record(rows.len() as f64);
        let started = crate::otel::now();
        let topics: HashSet<&str> = rows.iter().map(|r| r.topic()).collect();
        // Rows of topics with a schema are encoded before the first is handed over, so that
        // librdkafka gets the batch as fast as plain JSON and batches it as well (encoding
        // between sends made it send smaller requests, which cost the broker more).
        #[cfg(feature = "schemas")]
        let mut encoded: Vec<Option<Result<Option<Vec<u8>>, Fate>>> = {
            let codecs = self.codecs(&topics).await;
            if codecs.is_empty() {
                Vec::new()
            } else {
                rows.iter()
                    .map(|r| Some(self.encode_row(&codecs, r)))
                    .collect()
            }
        };
        let problems = self
            .topic_problems(topics.into_iter().map(str::to_owned).collect())
            .await;

        let mut fates: Vec<Option<Fate>> = Vec::with_capacity(rows.len());
        let batch = self.reports.open(rows.len() + usize::from(last.is_some()));
        // Keys with a row refused before it left this process: their later rows must wait.
        let mut held: HashSet<&str> = waiting.iter().chain(blocked).map(String::as_str).collect();
        let span = tracing::debug_span!("outbox.produce", rows = rows.len());
        let inject = f64::from_bits(
            self.inject_refusals
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        for (i, row) in rows.iter().enumerate() {
            if row.key().is_some_and(|k| held.contains(k)) {
                fates.push(Some(Fate::HeldBack));
                continue;
            }
            let headers = if let Some(p) = problems.get(row.topic()) {
                Err(p.clone())
            } else if inject > 0.0 && fastrand::f64() < inject {
                self.injected
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err((
                    "injected produce failure".to_owned(),
                    RefusalReason::Refused,
                ))
            } else {
                kafka_headers(
                    row.headers(),
                    row.id,
                    self.seat.as_ref().map(|s| &*s.tenant),
                )
                .map_err(|e| (e, RefusalReason::Refused))
            };
            let headers = match headers {
                Ok(h) => h,
                Err((error, reason)) => {
                    if let Some(k) = row.key() {
                        held.insert(k);
                    }
                    fates.push(Some(Fate::Refused(error, reason)));
                    continue;
                }
            };
            #[cfg(feature = "schemas")]
            let encoded = match encoded
                .get_mut(i)
                .and_then(Option::take)
                .unwrap_or(Ok(None))
            {
                Ok(e) => e,
                Err(fate) => {
                    if let Some(k) = row.key() {
                        held.insert(k);
                    }
                    fates.push(Some(fate));
                    continue;
                }
            };
            #[cfg(not(feature = "schemas"))]
            let encoded: Option<Vec<u8>> = None;
            let mut record =
                BaseRecord::with_opaque_to(row.topic(), batch.opaque(i)).headers(headers);
            if let Some(e) = &encoded {
                record = record.payload(e.as_slice());
            } else if let Some(p) = row.payload() {
                record = record.payload(p.as_bytes());
            }
            if let Some(k) = row.key() {
                record = record.key(k.as_bytes());
            }
            // Enqueue in id order; when librdkafka's queue is full, wait for it to drain rather
            // than skipping ahead, so per-partition order follows outbox order.
            let fate = loop {
                match producer.send(record) {
                    Ok(()) => break None,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    Err((e, _)) => {
                        batch.not_sent();
                        break Some(fate_of_error(&e));
                    }
                }
            };
            if fate.is_some() {
                if let Some(k) = row.key() {
                    held.insert(k);
                }
            }
            fates.push(fate);
        }
        let mut last_fate = None;
        if let Some((topic, partition, key, earlier)) = last {
            let ids: Vec<i64> = earlier
                .iter()
                .copied()
                .chain(
                    rows.iter()
                        .zip(&fates)
                        .filter(|(_, f)| f.is_none())
                        .map(|(r, _)| r.id),
                )
                .collect();
            // The progress partition is the slot's own.
            let body = super::progress::ProgressRecord {
                slot: partition,
                ids,
            }
            .encode();
            let record = BaseRecord::with_opaque_to(topic, batch.opaque(rows.len()))
                .partition(partition)
                .key(key.as_bytes())
                .payload(body.as_bytes());
            if let Err((e, _)) = producer.send(record) {
                batch.not_sent();
                last_fate = Some(fate_of_error(&e));
            }
        }
        batch.sent_all();

        // One timer for the batch, and one wake-up when its last report is in: the reports
        // that are not in by the deadline leave their rows pending.
        let waited =
            tokio::time::timeout(self.config.delivery_timeout + REPORT_MARGIN, batch.wait())
                .instrument(span)
                .await;
        if waited.is_err() {
            debug!("delivery reports still missing at the deadline");
        }
        for (i, fate) in batch.close() {
            if i == rows.len() {
                last_fate = Some(fate);
            } else {
                fates[i] = Some(fate);
            }
        }
        for f in fates.iter_mut().filter(|f| f.is_none()) {
            *f = Some(Fate::Deferred(
                "no delivery report before the timeout".into(),
            ));
        }
        let fates: Vec<Fate> = fates
            .into_iter()
            .map(|f| f.expect("every row has a fate"))
            .collect();
        if last.is_some() && last_fate.is_none() {
            last_fate = Some(Fate::Deferred(
                "no delivery report before the timeout".into(),
            ));
        }
        if !crate::otel::enabled() {
            return (fates, last_fate);
        }
        let sent: Vec<crate::otel::SentRow<'_>> = rows
            .iter()
            .zip(&fates)
            .filter(|(_, f)| !matches!(f, Fate::HeldBack | Fate::Waiting(_)))
            .map(|(r, f)| crate::otel::SentRow {
                topic: r.topic(),
                id: r.id,
                headers: r.headers(),
                created: r.created,
                error: match f {
                    Fate::Sent => None,
                    Fate::Refused(_, reason) => Some(reason.as_str()),
                    _ => Some("deferred"),
                },
            })
            .collect();
        crate::otel::sent_batch(started, &sent, span_parent, last.is_some());
        (fates, last_fate)
    }
}
