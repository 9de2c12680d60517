//! The consumer runtime: handlers, retries, dead letters, crashes and restarts, the shared
//! circuit breaker, hostile input. One binary, a module per concern.

mod basics;
mod breaker;
mod call;
mod classify;
mod compacted;
mod drivers;
mod fleet;
mod harness;
mod health;
mod hostile;
mod recovery;
