//! `outbox dlq …`: flags in, calls into `outbox::dlq`, text or JSON out. No logic of its own.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use outbox::dlq::{
    Archiver, Dlq, DlqError, Filter, FromTopicOptions, ReplayOptions, RunOutcome, Status,
};
use tokio_util::sync::CancellationToken;

use super::{db_config, kafka_config, shutdown_signal, DbArgs, KafkaArgs, UsageError};

/// Selection flags shared by list, replay and drop.
#[derive(Args, Clone, Default)]
pub struct FilterArgs {
    /// Original topic (e.g. orders.created).
    #[arg(long)]
    topic: Option<String>,
    /// Consumer group that dead-lettered the message.
    #[arg(long)]
    group: Option<String>,
    /// Case-insensitive substring of the error.
    #[arg(long)]
    error_contains: Option<String>,
    /// Exactly this normalised error (a cause group from `dlq summary`).
    #[arg(long)]
    error_group: Option<String>,
    /// x-error-kind: transient-exhausted, permanent, decode, panic, unavailable.
    #[arg(long)]
    kind: Option<String>,
    /// new, replayed or dropped.
    #[arg(long)]
    status: Option<String>,
    /// Dead-lettered at or after: RFC 3339 time or a duration ago (2h).
    #[arg(long)]
    since: Option<String>,
    /// Dead-lettered before: RFC 3339 time or a duration ago.
    #[arg(long)]
    until: Option<String>,
}

impl FilterArgs {
    fn to_filter(&self, ids: &[i64]) -> Result<Filter, UsageError> {
        Ok(Filter {
            ids: ids.to_vec(),
            topic: self.topic.clone(),
            group: self.group.clone(),
            error_contains: self.error_contains.clone(),
            error_group: self.error_group.clone(),
            kind: self.kind.clone(),
            status: self
                .status
                .as_deref()
                .map(str::parse::<Status>)
                .transpose()
                .map_err(|e| UsageError(e.to_string()))?,
            since: self.since.clone(),
            until: self.until.clone(),
        })
    }
}

/// A share: `10%` or `0.1`.
fn parse_share(s: &str) -> Result<f64, String> {
    let v = match s.trim().strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a share: give 10% or 0.1"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{s:?} is out of range: give 0% to 100%"));
    }
    Ok(v)
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a rate: give messages per second"))?;
    if !(v.is_finite() && v > 0.0 && v <= 1_000_000.0) {
        return Err(format!("{s:?} is out of range: 0 < rate <= 1000000"));
    }
    Ok(v)
}

fn parse_id(s: &str) -> Result<i64, String> {
    match s.parse::<i64>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a dead letter id (a positive integer)"
        )),
    }
}

