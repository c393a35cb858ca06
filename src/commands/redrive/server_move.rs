//! The server-side path of `redrive`: the broker moves every message back to its source
//! itself (SQS `StartMessageMoveTask`), and dlqctl plans, confirms, starts it, follows its
//! progress and records it. Chosen only when nothing is filtered and nothing goes elsewhere.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use super::{Progress, ask, cancelled, needs_prompt, print_move_task, watch_signals};
use crate::broker::Broker;
use crate::broker::sqs::MOVE_TASK_MAX_RATE;
use crate::cli::RedriveArgs;
use crate::commands::Context;
use crate::error::{Error, Result};
use crate::redrive::audit::{self, AuditLog, RunInfo};
use crate::redrive::default_runs_dir;
use crate::redrive::engine::Summary;
use crate::redrive::throttle::Rate;

const POLL: Duration = Duration::from_secs(1);

pub async fn run(ctx: &mut Context, args: &RedriveArgs, source: &dyn Broker, dlq: &str, why: &str) -> Result<()> {
    let description = source.describe().await?;
    let rate = match args.rate {
        Rate::PerSecond(n) => Some(n.get().min(MOVE_TASK_MAX_RATE)),
        Rate::Unlimited => None,
    };
    let pace =
        rate.map_or(format!("as fast as the broker allows (at most {MOVE_TASK_MAX_RATE}/s)"), |r| format!("{r}/s"));
    let depth = description.depth.unwrap_or(0);
    let sources = if description.sources.is_empty() { "their sources".into() } else { description.sources.join(", ") };
    if args.dry_run {
        if ctx.out.is_json() {
            return ctx.out.json_line(&json!({
                "dlq": dlq, "path": "server", "why": why, "approximate_messages": depth,
                "sources": description.sources, "rate": rate,
            }));
        }
        let line = format!(
            "dry run: path: server-side move task ({why}); would move about {depth} message(s) from {dlq} back to \
             {sources} at {pace}; nothing was changed"
        );
        std::io::Write::write_all(ctx.out.writer(), format!("{}\n", crate::output::printable(&line)).as_bytes())?;
        return Ok(());
    }
    if needs_prompt(args, dlq)?
        && !ask(format!(
            "Start a server-side move of about {depth} message(s) from {dlq} back to {sources} at {pace}?"
        ))?
    {
        return Err(cancelled());
    }

    let run_id = format!("redrive-{}-{}", Utc::now().format("%Y%m%dT%H%M%SZ"), std::process::id());
    let audit_path = args.audit_log.clone().unwrap_or_else(|| default_runs_dir().join(format!("{run_id}.audit.jsonl")));
    let mut audit = AuditLog::create(
        &audit_path,
        &RunInfo {
            dlq,
            to: Some("the sources (server-side move task)"),
            selection: "everything",
            note: args.note.as_deref(),
            checkpoint: None,
        },
    )?;
    let handle = source.start_move_task(rate).await?;
    audit.event(&json!({"time": audit::now(), "event": "move_task_started", "task": handle, "rate": rate}))?;
    audit.flush()?;
    ctx.out.note(&format!("server-side move task started ({why}); audit log {}", audit.path().display()));

    let interrupted = Arc::new(AtomicBool::new(false));
    watch_signals(interrupted.clone());
    let progress = Progress::new(ctx.out.quiet(), Some(depth));
    let task = loop {
        tokio::time::sleep(POLL).await;
        let task = source.move_task().await?;
        if let Some(t) = &task {
            progress.update(&Summary { moved: t.moved, ..Summary::default() });
            if t.status != "RUNNING" && t.status != "CANCELLING" {
                break task;
            }
        }
        if interrupted.load(Ordering::Relaxed) {
            progress.finish();
            return Err(Error::Finished {
                code: 130,
                message: "stopped following; the move task keeps running on the server: follow it with --status, \
                          stop it with --cancel"
                    .into(),
            });
        }
    };
    progress.finish();
    let task = task.expect("the loop ends on a task");
    audit.event(&json!({
        "time": audit::now(), "event": "move_task_finished", "task": handle,
        "status": task.status, "moved": task.moved, "failure": task.failure,
    }))?;
    audit.flush()?;
    print_move_task(ctx, dlq, Some(&task), false)?;
    match task.status.as_str() {
        "COMPLETED" => Ok(()),
        status => Err(Error::Finished {
            code: 1,
            message: format!(
                "the move task ended {status} after moving {}{}; what it did not move is still in the DLQ",
                task.moved,
                task.failure.as_deref().map(|f| format!(": {f}")).unwrap_or_default()
            ),
        }),
    }
}
