//! Routing by tenant: a message's `x-tenant` header (set by a fleet relay, `outbox relay
//! --tenants`) names a tenant of the registry (`outbox_tenants` in the consumer's schema,
//! the relay's control schema); its handler's transaction and inbox mark run in that tenant's
//! database, with `search_path` set to the tenant's schema, so the handler's business writes
//! and the mark that dedupes them commit together where the tenant's data lives.
//!
//! A message without the header is handled in the consumer's own database, as always. A tenant
//! that is neither registered nor discovered, or whose database this consumer was not given,
//! is a permanent error: the message is dead-lettered with the reason, and replayed once the
//! registry or the configuration is fixed. A tenant's database that is down is a transient
//! error of that message (retries, then its dead letter): it does not trip the consumer's own
//! database breaker, so the other tenants keep flowing.
//!
//! Pools are the consumer's driver's: opened here from [`TenantRouting::databases`] on
//! tokio-postgres; on sqlx, the service's own, from `TenantRouting::sqlx_databases`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use super::handler::HandlerError;
use super::inbox::Inbox;
use crate::config::DbConfig;
use crate::fleet::{validate_database_name, validate_tenant_name, DEFAULT_DATABASE};
use crate::schema::{shown, Schema};
use crate::sql::{render, tenants as sql};

/// Where a consumer sends each tenant's messages ([`super::ConsumerConfig::tenants`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TenantRouting {
    /// The connections the registry's `database` column names, besides `default` (the
    /// consumer's own database). Their schemas are ignored: each tenant names its own.
    pub databases: BTreeMap<String, DbConfig>,
    /// Also route a tenant that is not registered to the schema of the consumer's database
    /// with its name, when that name matches this LIKE pattern (the relay's `--discover`,
    /// e.g. `tenant_%`) and the schema is migrated.
    pub discover: Option<String>,
    /// Pooled connections per named database (the consumer's own database uses its pool).
    pub pool_size: usize,
    /// How long a resolved tenant is trusted before the registry is read again (a tenant
    /// moved to another database is followed within this).
    pub refresh: Duration,
    /// A consumer on sqlx (built by `Consumer::sqlx`): the service's pool of each database the
    /// registry names besides `default` (which is the consumer's own pool). Used instead of
    /// `databases`, which an sqlx consumer must leave empty.
    #[cfg(feature = "sqlx")]
    pub sqlx_databases: BTreeMap<String, sqlx::PgPool>,
}

impl TenantRouting {
    /// Default [`TenantRouting::pool_size`].
    pub const DEFAULT_POOL_SIZE: usize = 4;
    /// Default [`TenantRouting::refresh`].
    pub const DEFAULT_REFRESH: Duration = Duration::from_secs(5);
}

impl Default for TenantRouting {
    fn default() -> Self {
        Self {
            databases: BTreeMap::new(),
            discover: None,
            pool_size: Self::DEFAULT_POOL_SIZE,
            refresh: Self::DEFAULT_REFRESH,
            #[cfg(feature = "sqlx")]
            sqlx_databases: BTreeMap::new(),
        }
    }
}

/// A database's pool, of the consumer's driver.
#[derive(Clone)]
pub(super) enum TenantPool {
    /// tokio-postgres.
    Pg(Pool),
    /// sqlx: the service's own pools.
    #[cfg(feature = "sqlx")]
    Sqlx(sqlx::PgPool),
}

/// A resolved tenant: where its messages' transactions run.
pub(super) struct Target {
    /// The pool of its database.
    pub(super) pool: TenantPool,
    /// Its inbox (`processed_messages` in its schema).
    pub(super) inbox: Inbox,
    /// `SET LOCAL search_path` to its schema, first in each of its transactions.
    pub(super) set_path: String,
    /// Its database's name, for errors.
    pub(super) database: String,
}

/// Resolves tenants through the registry, with a short cache.
pub(super) struct Router {
    control: Pool,
    control_schema: Schema,
    group: String,
    pools: HashMap<String, TenantPool>,
    discover: Option<String>,
    refresh: Duration,
    cache: Mutex<HashMap<String, (Instant, Arc<Target>)>>,
}