#[derive(Subcommand)]
pub enum DlqAction {
    /// Consume DLQ topics into the archive (sidecar until SIGTERM, or --once).
    Archive {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// DLQ topics to archive (repeatable); default every *.dlq on the cluster.
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// Archive what is there now, then exit.
        #[arg(long)]
        once: bool,
        /// Replayed/dropped letters are purged this long after archiving.
        #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
        retention: Duration,
        /// Dead-letter topic suffix.
        #[arg(long, default_value = "dlq")]
        dlq_suffix: String,
        /// The archiver's consumer group.
        #[arg(long, default_value = outbox::dlq::ARCHIVE_GROUP)]
        archive_group: String,
        /// Serve Prometheus /metrics on this address (sidecar mode).
        #[arg(long)]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// New letters by topic and group, and grouped by cause.
    Summary {
        #[command(flatten)]
        db: DbArgs,
        /// One JSON document instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Letters matching filters, newest first.
    List {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Next page: letters with ids below this.
        #[arg(long)]
        before_id: Option<i64>,
        /// JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One letter: headers, key, body.
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// Archive id.
        #[arg(value_parser = parse_id)]
        id: i64,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Send letters back to their original topic as a throttled, resumable job.
    Replay {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        kafka: KafkaArgs,
        #[command(flatten)]
        filter: FilterArgs,
        /// Archive ids (repeatable).
        #[arg(long = "id", value_parser = parse_id)]
        ids: Vec<i64>,
        /// Replay from this DLQ topic directly (no archive), under --replay-group.
        #[arg(long)]
        from_topic: Option<String>,
        /// Consumer group of --from-topic replays (its offsets say what was replayed).
        #[arg(long, default_value = outbox::dlq::REPLAY_GROUP)]
        replay_group: String,
        /// Send to this topic instead of the original.
        #[arg(long)]
        to: Option<String>,
        /// Messages per second.
        #[arg(long, default_value = "100", value_parser = parse_rate)]
        rate: f64,
        /// At most this many letters (oldest first).
        #[arg(long)]
        limit: Option<i64>,
        /// Print what would go; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Letters sent first; the rest waits for their outcome (0: no canary).
        #[arg(long, default_value_t = outbox::dlq::DEFAULT_CANARY)]
        canary: u32,
        /// How long to wait for the canary's outcome.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        canary_wait: Duration,
        /// Stop when more than this share of replayed letters comes back (10% or 0.1).
        #[arg(long, default_value = "10%", value_parser = parse_share)]
        max_refail: f64,
        /// Skip letters already replayed this many times.
        #[arg(long, default_value_t = outbox::dlq::DEFAULT_LOOP_GUARD)]
        loop_guard: u32,
        /// Replay letters the loop guard would skip.
        #[arg(long)]
        force: bool,
        /// Allow replaying every new letter (no filter).
        #[arg(long)]
        all: bool,
        /// Who is replaying (audit); default the OS user.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Mark letters dropped, with a reason.
    Drop {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        filter: FilterArgs,
        /// Archive ids (repeatable).
        #[arg(long = "id", value_parser = parse_id)]
        ids: Vec<i64>,
        /// Why (required, audited).
        #[arg(long)]
        reason: String,
        /// Allow dropping every new letter (no filter).
        #[arg(long)]
        all: bool,
        /// Who is dropping (audit); default the OS user.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Who did what, when, to how many letters.
    Audit {
        #[command(flatten)]
        db: DbArgs,
        /// At most this many rows, newest first.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replay jobs, newest first.
    Jobs {
        #[command(flatten)]
        db: DbArgs,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
        /// JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Pause, resume, cancel or show one replay job.
    Job {
        #[command(subcommand)]
        action: JobAction,
    },
}

#[derive(Subcommand)]
pub enum JobAction {
    /// Stop a running job after the letters in flight; resumable.
    Pause {
        #[command(flatten)]
        db: DbArgs,
        /// Job id.
        id: i64,
        /// Who (recorded in the job's reason).
        #[arg(long)]
        actor: Option<String>,
    },
    /// Run a paused, pending or orphaned job in the foreground.
    Resume {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// Job id.
        id: i64,
    },
    /// Cancel a job; unsent letters stay new.
    Cancel {
        #[command(flatten)]
        db: DbArgs,
        /// Job id.
        id: i64,
        /// Who (recorded in the job's reason).
        #[arg(long)]
        actor: Option<String>,
    },
    /// One job and its counts.
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// Job id.
        id: i64,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Invalid requests exit 2, everything else 1.
fn lift(e: DlqError) -> anyhow::Error {
    if e.is_invalid() {
        anyhow::Error::new(UsageError(e.to_string()))
    } else {
        anyhow::Error::new(e)
    }
}

/// A progress bar on a terminal; otherwise a plain line at the first update and every 5 s.
pub(crate) struct Meter {
    bar: Option<indicatif::ProgressBar>,
    last: Instant,
    label: String,
}

impl Meter {
    pub(crate) fn new(label: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:40}] {pos}/{len} {msg} ({eta} left)",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b.set_prefix(label.to_owned());
            b
        });
        Self {
            bar,
            last: Instant::now() - Duration::from_secs(3600),
            label: label.to_owned(),
        }
    }

    pub(crate) fn update(&mut self, pos: u64, total: u64, msg: &str) {
        match &self.bar {
            Some(b) => {
                b.set_length(total);
                b.set_position(pos);
                b.set_message(msg.to_owned());
            }
            None if self.last.elapsed() >= Duration::from_secs(5) => {
                self.last = Instant::now();
                eprintln!("{}: {pos}/{total} {msg}", self.label);
            }
            None => {}
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn actor_or_default(a: Option<String>) -> String {
    a.unwrap_or_else(outbox::dlq::default_actor)
}

fn age(secs: Option<f64>) -> String {
    secs.map_or_else(
        || "-".into(),
        |s| humantime::format_duration(Duration::from_secs(s.max(0.0) as u64)).to_string(),
    )
}

fn cut(s: &str, n: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= n {
        one_line
    } else {
        format!("{}…", one_line.chars().take(n - 1).collect::<String>())
    }
}

/// A token cancelled by SIGINT/SIGTERM.
fn interrupt_token() -> CancellationToken {
    let t = CancellationToken::new();
    let t2 = t.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        t2.cancel();
    });
    t
}

pub async fn run(action: DlqAction) -> anyhow::Result<()> {
    match action {
        DlqAction::Archive {
            db,
            kafka,
            topics,
            once,
            retention,
            dlq_suffix,
            archive_group,
            metrics_addr,
        } => {
            let stop = CancellationToken::new();
            if let Some(addr) = metrics_addr {
                let s = stop.clone();
                outbox::metrics::serve(addr, async move { s.cancelled().await })
                    .await
                    .map_err(|e| UsageError(format!("--metrics-addr {addr}: {e}")))?;
            }
            let db = db_config(&db)?;
            let kafka = kafka_config(&kafka)?;
            let a = Archiver::new(&db, &kafka, topics)
                .map_err(lift)?
                .suffix(&dlq_suffix)
                .retention(retention)
                .group(&archive_group);
            let r = if once {
                let mut m = Meter::new("archive");
                let r = a
                    .run_once(&mut |r, total| {
                        m.update(
                            r.read,
                            total.unwrap_or(r.read),
                            &format!("archived {}", r.archived),
                        )
                    })
                    .await
                    .map_err(lift)?;
                m.finish();
                r
            } else {
                a.run(shutdown_signal()).await.map_err(lift)?
            };
            println!(
                "archived={} duplicates={} read={}",
                r.archived, r.duplicates, r.read
            );
        }
        DlqAction::Summary { db, json } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let s = dlq
                .summary()
                .await
                .map_err(lift)
                .context("summary failed")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
                return Ok(());
            }
            if s.topics.is_empty() {
                println!("the archive is empty (is `outbox dlq archive` running?)");
                return Ok(());
            }
            println!(
                "{:<32} {:<24} {:>8} {:>9} {:>8}  oldest new",
                "TOPIC", "GROUP", "NEW", "REPLAYED", "DROPPED"
            );
            for t in &s.topics {
                println!(
                    "{:<32} {:<24} {:>8} {:>9} {:>8}  {}",
                    cut(&t.original_topic, 32),
                    cut(t.consumer_group.as_deref().unwrap_or("-"), 24),
                    t.new,
                    t.replayed,
                    t.dropped,
                    age(t.oldest_new_age_secs)
                );
            }
            println!();
            println!("CAUSES OF NEW LETTERS ({} groups)", s.groups.len());
            println!(
                "{:>7}  {:<24} {:<16} {:<20} {:>9}  {:<24} {:<24} ERROR",
                "COUNT", "TOPIC", "GROUP", "KIND", "EXAMPLE", "FIRST SEEN", "LAST SEEN"
            );
            for g in &s.groups {
                println!(
                    "{:>7}  {:<24} {:<16} {:<20} {:>9}  {:<24} {:<24} {}",
                    g.count,
                    cut(&g.original_topic, 24),
                    cut(g.consumer_group.as_deref().unwrap_or("-"), 16),
                    g.error_kind.as_deref().unwrap_or("-"),
                    g.example_id,
                    g.first_seen,
                    g.last_seen,
                    cut(&g.error_group, 100)
                );
            }
        }
        DlqAction::List {
            db,
            filter,
            limit,
            before_id,
            json,
        } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let rows = dlq
                .list(&filter.to_filter(&[])?, limit, before_id)
                .await
                .map_err(lift)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            println!(
                "{:>9}  {:<24} {:<8} {:<20} {:<24} {:<16} ERROR",
                "ID", "FAILED AT", "STATUS", "KIND", "TOPIC", "GROUP"
            );
            for r in &rows {
                println!(
                    "{:>9}  {:<24} {:<8} {:<20} {:<24} {:<16} {}",
                    r.id,
                    r.failed_at,
                    r.status,
                    r.error_kind.as_deref().unwrap_or("-"),
                    cut(&r.original_topic, 24),
                    cut(r.consumer_group.as_deref().unwrap_or("-"), 16),
                    cut(r.error.as_deref().unwrap_or("-"), 100)
                );
            }
            if rows.len() as i64 == limit {
                if let Some(last) = rows.last() {
                    eprintln!("more: add --before-id {}", last.id);
                }
            }
        }
        DlqAction::Show { db, id, json } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let d = dlq.show(id).await.map_err(lift)?;
            let j = d.to_json(false);
            if json {
                println!("{}", serde_json::to_string_pretty(&j)?);
                return Ok(());
            }
            for k in [
                "id",
                "status",
                "status_reason",
                "original_topic",
                "original_partition",
                "original_offset",
                "consumer_group",
                "dlq_topic",
                "partition",
                "offset",
                "message_type",
                "message_id",
                "error_kind",
                "error",
                "attempts",
                "dlq_retries",
                "first_failed_at",
                "failed_at",
                "archived_at",
                "times_replayed",
            ] {
                let v = &j[k];
                let text = match v {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Null => "-".into(),
                    other => other.to_string(),
                };
                println!("{k:<19} {text}");
            }
            let bytes = |v: &serde_json::Value| match (v.get("text"), v.get("base64")) {
                (Some(t), _) => t.as_str().unwrap_or("").to_owned(),
                (_, Some(b)) => format!("(base64) {}", b.as_str().unwrap_or("")),
                _ => "(none)".into(),
            };
            println!("key                 {}", bytes(&j["key"]));
            println!("headers:");
            for h in j["headers"].as_array().into_iter().flatten() {
                let v = &h["value"];
                println!(
                    "  {:<24} {}",
                    h["name"].as_str().unwrap_or(""),
                    if v.is_null() {
                        "(null)".into()
                    } else {
                        bytes(v)
                    }
                );
            }
            println!("body:");
            println!("{}", bytes(&j["body"]));
        }
        DlqAction::Replay {
            db,
            kafka,
            filter,
            ids,
            from_topic,
            replay_group,
            to,
            rate,
            limit,
            dry_run,
            canary,
            canary_wait,
            max_refail,
            loop_guard,
            force,
            all,
            actor,
        } => {
            let db = db_config(&db)?;
            let f = filter.to_filter(&ids)?;
            if let Some(topic) = from_topic {
                let kafka = kafka_config(&kafka)?;
                let opts = {
                    let mut c = FromTopicOptions::default();
                    c.filter = f;
                    c.to_topic = to;
                    c.rate = rate;
                    c.limit = limit.map(|l| l.max(0) as u64);
                    c.dry_run = dry_run;
                    c.group = replay_group;
                    c
                };
                let stop = interrupt_token();
                let mut m = Meter::new(&format!("replay {topic}"));
                let r = outbox::dlq::replay_from_topic(
                    &kafka,
                    &topic,
                    &opts,
                    &stop,
                    &mut |r, total| {
                        m.update(
                            r.read,
                            total,
                            &format!("replayed {} skipped {}", r.replayed, r.skipped),
                        )
                    },
                )
                .await
                .map_err(lift)?;
                m.finish();
                if dry_run {
                    println!(
                        "dry run: would replay {} of {} record(s) read; nothing sent or committed",
                        r.replayed, r.read
                    );
                }
                println!(
                    "replayed={} failed={} skipped={} read={}",
                    if dry_run { 0 } else { r.replayed },
                    r.failed,
                    r.skipped,
                    r.read
                );
                if r.failed > 0 {
                    anyhow::bail!(
                        "{} record(s) failed; the group's offsets stop before the first",
                        r.failed
                    );
                }
                return Ok(());
            }
            let opts = {
                let mut c = ReplayOptions::default();
                c.to_topic = to;
                c.rate = rate;
                c.limit = limit;
                c.canary = canary;
                c.canary_wait = canary_wait;
                c.max_refail = max_refail;
                c.loop_guard = loop_guard;
                c.force = force;
                c.all = all;
                c.actor = actor_or_default(actor);
                c
            };
            let dlq = Dlq::new(&db);
            if dry_run {
                let d = dlq.dry_run(&f, &opts).await.map_err(lift)?;
                println!(
                    "dry run: {} letter(s) would be replayed, {} skipped by the loop guard; nothing changed",
                    d.count, d.skipped_loop_guard
                );
                for (t, n) in &d.by_topic {
                    println!("  {n:>8} → {t}");
                }
                for r in &d.sample {
                    println!(
                        "  {:>9}  {:<24} {}",
                        r.id,
                        r.failed_at,
                        cut(r.error.as_deref().unwrap_or("-"), 80)
                    );
                }
                println!("replayed=0 failed=0");
                return Ok(());
            }
            let kafka = kafka_config(&kafka)?;
            let job = dlq.create_job(&f, &opts).await.map_err(lift)?;
            eprintln!(
                "replay job {} created: {} letter(s) frozen, {} skipped by the loop guard; Ctrl-C pauses it (resume: outbox dlq job resume {})",
                job.id, job.pending, job.skipped, job.id
            );
            run_job(&dlq, &kafka, job.id).await?;
        }
        DlqAction::Drop {
            db,
            filter,
            ids,
            reason,
            all,
            actor,
        } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let r = dlq
                .drop_letters(
                    &filter.to_filter(&ids)?,
                    all,
                    &reason,
                    &actor_or_default(actor),
                )
                .await
                .map_err(lift)?;
            println!("dropped={}", r.dropped);
        }
        DlqAction::Audit { db, limit, json } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let rows = dlq.audit(limit).await.map_err(lift)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            println!(
                "{:>7}  {:<24} {:<16} {:<14} {:>8}  REASON / FILTER",
                "ID", "AT", "ACTOR", "ACTION", "COUNT"
            );
            for a in &rows {
                println!(
                    "{:>7}  {:<24} {:<16} {:<14} {:>8}  {} {}",
                    a.id,
                    a.at,
                    cut(&a.actor, 16),
                    a.action,
                    a.count,
                    a.reason.as_deref().unwrap_or(""),
                    cut(&a.filter.to_string(), 120)
                );
            }
        }
        DlqAction::Jobs { db, limit, json } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let jobs = dlq.jobs(limit).await.map_err(lift)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
                return Ok(());
            }
            println!(
                "{:>6}  {:<10} {:<24} {:<14} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9}  REASON",
                "ID",
                "STATUS",
                "CREATED",
                "BY",
                "TOTAL",
                "PENDING",
                "SENT",
                "FAILED",
                "SKIPPED",
                "CAME BACK"
            );
            for j in &jobs {
                println!(
                    "{:>6}  {:<10} {:<24} {:<14} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9}  {}",
                    j.id,
                    format!("{:?}", j.status).to_lowercase(),
                    j.created_at,
                    cut(&j.created_by, 14),
                    j.total,
                    j.pending,
                    j.sent,
                    j.failed,
                    j.skipped,
                    j.came_back,
                    j.status_reason.as_deref().unwrap_or("")
                );
            }
        }
        DlqAction::Job { action } => match action {
            JobAction::Pause { db, id, actor } => {
                let dlq = Dlq::new(&db_config(&db)?);
                let j = dlq
                    .pause_job(id, &actor_or_default(actor))
                    .await
                    .map_err(lift)?;
                println!(
                    "job {} paused ({} sent, {} pending)",
                    j.id, j.sent, j.pending
                );
            }
            JobAction::Cancel { db, id, actor } => {
                let dlq = Dlq::new(&db_config(&db)?);
                let j = dlq
                    .cancel_job(id, &actor_or_default(actor))
                    .await
                    .map_err(lift)?;
                println!(
                    "job {} cancelled ({} sent; {} unsent letter(s) stay new)",
                    j.id, j.sent, j.pending
                );
            }
            JobAction::Resume { db, kafka, id } => {
                let dlq = Dlq::new(&db_config(&db)?);
                let kafka = kafka_config(&kafka)?;
                run_job(&dlq, &kafka, id).await?;
            }
            JobAction::Show { db, id, json } => {
                let dlq = Dlq::new(&db_config(&db)?);
                let j = dlq.job(id).await.map_err(lift)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&j)?);
                } else {
                    let v = serde_json::to_value(&j)?;
                    for (k, v) in v.as_object().into_iter().flatten() {
                        println!("{k:<15} {v}");
                    }
                }
            }
        },
    }
    Ok(())
}

