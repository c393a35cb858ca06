//! One trait over every place dead letters live, in the manner of `object_store`:
//! a module per backend, capability flags instead of silent no-ops, and a shared
//! conformance suite (`tests/conformance/`) that every backend runs.

use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use futures::stream::BoxStream;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::{DeadLetter, LetterView};
use crate::target::{ArchiveTarget, Target};

pub mod archive;
pub mod bounded;
pub mod kafka;
pub mod rabbitmq;
pub mod sqs;

pub type LetterStream<'a> = BoxStream<'a, Result<DeadLetter>>;

/// What [`Broker::peek_each`] hands each dead letter to; its error ends the read.
pub type Visit<'a> = dyn FnMut(&LetterView<'_>) -> Result<()> + Send + 'a;

/// What a backend can do, so callers ask instead of discovering a no-op.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Capabilities {
    /// `peek` reads without removing.
    pub peek: bool,
    /// What a peek costs on this broker, in a sentence, when it is not free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peek_cost: Option<&'static str>,
    /// `receive`, `settle` and `release` work (a redrive can take messages out).
    pub consume: bool,
    /// The broker can move everything back to the sources itself (the SQS move task).
    pub server_move: bool,
    /// A message a run removed can be read again by a later run, as itself (Kafka: a commit
    /// held back by a record left behind, with the offsets settled past it in commit metadata
    /// that some brokers drop). Elsewhere a letter met again with a settled redrive id is
    /// another letter (a twin), and needs a copy of its own.
    pub rereads_settled: bool,
}

/// A server-side move (SQS message move task), as the broker reports it.
#[derive(Debug, Clone, Serialize)]
pub struct MoveTask {
    pub handle: Option<String>,
    /// RUNNING, COMPLETED, CANCELLING, CANCELLED or FAILED.
    pub status: String,
    pub moved: u64,
    pub to_move: Option<u64>,
    pub failure: Option<String>,
}

/// A DLQ as `list` and `describe` show it.
#[derive(Debug, Clone, Serialize)]
pub struct Description {
    /// The target, password masked.
    pub target: String,
    pub name: String,
    pub kind: &'static str,
    pub depth: Option<u64>,
    /// Age of the oldest dead letter, in seconds.
    #[serde(serialize_with = "as_seconds")]
    pub oldest_age: Option<Duration>,
    /// How long the DLQ keeps a message, in seconds; `None` when unknown or unlimited.
    #[serde(serialize_with = "as_seconds")]
    pub retention: Option<Duration>,
    /// Queues or topics that dead-letter into it.
    pub sources: Vec<String>,
    pub capabilities: Capabilities,
    /// Problems or caveats worth a human's attention.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

fn as_seconds<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(d.as_secs()),
        None => s.serialize_none(),
    }
}

/// A backend's own token for a message it handed out, to settle or release it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Handle {
    /// A line of the archive file as it was when the run began: its index, and a digest of
    /// its bytes so that settling can never remove another line.
    ArchiveLine { index: u64, digest: u64 },
    /// An AMQP delivery tag on the backend's consuming channel.
    Delivery(u64),
    /// A key into the backend's own table (SQS receipt handles).
    Token(u64),
}

/// Where one copy of a dead letter goes, as plans and audit logs name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Destination {
    /// Human-readable, password-free: `archive /tmp/replay.jsonl`, `exchange orders, key order.created`.
    pub label: String,
    pub route: Route,
}

/// How a sink addresses a destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// Append to the sink's archive file.
    Archive,
    /// Publish to an AMQP exchange (`""`: the default exchange, the key naming a queue),
    /// with further routing keys as a `CC` header.
    Amqp { exchange: String, routing_key: String, cc: Vec<String> },
    /// Send to an SQS queue, named as the message or the operator named it.
    Sqs(crate::target::SqsQueue),
    /// Produce to a Kafka topic; to one partition, or by key when `None`.
    Kafka { topic: String, partition: Option<i32> },
}

