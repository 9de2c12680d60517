//! Error normalisation for grouping: one error on a hundred messages is one defect, so they
//! must group as one cause. Ids that differ from message to message are replaced by placeholders.

use std::sync::OnceLock;

use regex::Regex;

/// The error with UUIDs (`<uuid>`), hex ids (`<hex>`: `0x…`, or 8+ hex digits with a digit)
/// and numbers (`<n>`) replaced, whitespace collapsed, cut to 300 characters.
///
/// ```
/// assert_eq!(
///     outbox::dlq::normalize_error("order 123 of 0195a5c2-7c1e-7b41-9a2e-2f1d4c3b2a19 failed at 0xdeadbeef"),
///     "order <n> of <uuid> failed at <hex>"
/// );
/// ```
pub fn normalize_error(error: &str) -> String {
    static PATTERNS: OnceLock<[(Regex, &'static str); 4]> = OnceLock::new();
    let patterns = PATTERNS.get_or_init(|| {
        [
            (
                Regex::new(r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
                    .expect("uuid pattern"),
                "<uuid>",
            ),
            (
                Regex::new(r"(?i)\b0x[0-9a-f]+\b").expect("0x pattern"),
                "<hex>",
            ),
            (
                // A hex run of 8+ with at least one digit (so plain words like "deadbeef"... and
                // "accepted" stay words unless they carry digits).
                Regex::new(r"(?i)\b[0-9a-f]*[0-9][0-9a-f]*\b").expect("hex pattern"),
                "",
            ),
            (Regex::new(r"\s+").expect("space pattern"), " "),
        ]
    });
    let s = patterns[0].0.replace_all(error, patterns[0].1);
    let s = patterns[1].0.replace_all(&s, patterns[1].1);
    // Runs of hex characters containing a digit: 8+ long are hex ids, shorter ones with only
    // decimal digits are numbers; anything else (e.g. "e2e") stays as written.
    let s = patterns[2].0.replace_all(&s, |c: &regex::Captures<'_>| {
        let m = &c[0];
        if m.len() >= 8 {
            "<hex>".to_owned()
        } else if m.bytes().all(|b| b.is_ascii_digit()) {
            "<n>".to_owned()
        } else {
            m.to_owned()
        }
    });
    // Digits glued to letters ("order42", "v2") count as numbers too.
    static DIGITS: OnceLock<Regex> = OnceLock::new();
    let digits = DIGITS.get_or_init(|| Regex::new(r"[0-9]+").expect("digits pattern"));
    let s = digits.replace_all(&s, "<n>");
    let s = patterns[3].0.replace_all(s.trim(), patterns[3].1);
    s.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::normalize_error as n;

    #[test]
    fn the_same_defect_with_different_ids_groups_together() {
        assert_eq!(n("customer 42 not found"), n("customer 1337 not found"));
        assert_eq!(
            n("payment 0195a5c2-7c1e-7b41-9a2e-2f1d4c3b2a19 declined"),
            n("payment 0195A5C2-0000-7b41-9a2e-2f1d4c3b2a19 declined")
        );
        assert_eq!(n("row 5f3a9c2e1b locked"), "row <hex> locked");
        assert_eq!(n("at 0xdeadbeef"), "at <hex>");
        assert_eq!(n("order42 failed"), "order<n> failed");
        assert_eq!(n("  a \n\t b  "), "a b");
    }

    #[test]
    fn different_defects_stay_apart_and_words_survive() {
        assert_ne!(n("customer 42 not found"), n("card 42 expired"));
        assert_eq!(n("decade accepted"), "decade accepted");
        assert_eq!(n(&"x".repeat(1000)).len(), 300);
    }
}
