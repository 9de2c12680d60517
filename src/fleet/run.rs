//! The fleet: a [`Relay`] per distinct outbox of the registry, started and stopped as it
//! changes, their passes through one gate (see the module above).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::registry::{self, Tenant, DEFAULT_DATABASE};
use super::{shared, FleetError};
use crate::config::{DbConfig, KafkaConfig};
use crate::relay::gate::{Gate, Seat, TenantGauges};
use crate::relay::{Relay, RelayConfig, RelayError, Shared, SharedProducer};
use crate::schema::Schema;

/// How a fleet finds its tenants and shares its passes.
#[derive(Clone)]
#[non_exhaustive]
pub struct FleetConfig {
    /// The connections tenants name by `database`, besides [`DEFAULT_DATABASE`] (the control
    /// database). Their schemas are ignored: each tenant names its own.
    pub databases: BTreeMap<String, DbConfig>,
    /// Read the registry (`outbox_tenants` in the control schema). Default true.
    pub registry: bool,
    /// Also publish every schema of the control database whose name matches this LIKE pattern
    /// and holds an outbox (tenant = schema name, weight 1), e.g. `tenant_%`.
    pub discover: Option<String>,
    /// How often the registry is read besides its notifications (default 5 s).
    pub reload_interval: Duration,
    /// Passes running at once across tenants (default [`FleetConfig::DEFAULT_PASSES`]).
    pub passes: usize,
    /// Batches one pass may claim before giving way (default [`FleetConfig::DEFAULT_QUANTUM`]).
    pub quantum: usize,
    /// Postgres sessions the fleet may hold in all, over every database it may use (the
    /// control database and each of `databases`): each gets an equal share, of which two are
    /// its lock and LISTEN sessions and the rest its pool (default
    /// [`FleetConfig::DEFAULT_CONNECTION_BUDGET`]). Tenant count does not change it.
    pub connection_budget: usize,
    /// Tenants whose backlog gauges carry their own `tenant` label (the first the fleet
    /// started, by name, keep it);
    /// the others are summed under `tenant="other"`, so many tenants do not explode the
    /// metrics (default [`FleetConfig::DEFAULT_TENANT_LABELS`]).
    pub tenant_labels: usize,
    /// How long an idle tenant's relay waits for a notification before it looks at its outbox
    /// anyway (default [`FleetConfig::DEFAULT_IDLE_POLL`]; each tenant at its own pace between
    /// half and one and a half of it). Notifications wake it at once: every INSERT into an
    /// outbox sends one. What they miss is a row put back to `pending` by plain SQL (`outbox
    /// requeue` notifies); a tenant whose last claim saw rows backed off, not due yet, polls
    /// at `relay.poll_interval` until they went. An idle relay alone polls at
    /// `relay.poll_interval`; 200 idle tenants at that pace kept 0.6 of a core busy in
    /// Postgres (`benches/fleet.rs`, `idle_cores`).
    pub idle_poll: Duration,
    /// Every tenant's relay settings. In exactly-once mode the transactional ids and the
    /// progress topic of a tenant outside the control database carry its database's name.
    pub relay: RelayConfig,
}

