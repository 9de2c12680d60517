//! Progress of long commands on standard error: a bar on a terminal, otherwise a plain line
//! at the first update and every 5 s (standard output stays the result alone).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A progress bar on a terminal; otherwise a plain line at the first update and every 5 s.
pub(crate) struct Meter {
    bar: Option<indicatif::ProgressBar>,
    last: Instant,
    label: String,
}

impl Meter {
    pub(crate) fn new(label: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:40}] {pos}/{len} {msg} ({eta} left)",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b.set_prefix(label.to_owned());
            b
        });
        Self {
            bar,
            last: Instant::now() - Duration::from_secs(3600),
            label: label.to_owned(),
        }
    }

    pub(crate) fn update(&mut self, pos: u64, total: u64, msg: &str) {
        match &self.bar {
            Some(b) => {
                b.set_length(total);
                b.set_position(pos);
                b.set_message(msg.to_owned());
            }
            None if self.last.elapsed() >= Duration::from_secs(5) => {
                self.last = Instant::now();
                eprintln!("{}: {pos}/{total} {msg}", self.label);
            }
            None => {}
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
