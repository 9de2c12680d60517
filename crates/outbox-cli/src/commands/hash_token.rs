//! `outbox hash-token`: Print the SHA-256 of a token read from standard input, for a tokens file.

use std::io::Write;

use crate::args::*;

pub async fn run(out: &mut dyn Write) -> anyhow::Result<()> {
    let mut t = String::new();
    std::io::stdin().read_line(&mut t)?;
    // The server trims a request's token before checking it: hash what it will compare.
    let t = t.trim();
    crate::redact::register([t]);
    if t.is_empty() {
        return Err(UsageError("give the token on standard input".into()).into());
    }
    let min = outbox::admin::MIN_TOKEN_CHARS;
    if t.chars().count() < min {
        return Err(UsageError(format!(
            "the token is too short: the server takes tokens of at least {min} characters"
        ))
        .into());
    }
    writeln!(out, "{}", outbox::admin::token_hash(t))?;

    Ok(())
}