impl FleetConfig {
    /// Default [`FleetConfig::passes`].
    pub const DEFAULT_PASSES: usize = 4;
    /// Default [`FleetConfig::quantum`].
    pub const DEFAULT_QUANTUM: usize = 4;
    /// Default [`FleetConfig::reload_interval`].
    pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);
    /// Default [`FleetConfig::connection_budget`].
    pub const DEFAULT_CONNECTION_BUDGET: usize = 32;
    /// Default [`FleetConfig::tenant_labels`].
    pub const DEFAULT_TENANT_LABELS: usize = 20;
    /// Default [`FleetConfig::idle_poll`].
    pub const DEFAULT_IDLE_POLL: Duration = Duration::from_secs(5);
    /// The `linger.ms` of the fleet's producer unless the Kafka properties set one (a relay
    /// alone lingers 0 ms). The relays of a fleet hand their shared producer many small
    /// batches at once (a tenant's pass of a few hundred rows, several passes overlapping):
    /// without a linger librdkafka sends each partition's first few rows of each as a request
    /// of its own, and the broker and the fleet pay per request. One millisecond lets them
    /// coalesce: in one hour 200 tenants × 500 rows drained at 43,500 – 47,800 msg/s
    /// against 37,200 – 42,100 without, at 37 – 38 µs of CPU per message against 43 – 46
    /// (`benches/fleet.rs`, BENCHMARKS_HISTORY round 25). 5 ms cost less CPU still, but adds
    /// 5 ms to every event's commit → ack; 1 ms adds at most 1.
    pub const DEFAULT_LINGER_MS: u32 = 1;

    /// Each database's pool size under the budget, or why the budget is too small.
    fn pool_size(&self) -> Result<usize, FleetError> {
        let dbs = 1 + self.databases.len();
        let share = self.connection_budget / dbs;
        if share < 4 {
            return Err(FleetError::Invalid(format!(
                "connection budget {}: {dbs} database(s) need at least 4 sessions each (a lock session, a LISTEN session and a pool of 2)",
                self.connection_budget
            )));
        }
        Ok(share - 2)
    }
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            databases: BTreeMap::new(),
            registry: true,
            discover: None,
            reload_interval: Self::DEFAULT_RELOAD_INTERVAL,
            passes: Self::DEFAULT_PASSES,
            quantum: Self::DEFAULT_QUANTUM,
            connection_budget: Self::DEFAULT_CONNECTION_BUDGET,
            tenant_labels: Self::DEFAULT_TENANT_LABELS,
            idle_poll: Self::DEFAULT_IDLE_POLL,
            relay: RelayConfig::default(),
        }
    }
}

/// One outbox the fleet publishes, and the tenants that name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drainer {
    /// The tenants of the registry (or discovered) that point at this outbox, in name order;
    /// the first names its metrics.
    pub tenants: Vec<String>,
    /// The connection's name.
    pub database: String,
    /// The outbox's schema.
    pub schema: Schema,
    /// The weight it runs at (the first tenant's).
    pub weight: u32,
    /// Passes it was given so far.
    pub passes: u64,
    /// Passes the fleet had given (to any tenant) when this one first asked for a pass, and
    /// when it was first given one: the difference is how many passes others had while it
    /// waited for its first.
    pub first_pass: Option<(u64, Option<u64>)>,
}

/// The publisher of many outboxes. See the module documentation.
pub struct Fleet {
    control: DbConfig,
    kafka: KafkaConfig,
    config: FleetConfig,
    gate: Gate,
    view: FleetView,
    health: crate::health::Health,
}

/// What a running fleet publishes now; cheap to clone, readable while it runs.
#[derive(Clone, Default)]
pub struct FleetView {
    inner: Arc<Mutex<Vec<Drainer>>>,
    gate: Option<Gate>,
}

impl FleetView {
    /// The outboxes being published, in the order of their first tenant's name.
    pub fn drainers(&self) -> Vec<Drainer> {
        let mut v = self.inner.lock().expect("fleet view").clone();
        if let Some(g) = &self.gate {
            for d in &mut v {
                d.passes = g.granted(seat_id(&d.database, &d.schema));
                d.first_pass = g.first(seat_id(&d.database, &d.schema));
            }
        }
        v
    }
}

/// A drainer's identity: the connection (host, port, database) and the schema. Two names for
/// one server and database are one.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct Target {
    server: String,
    schema: String,
}

struct Running {
    drainer: Drainer,
    weight: Arc<AtomicU32>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// What `run` builds once and every tenant's relay shares.
struct Sharing {
    databases: HashMap<String, shared::Database>,
    producer: Option<SharedProducer>,
    gauges: Arc<TenantGauges>,
}

fn seat_id(database: &str, schema: &Schema) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (database, schema.name()).hash(&mut h);
    h.finish()
}

