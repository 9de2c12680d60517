//! One relay for many outboxes: the schemas and databases a registry lists (`outbox_tenants`
//! in the control schema) or a rule discovers, published side by side, fairly, each failing
//! on its own (`docs/design/many-databases.md`).
//!
//! A [`Fleet`] keeps one [`Relay`](crate::Relay) per distinct outbox — every guarantee is that relay's —
//! started when a tenant appears and stopped when it goes, reloaded on the registry's
//! notification and every [`FleetConfig::reload_interval`]. Their passes go through one gate
//! (`relay/gate.rs`): at most [`FleetConfig::passes`] at once, the next to the tenant with the
//! least service per weight, each pass at most [`FleetConfig::quantum`] batches.
//!
//! The registry (`registry.rs`: [`Tenant`], [`put_tenant`], [`tenants`]) is core: a consumer
//! routing by tenant reads it too. The fleet itself (`run.rs`: [`Fleet`]) needs the `relay`
//! feature.

mod registry;
#[cfg(feature = "relay")]
mod run;
#[cfg(feature = "relay")]
mod shared;

#[cfg(feature = "relay")]
use crate::relay::RelayError;

pub use registry::{put_tenant, remove_tenant, tenants, Tenant, DEFAULT_DATABASE};
pub(crate) use registry::{validate_database_name, validate_tenant_name};
#[cfg(feature = "relay")]
pub use run::{Drainer, Fleet, FleetConfig, FleetView};

/// What a fleet could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// A registry entry or setting that cannot be used; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// Postgres was unreachable or refused a statement.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// A tenant's relay could not be built.
    #[cfg(feature = "relay")]
    #[error(transparent)]
    Relay(#[from] RelayError),
}
