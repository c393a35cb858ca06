//! The command line, as clap definitions. Completions and the man page are generated
//! from these (see `tests/assets.rs`), so help text here is the documentation.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::output::{ColorChoice, Format};
use crate::redrive::throttle::Rate;

const TARGETS_HELP: &str = "\
TARGETS:
  examples/orders-dlq.jsonl                    a JSONL archive (- reads stdin)
  rabbitmq://USER:PASS@HOST:PORT/VHOST/QUEUE   a RabbitMQ queue (vhost %2f is /)
  sqs://QUEUE, a queue URL or ARN              an SQS queue (AWS credential chain)
  kafka://HOST:PORT[,HOST:PORT]/TOPIC          a Kafka dead-letter topic
  NAME                                         a [targets.NAME] entry of the config file";

const EXIT_CODES_HELP: &str = "\
EXIT CODES:
  0  success
  1  runtime failure: unreachable, not found, invalid data, partial failure
  2  usage error: bad flag, malformed target
  3  lint findings at or above --fail-on
  130  interrupted (Ctrl-C or SIGTERM) after finishing the messages in flight";

#[derive(Debug, Parser)]
#[command(
    name = "dlqctl",
    version,
    about = "Inspect, understand and safely replay dead letters on SQS, RabbitMQ and Kafka",
    after_help = format!("{TARGETS_HELP}\n\n{EXIT_CODES_HELP}"),
    max_term_width = 100
)]
pub struct Cli {
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,

    /// When to colour output.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,

    /// Config file with named targets and redaction rules
    /// [default: $XDG_CONFIG_HOME/dlqctl/config.toml]
    #[arg(long, global = true, env = "DLQCTL_CONFIG", hide_env_values = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print no notes on stderr, only errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,

    /// Longest wait, in seconds, for any one answer from a broker (connect, read, publish,
    /// settle) before the run stops with an error instead of hanging on a stalled connection.
    #[arg(long, global = true, value_name = "SECONDS", default_value_t = 30.0, value_parser = positive_seconds)]
    pub timeout: f64,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Discover DLQs and the queues that feed them (for an archive: its one-line description).
    List(ListArgs),
    /// Look at dead letters without consuming them.
    Peek(PeekArgs),
    /// Count dead letters by reason, source, exception or age.
    Summarize(SummarizeArgs),
    /// Stream every dead letter as JSONL, with bounded memory.
    Export(ExportArgs),
    /// Move dead letters back to their source (or --to elsewhere), safely: plan, confirm,
    /// throttle, confirm-before-settle, audit log, resumable.
    Redrive(RedriveArgs),
    /// Check DLQ configuration and alerting, live or from templates and rule files (exit 3 on findings).
    Lint(LintArgs),
}

/// What every reading verb takes.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The DLQ to read (see TARGETS below).
    #[arg(value_name = "TARGET")]
    pub target: String,

    /// Only messages matching EXPR; repeat to AND several. FIELD=VALUE, FIELD!=VALUE,
    /// FIELD~REGEX, FIELD!~REGEX, age>2h, count>=3; fields: reason, exception, source, dlq, id,
    /// count, age, header.NAME, body.PATH.
    #[arg(long = "where", value_name = "EXPR")]
    pub filters: Vec<String>,

    /// Skip archive lines that are not dead letters, and report how many, instead of stopping.
    #[arg(long)]
    pub skip_invalid: bool,

    /// The longest archive line read, in MiB: a longer one (a file that is not an archive, a
    /// stream that never ends a line) stops the read.
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_line_mib: u32,

    /// Take the exception class from an application's own field: header:NAME (attr:NAME is the
    /// same, for SQS attributes) or body.PATH of a JSON body. Used by peek, summarize, export.
    #[arg(long, value_name = "SOURCE")]
    pub reason_from: Option<String>,

    /// Kafka: read from the earliest retained record instead of the group's committed offset.
    #[arg(long)]
    pub from_beginning: bool,

    /// Read even where reading can dead-letter messages again (a RabbitMQ quorum DLQ with a
    /// delivery limit counts every read as a delivery).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct RedactArgs {
    /// Replace a field's value before output: header.NAME, body.PATH (dotted), or NAME for both.
    /// Repeatable; adds to the config file's [redact] fields.
    #[arg(long = "redact", value_name = "FIELD")]
    pub fields: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// A broker (rabbitmq://.../VHOST, sqs://, kafka://HOST:PORT) or a DLQ.
    #[arg(value_name = "TARGET")]
    pub target: String,
}

#[derive(Debug, Args)]
pub struct PeekArgs {
    #[command(flatten)]
    pub read: ReadArgs,

    /// How many dead letters to show.
    #[arg(short = 'n', long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: u64,

    /// Show whole bodies and every header instead of a one-line preview.
    #[arg(long)]
    pub full: bool,

    #[command(flatten)]
    pub redact: RedactArgs,
}

#[derive(Debug, Args)]
pub struct SummarizeArgs {
    #[command(flatten)]
    pub read: ReadArgs,

