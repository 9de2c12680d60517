//! A test hook: `OUTBOX_CRASH_AT=<point>[:<n>]` aborts the process (no cleanup, like
//! `kill -9`) the `n`-th time (default 1st) it reaches `point`. The relay's exactly-once
//! points: `after_produce`, `before_commit`, `during_commit`, `after_commit`; rotation's:
//! `rotate_locked`, `rotate_truncated`, `rotate_advanced`. Read once; unset in production.

/// Aborts here if `OUTBOX_CRASH_AT` names `point` and this is its `n`-th visit.
pub(crate) fn point(point: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static HITS: AtomicU64 = AtomicU64::new(0);
    if let Some((p, n)) = at() {
        if p == point && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            eprintln!("OUTBOX_CRASH_AT={point}: aborting");
            std::process::abort();
        }
    }
}

/// `OUTBOX_CRASH_AT` as (point, n), read once.
pub(crate) fn at() -> &'static Option<(String, u64)> {
    static AT: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();
    AT.get_or_init(|| {
        let v = std::env::var("OUTBOX_CRASH_AT").ok()?;
        let (p, n) = v.split_once(':').unwrap_or((&v, "1"));
        Some((p.to_owned(), n.parse().unwrap_or(1)))
    })
}
