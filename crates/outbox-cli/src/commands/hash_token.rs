//! `outbox hash-token`: Print the SHA-256 of a token read from standard input, for a tokens file.

use std::io::Write;

use crate::args::*;

pub async fn run(out: &mut dyn Write) -> anyhow::Result<()> {
    let mut t = String::new();
    std::io::stdin().read_line(&mut t)?;
    let t = t.trim_end_matches(['\n', '\r']);
    if t.is_empty() {
        return Err(UsageError("give the token on standard input".into()).into());
    }
    writeln!(out, "{}", outbox::admin::token_hash(t))?;

    Ok(())
}
