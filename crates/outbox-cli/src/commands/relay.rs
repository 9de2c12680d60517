//! `outbox relay`: Run the publisher sidecar until SIGTERM/SIGINT.

use std::io::Write;
use std::time::Duration;

use clap::Args as ClapArgs;

use crate::args::*;
use outbox::{Relay, RelayConfig};

/// Run the publisher sidecar until SIGTERM/SIGINT.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    kafka: KafkaArgs,
    #[command(flatten)]
    cleanup: CleanupArgs,
    /// Rows claimed per pass.
    #[arg(long, default_value_t = outbox::RelayConfig::DEFAULT_BATCH_SIZE)]
    batch_size: usize,
    /// Batches in flight at once: the next is claimed and the previous marked while one
    /// waits for Kafka's acks (1 = one at a time). Each takes a pooled connection.
    #[arg(long, default_value_t = outbox::RelayConfig::DEFAULT_IN_FLIGHT_BATCHES)]
    in_flight_batches: usize,
    /// Attempts before a row becomes failed.
    #[arg(long, default_value_t = outbox::RelayConfig::DEFAULT_MAX_ATTEMPTS)]
    max_attempts: i32,
    /// Idle poll period (notifications wake the relay sooner).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    poll_interval: Duration,
    /// librdkafka message.timeout.ms; unreported rows stay pending after it.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    delivery_timeout: Duration,
    /// Flush budget at shutdown.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    shutdown_timeout: Duration,
    /// How often to run cleanup, or "off".
    #[arg(long, default_value = "1h", value_parser = parse_interval)]
    cleanup_interval: Interval,
    /// Do not LISTEN for the enqueue trigger's notifications; rely on polling only.
    #[arg(long)]
    no_listen: bool,
    /// How often to re-count relays and rebalance ordering lanes (dead relays' lanes are
    /// taken over within this interval).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    rebalance_interval: Duration,
    /// How often to look below the claim floor for rows of very long transactions and rows
    /// put back to pending by hand.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    sweep_interval: Duration,
    /// A transaction open longer than this after inserting outbox rows stops holding the
    /// claim floor back; its rows are published by the next sweep after it commits.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    long_transaction: Duration,
    /// Serve Prometheus /metrics, and the probes /healthz (live) and /readyz (Postgres and Kafka
    /// reachable, not shutting down), on this address (e.g. 127.0.0.1:9187).
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// A host name /metrics also answers to (repeat for several), besides IP literals and
    /// localhost: the name the scraper uses, e.g. a Kubernetes Service's. Others get 403.
    #[arg(
        long = "metrics-allowed-host",
        value_name = "NAME",
        requires = "metrics_addr"
    )]
    metrics_allowed_hosts: Vec<String>,
    /// Publish each row exactly once to read_committed readers: every batch in a Kafka
    /// transaction with a progress record of the ids it published (docs/EXACTLY_ONCE.md).
    #[arg(long)]
    exactly_once: bool,
    /// The compacted topic of progress records (exactly-once; created when missing, one
    /// partition per slot).
    #[arg(long, default_value = outbox::ExactlyOnce::DEFAULT_PROGRESS_TOPIC, requires = "exactly_once")]
    progress_topic: String,
    /// The start of each slot's transactional.id (exactly-once): `<prefix>-<schema>-<slot>`.
    #[arg(long, default_value = "outbox", requires = "exactly_once")]
    transactional_id_prefix: String,
    /// transaction.timeout.ms (exactly-once): how long a dead owner's open transaction can
    /// hold read_committed readers back, unless a new owner fences it sooner.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, requires = "exactly_once")]
    transaction_timeout: Duration,
    /// The topics file whose `format` entries say which topics carry a schema (Avro,
    /// Protobuf, JSON Schema): their rows are encoded and framed through the registry.
    #[arg(long, requires = "schema_registry_url")]
    topics_file: Option<String>,
    /// The schema registry's Confluent-compatible API, e.g.
    /// http://127.0.0.1:18081/apis/ccompat/v7 (with --topics-file).
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    schema_registry_url: Option<String>,
    /// Publish the outboxes of the registry (`outbox tenants`) in --schema instead of --schema's
    /// own outbox: one relay for many schemas and databases.
    #[arg(long)]
    tenants: bool,
    /// Also publish every schema of the database whose name matches this LIKE pattern and
    /// holds an outbox (e.g. 'tenant_%'); with or without --tenants.
    #[arg(long, value_name = "PATTERN")]
    discover: Option<String>,
    /// A database tenants name (repeatable), NAME=URL; `default` is DATABASE_URL's. Also read
    /// from OUTBOX_DATABASE_<NAME> variables, so URLs with passwords stay off the command line.
    #[arg(long = "database", value_name = "NAME=URL")]
    databases: Vec<String>,
    /// Fleet: passes running at once across tenants.
    #[arg(long, default_value_t = outbox::fleet::FleetConfig::DEFAULT_PASSES)]
    fleet_passes: usize,
    /// Fleet: batches one tenant's pass may claim before the next tenant's turn.
    #[arg(long, default_value_t = outbox::fleet::FleetConfig::DEFAULT_QUANTUM)]
    fleet_quantum: usize,
    /// Fleet: Postgres sessions in all, shared equally by the databases it may use (however
    /// many tenants they hold).
    #[arg(long, default_value_t = outbox::fleet::FleetConfig::DEFAULT_CONNECTION_BUDGET)]
    connection_budget: usize,
    /// Fleet: tenants whose backlog gauges get their own `tenant` label; the rest are summed
    /// under tenant="other".
    #[arg(long, default_value_t = outbox::fleet::FleetConfig::DEFAULT_TENANT_LABELS)]
    tenant_labels: usize,
    /// Fleet: how long an idle tenant waits for a notification before it looks anyway (each
    /// tenant between half and one and a half of it; a tenant with rows backed off polls at
    /// --poll-interval).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    fleet_idle_poll: Duration,
}

