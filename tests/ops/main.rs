//! What an operator and a maintainer see: the admin API and the dashboard (headless
//! Chromium), the CLI, metrics and alerts, and the crate's shape. These run the `outbox`
//! binary as a process; the metrics test installs the process-wide recorder, so no test here
//! runs a relay or consumer in-process besides it.

mod admin;
mod api;
mod browser;
mod cli;
mod compose;
mod console;
mod demo;
mod helm;
mod hostile;
mod jobs;
mod layout;
mod observability;