impl Fleet {
    /// A fleet whose registry lives in `control`'s schema (and database).
    ///
    /// # Errors
    /// [`FleetError::Invalid`] for a database named `default` in `config.databases`, an empty
    /// gate or quantum, or invalid relay settings.
    pub fn new(
        control: &DbConfig,
        kafka: &KafkaConfig,
        config: FleetConfig,
    ) -> Result<Self, FleetError> {
        if config.databases.contains_key(DEFAULT_DATABASE) {
            return Err(FleetError::Invalid(format!(
                "database {DEFAULT_DATABASE:?} is the control database; name the others differently"
            )));
        }
        for name in config.databases.keys() {
            registry::validate_database_name(name)?;
        }
        if config.passes == 0 || config.quantum == 0 {
            return Err(FleetError::Invalid(
                "passes and quantum must be at least 1".into(),
            ));
        }
        // The budget is refused here, before anything connects (exit 2 for the CLI).
        config.pool_size()?;
        if !config.registry && config.discover.is_none() {
            return Err(FleetError::Invalid(
                "a fleet needs the registry, a discovery rule, or both".into(),
            ));
        }
        config
            .relay
            .validate()
            .map_err(|e| FleetError::Relay(RelayError::Config(e)))?;
        let gate = Gate::new(config.passes);
        Ok(Self {
            control: control.clone(),
            kafka: kafka.clone(),
            view: FleetView {
                inner: Arc::default(),
                gate: Some(gate.clone()),
            },
            gate,
            config,
            health: crate::health::Health::new(),
        })
    }

    /// What it publishes, readable while [`Fleet::run`] runs.
    pub fn view(&self) -> FleetView {
        self.view.clone()
    }

    /// Live while its reload loop turns; ready while the registry was read at the last reload
    /// and Kafka answers. One tenant's database being down does not make the fleet unready.
    pub fn health(&self) -> crate::health::Health {
        self.health.clone()
    }

    /// The connection a tenant's `database` names.
    fn connection(&self, database: &str) -> Option<&DbConfig> {
        if database == DEFAULT_DATABASE {
            Some(&self.control)
        } else {
            self.config.databases.get(database)
        }
    }

    /// What should run now: the registry's enabled tenants and the discovered schemas,
    /// grouped by the outbox they name.
    async fn wanted(
        &self,
        c: &tokio_postgres::Client,
        unknown: &mut std::collections::HashSet<(String, String)>,
    ) -> Result<BTreeMap<Target, Drainer>, FleetError> {
        let mut all = Vec::new();
        if self.config.registry {
            all.extend(registry::list_on(c, &self.control.schema).await?);
        }
        if let Some(pattern) = &self.config.discover {
            for s in registry::discover_on(c, pattern).await? {
                if s == self.control.schema && self.config.registry {
                    // The control schema holds the registry; publish it only when listed.
                    continue;
                }
                all.push(Tenant {
                    tenant: s.name().to_owned(),
                    database: DEFAULT_DATABASE.to_owned(),
                    schema: s,
                    enabled: true,
                    weight: 1,
                });
            }
        }
        let mut out: BTreeMap<Target, Drainer> = BTreeMap::new();
        for t in all.into_iter().filter(|t| t.enabled) {
            let Some(db) = self.connection(&t.database) else {
                if unknown.insert((t.tenant.clone(), t.database.clone())) {
                    warn!(tenant = %t.tenant, database = %t.database, "tenant names a database this relay was not given (--database NAME=URL); not published");
                }
                continue;
            };
            let target = Target {
                server: server_of(db),
                schema: t.schema.name().to_owned(),
            };
            match out.get_mut(&target) {
                Some(d) => {
                    // Another name for an outbox already listed: one drainer, never two.
                    d.tenants.push(t.tenant);
                }
                None => {
                    out.insert(
                        target,
                        Drainer {
                            tenants: vec![t.tenant],
                            database: t.database,
                            schema: t.schema,
                            weight: t.weight,
                            passes: 0,
                            first_pass: None,
                        },
                    );
                }
            }
        }
        Ok(out)
    }

