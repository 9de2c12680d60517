//! The dead-letter tools: archive, summary, replay jobs, drop, audit.

#[path = "../common/mod.rs"]
mod common;

mod basics;
