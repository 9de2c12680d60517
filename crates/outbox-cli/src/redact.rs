//! The last line of defence for secrets: every value the command was given that may be a
//! secret (Kafka properties not known to be plain, the database password, the registry's URL
//! credentials, admin tokens read from standard input) is registered here, and every log line
//! and the final error are passed through [`clean`] before they reach standard error, whatever
//! library wrote the text. Log lines are also made single-line and terminal-safe: data that
//! reaches a log field (a topic name with a newline, a breaker reason with ESC bytes) can
//! neither forge a second line nor drive the operator's terminal.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

fn secrets() -> &'static Mutex<Vec<String>> {
    static S: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    S.get_or_init(Mutex::default)
}

/// Registers `values` as secrets for the rest of the process.
pub(crate) fn register<'a>(values: impl IntoIterator<Item = &'a str>) {
    let mut s = secrets()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for v in values {
        // One- and two-character values would blank out ordinary text; no real secret is so short.
        if v.len() < 3 {
            continue;
        }
        // A text may quote the value back escaped: as a `Debug` or JSON string (a quote or a
        // backslash in a password), or percent-encoded in a URL.
        let json = serde_json::to_string(v).unwrap_or_default();
        let json = json.get(1..json.len().saturating_sub(1)).unwrap_or(v);
        for form in [
            v.to_owned(),
            v.escape_debug().to_string(),
            json.to_owned(),
            percent_encode(v),
        ] {
            if !s.contains(&form) {
                s.push(form);
            }
        }
    }
    s.sort_by_key(|v| std::cmp::Reverse(v.len()));
}

/// Registers the credentials a URL carries (`scheme://user:password@host…`), as the
/// registry client reads them.
pub(crate) fn register_url(url: &str) {
    let secrets = outbox::schemas::url_secrets(url);
    register(secrets.iter().map(String::as_str));
}

/// `s` as a URL's userinfo carries it: every byte but unreserved ones percent-encoded.
pub(crate) fn percent_encode(s: &str) -> String {
    const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

/// `text` with every registered secret replaced by `<redacted>`.
pub(crate) fn clean(text: &str) -> String {
    let s = secrets()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut out = text.to_owned();
    for v in s.iter() {
        if out.contains(v.as_str()) {
            out = out.replace(v.as_str(), "<redacted>");
        }
    }
    out
}

/// One log line as written: secrets out, then every control character but the final newline
/// shown as an escape (`\n`, `\x1b`), so one event stays one line.
pub(crate) fn log_line(buf: &[u8]) -> Vec<u8> {
    let text = clean(&String::from_utf8_lossy(buf));
    let (body, nl) = match text.strip_suffix('\n') {
        Some(b) => (b, "\n"),
        None => (text.as_str(), ""),
    };
    let mut out = String::with_capacity(body.len() + 1);
    for c in body.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            c if c.is_control() && c != '\t' => {
                if (c as u32) < 0x100 {
                    out.push_str(&format!("\\x{:02x}", c as u32));
                } else {
                    out.push_str(&c.escape_unicode().to_string());
                }
            }
            c => out.push(c),
        }
    }
    out.push_str(nl);
    out.into_bytes()
}

/// Standard error through [`log_line`]: the subscriber writes one whole event per call.
pub(crate) struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().write_all(&log_line(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_and_forged_lines_never_reach_the_log() {
        super::register(["S3cretValue", "pw"]);
        let line = super::log_line(b"WARN refused S3cretValue topic=\"a\nINFO forged\" pw\n");
        assert_eq!(
            String::from_utf8(line).unwrap(),
            "WARN refused <redacted> topic=\"a\\nINFO forged\" pw\n"
        );
        // Quoted back escaped, as `Debug`, JSON or a URL writes it.
        super::register(["pa\"ss\\w\u{7}rd"]);
        for quoted in [
            r#"error: "pa\"ss\\w\u{7}rd""#,
            r#"{"value":"pa\"ss\\w\u0007rd"}"#,
            "postgres://u:pa%22ss%5Cw%07rd@h/db",
        ] {
            let line = String::from_utf8(super::log_line(quoted.as_bytes())).unwrap();
            assert!(
                line.contains("<redacted>") && !line.contains("ss"),
                "{quoted} -> {line}"
            );
        }
        let line = super::log_line(b"reason=\x1b[2Jcleared\n");
        assert_eq!(String::from_utf8(line).unwrap(), "reason=\\x1b[2Jcleared\n");
    }
}