pub async fn run(args: Args, _out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        kafka,
        cleanup,
        batch_size,
        in_flight_batches,
        max_attempts,
        poll_interval,
        delivery_timeout,
        shutdown_timeout,
        cleanup_interval,
        no_listen,
        rebalance_interval,
        sweep_interval,
        long_transaction,
        metrics_addr,
        metrics_allowed_hosts,
        exactly_once,
        progress_topic,
        transactional_id_prefix,
        transaction_timeout,
        topics_file,
        schema_registry_url,
        tenants,
        discover,
        databases,
        fleet_passes,
        fleet_quantum,
        connection_budget,
        tenant_labels,
        fleet_idle_poll,
    } = args;
    if let Some(url) = &schema_registry_url {
        crate::redact::register_url(url);
    }
    let schemas = match (&topics_file, &schema_registry_url) {
        (Some(file), Some(url)) => Some(
            outbox::schemas::SchemaConfig::from_topics_file(url, file)
                .and_then(outbox::schemas::Schemas::new)
                .map_err(|e| UsageError(e.to_string()))?,
        ),
        _ => None,
    };
    let db = db_config(&db)?;
    let kafka = kafka_config(&kafka)?;
    let config = {
        let mut c = RelayConfig::default();
        c.batch_size = batch_size;
        c.max_attempts = max_attempts;
        c.poll_interval = poll_interval;
        c.delivery_timeout = delivery_timeout;
        c.shutdown_timeout = shutdown_timeout;
        c.listen = !no_listen;
        c.cleanup = cleanup_config(&cleanup, cleanup_interval.0);
        c.rebalance_interval = rebalance_interval;
        c.sweep_interval = sweep_interval;
        c.long_transaction = long_transaction;
        c.in_flight_batches = in_flight_batches;
        if exactly_once {
            let mut eo = outbox::ExactlyOnce::default();
            eo.progress_topic = progress_topic;
            eo.transactional_id_prefix = transactional_id_prefix;
            eo.transaction_timeout = transaction_timeout;
            c.exactly_once = Some(eo);
        }
        c.schemas = schemas;
        c
    };
    if tenants || discover.is_some() {
        let mut fleet = outbox::fleet::FleetConfig::default();
        fleet.databases = named_databases(&databases)?;
        fleet.registry = tenants;
        fleet.discover = discover;
        fleet.passes = fleet_passes;
        fleet.quantum = fleet_quantum;
        fleet.connection_budget = connection_budget;
        fleet.tenant_labels = tenant_labels;
        fleet.idle_poll = fleet_idle_poll;
        fleet.relay = config;
        let fleet = outbox::fleet::Fleet::new(&db, &kafka, fleet).map_err(|e| match e {
            outbox::fleet::FleetError::Invalid(m) => anyhow::Error::new(UsageError(m)),
            other => anyhow::Error::new(UsageError(other.to_string())),
        })?;
        let stop = tokio_util::sync::CancellationToken::new();
        serve_metrics(
            metrics_addr,
            metrics_allowed_hosts,
            Some(fleet.health()),
            &stop,
        )
        .await?;
        fleet.run(shutdown_signal()).await?;
        stop.cancel();
        return Ok(());
    }
    let relay = Relay::new(&db, &kafka, config).map_err(|e| match e {
        outbox::RelayError::Config(c) => anyhow::Error::new(UsageError(c.to_string())),
        outbox::RelayError::Kafka(k) => {
            anyhow::Error::new(UsageError(format!("kafka configuration: {k}")))
        }
        other => anyhow::Error::new(other),
    })?;
    let stop = tokio_util::sync::CancellationToken::new();
    serve_metrics(
        metrics_addr,
        metrics_allowed_hosts,
        Some(relay.health()),
        &stop,
    )
    .await?;
    relay.run(shutdown_signal()).await?;
    stop.cancel();

    Ok(())
}