    /// What to group by.
    #[arg(long, value_enum, default_value_t = GroupBy::Reason)]
    pub by: GroupBy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GroupBy {
    /// The reason kind (rejected, expired, max_receive_count, exception, ...).
    Reason,
    /// The queue or topic the message came from.
    Source,
    /// The exception class or error code.
    Exception,
    /// How long ago it died, in buckets.
    Age,
    /// The exchange it was first published to (RabbitMQ).
    Exchange,
    /// Its original routing key(s) (RabbitMQ).
    RoutingKey,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub read: ReadArgs,

    /// Write to FILE instead of stdout; it appears only when the export is complete.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,

    #[command(flatten)]
    pub redact: RedactArgs,
}

#[derive(Debug, Args)]
pub struct RedriveArgs {
    #[command(flatten)]
    pub read: ReadArgs,

    /// Send copies here instead of each message's own source: a .jsonl archive (replay into a
    /// file) or another broker's target.
    #[arg(long, value_name = "TARGET")]
    pub to: Option<String>,

    /// Move at most N messages.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,

    /// Messages per second, evenly paced; 'unlimited' lifts the limit.
    #[arg(long, value_name = "N|unlimited", default_value = "50")]
    pub rate: Rate,

    /// Messages taken from the DLQ and held unsettled at once (the most a crash can duplicate).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub batch: u64,

    /// Print what would move, and change nothing beyond what reading costs.
    #[arg(long)]
    pub dry_run: bool,

    /// Save the plan, with the exact message ids, to FILE (JSONL).
    #[arg(long, value_name = "FILE")]
    pub plan_out: Option<PathBuf>,

    /// Do not ask for confirmation (required when there is no terminal to ask on).
    #[arg(short = 'y', long)]
    pub yes: bool,

    /// Why this redrive is done, for the audit log.
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,

    /// Audit log path [default: $XDG_STATE_HOME/dlqctl/runs/RUN.audit.jsonl]
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,

    /// Continue an interrupted run from its checkpoint, without publishing again what it
    /// already had confirmed.
    #[arg(long, value_name = "CHECKPOINT")]
    pub resume: Option<PathBuf>,

    /// Skip messages dlqctl has already redriven N times (loop guard).
    #[arg(long, value_name = "N")]
    pub max_redrives: Option<u64>,

    /// Retries of a transient publish failure, with exponential backoff and jitter.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub retries: u32,

    /// Kafka: produce each copy to its original partition instead of letting its key decide.
    #[arg(long)]
    pub keep_partition: bool,

    /// How to move: the broker's own server-side move (SQS move task: everything back to its
    /// source), a client-side move by dlqctl (needed for --where, --to, --limit,
    /// --max-redrives), or whichever fits.
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,

    /// Show the DLQ's server-side move task and its progress, then exit.
    #[arg(long, conflicts_with_all = ["cancel", "dry_run"])]
    pub status: bool,

    /// Cancel the DLQ's running server-side move task, then exit.
    #[arg(long, conflicts_with = "dry_run")]
    pub cancel: bool,

    /// Stop after N messages in a row could not be delivered (the destination looks down or gone).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_consecutive_failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Server-side when nothing is filtered and everything goes back to its source.
    Auto,
    Server,
    Client,
}

#[derive(Debug, Args)]
pub struct LintArgs {
    /// A broker to inventory live (repeatable): sqs:// (?prefix=), rabbitmq://USER:PASS@HOST:PORT/VHOST,
    /// kafka://HOST:PORT.
    #[arg(long = "broker", value_name = "TARGET")]
    pub brokers: Vec<String>,

    /// A CloudFormation template (YAML or JSON) declaring SQS queues and CloudWatch alarms (repeatable).
    #[arg(long = "template", value_name = "FILE")]
    pub templates: Vec<PathBuf>,

    /// A Prometheus rule file whose alerting rules watch DLQs by label (repeatable).
    #[arg(long = "rules", value_name = "FILE")]
    pub rules: Vec<PathBuf>,

    /// A dlqctl alert file (TOML) describing alerts kept elsewhere (repeatable).
    #[arg(long = "alerts", value_name = "FILE")]
    pub alerts: Vec<PathBuf>,

    /// Report format (-o json also selects json).
    #[arg(long, value_enum, default_value_t = LintFormat::Text)]
    pub format: LintFormat,

    /// Exit 3 when an unwaived finding is at least this severe.
    #[arg(long, value_enum, default_value_t = crate::lint::rules::Severity::Warning)]
    pub fail_on: crate::lint::rules::Severity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LintFormat {
    Text,
    Json,
    /// SARIF 2.1.0, for GitHub code scanning.
    Sarif,
}

/// `--timeout`: a positive number of seconds, fractions allowed.
fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(n) if n > 0.0 && n.is_finite() && n <= 86_400.0 => Ok(n),
        _ => Err("a number of seconds above 0 (at most a day)".into()),
    }
}
