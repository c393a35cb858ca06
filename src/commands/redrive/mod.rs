//! `dlqctl redrive`: plan, confirm, then move with the engine; progress on stderr, a
//! summary at the end, an audit log and a checkpoint on disk.

mod server_move;

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use comfy_table::Color;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::Context;
use crate::broker::{self, Broker, Destination, MoveTask, OpenOptions, Sink};
use crate::cli::{Mode, RedriveArgs};
use crate::error::{Error, Result};
use crate::output::{printable, say};
use crate::redrive::audit::{AuditLog, RunInfo};
use crate::redrive::checkpoint::Checkpoint;
use crate::redrive::default_runs_dir;
use crate::redrive::engine::{Engine, Options, Summary};
use crate::redrive::plan::{self, Plan};
use crate::redrive::select::Selection;
use crate::target::mask_input;

/// Whether this redrive is the broker's own server-side move, and why (either way); an error
/// when `--mode server` was asked for something only a client-side move can do.
fn server_path(args: &RedriveArgs, selection: &Selection, source: &dyn Broker) -> Result<(bool, String)> {
    let needs_client = [
        (!selection.is_everything(), "--where"),
        (args.to.is_some(), "--to"),
        (args.limit.is_some(), "--limit"),
        (args.max_redrives.is_some(), "--max-redrives"),
        (args.resume.is_some(), "--resume"),
    ]
    .into_iter()
    .filter_map(|(used, flag)| used.then_some(flag))
    .collect::<Vec<_>>();
    let capable = source.capabilities().server_move;
    match args.mode {
        Mode::Client => Ok((false, "asked for with --mode client".into())),
        Mode::Server if !capable => {
            Err(Error::Usage(format!("{} has no server-side move: use --mode client (or auto)", source.backend())))
        }
        Mode::Server if !needs_client.is_empty() => Err(Error::Usage(format!(
            "a server-side move takes everything back to its source; {} need(s) --mode client",
            needs_client.join(", ")
        ))),
        Mode::Server => Ok((true, "asked for with --mode server".into())),
        Mode::Auto if !capable => Ok((false, "the broker has no server-side move".into())),
        Mode::Auto if needs_client.is_empty() => {
            Ok((true, "nothing is filtered and every message goes back to its source".into()))
        }
        Mode::Auto => Ok((false, format!("{} need(s) it", needs_client.join(", ")))),
    }
}

fn print_move_task(ctx: &mut Context, dlq: &str, task: Option<&MoveTask>, cancelled: bool) -> Result<()> {
    if ctx.out.is_json() {
        return ctx.out.json_line(&serde_json::json!({"dlq": dlq, "move_task": task, "cancelled": cancelled}));
    }
    let Some(task) = task else {
        ctx.out.note(&format!("no server-side move task has run on {dlq}"));
        return Ok(());
    };
    let mut table = ctx.out.table(&["status", "moved", "to move", "failure", "task"]);
    table.add_row(vec![
        if cancelled { "CANCELLING".to_owned() } else { task.status.clone() },
        task.moved.to_string(),
        task.to_move.map_or("?".into(), |n| n.to_string()),
        task.failure.clone().unwrap_or_else(|| "-".into()),
        task.handle.clone().unwrap_or_default(),
    ]);
    ctx.out.print_table(&mut table)
}

/// Moved messages seen again in the DLQ before the run stops.
const MAX_RETURNS: u64 = 5;
/// How often a non-terminal run prints a status line.
const STATUS_EVERY: Duration = Duration::from_secs(5);

