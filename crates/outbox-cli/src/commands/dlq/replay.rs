//! `outbox dlq replay`: Send letters back to their original topic as a throttled, resumable job.

use std::io::Write;
use std::time::Duration;

use clap::Args as ClapArgs;
use outbox::dlq::{Dlq, FromTopicOptions, ReplayOptions};

use super::*;
use crate::args::*;
use crate::progress::Meter;

/// Send letters back to their original topic as a throttled, resumable job.
#[derive(ClapArgs)]
pub struct Args {
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
    /// How long the groups reading the target topics keep processed marks; older letters are
    /// refused (a group whose mark expired would handle them twice).
    #[arg(long, default_value = "35d", value_parser = humantime::parse_duration)]
    marks_retention: std::time::Duration,
    /// Replay letters older than --marks-retention anyway (recorded in the audit).
    #[arg(long)]
    accept_duplicates: bool,
    /// Replay decode, permanent and panic letters: their fix is deployed (recorded in the audit).
    #[arg(long)]
    confirm_kinds: bool,
    /// Replay letters whose group has handled newer messages of their key since (it was not in
    /// strict order): each lands behind those (recorded in the audit).
    #[arg(long)]
    confirm_order: bool,
    /// How long after the job ends a letter coming back to the DLQ still counts as its comeback.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    watch: std::time::Duration,
    /// Who is replaying (audit); default the OS user.
    #[arg(long)]
    actor: Option<String>,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
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
        marks_retention,
        accept_duplicates,
        watch,
        confirm_kinds,
        confirm_order,
        actor,
    } = args;
    // The window decides which letters need --accept-duplicates; an absurd one would stand in
    // for that confirmation, and no group keeps marks for less than an hour or past ten years.
    let hour = Duration::from_secs(3600);
    if marks_retention < hour || marks_retention > 24 * 3650 * hour {
        return Err(UsageError(
            "--marks-retention: 1h to 3650d (how long the target groups keep processed marks)"
                .into(),
        )
        .into());
    }
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
        let r = outbox::dlq::replay_from_topic(&kafka, &topic, &opts, &stop, &mut |r, total| {
            m.update(
                r.read,
                total,
                &format!("replayed {} skipped {}", r.replayed, r.skipped),
            )
        })
        .await
        .map_err(lift)?;
        m.finish();
        if dry_run {
            writeln!(
                out,
                "dry run: would replay {} of {} record(s) read; nothing sent or committed",
                r.replayed, r.read
            )?;
        }
        writeln!(
            out,
            "replayed={} failed={} skipped={} read={}",
            if dry_run { 0 } else { r.replayed },
            r.failed,
            r.skipped,
            r.read
        )?;
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
        c.marks_retention = marks_retention;
        c.accept_duplicates = accept_duplicates;
        c.watch = watch;
        c.confirm_kinds = confirm_kinds;
        c.confirm_order = confirm_order;
        c.actor = actor_or_default(actor);
        c
    };
    let dlq = Dlq::new(&db);
    if dry_run {
        let d = dlq.dry_run(&f, &opts).await.map_err(lift)?;
        writeln!(out,
            "dry run: {} letter(s) would be replayed, {} skipped by the loop guard; nothing changed",
            d.count, d.skipped_loop_guard
        )?;
        for (kind, n) in &d.risky_kinds {
            if !opts.confirm_kinds {
                writeln!(out, "  {n} {kind} letter(s): the replay needs --confirm-kinds (their fix must be deployed)")?;
            }
        }
        if d.passed_by_newer > 0 {
            let ids: Vec<String> = d.passed_sample.iter().map(|i| format!("#{i}")).collect();
            writeln!(
                out,
                "  {} letter(s) ({}) have newer messages of their key already handled by their group: replayed, each lands behind them{}",
                d.passed_by_newer,
                ids.join(" "),
                if opts.confirm_order { " (accepted)" } else { "; the replay needs --confirm-order" }
            )?;
        }
        if d.older_than_marks > 0 && !opts.accept_duplicates {
            writeln!(out, "  {} of them older than the marks retention: the replay needs --accept-duplicates (a group whose mark expired handles them twice)", d.older_than_marks)?;
        } else if d.older_than_marks > 0 {
            writeln!(
                out,
                "  {} of them older than the marks retention (accepted: they may be handled twice)",
                d.older_than_marks
            )?;
        }
        for (t, n) in &d.by_topic {
            writeln!(out, "  {n:>8} → {t}")?;
        }
        for r in &d.sample {
            writeln!(
                out,
                "  {:>9}  {:<24} {}",
                r.id,
                r.failed_at,
                cut(r.error.as_deref().unwrap_or("-"), 80)
            )?;
        }
        writeln!(out, "replayed=0 failed=0")?;
        return Ok(());
    }
    let kafka = kafka_config(&kafka)?;
    let job = dlq.create_job(&f, &opts).await.map_err(lift)?;
    eprintln!(
        "replay job {} created: {} letter(s) frozen, {} skipped by the loop guard; Ctrl-C pauses it (resume: outbox dlq job resume {})",
        job.id, job.pending, job.skipped, job.id
    );
    job::run_job(&dlq, &kafka, job.id, job::How::New, out).await?;

    Ok(())
}