    fn start(&self, d: &Drainer, sharing: &Sharing) -> Result<Running, FleetError> {
        let mut db = self
            .connection(&d.database)
            .expect("checked by wanted")
            .clone();
        db.schema = d.schema.clone();
        let mut config = self.config.relay.clone();
        // The database's shared LISTEN session wakes it.
        config.listen = false;
        if config.floor_sample_interval.is_zero() {
            config.floor_sample_interval = RelayConfig::FLEET_FLOOR_SAMPLE_INTERVAL;
        }
        if d.database != DEFAULT_DATABASE {
            if let Some(eo) = config.exactly_once.as_mut() {
                // Same schema name in two databases: distinct transactional ids and progress.
                eo.transactional_id_prefix =
                    format!("{}-{}", eo.transactional_id_prefix, d.database);
                eo.progress_topic = format!("{}.{}", eo.progress_topic, d.database);
            }
        }
        let database = &sharing.databases[&d.database];
        database.locks.expect(d.schema.name());
        sharing.gauges.admit(&d.tenants[0]);
        let mut relay = Relay::with_shared(
            &db,
            &self.kafka,
            config,
            Shared {
                pool: Some(database.pool.clone()),
                locks: Some(database.locks.clone()),
                producer: sharing.producer.clone(),
            },
        )?;
        database.follow(d.schema.notify_channel(), relay.waker());
        let weight = Arc::new(AtomicU32::new(d.weight));
        let id = seat_id(&d.database, &d.schema);
        relay.seat(Seat {
            gate: self.gate.clone(),
            id,
            weight: weight.clone(),
            quantum: self.config.quantum,
            idle_poll: self.config.idle_poll,
            tenant: Arc::from(d.tenants[0].as_str()),
            gauges: sharing.gauges.clone(),
        });
        let stop = CancellationToken::new();
        let (tenant, until) = (d.tenants[0].clone(), stop.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = relay.run(until.cancelled_owned()).await {
                warn!(tenant = %tenant, error = %e, "tenant's relay ended");
            }
        });
        info!(tenants = ?d.tenants, database = %d.database, schema = %d.schema, weight = d.weight, "publishing tenant");
        Ok(Running {
            drainer: d.clone(),
            weight,
            stop,
            task,
        })
    }

    /// Reloads until `shutdown` resolves, then stops every tenant's relay (each finishes its
    /// batch and flushes) and returns.
    ///
    /// # Errors
    /// None at present: a registry that cannot be read is retried at the next reload, with
    /// the tenants already running left as they are.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), FleetError> {
        let cancel = CancellationToken::new();
        {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                shutdown.await;
                cancel.cancel();
            });
        }
        let wake = Arc::new(tokio::sync::Notify::new());
        let pool_size = self.config.pool_size()?;
        let mut databases = HashMap::new();
        databases.insert(
            DEFAULT_DATABASE.to_owned(),
            shared::Database::new(&self.control, pool_size, cancel.clone())?,
        );
        for (name, db) in &self.config.databases {
            databases.insert(
                name.clone(),
                shared::Database::new(db, pool_size, cancel.clone())?,
            );
        }
        let control = &databases[DEFAULT_DATABASE];
        control.follow_registry(
            format!("outbox_tenants:{}", self.control.schema.name()),
            wake.clone(),
        );
        let prober = crate::health::spawn_prober(
            self.health.clone(),
            control.pool.clone(),
            self.control.clone(),
            self.kafka.clone(),
            cancel.clone(),
        );
        let producer = if self.config.relay.exactly_once.is_none() {
            Some(SharedProducer::new(
                &shared_producer_config(&self.kafka),
                &self.config.relay,
            )?)
        } else {
            None
        };
        let sharing = Sharing {
            databases,
            producer,
            gauges: Arc::new(TenantGauges::new(self.config.tenant_labels)),
        };
        {
            // The relays record their gauges every 15 s; published here, labels capped.
            let (gauges, cancel) = (sharing.gauges.clone(), cancel.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => gauges.publish(),
                    }
                }
            });
        }
        let mut running: HashMap<Target, Running> = HashMap::new();
        let mut unknown = std::collections::HashSet::new();
        let outage = crate::outage::Outage::new("Postgres (the fleet's registry)", "fleet");
        while !cancel.is_cancelled() {
            self.health.beat(
                "fleet",
                self.config.reload_interval * 3 + Duration::from_secs(30),
            );
            let wanted = match sharing.databases[DEFAULT_DATABASE].pool.get().await {
                Ok(c) => self.wanted(&c, &mut unknown).await,
                Err(e) => Err(FleetError::Invalid(format!("control database: {e}"))),
            };
            match wanted {
                Ok(wanted) => {
                    outage.ok();
                    self.health.condition("registry", Ok(()));
                    self.apply(wanted, &mut running, &sharing);
                }
                Err(e) => {
                    self.health.condition("registry", Err(e.to_string()));
                    outage.failed(&format!("registry not read; tenants keep running: {e}"));
                }
            }
            tokio::select! {
                () = cancel.cancelled() => {}
                () = wake.notified() => {}
                () = tokio::time::sleep(self.config.reload_interval) => {}
            }
        }
        self.health.stopping();
        for r in running.values() {
            r.stop.cancel();
        }
        for (_, r) in running.drain() {
            let _ = r.task.await;
        }
        if let Some(p) = &sharing.producer {
            let (p, budget) = (p.clone(), self.config.relay.shutdown_timeout);
            let _ = tokio::task::spawn_blocking(move || p.flush(budget)).await;
        }
        prober.abort();
        info!("fleet stopped");
        Ok(())
    }

    /// Starts what is wanted and not running, stops what runs and is not wanted, updates
    /// weights and names in place.
    fn apply(
        &self,
        wanted: BTreeMap<Target, Drainer>,
        running: &mut HashMap<Target, Running>,
        sharing: &Sharing,
    ) {
        let gone: Vec<Target> = running
            .keys()
            .filter(|t| !wanted.contains_key(*t))
            .cloned()
            .collect();
        for t in gone {
            let r = running.remove(&t).expect("listed");
            info!(tenants = ?r.drainer.tenants, schema = %r.drainer.schema, "tenant removed or disabled; stopping its relay");
            r.stop.cancel();
            sharing.databases[&r.drainer.database].unfollow(&r.drainer.schema.notify_channel());
            self.gate
                .forget(seat_id(&r.drainer.database, &r.drainer.schema));
            sharing.gauges.forget(&r.drainer.tenants[0]);
            // It finishes its batch and flushes on its own task; nothing waits for it here.
            drop(r.task);
        }
        for (t, d) in wanted {
            match running.get_mut(&t) {
                Some(r) => {
                    r.weight.store(d.weight, Ordering::Relaxed);
                    r.drainer.weight = d.weight;
                    r.drainer.tenants = d.tenants;
                }
                None => match self.start(&d, sharing) {
                    Ok(r) => {
                        running.insert(t, r);
                    }
                    Err(e) => {
                        warn!(tenants = ?d.tenants, error = %e, "tenant's relay not started; retried at the next reload");
                    }
                },
            }
        }
        let mut view: Vec<Drainer> = running.values().map(|r| r.drainer.clone()).collect();
        view.sort_by(|a, b| a.tenants[0].cmp(&b.tenants[0]));
        *self.view.inner.lock().expect("fleet view") = view;
    }
}

