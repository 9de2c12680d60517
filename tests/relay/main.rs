//! The relay as a team runs it: enqueue paths, per-key order across relays, kill -9 loops, the
//! plans of its hot statements, TLS and SASL. One binary, a module per concern.

mod basics;
mod crash;
mod exactly;
mod fleet;
mod health;
mod ordering;
mod plans;
mod ring;
mod security;
mod sqlx;
mod upgrade;