pub async fn run(ctx: &mut Context, args: &RedriveArgs) -> Result<()> {
    let selection = Selection::parse(&args.read.filters)?;
    let extra = OpenOptions { keep_partition: args.keep_partition, ..OpenOptions::default() };
    let (target, source) = ctx.open_with(&args.read, extra).await?;
    let dlq = target.to_string();
    if args.status || args.cancel {
        let task = if args.cancel { Some(source.cancel_move_task().await?) } else { source.move_task().await? };
        return print_move_task(ctx, &dlq, task.as_ref(), args.cancel);
    }
    let (server, why) = server_path(args, &selection, source.as_ref())?;
    if server {
        return server_move::run(ctx, args, source.as_ref(), &dlq, &why).await;
    }
    if source.capabilities().server_move {
        ctx.out.note(&format!("path: client-side move by dlqctl ({why})"));
    }
    let to = args.to.as_deref().map(|t| ctx.config.resolve(t)).transpose()?;
    if let Some(to) = &to
        && broker::names_the_same_dlq(&target, to)
    {
        return Err(Error::Usage(format!(
            "--to {to} names the DLQ being redriven ({dlq}): its copies would land back where they came from; \
             name another queue, topic or file"
        )));
    }
    let fixed_destination: Option<Destination> = to.as_ref().map(broker::sink_destination).transpose()?;
    if to.is_none() && source.source_sink().is_none() {
        return Err(Error::Usage(format!(
            "{dlq} cannot send letters back to their sources itself: {}; name the destination with --to \
             (for example --to rabbitmq://HOST/VHOST/QUEUE, sqs://QUEUE or kafka://HOST:PORT/TOPIC)",
            if source.backend() == "archive" {
                "an archive records which queue or topic each letter came from, not how to reach that broker"
            } else {
                "this backend cannot publish"
            }
        )));
    }
    if !args.dry_run {
        // Before the plan, the audit log and the checkpoint: a run that could not remove what
        // it copies (stdin, a read-only archive, one another run holds) stops here, having
        // published nothing and left nothing behind.
        source.begin_consume().await.map_err(|e| match e {
            Error::NotSupported { why, .. } => {
                Error::Usage(format!("cannot redrive {dlq}: a redrive removes what it moves, and {why}"))
            }
            other => other,
        })?;
    }

    let needs_prompt = needs_prompt(args, &dlq)?;
    // What the progress bar counts towards: the plan's count when there is one.
    let mut expected = args.limit;
    if args.dry_run || needs_prompt || args.plan_out.is_some() {
        let plan = plan::build(plan::Request {
            source: source.as_ref(),
            dlq: &dlq,
            selection: &selection,
            limit: args.limit,
            max_redrives: args.max_redrives,
            fixed_destination: fixed_destination.as_ref(),
            plan_out: args.plan_out.as_deref(),
        })
        .await?;
        if args.dry_run {
            print_plan(ctx, &dlq, &selection, &plan)?;
            if let Some(cost) = plan.read_cost {
                ctx.out.note(&format!("planning read every message: {cost}"));
            }
            return Ok(());
        }
        expected = Some(plan.selected - plan.unroutable);
        if needs_prompt && !confirm(ctx, &dlq, &plan)? {
            return Err(cancelled());
        }
    }

    let run_id = format!("redrive-{}-{}", Utc::now().format("%Y%m%dT%H%M%SZ"), std::process::id());
    let runs = default_runs_dir();
    let to_label = fixed_destination.as_ref().map(|d| d.label.as_str());
    let mut checkpoint = match &args.resume {
        Some(path) => Checkpoint::resume(path, &dlq, to_label)?,
        None => Checkpoint::create(&runs.join(format!("{run_id}.checkpoint.jsonl")), &dlq, to_label)?,
    };
    let audit_path = args.audit_log.clone().unwrap_or_else(|| runs.join(format!("{run_id}.audit.jsonl")));
    let selection_text = selection.to_string();
    let mut audit = AuditLog::create(
        &audit_path,
        &RunInfo {
            dlq: &dlq,
            to: to_label,
            selection: &selection_text,
            note: args.note.as_deref(),
            checkpoint: Some(checkpoint.path()),
        },
    )?;
    let owned_sink: Option<Box<dyn Sink>> = match &to {
        Some(to) => Some(broker::open_sink(to, ctx.timeout).await?),
        None => None,
    };
    for note in owned_sink.iter().flat_map(|sink| sink.open_notes()) {
        ctx.out.note(&note);
    }
    let sink: Option<&dyn Sink> = owned_sink.as_deref().or_else(|| source.source_sink());
    ctx.out.note(&format!("audit log {}; checkpoint {}", audit.path().display(), checkpoint.path().display()));

    let interrupted = Arc::new(AtomicBool::new(false));
    watch_signals(interrupted.clone());
    let progress = Progress::new(ctx.out.quiet(), expected);
    let options = Options {
        selection,
        limit: args.limit,
        rate: args.rate,
        batch: args.batch as usize,
        max_redrives: args.max_redrives,
        retries: args.retries,
        max_consecutive_failures: args.max_consecutive_failures,
        max_returns: MAX_RETURNS,
    };
    let summary = Engine {
        source: source.as_ref(),
        dlq: &dlq,
        sink,
        fixed_destination,
        options: &options,
        audit: &mut audit,
        checkpoint: &mut checkpoint,
        interrupted: &interrupted,
        progress: &|s| progress.update(s),
    }
    .run()
    .await?;
    progress.finish();
    print_summary(ctx, &dlq, &summary)?;
    verdict(&summary, &audit, &resume_command(args, &checkpoint))
}