/// Runs a job in the foreground with its progress; the final line is always printed.
async fn run_job(dlq: &Dlq, kafka: &outbox::KafkaConfig, id: i64) -> anyhow::Result<()> {
    let stop = interrupt_token();
    let mut m = Meter::new(&format!("replay job {id}"));
    let outcome = dlq
        .run_job(kafka, id, &stop, &mut |p| {
            m.update(
                p.sent + p.failed + p.skipped,
                p.total,
                &format!("failed {} came back {}", p.failed, p.came_back),
            )
        })
        .await;
    m.finish();
    let outcome = outcome.map_err(lift)?;
    let j = dlq.job(id).await.map_err(lift)?;
    println!(
        "replayed={} failed={} skipped={} came_back={} pending={} job={} status={}",
        j.sent,
        j.failed,
        j.skipped,
        j.came_back,
        j.pending,
        j.id,
        format!("{:?}", j.status).to_lowercase()
    );
    match outcome {
        RunOutcome::Completed if j.failed == 0 => Ok(()),
        RunOutcome::Completed => anyhow::bail!(
            "{} letter(s) could not be replayed (see `outbox dlq job show {id}`)",
            j.failed
        ),
        RunOutcome::Paused(why) => {
            anyhow::bail!("job {id} paused: {why}; resume with `outbox dlq job resume {id}`")
        }
        RunOutcome::Cancelled => anyhow::bail!("job {id} was cancelled"),
        RunOutcome::Stopped(why) => anyhow::bail!("job {id} stopped: {why}"),
    }
}