/// Whether trying again can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Failure {
    /// Timeouts, resets, throttling, a blocked connection: retry with backoff.
    Transient,
    /// Not found, access denied, too large, unroutable: leave the message and go on.
    Permanent,
}

#[derive(Debug, Clone)]
pub struct PublishError {
    pub failure: Failure,
    pub message: String,
}

/// Something that takes copies and confirms them: a broker's own source queues, another
/// broker, or an archive file.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Publish each copy to its destination and return once every one is confirmed by the
    /// destination (publisher confirm, send success, delivery report, fsync) or has failed.
    /// The results are in the order of `batch`.
    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<Result<(), PublishError>>;

    /// What opening the destination found and did that the operator should hear about
    /// (an archive's unfinished last line cut off).
    fn open_notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// What a backend keeps about the messages it handed out, by the token in their
/// `Handle::Token` (SQS receipt handles, Kafka partition and offset).
#[derive(Debug)]
pub struct Tokens<T> {
    next: std::sync::atomic::AtomicU64,
    held: std::sync::Mutex<std::collections::HashMap<u64, T>>,
}

impl<T> Default for Tokens<T> {
    fn default() -> Self {
        Tokens { next: Default::default(), held: Default::default() }
    }
}

impl<T> Tokens<T> {
    /// Keep `value` and return the handle that stands for it.
    pub fn issue(&self, value: T) -> Handle {
        let token = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.held.lock().expect("not poisoned").insert(token, value);
        Handle::Token(token)
    }

    /// Give back what these handles stand for, forgetting them.
    pub fn take(&self, handles: &[Handle]) -> Vec<T> {
        let mut held = self.held.lock().expect("not poisoned");
        handles
            .iter()
            .filter_map(|h| match h {
                Handle::Token(t) => held.remove(t),
                _ => None,
            })
            .collect()
    }
}

#[derive(Debug)]
pub struct Received {
    pub handle: Handle,
    pub letter: DeadLetter,
}

/// The longest archive line read unless `--max-line-mib` says otherwise: well above any
/// broker's largest message, even base64-encoded.
pub const DEFAULT_MAX_LINE: usize = 64 << 20;

/// How long one call to a broker may take unless `--timeout` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Options that shape how a backend reads.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// The longest any one call to the broker may take (`--timeout`).
    pub timeout: Duration,
    /// Skip archive lines that are not dead letters instead of stopping at the first.
    pub skip_invalid: bool,
    /// The longest archive line read, in bytes (`--max-line-mib`).
    pub max_line: usize,
    /// Read even where reading can dead-letter messages again (a quorum DLQ with a delivery limit).
    pub force: bool,
    /// Kafka: read from the earliest retained offset, not the group's committed one.
    pub from_beginning: bool,
    /// Kafka: redrive to the original partition rather than by key.
    pub keep_partition: bool,
    /// Whether the verb looks at bodies. `false` lets a backend that would copy each body out
    /// of its client's buffer leave it there (letters then come without one).
    pub bodies: bool,
    /// Whether the verb looks at headers. `false` lets a backend that would convert each header
    /// leave them out: letters then carry what it derives from them (source, reason, times) and
    /// no headers or extras.
    pub headers: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            timeout: DEFAULT_TIMEOUT,
            skip_invalid: false,
            max_line: DEFAULT_MAX_LINE,
            force: false,
            from_beginning: false,
            keep_partition: false,
            bodies: true,
            headers: true,
        }
    }
}

#[async_trait]
pub trait Broker: Send + Sync {
    /// Short backend name for messages ("archive", "RabbitMQ", ...).
    fn backend(&self) -> &'static str;

    fn capabilities(&self) -> Capabilities;

    async fn describe(&self) -> Result<Description>;

    /// Every DLQ this target can see: one for a DLQ target, all of them for a broker-level one.
    async fn list(&self) -> Result<Vec<Description>>;

