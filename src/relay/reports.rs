//! Delivery reports, gathered per batch.
//!
//! The relay hands librdkafka a whole batch and then needs every record's fate. A future per
//! record (rdkafka's `FutureProducer`) costs a boxed channel, a waker and a task wake-up per
//! message, which measured as a fifth of the relay process's CPU. Here each record carries a
//! plain number as its delivery opaque — the batch's ticket and the row's position — and
//! librdkafka's polling thread files the report straight into the batch it belongs to. The
//! batch's task is woken once, when its last report is in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::message::DeliveryResult;
use tokio::sync::Notify;

use super::{fate_of_error, Fate};
use crate::kafka::KafkaQuiet;

/// Bits of the opaque that hold the row's position in its batch (the batch size is capped at
/// 50,000, below 2^24); the bits above hold the batch's ticket.
const INDEX_BITS: u32 = 24;

// The opaque packs a 40-bit ticket above the index: a 64-bit `usize`, a batch that fits.
const _: () = assert!(super::MAX_BATCH_SIZE < 1 << INDEX_BITS && usize::BITS == 64);

/// The relay's producer: its polling thread (`poll_thread.rs`) delivers the reports to [`Reports`].
pub(crate) type RelayProducer = super::poll_thread::Polled<RelayContext>;

/// The producer's callbacks: librdkafka's log and error events as outage lines
/// ([`KafkaQuiet`]), delivery reports to the batch that sent the record.
pub(crate) struct RelayContext {
    pub quiet: KafkaQuiet,
    pub reports: Arc<Reports>,
}

impl rdkafka::ClientContext for RelayContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.quiet.log(level, fac, log_message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.quiet.error(error, reason);
    }
}

impl rdkafka::producer::ProducerContext for RelayContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let fate = match result {
            Ok(_) => Fate::Sent,
            Err((e, _)) => fate_of_error(e),
        };
        self.reports.file(opaque, fate);
    }
}

/// The batches waiting for reports, by ticket. Shared by every producer the relay creates, so
/// a replaced producer's last reports still reach their batch.
#[derive(Default)]
pub(crate) struct Reports {
    batches: Mutex<HashMap<u64, Arc<Batch>>>,
    next: AtomicU64,
}

/// One batch's reports.
pub(crate) struct Batch {
    ticket: u64,
    /// Records sent and not yet reported, plus one while the batch is still being sent (so the
    /// count cannot reach zero before the last record is handed over).
    outstanding: AtomicUsize,
    /// (position in the batch, fate), in the order the reports came.
    filed: Mutex<Vec<(usize, Fate)>>,
    done: Notify,
}

impl Reports {
    /// Opens a batch of up to `rows` records. Its reports are taken until the returned guard is
    /// closed or dropped.
    pub(crate) fn open(self: &Arc<Self>, rows: usize) -> OpenBatch {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed) & ((1 << (64 - INDEX_BITS)) - 1);
        let batch = Arc::new(Batch {
            ticket,
            outstanding: AtomicUsize::new(1),
            filed: Mutex::new(Vec::with_capacity(rows)),
            done: Notify::new(),
        });
        self.batches
            .lock()
            .expect("reports lock")
            .insert(ticket, batch.clone());
        OpenBatch {
            reports: self.clone(),
            batch,
        }
    }

    fn file(&self, opaque: usize, fate: Fate) {
        let ticket = (opaque as u64) >> INDEX_BITS;
        let index = opaque & ((1 << INDEX_BITS) - 1);
        let batch = self
            .batches
            .lock()
            .expect("reports lock")
            .get(&ticket)
            .cloned();
        if let Some(batch) = batch {
            batch.filed.lock().expect("batch lock").push((index, fate));
            batch.settle_one();
        }
    }
}

/// A batch taking reports; dropping it stops them (later ones are dropped: their rows were
/// already given up as deferred and stay pending).
pub(crate) struct OpenBatch {
    reports: Arc<Reports>,
    batch: Arc<Batch>,
}

impl std::ops::Deref for OpenBatch {
    type Target = Batch;
    fn deref(&self) -> &Batch {
        &self.batch
    }
}

impl OpenBatch {
    /// Stops taking reports and returns what was filed: (position in the batch, fate).
    pub(crate) fn close(self) -> Vec<(usize, Fate)> {
        let batch = self.batch.clone();
        drop(self);
        let filed = std::mem::take(&mut *batch.filed.lock().expect("batch lock"));
        filed
    }
}

impl Drop for OpenBatch {
    fn drop(&mut self) {
        self.reports
            .batches
            .lock()
            .expect("reports lock")
            .remove(&self.batch.ticket);
    }
}

impl Batch {
    /// The opaque for the record at `index`, counted as outstanding: call before handing it to
    /// librdkafka, and [`Batch::not_sent`] if librdkafka refuses it there and then.
    pub(crate) fn opaque(&self, index: usize) -> usize {
        debug_assert!(index < 1 << INDEX_BITS);
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        ((self.ticket << INDEX_BITS) as usize) | index
    }

    /// A record librdkafka refused at once: no report will come for it.
    pub(crate) fn not_sent(&self) {
        self.settle_one();
    }

    /// Every record is handed over: drops the sender's own count, so the last report (or this,
    /// when every report is already in) wakes [`Batch::wait`].
    pub(crate) fn sent_all(&self) {
        self.settle_one();
    }

    /// Resolves once every record handed over has its report.
    pub(crate) async fn wait(&self) {
        self.done.notified().await;
    }

    fn settle_one(&self) {
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            // `notify_one` keeps a permit when nobody waits yet.
            self.done.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_wakes_once_its_last_report_is_filed_and_drops_reports_after_close() {
        let reports = Arc::new(Reports::default());
        let _other = reports.open(1);
        let batch = reports.open(3);
        let a = batch.opaque(0);
        let b = batch.opaque(2);
        let refused = batch.opaque(1);
        let _ = refused;
        batch.not_sent();
        reports.file(a, Fate::Sent);
        batch.sent_all();
        // One report is still out.
        assert_eq!(batch.outstanding.load(Ordering::Acquire), 1);
        reports.file(b, Fate::Deferred("x".into()));
        batch.wait().await;
        let kept = batch.batch.clone();
        let filed = batch.close();
        assert_eq!(filed.len(), 2);
        assert!(matches!(filed[0], (0, Fate::Sent)));
        assert!(matches!(filed[1], (2, Fate::Deferred(_))));
        // A report after close is dropped, not filed into a later batch.
        reports.file(a, Fate::Sent);
        assert!(kept.filed.lock().unwrap().is_empty());
        assert_eq!(
            reports.batches.lock().unwrap().len(),
            1,
            "only the other batch is open"
        );
    }
}
