//! `outbox tenants`: the registry a relay fleet publishes (`outbox relay --tenants`), in
//! --schema (the control schema). Running fleet relays follow every change within seconds.

use std::io::Write;

use clap::{Args as ClapArgs, Subcommand};

use crate::args::*;
use outbox::fleet::{FleetError, Tenant};

/// The tenants a relay fleet publishes.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Every tenant: name, database, schema, enabled, weight.
    List {
        /// One JSON object per tenant.
        #[arg(long)]
        json: bool,
    },
    /// Add a tenant, or change one.
    Add {
        /// Its name (letters, digits, `_ . -`).
        tenant: String,
        /// The schema holding its outbox (migrate it first: `outbox migrate --schema …`).
        #[arg(long = "tenant-schema", value_name = "SCHEMA")]
        tenant_schema: String,
        /// The database's name as the relays know it (`--database NAME=URL`); `default`: this
        /// one.
        #[arg(long, default_value = outbox::fleet::DEFAULT_DATABASE)]
        database: String,
        /// Its share of passes when tenants compete (1 – 100).
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// Register it without publishing it yet.
        #[arg(long)]
        disabled: bool,
    },
    /// Publish a disabled tenant again.
    Enable {
        /// The tenant.
        tenant: String,
    },
    /// Stop publishing a tenant (its relay finishes its batch); its rows stay pending.
    Disable {
        /// The tenant.
        tenant: String,
    },
    /// Remove a tenant from the registry (its outbox stays as it is).
    Remove {
        /// The tenant.
        tenant: String,
    },
}

fn lift(e: FleetError) -> anyhow::Error {
    match e {
        FleetError::Invalid(m) => anyhow::Error::new(UsageError(m)),
        e => anyhow::Error::new(e),
    }
}

/// A tenant name as the registry would take it, refused (cut and escaped) otherwise, before it
/// is looked up or echoed.
fn checked(tenant: &str) -> anyhow::Result<&str> {
    Tenant::new(tenant, outbox::Schema::default()).map_err(lift)?;
    Ok(tenant)
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let db = db_config(&args.db)?;
    match args.action {
        Action::List { json } => {
            let all = outbox::fleet::tenants(&db).await.map_err(lift)?;
            for t in &all {
                if json {
                    writeln!(
                        out,
                        "{}",
                        serde_json::json!({
                            "tenant": t.tenant, "database": t.database, "schema": t.schema.name(),
                            "enabled": t.enabled, "weight": t.weight,
                        })
                    )?;
                } else {
                    writeln!(
                        out,
                        "{:<24} {:<12} {:<24} {:<8} weight {}",
                        t.tenant,
                        t.database,
                        t.schema.name(),
                        if t.enabled { "enabled" } else { "disabled" },
                        t.weight
                    )?;
                }
            }
            if all.is_empty() && !json {
                writeln!(
                    out,
                    "no tenants (add one: outbox tenants add NAME --tenant-schema SCHEMA)"
                )?;
            }
        }
        Action::Add {
            tenant,
            tenant_schema,
            database,
            weight,
            disabled,
        } => {
            let schema =
                outbox::Schema::new(tenant_schema).map_err(|e| UsageError(e.to_string()))?;
            let mut t = Tenant::new(&tenant, schema).map_err(lift)?;
            t.database = database;
            t.weight = weight;
            t.enabled = !disabled;
            outbox::fleet::put_tenant(&db, &t).await.map_err(lift)?;
            writeln!(
                out,
                "tenant {} → {}.{}",
                t.tenant,
                t.database,
                t.schema.name()
            )?;
        }
        Action::Enable { tenant } => set_enabled(&db, checked(&tenant)?, true, out).await?,
        Action::Disable { tenant } => set_enabled(&db, checked(&tenant)?, false, out).await?,
        Action::Remove { tenant } => {
            checked(&tenant)?;
            if !outbox::fleet::remove_tenant(&db, &tenant)
                .await
                .map_err(lift)?
            {
                return Err(UsageError(format!("no tenant {tenant:?}")).into());
            }
            writeln!(out, "tenant {tenant} removed")?;
        }
    }
    Ok(())
}

async fn set_enabled(
    db: &outbox::DbConfig,
    tenant: &str,
    enabled: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let all = outbox::fleet::tenants(db).await.map_err(lift)?;
    let Some(mut t) = all.into_iter().find(|t| t.tenant == tenant) else {
        return Err(UsageError(format!("no tenant {tenant:?}")).into());
    };
    t.enabled = enabled;
    outbox::fleet::put_tenant(db, &t).await.map_err(lift)?;
    writeln!(
        out,
        "tenant {tenant} {}",
        if enabled { "enabled" } else { "disabled" }
    )?;
    Ok(())
}