/// `host:port/database` of a connection: two names for it are one server.
fn server_of(db: &DbConfig) -> String {
    let hosts: Vec<String> = db
        .pg
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(s) => s.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = db.pg.get_ports().iter().map(u16::to_string).collect();
    format!(
        "{}:{}/{}",
        hosts.join(","),
        ports.join(","),
        db.pg.get_dbname().unwrap_or("")
    )
}

/// The Kafka settings of a fleet's shared producer: the user's, with the fleet's
/// [`FleetConfig::DEFAULT_LINGER_MS`] unless they set `linger.ms` themselves.
fn shared_producer_config(kafka: &KafkaConfig) -> KafkaConfig {
    let mut kafka = kafka.clone();
    kafka
        .properties
        .entry("linger.ms".to_owned())
        .or_insert_with(|| FleetConfig::DEFAULT_LINGER_MS.to_string());
    kafka
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_producer_lingers_a_millisecond_unless_told_otherwise() {
        let kafka = KafkaConfig::new("127.0.0.1:9092").unwrap();
        let shared = shared_producer_config(&kafka);
        assert_eq!(
            shared.properties.get("linger.ms").map(String::as_str),
            Some("1")
        );
        let mut told = kafka.clone();
        told.set_from_pair("linger.ms=0").unwrap();
        let shared = shared_producer_config(&told);
        assert_eq!(
            shared.properties.get("linger.ms").map(String::as_str),
            Some("0")
        );
        // The user's other settings pass through untouched.
        assert_eq!(shared.bootstrap_servers, "127.0.0.1:9092");
    }
}
