//! One file per `outbox` command: its flags, the library call, the rendering to a writer.

pub mod admin;
pub mod cleanup;
pub mod dlq;
pub mod hash_token;
pub mod migrate;
pub mod relay;
pub mod requeue;
pub mod schemas;
pub mod status;
pub mod tenants;
pub mod topics;
pub mod trace;