/// The command that continues this run: the targets as the operator typed them (passwords
/// masked), every flag that decides what moves and where, and `--yes` when this run had it.
fn resume_command(args: &RedriveArgs, checkpoint: &Checkpoint) -> String {
    let mut words = vec!["dlqctl".to_owned(), "redrive".to_owned(), mask_input(&args.read.target)];
    let mut flag = |name: &str, value: Option<String>| {
        words.push(name.to_owned());
        words.extend(value);
    };
    if let Some(to) = &args.to {
        flag("--to", Some(mask_input(to)));
    }
    for filter in &args.read.filters {
        flag("--where", Some(filter.clone()));
    }
    if let Some(max) = args.max_redrives {
        flag("--max-redrives", Some(max.to_string()));
    }
    if args.read.skip_invalid {
        flag("--skip-invalid", None);
    }
    if args.keep_partition {
        flag("--keep-partition", None);
    }
    if args.yes {
        flag("--yes", None);
    }
    flag("--resume", Some(checkpoint.path().display().to_string()));
    words.iter().map(|w| shell_quoted(w)).collect::<Vec<_>>().join(" ")
}

/// `word` as a POSIX shell reads it back: bare when it is plain, else in single quotes.
fn shell_quoted(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Whether to ask before moving; a refusal when asking is needed and there is no terminal.
fn needs_prompt(args: &RedriveArgs, dlq: &str) -> Result<bool> {
    let needed = !args.yes && !args.dry_run;
    if needed && !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return Err(Error::Usage(format!(
            "refusing to redrive {dlq} without confirmation, and there is no terminal to ask on: \
             run with --dry-run to see the plan, then with --yes"
        )));
    }
    Ok(needed)
}

/// Ask on the terminal; the default is no.
fn ask(question: String) -> Result<bool> {
    dialoguer::Confirm::new()
        .with_prompt(printable(&question))
        .default(false)
        .interact()
        .map_err(|e| Error::Runtime(format!("cannot ask for confirmation: {e}")))
}

fn cancelled() -> Error {
    Error::Finished { code: 1, message: "redrive cancelled: nothing was moved".into() }
}

fn confirm(ctx: &Context, dlq: &str, plan: &Plan) -> Result<bool> {
    if plan.selected == 0 {
        ctx.out.note(&format!("nothing in {dlq} matches: nothing to redrive"));
        return Ok(false);
    }
    for line in plan_lines(plan) {
        let _ = writeln!(std::io::stderr(), "{}", printable(&line));
    }
    ask(format!(
        "Redrive {} message(s) from {dlq} to {}?",
        plan.selected - plan.unroutable,
        plan.destinations().join(", ")
    ))
}

fn plan_lines(plan: &Plan) -> Vec<String> {
    let mut lines = vec![format!(
        "plan: {} scanned, {} selected, {} not matching, {} over --max-redrives, {} with no known source",
        plan.scanned, plan.selected, plan.skipped, plan.over_max_redrives, plan.unroutable
    )];
    for g in &plan.groups {
        lines.push(format!("  {} <- {} x{} (e.g. {})", g.destination, g.reason, g.count, g.sample_ids.join(", ")));
    }
    lines
}

