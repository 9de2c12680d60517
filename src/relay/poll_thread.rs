//! The relay's producer handle: a `BaseProducer` served by a polling thread of its own.
//!
//! rdkafka's `ThreadedProducer` polls in slices of exactly 100 ms, and its `poll` keeps
//! polling until the slice's deadline: when less than a millisecond is left, the wait it asks
//! librdkafka for rounds down to 0 ms and the loop spins until the deadline passes. That is up
//! to a millisecond of busy CPU in every 100 ms, per producer, idle or not: an idle
//! exactly-once relay (one producer per slot, eight at the time) burned 6 % of a core in its
//! polling threads (117 clock ticks in 20 s, measured per thread from `/proc`). Here each
//! slice ends [`SLICE_TAIL`] past a whole millisecond: a slice that times out overshoots its
//! last wait by the kernel's timer slack (50 µs by default), which is past the deadline, so an
//! idle producer does not spin at all.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::producer::{BaseProducer, ProducerContext};

/// One polling slice: how long the thread may sleep in librdkafka before it looks at `stop`.
const SLICE: Duration = Duration::from_millis(100);
/// What a slice adds past the whole millisecond (see the module docs).
const SLICE_TAIL: Duration = Duration::from_micros(20);

/// A producer and its polling thread; clones share both. When the last clone is dropped the
/// thread stops, and the producer is dropped (purged and flushed, as rdkafka drops it).
pub(crate) struct Polled<C: ProducerContext + 'static> {
    producer: Arc<BaseProducer<C>>,
    // Declared after `producer`, so dropped after it: the thread then holds the last
    // reference, and the producer is destroyed on it before `join` returns.
    _poller: Arc<Poller>,
}

impl<C: ProducerContext + 'static> Polled<C> {
    /// Starts the polling thread for `producer`.
    pub(crate) fn new(producer: BaseProducer<C>) -> std::io::Result<Self> {
        let producer = Arc::new(producer);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let producer = producer.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("outbox-poll".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        producer.poll(SLICE + SLICE_TAIL);
                    }
                })?
        };
        Ok(Self {
            producer,
            _poller: Arc::new(Poller {
                stop,
                thread: Some(thread),
            }),
        })
    }
}

impl<C: ProducerContext + 'static> Clone for Polled<C> {
    fn clone(&self) -> Self {
        Self {
            producer: self.producer.clone(),
            _poller: self._poller.clone(),
        }
    }
}

impl<C: ProducerContext + 'static> Deref for Polled<C> {
    type Target = BaseProducer<C>;

    fn deref(&self) -> &BaseProducer<C> {
        &self.producer
    }
}

/// Stops and joins the polling thread when the last handle goes.
struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // The thread ends within one slice; a panic there has already been reported.
            let _ = t.join();
        }
    }
}
