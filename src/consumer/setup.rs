//! What a consumer builds from its configuration before it runs (or becomes a harness): the
//! handlers sorted into their driver's table, the librdkafka settings, the pool, the state its handler tasks share.

use std::collections::HashMap;

use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::dead_letter::DeadLetterLog;
#[cfg(feature = "sqlx")]
use super::driver::Sqlx;
use super::driver::{Pg, Routes, Transactions};
use super::{call, Consumer, ConsumerError, Driver, HandlerRef, Inbox, Shared, Sink};

// The driver is read from the configuration, where the constructor put it.
#[allow(deprecated)]
impl<D> Consumer<D> {
    /// The handlers sorted into the configured driver's table over `pool` (or the service's
    /// sqlx pool); a handler of the other driver is refused, by name.
    pub(super) fn transactions(&self, pool: &Pool) -> Result<Box<dyn Transactions>, ConsumerError> {
        let handlers = self.handlers.clone();
        Ok(match &self.config.driver {
            Driver::TokioPostgres => Box::new(Routes::new(Pg(pool.clone()), handlers)?),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(p) => Box::new(Routes::new(Sqlx(p.clone()), handlers)?),
        })
    }

    /// The group consumer's librdkafka settings: offsets stored only past final outcomes and
    /// auto-committed from there, no topic auto-creation, a bounded prefetch, statistics for
    /// the lag metrics; the pass-through properties win where they set the same name.
    pub(super) fn client_config(&self) -> rdkafka::ClientConfig {
        let mut cc = self.kafka.client_config();
        cc.set("group.id", &self.config.group)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            // Records of aborted Kafka transactions (an exactly-once relay's aborted batch)
            // never reach a handler; librdkafka's default, stated so it cannot drift.
            .set("isolation.level", "read_committed")
            .set("allow.auto.create.topics", "false");
        if !self.kafka.properties.contains_key("auto.offset.reset") {
            cc.set("auto.offset.reset", "earliest");
        }
        if let Some(id) = &self.config.instance_id {
            cc.set("group.instance.id", id);
        }
        // With KIP-848 (`group.protocol=consumer`) the session timeout is the broker's setting.
        let consumer_protocol = self
            .kafka
            .properties
            .get("group.protocol")
            .is_some_and(|p| p == "consumer");
        if !consumer_protocol && !self.kafka.properties.contains_key("session.timeout.ms") {
            let ms = self.config.session_timeout.as_millis();
            cc.set("session.timeout.ms", ms.to_string())
                .set("heartbeat.interval.ms", (ms / 3).max(100).to_string());
        }
        if !self
            .kafka
            .properties
            .contains_key("queued.max.messages.kbytes")
        {
            // Bounds librdkafka's prefetch buffer (per partition), part of "bounded memory".
            cc.set("queued.max.messages.kbytes", "8192");
        }
        if !self.kafka.properties.contains_key("statistics.interval.ms") {
            // Per-partition lag for the metrics comes from librdkafka's statistics.
            cc.set("statistics.interval.ms", "5000");
        }
        cc
    }

    /// The runtime's pool, sized for what holds connections, with handlers' `search_path`.
    pub(super) fn pool(&self) -> Result<Pool, ConsumerError> {
        let mut db = self.db.clone();
        // Connections for what holds them: a transaction per running in-transaction handler,
        // one per mark writer of call handlers (a few: each writes the marks of every call
        // answered meanwhile in one transaction), and two for upkeep, heartbeats and dead
        // letters.
        let holds = self.handlers.values().any(HandlerRef::holds_transaction);
        let calls = self.handlers.values().any(|h| !h.holds_transaction());
        if holds && self.config.concurrency > self.config.transaction_slots() {
            // Said once at start: a service that raised `concurrency` for in-transaction
            // handlers (before `transactions` existed) gets `transactions` of them at once.
            info!(
                concurrency = self.config.concurrency,
                transactions = self.config.transaction_slots(),
                "in-transaction handlers run at most `transactions` at once; raise ConsumerConfig::transactions for more"
            );
        }
        // With sqlx the handlers' transactions come from the service's pool, not ours.
        let own_tx = matches!(self.config.driver, Driver::TokioPostgres);
        #[cfg(feature = "sqlx")]
        if let Driver::Sqlx(p) = &self.config.driver {
            let max = p.options().get_max_connections() as usize;
            if holds && max < self.config.transaction_slots() {
                info!(
                    max_connections = max,
                    transactions = self.config.transaction_slots(),
                    "the sqlx pool has fewer connections than ConsumerConfig::transactions: handlers wait for its connections"
                );
            }
        }
        db.pool_size = if holds && own_tx {
            self.config.transaction_slots()
        } else {
            0
        } + if calls {
            call::writers(self.config.concurrency)
        } else {
            0
        } + 2;
        // Handlers see the consumer's schema first, so their business tables (which live next
        // to processed_messages) resolve without qualification.
        let opts = format!(
            "{} -c search_path={},public",
            db.pg.get_options().unwrap_or(""),
            db.schema.name()
        );
        db.pg.options(opts.trim());
        crate::db::pool(&db).map_err(|e| ConsumerError::Config(format!("pool: {e}")))
    }

    /// What every handler task shares, from this consumer's parts.
    ///
    /// # Errors
    /// [`ConsumerError::Config`] when a tenant database's pool cannot be built.
    pub(super) fn into_shared(
        self,
        tx: Box<dyn Transactions>,
        pool: Pool,
        producer: Sink,
        cancel: CancellationToken,
        retry_topics: HashMap<String, (String, usize)>,
        drain_topics: HashMap<String, String>,
    ) -> Result<Shared, ConsumerError> {
        let has_calls = self.handlers.values().any(|h| !h.holds_transaction());
        let holds = super::holds::Holds::new(
            self.config.strict_order.as_ref(),
            self.holds_stale.clone(),
            &self.db.schema,
        );
        let tenants = self
            .config
            .tenants
            .as_ref()
            .map(|t| {
                super::tenants::Router::new(
                    t,
                    pool.clone(),
                    #[cfg(feature = "sqlx")]
                    match &self.config.driver {
                        super::Driver::Sqlx(p) => Some(p.clone()),
                        super::Driver::TokioPostgres => None,
                    },
                    &self.db.schema,
                    &self.config.group,
                )
            })
            .transpose()
            .map_err(|e| ConsumerError::Config(format!("tenant routing: {e}")))?;
        Ok(Shared {
            tenants,
            health: self.health.clone(),
            dlq: crate::dlq::Dlq::with_pool(pool.clone(), self.db.schema.clone()),
            dead_lettered: DeadLetterLog::new(&self.db.schema, &self.config.group, &self.kafka),
            pool,
            producer,
            tx,
            inbox: Inbox::new(&self.db.schema, self.config.group.clone()),
            retry_topics,
            drain_topics,
            config: self.config,
            stats: self.stats,
            cancel,
            breakers: self.breakers,
            freshness: self.freshness,
            pg_outage: crate::outage::Outage::new("postgres", "consumer"),
            registry_outage: crate::outage::Outage::new("schema registry", "consumer"),
            marks: call::Marks::default(),
            has_calls,
            db_schema: self.db.schema.clone(),
            holds,
        })
    }

    /// With a breaker: each DLQ topic the group reads during drains → its main topic.
    pub(super) fn drain_topics(&self) -> HashMap<String, String> {
        if self.config.breaker.is_none() {
            return HashMap::new();
        }
        self.config
            .topics
            .iter()
            .map(|t| (self.config.dlq_topic(t), t.clone()))
            .collect()
    }
}
