//! Per-partition offset tracking: the offset to commit is the lowest one not yet final.

use std::collections::BTreeSet;

/// Tracks which offsets of one partition are in flight.
///
/// Messages finish out of order under concurrency; committing the highest finished offset
/// would skip unfinished ones on a crash. The safe commit point is the lowest unfinished offset,
/// or one past the highest received when nothing is unfinished.
#[derive(Debug)]
pub(crate) struct OffsetTracker {
    /// Distinguishes this assignment from a later one of the same partition.
    pub epoch: u64,
    in_flight: BTreeSet<i64>,
    max_seen: Option<i64>,
    stored: Option<i64>,
}

impl OffsetTracker {
    pub fn new(epoch: u64) -> Self {
        Self {
            epoch,
            in_flight: BTreeSet::new(),
            max_seen: None,
            stored: None,
        }
    }

    /// A message at `offset` was accepted and is not final yet.
    pub fn begin(&mut self, offset: i64) {
        self.in_flight.insert(offset);
        self.max_seen = Some(self.max_seen.map_or(offset, |m| m.max(offset)));
    }

    /// The message at `offset` reached a final outcome. Returns the new commit point (the next
    /// offset to consume) when it moved forward.
    pub fn finish(&mut self, offset: i64) -> Option<i64> {
        self.in_flight.remove(&offset);
        let point = match self.in_flight.first() {
            Some(lowest) => *lowest,
            None => self.max_seen? + 1,
        };
        if self.stored.is_none_or(|s| point > s) {
            self.stored = Some(point);
            Some(point)
        } else {
            None
        }
    }

    /// Messages accepted but not final.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_point_is_lowest_unfinished() {
        let mut t = OffsetTracker::new(1);
        for o in 10..15 {
            t.begin(o);
        }
        assert_eq!(t.finish(12), Some(10), "10 still unfinished");
        assert_eq!(t.finish(11), None);
        assert_eq!(t.finish(10), Some(13));
        assert_eq!(t.finish(14), None, "13 still unfinished");
        assert_eq!(t.finish(13), Some(15));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn gaps_in_offsets_are_fine() {
        let mut t = OffsetTracker::new(1);
        t.begin(3);
        t.begin(7);
        assert_eq!(t.finish(7), Some(3));
        assert_eq!(t.finish(3), Some(8));
    }
}
