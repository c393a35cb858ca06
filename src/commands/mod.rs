//! One module per verb. This file holds what they share: the runtime, the context
//! (config, output), opening a target, and turning errors into exit codes.

use std::process::ExitCode;
use std::time::Duration;

use chrono::Utc;
use futures::{StreamExt, TryStreamExt};

use crate::broker::{self, Broker, LetterStream, OpenOptions};
use crate::cli::{Cli, Command, ReadArgs, RedactArgs};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::output::Output;
use crate::redact::Redactor;
use crate::redrive::select::{ReasonFrom, Selection};
use crate::target::Target;

mod export;
mod lint;
mod list;
mod peek;
mod redrive;
mod summarize;

/// What every verb gets: the loaded config and the output sink.
pub struct Context {
    pub config: Config,
    pub out: Output,
    /// `--timeout`: the longest wait for any one answer from a broker.
    pub timeout: Duration,
}

impl Context {
    /// Resolve and open the DLQ named on the command line.
    pub async fn open(&self, read: &ReadArgs) -> Result<(Target, Box<dyn Broker>)> {
        self.open_with(read, OpenOptions::default()).await
    }

    /// [`Context::open`], with options only some verbs have (`--keep-partition`).
    pub async fn open_with(&self, read: &ReadArgs, extra: OpenOptions) -> Result<(Target, Box<dyn Broker>)> {
        let target = self.config.resolve(&read.target)?;
        let options = OpenOptions {
            timeout: self.timeout,
            skip_invalid: read.skip_invalid,
            max_line: (read.max_line_mib as usize) << 20,
            force: read.force,
            from_beginning: read.from_beginning,
            ..extra
        };
        let broker = broker::open(&target, &options).await?;
        Ok((target, broker))
    }

    /// [`Context::open`] for a verb that shows neither bodies nor headers (summarize): they are
    /// still read when `--where` or `--reason-from` look into them.
    pub async fn open_for_summary(&self, read: &ReadArgs) -> Result<(Target, Box<dyn Broker>)> {
        let selection = Selection::parse(&read.filters)?;
        let reason_from = read.reason_from.as_deref().map(ReasonFrom::parse).transpose()?;
        let bodies = selection.reads_bodies() || reason_from.as_ref().is_some_and(ReasonFrom::reads_bodies);
        let headers = selection.reads_headers() || reason_from.as_ref().is_some_and(ReasonFrom::reads_headers);
        self.open_with(read, OpenOptions { bodies, headers, ..OpenOptions::default() }).await
    }

    /// Read the DLQ without consuming it: the messages `--where` selects, at most `limit`.
    /// Says on stderr what reading costs on this broker, once the read has begun (so a
    /// mistyped DLQ gets only its error).
    pub async fn letters<'a>(
        &self,
        broker: &'a dyn Broker,
        read: &ReadArgs,
        limit: Option<u64>,
    ) -> Result<LetterStream<'a>> {
        let selection = Selection::parse(&read.filters)?;
        let reason_from = read.reason_from.as_deref().map(ReasonFrom::parse).transpose()?;
        // Without a selection the broker can stop reading at the limit itself.
        let read_limit = if selection.is_everything() { limit } else { None };
        let now = Utc::now();
        let letters = broker.peek(read_limit).await?;
        if let Some(cost) = broker.capabilities().peek_cost {
            self.out.note(cost);
        }
        if reason_from.is_none() && selection.is_everything() {
            // Nothing to change or leave out, and the broker stops at the limit: each adapter
            // below would only move every letter once more.
            return Ok(letters);
        }
        let selected = letters
            .map_ok(move |mut letter| {
                if let Some(from) = &reason_from {
                    from.apply(&mut letter);
                }
                letter
            })
            .try_filter(move |letter| std::future::ready(selection.matches(letter, now)));
        Ok(match limit {
            Some(n) => selected.take(usize::try_from(n).unwrap_or(usize::MAX)).boxed(),
            None => selected.boxed(),
        })
    }

    /// Options for verbs that only list or lint.
    pub fn open_options(&self) -> OpenOptions {
        OpenOptions { timeout: self.timeout, ..OpenOptions::default() }
    }

    /// The config file's `[redact] fields` alone, for verbs without `--redact` that still show
    /// what messages carry (summarize's group keys).
    pub fn config_redactor(&self) -> Redactor {
        Redactor::new(&self.config.redact.fields)
    }

    /// `--redact` fields plus the config file's `[redact] fields`.
    pub fn redactor(&self, args: &RedactArgs) -> Redactor {
        Redactor::new(self.config.redact.fields.iter().chain(&args.fields))
    }

    /// Print what the backend learned while reading (skipped lines, incomplete scans).
    pub fn report_read_notes(&self, broker: &dyn Broker) {
        for note in broker.read_notes() {
            self.out.note(&note);
        }
    }
}

/// Run a parsed command line to completion and map the outcome to an exit code.
pub fn run(cli: Cli) -> ExitCode {
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            crate::output::say(&e.to_string());
            ExitCode::from(e.exit_code())
        }
    }
}

fn execute(cli: Cli) -> Result<()> {
    let config = Config::load(cli.config.as_deref())?;
    let out = Output::new(cli.output, cli.color, cli.quiet);
    let mut ctx = Context { config, out, timeout: Duration::from_secs_f64(cli.timeout) };
    // One thread is plenty for a CLI that waits on I/O, and it starts fastest.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    let outcome = runtime.block_on(async {
        match &cli.command {
            Command::List(args) => list::run(&mut ctx, args).await,
            Command::Peek(args) => peek::run(&mut ctx, args).await,
            Command::Summarize(args) => summarize::run(&mut ctx, args).await,
            Command::Export(args) => export::run(&mut ctx, args).await,
            Command::Redrive(args) => redrive::run(&mut ctx, args).await,
            Command::Lint(args) => lint::run(&mut ctx, args).await,
        }
    });
    // What is still running now is a blocking broker call --timeout gave up on (a commit to a
    // stalled coordinator): the run has accounted for it, so exit without waiting for it.
    runtime.shutdown_background();
    outcome?;
    ctx.out.finish()
}

/// `3d4h`, `2h5m`, `42s`: the two largest units, enough to read at a glance.
pub fn format_age(age: Duration) -> String {
    let secs = age.as_secs();
    if secs == 0 && !age.is_zero() {
        return format!("{}ms", age.as_millis());
    }
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(format_age(Duration::from_secs(42)), "42s");
        assert_eq!(format_age(Duration::from_millis(200)), "200ms");
        assert_eq!(format_age(Duration::from_secs(125)), "2m5s");
        assert_eq!(format_age(Duration::from_secs(3 * 3600 + 60)), "3h1m");
        assert_eq!(format_age(Duration::from_secs(2 * 86_400 + 5 * 3600 + 7)), "2d5h");
    }
}