fn print_plan(ctx: &mut Context, dlq: &str, selection: &Selection, plan: &Plan) -> Result<()> {
    if ctx.out.is_json() {
        let report = serde_json::json!({"dlq": dlq, "selection": selection.to_string(), "plan": plan});
        return ctx.out.json_line(&report);
    }
    let mut table = ctx.out.table(&["destination", "reason", "count", "sample ids"]);
    for g in &plan.groups {
        let color = if g.destination == plan::UNROUTABLE { Color::Red } else { Color::Green };
        table.add_row(vec![
            ctx.out.colored(&g.destination, color),
            g.reason.clone().into(),
            g.count.to_string().into(),
            g.sample_ids.join(", ").into(),
        ]);
    }
    ctx.out.print_table(&mut table)?;
    let moving = plan.selected - plan.unroutable;
    let line = format!(
        "dry run: would move {moving} of {} scanned from {dlq} ({} not matching, {} over --max-redrives, {} staying \
         because their source is unknown); nothing was changed",
        plan.scanned, plan.skipped, plan.over_max_redrives, plan.unroutable
    );
    std::io::Write::write_all(ctx.out.writer(), format!("{}\n", printable(&line)).as_bytes())?;
    Ok(())
}

fn print_summary(ctx: &mut Context, dlq: &str, s: &Summary) -> Result<()> {
    if ctx.out.is_json() {
        return ctx.out.json_line(&serde_json::json!({"dlq": dlq, "summary": s}));
    }
    let mut table =
        ctx.out.table(&["selected", "moved", "skipped", "failed", "no source", "not settled", "still in dlq"]);
    let moved_color = if s.is_clean() { Color::Green } else { Color::Yellow };
    table.add_row(vec![
        s.selected.to_string().into(),
        ctx.out.colored(s.moved, moved_color),
        (s.skipped + s.over_max_redrives).to_string().into(),
        ctx.out.colored(s.failed, if s.failed > 0 { Color::Red } else { Color::Reset }),
        s.unroutable.to_string().into(),
        s.not_settled.to_string().into(),
        s.still_in_dlq.map_or("?".into(), |n| n.to_string()).into(),
    ]);
    ctx.out.print_table(&mut table)
}

/// The exit: 0 when everything selected moved, 130 when interrupted, else 1, with one line
/// saying what to do next.
fn verdict(s: &Summary, audit: &AuditLog, resume: &str) -> Result<()> {
    if s.interrupted {
        return Err(Error::Finished {
            code: 130,
            message: format!("interrupted after moving {}; nothing was lost; continue with {resume}", s.moved),
        });
    }
    if let Some(why) = &s.stopped {
        return Err(Error::Finished {
            code: 1,
            message: format!(
                "stopped: {why}; nothing was lost; details in {}; continue with {resume}",
                audit.path().display()
            ),
        });
    }
    if !s.is_clean() {
        return Err(Error::Finished {
            code: 1,
            message: format!(
                "{} message(s) stayed in the DLQ ({} failed, {} with no known source); reasons in {}",
                s.failed + s.unroutable,
                s.failed,
                s.unroutable,
                audit.path().display()
            ),
        });
    }
    Ok(())
}

/// Ctrl-C or SIGTERM: finish the messages in flight, then stop. A second one ends at once
/// (nothing is lost: unsettled messages are still in the DLQ).
fn watch_signals(interrupted: Arc<AtomicBool>) {
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        for _ in 0..2 {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match &mut term { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            if interrupted.swap(true, Ordering::Relaxed) {
                std::process::exit(130);
            }
            say("stopping after the messages in flight (again to stop now)");
        }
    });
}

/// A bar on a terminal; otherwise a status line every few seconds.
struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
    started: Instant,
    last_line: std::cell::Cell<Instant>,
}

impl Progress {
    fn new(quiet: bool, expected: Option<u64>) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = match expected {
                Some(n) => ProgressBar::new(n),
                None => ProgressBar::new_spinner(),
            };
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{spinner} {wide_bar} {pos} moved  {per_sec}  eta {eta}  {msg}")
                    .expect("valid template"),
            );
            bar
        });
        Progress { bar, quiet, started: Instant::now(), last_line: std::cell::Cell::new(Instant::now()) }
    }

    fn update(&self, s: &Summary) {
        if let Some(bar) = &self.bar {
            bar.set_position(s.moved);
            bar.set_message(format!("{} failed, {} skipped", s.failed, s.skipped));
        } else if !self.quiet && self.last_line.get().elapsed() >= STATUS_EVERY {
            self.last_line.set(Instant::now());
            let rate = s.moved as f64 / self.started.elapsed().as_secs_f64().max(0.001);
            say(&format!("redrive: {} moved, {} failed, {} skipped ({rate:.1}/s)", s.moved, s.failed, s.skipped));
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
