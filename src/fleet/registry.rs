//! The registry of tenants (`outbox_tenants` in the control schema) and discovery by rule.

use crate::config::DbConfig;
use crate::schema::{shown, Schema};
use crate::sql::{render, tenants as sql};

use super::FleetError;

/// The database name that stands for the control database itself.
pub const DEFAULT_DATABASE: &str = "default";

/// One registered outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Its name: in logs, metrics and status.
    pub tenant: String,
    /// The name of the connection its outbox lives behind ([`DEFAULT_DATABASE`]: the control
    /// database; others are [`super::FleetConfig::databases`]).
    pub database: String,
    /// The schema holding its outbox.
    pub schema: Schema,
    /// A disabled tenant is not published.
    pub enabled: bool,
    /// Its share of passes when tenants compete, 1 – 100.
    pub weight: u32,
}

impl Tenant {
    /// An enabled tenant of weight 1 in the control database.
    ///
    /// # Errors
    /// [`FleetError::Invalid`] for a name the registry would refuse.
    pub fn new(tenant: &str, schema: Schema) -> Result<Self, FleetError> {
        let t = Self {
            tenant: tenant.to_owned(),
            database: DEFAULT_DATABASE.to_owned(),
            schema,
            enabled: true,
            weight: 1,
        };
        t.validate()?;
        Ok(t)
    }

    /// Checks what the table's constraints check, with a message that names the field.
    ///
    /// # Errors
    /// [`FleetError::Invalid`] naming the field and the rule.
    pub fn validate(&self) -> Result<(), FleetError> {
        validate_tenant_name(&self.tenant)?;
        validate_database_name(&self.database)?;
        if !(1..=100).contains(&self.weight) {
            return Err(FleetError::Invalid(format!(
                "weight {}: from 1 to 100",
                self.weight
            )));
        }
        Ok(())
    }
}

impl Tenant {
    /// The connection to this tenant's outbox: `control` for [`DEFAULT_DATABASE`], otherwise
    /// the entry of `databases` it names, with the tenant's schema. `None` when its database
    /// is not among them.
    pub fn connection(
        &self,
        control: &DbConfig,
        databases: &std::collections::BTreeMap<String, DbConfig>,
    ) -> Option<DbConfig> {
        let mut db = if self.database == DEFAULT_DATABASE {
            control.clone()
        } else {
            databases.get(&self.database)?.clone()
        };
        db.schema = self.schema.clone();
        Some(db)
    }
}

/// 1 to 63 bytes, the first one `first`, every one `any`: the shape of both name rules.
fn fits(name: &str, first: fn(&u8) -> bool, any: fn(&u8) -> bool) -> bool {
    (1..=63).contains(&name.len()) && first(&name.as_bytes()[0]) && name.as_bytes().iter().all(any)
}

/// Checks a tenant's name (the registry's rule; also what a consumer accepts in `x-tenant`).
pub(crate) fn validate_tenant_name(name: &str) -> Result<(), FleetError> {
    if fits(name, u8::is_ascii_alphanumeric, |b| {
        b.is_ascii_alphanumeric() || b"_.-".contains(b)
    }) {
        return Ok(());
    }
    Err(FleetError::Invalid(format!(
        "tenant {}: 1 to 63 letters, digits, `_`, `.` or `-`, starting with a letter or digit",
        shown(name)
    )))
}

/// Checks a database name (a tenant's `database`, a key of [`super::FleetConfig::databases`]):
/// lowercase letters, digits and `_`, not a URL.
pub(crate) fn validate_database_name(name: &str) -> Result<(), FleetError> {
    if fits(name, u8::is_ascii_lowercase, |b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_'
    }) {
        return Ok(());
    }
    // A URL pasted here may carry a password: such a value is not shown.
    let shown = if name.contains([':', '/', '@']) {
        "(not shown)".to_owned()
    } else {
        shown(name)
    };
    Err(FleetError::Invalid(format!(
        "database {shown}: a name of lowercase letters, digits and `_` (a connection given as --database NAME=URL), not a URL"
    )))
}

/// Every tenant of the registry in `control`'s schema, in name order.
///
/// # Errors
/// [`FleetError::Postgres`] when the registry cannot be read (not migrated, Postgres down).
pub async fn tenants(control: &DbConfig) -> Result<Vec<Tenant>, FleetError> {
    let c = crate::db::connect(control).await?;
    list_on(&c, &control.schema).await
}

pub(super) async fn list_on(
    c: &tokio_postgres::Client,
    schema: &Schema,
) -> Result<Vec<Tenant>, FleetError> {
    let rows = c.query(&render(sql::LIST, schema), &[]).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let name: String = r.get(0);
        // The table's CHECK holds the same rule: a row that breaks it was written around it.
        let Ok(s) = Schema::new(r.get::<_, String>(2)) else {
            tracing::warn!(tenant = %name, "registry row with an invalid schema name; skipped");
            continue;
        };
        out.push(Tenant {
            tenant: name,
            database: r.get(1),
            schema: s,
            enabled: r.get(3),
            weight: u32::try_from(r.get::<_, i32>(4)).unwrap_or(1),
        });
    }
    Ok(out)
}

/// Adds `tenant` to the registry, or changes it; running fleet relays pick it up at once.
///
/// # Errors
/// [`FleetError::Invalid`] for a bad field, [`FleetError::Postgres`] otherwise.
pub async fn put_tenant(control: &DbConfig, tenant: &Tenant) -> Result<(), FleetError> {
    tenant.validate()?;
    let c = crate::db::connect(control).await?;
    let weight = i32::try_from(tenant.weight).unwrap_or(1);
    c.execute(
        &render(sql::PUT, &control.schema),
        &[
            &tenant.tenant,
            &tenant.database,
            &tenant.schema.name(),
            &tenant.enabled,
            &weight,
        ],
    )
    .await?;
    Ok(())
}

/// Removes `tenant` from the registry (its outbox stays); false when it was not there.
///
/// # Errors
/// [`FleetError::Postgres`] when the registry cannot be written.
pub async fn remove_tenant(control: &DbConfig, tenant: &str) -> Result<bool, FleetError> {
    let c = crate::db::connect(control).await?;
    let n = c
        .execute(&render(sql::REMOVE, &control.schema), &[&tenant])
        .await?;
    Ok(n > 0)
}

/// The schemas of `c`'s database that hold an outbox and match the LIKE `pattern`.
pub(super) async fn discover_on(
    c: &tokio_postgres::Client,
    pattern: &str,
) -> Result<Vec<Schema>, FleetError> {
    let rows = c.query(sql::DISCOVER, &[&pattern]).await?;
    Ok(rows
        .iter()
        .filter_map(|r| Schema::new(r.get::<_, String>(0)).ok())
        .collect())
}
