//! The command line, as clap definitions. Completions and the man page are generated
//! from these (see `tests/assets.rs`), so help text here is the documentation.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::output::{ColorChoice, Format};

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
  3  lint findings at or above --fail-on";

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
    #[arg(
        long,
        global = true,
        env = "DLQCTL_CONFIG",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,

    /// Print no notes on stderr, only errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,

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
}

/// What every reading verb takes.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The DLQ to read (see TARGETS below).
    #[arg(value_name = "TARGET")]
    pub target: String,

    /// Skip archive lines that are not dead letters, and report how many, instead of stopping.
    #[arg(long)]
    pub skip_invalid: bool,
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