    /// Read up to `limit` dead letters (all of them with `None`) without removing any.
    async fn peek(&self, limit: Option<u64>) -> Result<LetterStream<'_>>;

    /// [`Broker::peek`] for a verb that only writes letters out (export): each is handed to
    /// `visit` as a view, so a backend reading from its client's buffers (Kafka) need not
    /// copy it into a letter first. By default, each letter of `peek`.
    async fn peek_each(&self, limit: Option<u64>, visit: &mut Visit<'_>) -> Result<()> {
        let mut letters = self.peek(limit).await?;
        while let Some(letter) = letters.try_next().await? {
            visit(&letter.view())?;
        }
        Ok(())
    }

    /// Get ready to take messages out, before anything is read or published: take what a run
    /// must hold alone (an archive's lock) and check that settling will be possible, so that a
    /// run that cannot remove what it copies fails before copying anything.
    async fn begin_consume(&self) -> Result<()> {
        if self.capabilities().consume { Ok(()) } else { Err(self.not_supported("receive messages")) }
    }

    /// The run that took messages out has ended: finish what settling left to do (an archive's
    /// one rewrite) and let go of what `begin_consume` took.
    async fn end_consume(&self) -> Result<()> {
        Ok(())
    }

    /// Take up to `max` messages out of view, each with a handle to settle or release.
    async fn receive(&self, _max: usize) -> Result<Vec<Received>> {
        Err(self.not_supported("receive messages"))
    }

    /// Remove these messages for good; call only after their copies are confirmed elsewhere.
    async fn settle(&self, _handles: &[Handle]) -> Result<()> {
        Err(self.not_supported("settle messages"))
    }

    /// Put these messages back, untouched.
    async fn release(&self, _handles: &[Handle]) -> Result<()> {
        Err(self.not_supported("release messages"))
    }

    /// Where this message came from and so returns to by default; `None` when the message
    /// does not say (it then stays in the DLQ and is reported, never guessed).
    fn source_destination(&self, _letter: &DeadLetter) -> Option<Destination> {
        None
    }

    /// The sink that publishes to this broker's source queues, for redrives without `--to`.
    fn source_sink(&self) -> Option<&dyn Sink> {
        None
    }

    /// Start moving every message back to its source on the broker's side.
    async fn start_move_task(&self, _rate: Option<u32>) -> Result<String> {
        Err(self.not_supported("move messages on the server"))
    }

    /// The newest server-side move of this DLQ, if any.
    async fn move_task(&self) -> Result<Option<MoveTask>> {
        Err(self.not_supported("move messages on the server"))
    }

    async fn cancel_move_task(&self) -> Result<MoveTask> {
        Err(self.not_supported("move messages on the server"))
    }

    /// End a read (`peek`): give back whatever it still holds. A read that stops early (a limit,
    /// a selection) leaves its stream unpolled, so the caller says when it is done.
    async fn end_read(&self) -> Result<()> {
        Ok(())
    }

    /// What `lint` checks: every queue a broker-level target can see, with its alarms where
    /// the broker keeps them (CloudWatch for SQS).
    async fn lint_inventory(&self) -> Result<crate::lint::Inventory> {
        Err(self.not_supported("describe its configuration for lint"))
    }

    /// Caveats learned while reading (lines skipped, scan incomplete), shown after a verb's output.
    fn read_notes(&self) -> Vec<String> {
        Vec::new()
    }

    fn not_supported(&self, operation: &'static str) -> Error {
        Error::NotSupported { backend: self.backend(), operation, why: "this backend does not implement it".into() }
    }
}

/// Open the backend for a target, every call to it bounded by `options.timeout`.
pub async fn open(target: &Target, options: &OpenOptions) -> Result<Box<dyn Broker>> {
    let shown = target.to_string();
    let inner = bounded::within(options.timeout, &shown, "connecting", open_unbounded(target, options)).await?;
    Ok(Box::new(bounded::Bounded::<dyn Broker>::new(inner, options.timeout, shown)))
}