impl Router {
    /// A router over the consumer's own pool (`own`: its database, also the registry's) and a
    /// pool per named database: opened here for tokio-postgres, the service's for sqlx
    /// (`own_sqlx`: the consumer's sqlx pool, whose database is `default`).
    pub(super) fn new(
        routing: &TenantRouting,
        own: Pool,
        #[cfg(feature = "sqlx")] own_sqlx: Option<sqlx::PgPool>,
        schema: &Schema,
        group: &str,
    ) -> Result<Self, String> {
        let named = |name: &str| {
            if name == DEFAULT_DATABASE {
                return Err(format!(
                    "database {DEFAULT_DATABASE:?} is the consumer's own; name the others differently"
                ));
            }
            // A name the registry could never hold is a typo here: refused, not ignored.
            validate_database_name(name).map_err(|e| e.to_string())
        };
        let mut pools = HashMap::new();
        #[cfg(feature = "sqlx")]
        match own_sqlx {
            Some(own_sqlx) => {
                if !routing.databases.is_empty() {
                    return Err("a consumer on sqlx names its databases' pools in TenantRouting::sqlx_databases, not databases".into());
                }
                for (name, pool) in &routing.sqlx_databases {
                    named(name)?;
                    pools.insert(name.clone(), TenantPool::Sqlx(pool.clone()));
                }
                pools.insert(DEFAULT_DATABASE.to_owned(), TenantPool::Sqlx(own_sqlx));
            }
            None if !routing.sqlx_databases.is_empty() => {
                return Err("TenantRouting::sqlx_databases is for a consumer on sqlx (Consumer::sqlx); name tokio-postgres databases in databases".into());
            }
            None => {}
        }
        if pools.is_empty() {
            // tokio-postgres: a pool per named database, opened here.
            for (name, db) in &routing.databases {
                named(name)?;
                let mut db = db.clone();
                db.pool_size = routing.pool_size.max(1);
                let pool = crate::db::pool(&db).map_err(|e| format!("database {name}: {e}"))?;
                pools.insert(name.clone(), TenantPool::Pg(pool));
            }
            pools.insert(DEFAULT_DATABASE.to_owned(), TenantPool::Pg(own.clone()));
        }
        Ok(Self {
            control: own,
            control_schema: schema.clone(),
            group: group.to_owned(),
            pools,
            discover: routing.discover.clone(),
            refresh: routing.refresh,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Where `tenant`'s messages go.
    ///
    /// # Errors
    /// Permanent for a tenant that is not a name, not registered (nor discovered) or whose
    /// database is not configured; database-unavailable when the registry cannot be read.
    pub(super) async fn target(&self, tenant: &str) -> Result<Arc<Target>, HandlerError> {
        if let Some((at, t)) = self.cache.lock().expect("tenant cache").get(tenant) {
            if at.elapsed() < self.refresh {
                return Ok(t.clone());
            }
        }
        if validate_tenant_name(tenant).is_err() {
            return Err(HandlerError::permanent(format!(
                "x-tenant {} is not a tenant name",
                shown(tenant)
            )));
        }
        let (database, schema) = self.lookup(tenant).await?;
        let Some(pool) = self.pools.get(&database) else {
            return Err(HandlerError::permanent(format!(
                "tenant {tenant}: its database {database} is not configured on this consumer (TenantRouting::databases, or sqlx_databases on sqlx)"
            )));
        };
        let target = Arc::new(Target {
            pool: pool.clone(),
            inbox: Inbox::new(&schema, self.group.clone()),
            set_path: format!("SET LOCAL search_path TO {}, public", schema.quoted()),
            database,
        });
        self.cache
            .lock()
            .expect("tenant cache")
            .insert(tenant.to_owned(), (Instant::now(), target.clone()));
        Ok(target)
    }

    /// The tenant's database name and schema: the registry first, then the discovery rule.
    async fn lookup(&self, tenant: &str) -> Result<(String, Schema), HandlerError> {
        let c = self
            .control
            .get()
            .await
            .map_err(|e| HandlerError::database_unavailable(format!("postgres pool: {e}")))?;
        let find = c
            .prepare_cached(&render(sql::FIND, &self.control_schema))
            .await?;
        if let Some(r) = c.query_opt(&find, &[&tenant]).await? {
            let schema = Schema::new(r.get::<_, String>(1)).map_err(|e| {
                HandlerError::permanent(format!("tenant {tenant}: registry row: {e}"))
            })?;
            return Ok((r.get(0), schema));
        }
        if let (Some(pattern), Ok(schema)) = (&self.discover, Schema::new(tenant)) {
            let found: bool = c
                .query_one(sql::DISCOVERED, &[&tenant, pattern])
                .await?
                .get(0);
            if found {
                return Ok((DEFAULT_DATABASE.to_owned(), schema));
            }
        }
        Err(HandlerError::permanent(format!(
            "tenant {tenant} is not in the registry of schema {}{} (outbox tenants add)",
            self.control_schema,
            if self.discover.is_some() {
                " nor a migrated schema matching the discovery rule"
            } else {
                ""
            }
        )))
    }
}
