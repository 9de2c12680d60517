//! The dead-letter tools: archive, summary, replay jobs, drop, audit.

mod basics;
mod comebacks;
mod journey;
mod order;
mod strict;