async fn open_unbounded(target: &Target, options: &OpenOptions) -> Result<Box<dyn Broker>> {
    match target {
        Target::Archive(t) => Ok(Box::new(archive::ArchiveBroker::open(t.clone(), options).await?)),
        Target::Rabbitmq(t) => Ok(Box::new(rabbitmq::RabbitmqBroker::open(t, target.to_string(), options).await?)),
        Target::Sqs(t) => Ok(Box::new(sqs::SqsBroker::open(t, target.to_string(), options).await?)),
        Target::Kafka(t) => Ok(Box::new(kafka::KafkaBroker::open(t, target.to_string(), options).await?)),
    }
}

/// The one destination every copy goes to with `--to TARGET`; checks the target can take
/// copies without touching it, so a dry run leaves no trace.
pub fn sink_destination(target: &Target) -> Result<Destination> {
    match target {
        Target::Archive(ArchiveTarget::File(path)) => {
            Ok(Destination { label: format!("archive {}", path.display()), route: Route::Archive })
        }
        Target::Archive(ArchiveTarget::Stdin) => {
            Err(Error::Usage("--to - is not a place to write: name a .jsonl file".into()))
        }
        Target::Rabbitmq(t) => rabbitmq::destination_for(t, &target.to_string()),
        Target::Sqs(t) => sqs::destination_for(t, &target.to_string()),
        Target::Kafka(t) => kafka::destination_for(t, &target.to_string()),
    }
}

/// Whether `--to` names the DLQ being read: the same file (by device and inode, through
/// symlinks and hard links), queue or topic. Copies written there would be read again as
/// dead letters, or, in an archive, rewritten away.
pub fn names_the_same_dlq(dlq: &Target, to: &Target) -> bool {
    match (dlq, to) {
        (Target::Archive(ArchiveTarget::File(a)), Target::Archive(ArchiveTarget::File(b))) => archive::same_file(a, b),
        (Target::Rabbitmq(a), Target::Rabbitmq(b)) => rabbitmq::names_the_dlq(a, b),
        (Target::Sqs(a), Target::Sqs(b)) => sqs::names_the_dlq(a, b),
        (Target::Kafka(a), Target::Kafka(b)) => kafka::names_the_dlq(a, b),
        _ => false,
    }
}

/// Open `--to TARGET` as a sink (after [`sink_destination`] accepted it), every publish
/// bounded by `timeout`.
pub async fn open_sink(target: &Target, timeout: Duration) -> Result<Box<dyn Sink>> {
    let shown = target.to_string();
    let inner = bounded::within(timeout, &shown, "connecting", open_sink_unbounded(target)).await?;
    Ok(Box::new(bounded::Bounded::<dyn Sink>::new(inner, timeout, shown)))
}

async fn open_sink_unbounded(target: &Target) -> Result<Box<dyn Sink>> {
    match target {
        Target::Archive(ArchiveTarget::File(path)) => Ok(Box::new(archive::ArchiveSink::open(path).await?)),
        Target::Rabbitmq(t) => {
            Ok(Box::new(rabbitmq::RabbitmqBroker::open(t, target.to_string(), &OpenOptions::default()).await?))
        }
        Target::Sqs(t) => Ok(Box::new(sqs::SqsBroker::open(t, target.to_string(), &OpenOptions::default()).await?)),
        Target::Kafka(t) => {
            let producer_only = crate::target::KafkaTarget { topic: None, ..t.clone() };
            Ok(Box::new(kafka::KafkaBroker::open(&producer_only, target.to_string(), &OpenOptions::default()).await?))
        }
        Target::Archive(ArchiveTarget::Stdin) => Err(sink_destination(target).expect_err("stdin is refused")),
    }
}
