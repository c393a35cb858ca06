//! Kafka through rdkafka (its bundled librdkafka). Kafka has no DLQ of its own: frameworks
//! write dead-letter topics (Spring `*.DLT` with `kafka_dlt-*` headers, Kafka Connect with
//! `__connect.errors.*`), and "already handled" is a consumer group's committed offset.
//!
//! Reads assign partitions directly, without joining the group and without committing, so
//! they change nothing. A redrive produces with `acks=all` (see [`PRODUCER_SETTINGS`]), waits
//! for each delivery report, then commits. A committed offset means "everything before it is
//! settled", so a message left behind (skipped, failed) holds its partition's commit back; the
//! settled offsets beyond it travel in the commit's metadata, and later runs skip them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use futures::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, DefaultConsumerContext, MessageStream, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::{Offset, TopicPartitionList};
use regex::Regex;

use super::bounded::ready_or_timeout;
use super::{
    Broker, Capabilities, Description, Destination, Failure, Handle, LetterStream, OpenOptions, PublishError, Received,
    Route, Sink, Tokens, Visit,
};
use crate::error::{Error, Result};
use crate::lint::{Inventory, QueueFacts};
use crate::model::{
    AsciiClass, BrokerKind, DeadLetter, Headers, HeadersView, LetterView, Name, Reason, ReasonKind, Source, Text,
    Value, ValueView,
};
use crate::target::{KafkaTarget, Secret};

const TIMEOUT: Duration = Duration::from_secs(10);
/// A read stops when nothing arrives for this long (gaps such as transaction markers mean a
/// partition's last offsets may never be delivered).
const IDLE: Duration = Duration::from_secs(3);
/// Names of dead-letter topics by convention; `?pattern=` overrides.
pub const DEFAULT_DLT_PATTERN: &str = r"(?i)(\.dlt$|-dlt$|\.dlq$|-dlq$|^dlq[.-]|dead[._-]?letter)";
/// Prefix of the commit metadata that lists settled offsets beyond the committed one.
const SETTLED: &str = "dlqctl-settled:";
/// How many records `list` reads per topic to learn the source topics from headers.
const SOURCE_SAMPLE: usize = 100;

pub struct KafkaBroker {
    target: KafkaTarget,
    shown: String,
    options: OpenOptions,
    /// The reader behind `receive`.
    taker: tokio::sync::Mutex<Option<Reader>>,
    /// Per partition: the offset to commit next, and settled offsets beyond it.
    commits: Mutex<BTreeMap<i32, Commit>>,
    /// What the group's committed offsets should be if this run is the only one settling.
    watch: Mutex<GroupWatch>,
    /// (partition, offset) of handed-out messages.
    handed: Tokens<(i32, i64)>,
    producer: tokio::sync::OnceCell<Detached<FutureProducer>>,
    /// Destination topics known to exist (checked once each, since a produce to a missing
    /// topic only times out).
    topics_seen: Mutex<BTreeSet<String>>,
    /// Messages the last read returned, for its closing note.
    read: AtomicU64,
    /// Partitions the last read left before their end because nothing more arrived.
    stopped_short: Mutex<Vec<String>>,
}

#[derive(Debug, Default, Clone)]
struct Commit {
    next: i64,
    beyond: BTreeSet<i64>,
}

/// librdkafka says why it cannot connect (a refused password, a failed TLS handshake) only in
/// its log, which a poll of the client delivers; a metadata call just times out. This keeps
/// the last connection failure logged so that dlqctl's error names the cause.
#[derive(Default)]
struct Reporter {
    last: Mutex<Option<String>>,
}

impl Reporter {
    fn last_failure(&self) -> Option<String> {
        self.last.lock().expect("reporter lock").clone()
    }

    /// A failure retrying will not cure: the credentials or the TLS set-up are wrong.
    fn refused(&self) -> Option<String> {
        self.last_failure().filter(|m| m.contains("SASL authentication") || m.contains("SSL"))
    }
}

impl ClientContext for Reporter {
    fn log(&self, _level: RDKafkaLogLevel, facility: &str, message: &str) {
        if facility == "FAIL" {
            // "sasl_ssl://host:9094/bootstrap: SASL authentication error: ... (after 15ms in state AUTH_REQ)"
            let failure = message.split_once(": ").map_or(message, |(_, why)| why);
            *self.last.lock().expect("reporter lock") = Some(failure.to_owned());
        }
    }
}

impl ConsumerContext for Reporter {}

/// The cluster's metadata, asked in short tries so that a refused password or certificate
/// fails at once, with librdkafka's own words, instead of after the whole timeout.
fn connect(consumer: &BaseConsumer<Reporter>, topic: Option<&str>, shown: &str) -> Result<rdkafka::metadata::Metadata> {
    const TRY: Duration = Duration::from_millis(500);
    let started = std::time::Instant::now();
    loop {
        match consumer.fetch_metadata(topic, TRY) {
            Ok(metadata) => return Ok(metadata),
            Err(e) => {
                // Nothing is assigned: the poll only hands librdkafka's log to the reporter.
                let _ = consumer.poll(Duration::ZERO);
                let reporter = consumer.context();
                if let Some(reason) = reporter.refused() {
                    return Err(Error::Runtime(format!(
                        "cannot connect to Kafka at {shown}: {reason} (check the SASL and SSL properties of the target)"
                    )));
                }
                if started.elapsed() >= TIMEOUT {
                    let cause = reporter.last_failure().unwrap_or_else(|| e.to_string());
                    return Err(Error::Runtime(format!(
                        "cannot reach Kafka at {shown}: {cause} (check the bootstrap servers)"
                    )));
                }
            }
        }
    }
}

/// How a redrive produces: every copy acknowledged by all in-sync replicas, one request in
/// flight so that each partition's copies keep their order. Not librdkafka's idempotent
/// producer: in librdkafka 2.12 it too keeps one request in flight, and while the broker
/// acknowledges it its broker thread polls without sleeping (confluentinc/librdkafka#4989), a
/// core taken from a broker on the same host for a whole redrive. Without it, a retry after a
/// lost acknowledgement can duplicate a copy: one of the bounded duplicates the redrive id
/// header is there for. Public for the bench's ceiling, which must produce the same way.
pub const PRODUCER_SETTINGS: [(&str, &str); 4] = [
    ("enable.idempotence", "false"),
    ("acks", "all"),
    ("max.in.flight.requests.per.connection", "1"),
    ("linger.ms", "5"),
];

/// How often a redrive checks that no other run commits for its group and topic.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Two redrives of one topic for one group each read every pending record (reads assign
/// partitions rather than share them through the group), so each would copy all of them. A
/// run notices the other by the group's committed offsets moving under it, and stops: the
/// duplicates are bounded by what the later run copied before its first check.
#[derive(Default)]
struct GroupWatch {
    /// Per partition: the group's committed offset as this run last saw or set it.
    expected: BTreeMap<i32, Option<i64>>,
    last_check: Option<std::time::Instant>,
}

/// Reads a topic from given offsets up to the high watermarks seen when it started.
struct Reader {
    /// Shared with the blocking commit, which runs off the async thread.
    consumer: Arc<Detached<StreamConsumer>>,
    /// The one topic read, as each letter shows it (the record's own name would be checked
    /// as UTF-8 again for every record).
    topic: String,
    /// Kafka allows only plain names, but a broker need not check: one pass decides for the
    /// read's topic and every id built on it.
    topic_is_plain: bool,
    /// Per partition: the next offset wanted and the end (high watermark) to stop at.
    positions: BTreeMap<i32, (i64, i64)>,
    /// Offsets already settled by an earlier run (from commit metadata): skipped.
    skip: BTreeMap<i32, BTreeSet<i64>>,
}

impl KafkaBroker {
    pub async fn open(target: &KafkaTarget, shown: String, options: &OpenOptions) -> Result<Self> {
        let broker = KafkaBroker {
            target: target.clone(),
            shown,
            options: options.clone(),
            taker: tokio::sync::Mutex::new(None),
            commits: Mutex::new(BTreeMap::new()),
            watch: Mutex::new(GroupWatch::default()),
            handed: Tokens::default(),
            producer: tokio::sync::OnceCell::new(),
            topics_seen: Mutex::new(BTreeSet::new()),
            read: AtomicU64::new(0),
            stopped_short: Mutex::new(Vec::new()),
        };
        // Fail now, within a bounded time, when the cluster cannot be reached. rdkafka takes
        // its log level from the `log` crate, which dlqctl leaves off: set so that librdkafka
        // says why a connection failed.
        let consumer: BaseConsumer<Reporter> = broker
            .config()
            .set("group.id", &broker.target.group)
            .set_log_level(RDKafkaLogLevel::Error)
            .create_with_context(Reporter::default())
            .map_err(|e| {
                Error::Runtime(format!("cannot create a Kafka client for {}: {}", broker.shown, broker.scrubbed(e)))
            })?;
        let consumer = Detached::new(consumer);
        let topic = target.topic.clone();
        let shown = broker.shown.clone();
        tokio::task::spawn_blocking(move || {
            let metadata = connect(&consumer, topic.as_deref(), &shown)?;
            if let Some(topic) = topic {
                let found = metadata.topics().iter().find(|t| t.name() == topic);
                if found.is_none_or(|t| t.error().is_some() || t.partitions().is_empty()) {
                    return Err(Error::Runtime(format!("{shown}: topic {topic:?} does not exist")));
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::Runtime(format!("metadata lookup failed: {}", broker.scrubbed(e))))??;
        Ok(broker)
    }

    fn config(&self) -> ClientConfig {
        // OpenSSL set up without its exit handler before any librdkafka client exists: with
        // it, clients destroyed off-thread (Detached) could still be running their threads'
        // OpenSSL clean-up while the exit handler freed what they clean, and dlqctl crashed
        // with SIGSEGV after a TLS redrive had finished (seen once in the SASL_SSL test).
        openssl_sys::init();
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", self.target.bootstrap.join(","))
            .set("socket.timeout.ms", "10000")
            .set("message.timeout.ms", "30000");
        // Security settings from the config file; what a consumer or producer sets after this wins.
        for (name, value) in &self.target.client {
            config.set(name, value);
        }
        if let Some(password) = &self.target.sasl_password {
            config.set("sasl.password", password.expose());
        }
        config
    }

    /// A client library message with every value from the config file masked: librdkafka
    /// quotes a property it rejects, `sasl.jaas.config` and passwords among them.
    fn scrubbed(&self, message: impl ToString) -> String {
        let mut message = message.to_string();
        let values = self.target.client.values().map(String::as_str);
        for value in values.chain(self.target.sasl_password.as_ref().map(Secret::expose)) {
            if value.len() >= 3 {
                message = message.replace(value, "****");
            }
        }
        message
    }

    fn consumer(&self) -> Result<Detached<StreamConsumer>> {
        self.config()
            .set("group.id", &self.target.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .map(Detached::new)
            .map_err(|e| {
                Error::Runtime(format!("cannot create a Kafka consumer for {}: {}", self.shown, self.scrubbed(e)))
            })
    }

    fn topic(&self) -> Result<&str> {
        self.target.topic.as_deref().ok_or_else(|| {
            Error::Usage(format!("{} names no topic: use kafka://HOST:PORT/TOPIC (list shows the DLTs)", self.shown))
        })
    }

    /// Partitions of a topic with their low and high watermarks.
    async fn watermarks(&self, consumer: &StreamConsumer, topic: &str) -> Result<BTreeMap<i32, (i64, i64)>> {
        let metadata = consumer
            .fetch_metadata(Some(topic), TIMEOUT)
            .map_err(|e| Error::Runtime(format!("metadata for {topic}: {e}")))?;
        let mut out = BTreeMap::new();
        for t in metadata.topics().iter().filter(|t| t.name() == topic) {
            for p in t.partitions() {
                let marks = consumer
                    .fetch_watermarks(topic, p.id(), TIMEOUT)
                    .map_err(|e| Error::Runtime(format!("watermarks of {topic}/{}: {e}", p.id())))?;
                out.insert(p.id(), marks);
            }
        }
        Ok(out)
    }

    /// The group's committed offsets (and settled-beyond metadata) per partition.
    fn committed(&self, consumer: &StreamConsumer, topic: &str, partitions: &[i32]) -> Result<BTreeMap<i32, Commit>> {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition(topic, *p);
        }
        let committed = consumer
            .committed_offsets(tpl, TIMEOUT)
            .map_err(|e| Error::Runtime(format!("committed offsets of group {:?}: {e}", self.target.group)))?;
        let mut out = BTreeMap::new();
        for e in committed.elements_for_topic(topic) {
            if let Offset::Offset(next) = e.offset() {
                out.insert(e.partition(), Commit { next, beyond: parse_settled(e.metadata()) });
            }
        }
        Ok(out)
    }

    /// A reader from the group's committed offsets (or the earliest, with --from-beginning
    /// or where the group has committed nothing) up to the current ends.
    async fn reader(&self, topic: &str, skip_settled: bool) -> Result<Reader> {
        let consumer = self.consumer()?;
        let marks = self.watermarks(&consumer, topic).await?;
        let partitions: Vec<i32> = marks.keys().copied().collect();
        let committed =
            if self.options.from_beginning { BTreeMap::new() } else { self.committed(&consumer, topic, &partitions)? };
        let mut tpl = TopicPartitionList::new();
        let mut positions = BTreeMap::new();
        let mut skip = BTreeMap::new();
        for (p, (low, high)) in &marks {
            let start = committed.get(p).map_or(*low, |c| c.next.max(*low));
            tpl.add_partition_offset(topic, *p, Offset::Offset(start))
                .map_err(|e| Error::Runtime(format!("assigning {topic}/{p}: {e}")))?;
            positions.insert(*p, (start, *high));
            if skip_settled {
                skip.insert(*p, self.settled_beyond(*p, committed.get(p)));
            }
        }
        consumer.assign(&tpl).map_err(|e| Error::Runtime(format!("assigning {topic}: {e}")))?;
        Ok(Reader::new(consumer, topic, positions, skip))
    }

    /// Offsets settled beyond the committed one: what the commit metadata says, and what this
    /// process settled itself (some brokers, Tansu among them, do not return commit metadata).
    fn settled_beyond(&self, partition: i32, committed: Option<&Commit>) -> BTreeSet<i64> {
        let mut settled = committed.map(|c| c.beyond.clone()).unwrap_or_default();
        if let Some(c) = self.commits.lock().expect("not poisoned").get(&partition) {
            settled.extend(&c.beyond);
        }
        settled
    }

    /// A record as a dead letter, still in librdkafka's buffers; what it owns is written
    /// over `owned`.
    fn record_letter<'a>(&self, m: &'a impl Message, topic: Topic<'a>, owned: &'a mut Owned) -> RecordLetter<'a> {
        let Owned { id, id_prefix, time: last_time, decoded, pairs: spare } = owned;
        // Records written together share a time: converted once.
        let time = m.timestamp().to_millis().and_then(|ms| match *last_time {
            Some((last, time)) if last == ms => Some(time),
            _ => {
                let time = Utc.timestamp_millis_opt(ms).single()?;
                *last_time = Some((ms, time));
                Some(time)
            }
        });
        let mut pairs = recycled(std::mem::take(spare));
        match m.headers() {
            Some(record) if self.options.headers => letter_headers(record, decoded, &mut pairs),
            Some(record) => decode_record_headers(record, decoded),
            None => *decoded = Decoded::default(),
        }
        let extras_at = pairs.len();
        if self.options.headers {
            push_extras(m, time, &mut pairs);
        }
        // `topic-partition@offset`, without the formatting machinery (a tenth of a summarize's
        // own work when written with format!). On the previous record's partition only the
        // offset is written again.
        match *id_prefix {
            Some((partition, len)) if partition == m.partition() => id.truncate(len),
            _ => {
                let mut partition = itoa::Buffer::new();
                id.clear();
                // Room for the widest partition and offset: one allocation for a new letter's id.
                id.reserve(topic.name.len() + "-@".len() + 11 + 20);
                [topic.name, "-", partition.format(m.partition()), "@"].iter().for_each(|part| id.push_str(part));
                *id_prefix = Some((m.partition(), id.len()));
            }
        }
        id.push_str(itoa::Buffer::new().format(m.offset()));
        RecordLetter {
            owned,
            topic,
            time,
            pairs,
            extras_at,
            body: if self.options.bodies { m.payload() } else { None },
        }
    }

    fn normalize(&self, m: &impl Message, topic: Topic<'_>) -> DeadLetter {
        self.record_letter(m, topic, &mut Owned::default()).into_letter()
    }

    /// A read of the DLT (`peek`, `peek_each`): unsettled records only, counted for the note.
    async fn start_read(&self) -> Result<Reader> {
        let topic = self.topic()?.to_owned();
        let reader = self.reader(&topic, true).await?;
        self.read.store(0, Ordering::Relaxed);
        Ok(reader)
    }

    /// A read that reached its end: what it left unread, for the note.
    fn read_ended(&self, reader: &Reader) {
        *self.stopped_short.lock().expect("not poisoned") = reader.short_of_the_end();
    }

    fn read_error(&self, e: KafkaError) -> Error {
        Error::Runtime(format!("reading {}: {e}", self.shown))
    }

    async fn producer(&self) -> std::result::Result<&FutureProducer, PublishError> {
        self.producer
            .get_or_try_init(|| async {
                let mut config = self.config();
                for (name, value) in PRODUCER_SETTINGS {
                    config.set(name, value);
                }
                config
                    // The topic's max.message.bytes decides what fits, not librdkafka's 1 MB default:
                    // a record the DLT holds must be able to go back to a topic configured like it.
                    .set("message.max.bytes", "104857600")
                    .create::<FutureProducer>()
                    .map(Detached::new)
            })
            .await
            .map(|producer| &**producer)
            .map_err(|e| PublishError {
                failure: Failure::Transient,
                message: format!("cannot create a producer: {}", self.scrubbed(e)),
            })
    }
}

impl Reader {
    fn new(
        consumer: Detached<StreamConsumer>,
        topic: &str,
        positions: BTreeMap<i32, (i64, i64)>,
        skip: BTreeMap<i32, BTreeSet<i64>>,
    ) -> Self {
        let topic_is_plain = AsciiClass::of(topic.as_bytes()) == AsciiClass::Plain;
        Reader { consumer: Arc::new(consumer), topic: topic.to_owned(), topic_is_plain, positions, skip }
    }

    /// What a read that went quiet left unread, said so instead of passing for a complete read.
    fn short_of_the_end(&self) -> Vec<String> {
        self.positions
            .iter()
            .filter(|(_, (next, end))| next < end)
            .map(|(p, (next, end))| {
                format!(
                    "partition {p}: the read stopped at offset {next} of {end}: nothing arrived for {}s \
                     (transaction markers and compaction leave such gaps; so does a stalled broker)",
                    IDLE.as_secs()
                )
            })
            .collect()
    }

    /// The next record within the read's bounds, or `None` at the end, passed through `f`
    /// while librdkafka still owns it (copying it out first would double the read's work).
    async fn next<T>(
        &mut self,
        f: impl FnOnce(&BorrowedMessage<'_>, Topic<'_>) -> T,
    ) -> Option<std::result::Result<T, KafkaError>> {
        let consumer = Arc::clone(&self.consumer);
        self.next_from(&mut consumer.stream(), f).await
    }

    /// As [`Reader::next`], from a stream of this reader's consumer kept for the whole read:
    /// each new stream registers a waker and drops it again, 100 instructions a record.
    async fn next_from<T>(
        &mut self,
        messages: &mut MessageStream<'_, DefaultConsumerContext>,
        f: impl FnOnce(&BorrowedMessage<'_>, Topic<'_>) -> T,
    ) -> Option<std::result::Result<T, KafkaError>> {
        loop {
            if self.positions.values().all(|(next, end)| next >= end) {
                return None;
            }
            let message = match ready_or_timeout(IDLE, messages.next()).await {
                Ok(None) => unreachable!("a consumer's stream never ends"),
                Err(_) => return None,
                Ok(Some(Err(e))) => return Some(Err(e)),
                Ok(Some(Ok(m))) => m,
            };
            let (p, o) = (message.partition(), message.offset());
            let Some((next, end)) = self.positions.get_mut(&p) else { continue };
            if o >= *end {
                // Arrived after the read began: left for the next one.
                *next = *end;
                continue;
            }
            *next = o + 1;
            if self.skip.get(&p).is_some_and(|s| s.contains(&o)) {
                continue;
            }
            return Some(Ok(f(&message, Topic { name: &self.topic, plain: self.topic_is_plain })));
        }
    }
}

/// A librdkafka client destroyed off the async thread, without waiting: destroying one waits
/// for each of its threads to notice (about 100 ms a client), and whatever a client owed
/// (delivery reports, commits) has been awaited before it is dropped.
struct Detached<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> Detached<T> {
    fn new(client: T) -> Self {
        Detached(Some(client))
    }
}

impl<T: Send + 'static> std::ops::Deref for Detached<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("present until dropped")
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        let client = self.0.take();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || drop(client));
        }
    }
}

/// Spring and Connect failure headers, decoded.
#[derive(Debug, Default, PartialEq)]
pub struct Decoded {
    pub reason: Reason,
    pub source: Source,
}

/// A letter's failure headers decoded as the record carrying them would be: what a redrive's
/// copy says when it dead-letters again (and the fuzz target's way in).
pub fn decode_failure_headers(headers: &Headers) -> Decoded {
    let mut decoded = Decoded::default();
    decode_record_headers(&record_headers(headers), &mut decoded);
    decoded
}

/// A letter's headers as a record carries them.
fn record_headers(headers: &Headers) -> OwnedHeaders {
    headers.iter().fold(OwnedHeaders::new_with_capacity(headers.len()), |record, (key, value)| {
        let bytes = (!matches!(value, Value::Null)).then(|| value_bytes(value));
        record.insert(rdkafka::message::Header { key, value: bytes.as_deref() })
    })
}

/// The first value under each framework name, by its place in [`FRAMEWORK_NAMES`] (`None`
/// inside: a null value), as [`crate::model::Headers::get`] finds the first.
type Firsts<T> = [Option<Option<T>>; FRAMEWORK_NAMES.len()];

/// A record's headers as a letter shows them, appended to `headers`, and the failure they
/// describe written over `decoded`, in one pass.
fn letter_headers<'a>(
    record: &'a impl rdkafka::message::Headers,
    decoded: &mut Decoded,
    headers: &mut Vec<(Text<'a>, ValueView<'a>)>,
) {
    headers.reserve(record.count());
    let mut firsts: Firsts<Raw> = [None; FRAMEWORK_NAMES.len()];
    for h in record.iter() {
        let value = h.value.map(Raw::of);
        let name = match framework_index(h.key) {
            Some(i) => {
                firsts[i].get_or_insert(value);
                Text::plain(h.key)
            }
            // Copied, not escaped, when it needs no escaping: the escaper's set-up costs more
            // than the check on a name this short.
            None if AsciiClass::of(h.key.as_bytes()) == AsciiClass::Plain => Text::plain(h.key),
            None => Text::new(h.key),
        };
        headers.push((name, value.map_or(ValueView::Null, Raw::view)));
    }
    decode_failure(|i| firsts[i].flatten(), decoded);
}

/// The failure a record's headers describe, read straight off them for reads that keep no
/// headers (summarize): none is converted or copied but the few the decoder takes.
fn decode_record_headers(record: &impl rdkafka::message::Headers, decoded: &mut Decoded) {
    let mut firsts: Firsts<&[u8]> = [None; FRAMEWORK_NAMES.len()];
    for h in record.iter() {
        if let Some(i) = framework_index(h.key) {
            firsts[i].get_or_insert(h.value);
        }
    }
    decode_failure(|i| firsts[i].flatten().map(Raw::of), decoded)
}

/// A header value of a record, as the decoder and a letter see it.
#[derive(Clone, Copy)]
enum Raw<'a> {
    Text(Text<'a>),
    Bytes(&'a [u8]),
}

impl<'a> Raw<'a> {
    /// Kafka header values are bytes: text when it is printable UTF-8, bytes otherwise (a
    /// big-endian partition number is valid UTF-8 but not text).
    fn of(bytes: &'a [u8]) -> Self {
        // Most values are printable ASCII, which one pass without branches tells, and whether
        // JSON escapes them; std's UTF-8 check, needed only for the rest, took 130
        // instructions on each short value.
        let class = AsciiClass::of(bytes);
        if class != AsciiClass::Other {
            // SAFETY: printable ASCII is valid UTF-8.
            let text = unsafe { std::str::from_utf8_unchecked(bytes) };
            return Raw::Text(if class == AsciiClass::Plain { Text::plain(text) } else { Text::new(text) });
        }
        // Checked before UTF-8: binary numbers (Spring's partition and offset) hold a control
        // byte, and are bytes whether or not they are also valid UTF-8.
        if has_control_character(bytes) {
            return Raw::Bytes(bytes);
        }
        std::str::from_utf8(bytes).map_or(Raw::Bytes(bytes), |text| Raw::Text(Text::new(text)))
    }

    fn view(self) -> ValueView<'a> {
        match self {
            Raw::Text(s) => ValueView::Text(s),
            Raw::Bytes(b) => ValueView::Bytes(b),
        }
    }
}

/// The topic a read is on, and whether JSON needs it escaped.
#[derive(Clone, Copy)]
struct Topic<'a> {
    name: &'a str,
    plain: bool,
}

impl<'a> Topic<'a> {
    /// `text` (the topic, or an id built on it) escaped as the topic must be.
    fn text(self, text: &'a str) -> Text<'a> {
        if self.plain { Text::plain(text) } else { Text::new(text) }
    }
}

/// What a [`RecordLetter`] owns, kept from one record's letter to the next by a read that
/// shows each and drops it: a record then allocates none of it.
#[derive(Default)]
struct Owned {
    id: String,
    /// The partition `id` was last written for, and the length of its `topic-partition@`.
    id_prefix: Option<(i32, usize)>,
    /// The last record time converted, in milliseconds and as a time.
    time: Option<(i64, DateTime<Utc>)>,
    decoded: Decoded,
    /// Empty: the allocation the next record's headers and extras are listed in.
    pairs: Vec<(Text<'static>, ValueView<'static>)>,
}

/// `pairs` emptied, as a vector of pairs borrowed for another lifetime, in the same
/// allocation: the standard library collects a vector mapped to a type of the same size in
/// place, and nothing is left in it to outlive its borrow.
fn recycled<'b>(mut pairs: Vec<(Text<'_>, ValueView<'_>)>) -> Vec<(Text<'b>, ValueView<'b>)> {
    pairs.clear();
    pairs.into_iter().map(|_| unreachable!("emptied")).collect()
}

/// A record as a dead letter, its headers and body still in librdkafka's buffers: `peek_each`
/// shows it as it is, `normalize` copies it into a letter.
struct RecordLetter<'a> {
    /// The id and the decoded failure.
    owned: &'a mut Owned,
    topic: Topic<'a>,
    time: Option<DateTime<Utc>>,
    /// The record's headers, then the extras from `extras_at` on, in one list (one allocation
    /// for both, kept from record to record). Empty when the read keeps no headers (summarize).
    pairs: Vec<(Text<'a>, ValueView<'a>)>,
    extras_at: usize,
    body: Option<&'a [u8]>,
}

impl RecordLetter<'_> {
    /// Done with: its header list's allocation is handed back for the next record.
    fn hand_back(self) {
        let RecordLetter { owned, pairs, .. } = self;
        owned.pairs = recycled(pairs);
    }

    fn view(&self) -> LetterView<'_> {
        LetterView {
            id: self.topic.text(&self.owned.id),
            broker: Some(BrokerKind::Kafka),
            dlq: Some(self.topic.text(self.topic.name)),
            source: &self.owned.decoded.source,
            reason: &self.owned.decoded.reason,
            failure_count: None,
            first_failed_at: None,
            last_failed_at: self.time,
            enqueued_at: None,
            headers: HeadersView::Pairs(&self.pairs[..self.extras_at]),
            extras: HeadersView::Pairs(&self.pairs[self.extras_at..]),
            body: self.body,
        }
    }

    fn into_letter(self) -> DeadLetter {
        let Owned { id, decoded, .. } = std::mem::take(self.owned);
        DeadLetter {
            id,
            broker: Some(BrokerKind::Kafka),
            dlq: Some(self.topic.name.to_owned()),
            source: decoded.source,
            reason: decoded.reason,
            failure_count: None,
            first_failed_at: None,
            last_failed_at: self.time,
            enqueued_at: None,
            headers: self.pairs[..self.extras_at]
                .iter()
                .map(|&(name, value)| (header_name(name.as_str()), Value::from(value)))
                .collect(),
            extras: self.pairs[self.extras_at..]
                .iter()
                .map(|&(name, value)| (name.as_str().to_owned(), Value::from(value)))
                .collect(),
            body: self.body.map(<[u8]>::to_vec),
        }
    }
}

/// Decode Spring Kafka's `kafka_dlt-*` headers (value side, else key side) or Kafka
/// Connect's `__connect.errors.*`, each asked for through `get` by its place in
/// [`FRAMEWORK_NAMES`]. Partition and offset are accepted as Spring writes them (4- and 8-byte
/// big-endian) or as text (Connect, older Spring). Written over `into` (the previous record's
/// failure, for a read that shows each letter and drops it), in the strings it already has.
fn decode_failure<'a>(get: impl Fn(usize) -> Option<Raw<'a>>, into: &mut Decoded) {
    let text = |place: usize| match get(place)? {
        Raw::Text(s) => Some(s.as_str()),
        Raw::Bytes(b) => std::str::from_utf8(b).ok(),
    };
    let number = |place: usize| -> Option<i64> {
        match get(place)? {
            Raw::Bytes(b) if b.len() == 4 => Some(i64::from(i32::from_be_bytes(b.try_into().ok()?))),
            Raw::Bytes(b) if b.len() == 8 => Some(i64::from_be_bytes(b.try_into().ok()?)),
            Raw::Text(s) => s.as_str().trim().parse().ok(),
            Raw::Bytes(_) => None,
        }
    };
    // The value side's headers, else the key side's: [class, cause class, message], shown prefix.
    let spring = |places: [usize; 3], prefix| {
        text(places[0]).map(|class| FailureText {
            prefix,
            class: Some(class),
            cause_class: text(places[1]),
            message: text(places[2]),
            topic: text(const { at("kafka_dlt-original-topic") }),
            partition: number(const { at("kafka_dlt-original-partition") }),
            offset: number(const { at("kafka_dlt-original-offset") }),
            ..FailureText::default()
        })
    };
    let value_side = const {
        [at("kafka_dlt-exception-fqcn"), at("kafka_dlt-exception-cause-fqcn"), at("kafka_dlt-exception-message")]
    };
    let key_side = const {
        [
            at("kafka_dlt-key-exception-fqcn"),
            at("kafka_dlt-key-exception-cause-fqcn"),
            at("kafka_dlt-key-exception-message"),
        ]
    };
    let connect = || {
        text(const { at("__connect.errors.exception.class.name") }).map(|class| FailureText {
            class: Some(class),
            message: text(const { at("__connect.errors.exception.message") }),
            code: text(const { at("__connect.errors.stage") }),
            topic: text(const { at("__connect.errors.topic") }),
            partition: number(const { at("__connect.errors.partition") }),
            offset: number(const { at("__connect.errors.offset") }),
            ..FailureText::default()
        })
    };
    let found = spring(value_side, "").or_else(|| spring(key_side, "key: ")).or_else(connect).unwrap_or_default();
    // Every field named: one added to the model cannot keep an earlier record's value.
    let Decoded {
        reason: Reason { kind, raw, code, exception_class, cause_class, message },
        source: Source { name, address, exchange, routing_keys, partition, offset },
    } = into;
    *kind = if found.class.is_some() { ReasonKind::Exception } else { ReasonKind::default() };
    refill(raw, found.class);
    if let Some(raw) = raw.as_mut().filter(|_| !found.prefix.is_empty()) {
        raw.insert_str(0, found.prefix);
    }
    refill(exception_class, found.class);
    refill(cause_class, found.cause_class);
    refill(message, found.message);
    refill(code, found.code);
    refill(name, found.topic);
    *address = None;
    *exchange = None;
    routing_keys.clear();
    *partition = found.partition.and_then(|p| i32::try_from(p).ok());
    *offset = found.offset;
}

/// A failure as its headers tell it, borrowed from them.
#[derive(Default)]
struct FailureText<'a> {
    /// Shown before the class in the reason's raw text: which side failed.
    prefix: &'static str,
    class: Option<&'a str>,
    cause_class: Option<&'a str>,
    message: Option<&'a str>,
    code: Option<&'a str>,
    topic: Option<&'a str>,
    partition: Option<i64>,
    offset: Option<i64>,
}

/// `slot` set to `value`, in the string it already holds where it holds one.
fn refill(slot: &mut Option<String>, value: Option<&str>) {
    match value {
        Some(value) => {
            let text = slot.get_or_insert_default();
            text.clear();
            text.push_str(value);
        }
        None => *slot = None,
    }
}

/// Where `name` is in [`FRAMEWORK_NAMES`], found while compiling: the decoder asks for each
/// header by its place, and a name not in the list does not compile.
const fn at(name: &str) -> usize {
    let mut i = 0;
    while i < FRAMEWORK_NAMES.len() {
        if FRAMEWORK_NAMES[i].len() == name.len() {
            let (known, wanted) = (FRAMEWORK_NAMES[i].as_bytes(), name.as_bytes());
            let mut j = 0;
            while j < known.len() && known[j] == wanted[j] {
                j += 1;
            }
            if j == known.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not one of FRAMEWORK_NAMES")
}

/// The names Spring Kafka and Kafka Connect put on dead letters, kept once for every letter
/// instead of copied into each. Spring's are in the order of how often its dead letters carry
/// them, those on every letter first: each record's names are looked up from the top.
const FRAMEWORK_NAMES: [&str; 24] = [
    "kafka_dlt-original-topic",
    "kafka_dlt-original-partition",
    "kafka_dlt-original-offset",
    "kafka_dlt-exception-fqcn",
    "kafka_dlt-exception-message",
    "kafka_dlt-exception-stacktrace",
    "kafka_dlt-original-timestamp",
    "kafka_dlt-original-timestamp-type",
    "kafka_dlt-original-consumer-group",
    "kafka_dlt-exception-cause-fqcn",
    "kafka_dlt-key-exception-fqcn",
    "kafka_dlt-key-exception-cause-fqcn",
    "kafka_dlt-key-exception-message",
    "kafka_dlt-key-exception-stacktrace",
    "__connect.errors.topic",
    "__connect.errors.partition",
    "__connect.errors.offset",
    "__connect.errors.connector.name",
    "__connect.errors.task.id",
    "__connect.errors.stage",
    "__connect.errors.class.name",
    "__connect.errors.exception.class.name",
    "__connect.errors.exception.message",
    "__connect.errors.exception.stacktrace",
];

/// What dlqctl adds to every record's headers, appended after them: where it is, when it was
/// written, its key.
fn push_extras<'a>(m: &'a impl Message, time: Option<DateTime<Utc>>, pairs: &mut Vec<(Text<'a>, ValueView<'a>)>) {
    pairs.push((Text::plain("partition"), ValueView::Int(i64::from(m.partition()))));
    pairs.push((Text::plain("offset"), ValueView::Int(m.offset())));
    if let Some(t) = time {
        pairs.push((Text::plain("timestamp"), ValueView::Timestamp(t)));
    }
    if let Some(key) = m.key() {
        pairs.push((Text::plain("key"), Raw::of(key).view()));
    }
}

/// A header's name as a letter keeps it: the framework's own names shared, not copied.
fn header_name(key: &str) -> Name {
    framework_index(key).map_or_else(|| Name::Owned(key.to_owned()), |i| Name::Borrowed(FRAMEWORK_NAMES[i]))
}

/// Where `key` is in [`FRAMEWORK_NAMES`]. Inlined: called for every header a read lists.
#[inline(always)]
fn framework_index(key: &str) -> Option<usize> {
    // Every framework name has one of two prefixes: any other name costs one comparison.
    if key.starts_with("kafka_dlt-") || key.starts_with("__connect.errors.") {
        FRAMEWORK_NAMES.iter().position(|name| *name == key)
    } else {
        None
    }
}

/// Whether UTF-8 `bytes` hold a control character other than tab and line breaks, read off the
/// bytes instead of decoding every char: C0 controls and DEL are single bytes, and the C1 ones
/// (U+0080 to U+009F) are encoded 0xC2 0x80 to 0xC2 0x9F. Bytes that are not UTF-8 may be
/// either way; their value is bytes regardless.
fn has_control_character(bytes: &[u8]) -> bool {
    bytes.iter().enumerate().any(|(i, &b)| match b {
        b'\t' | b'\n' | b'\r' => false,
        0..0x20 | 0x7f => true,
        0xc2 => bytes.get(i + 1).is_some_and(|&next| next < 0xa0),
        _ => false,
    })
}

fn value_bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::Bytes(b) => b.clone(),
        other => other.to_string().into_bytes(),
    }
}

/// `dlqctl-settled:5,7-9` -> {5, 7, 8, 9}.
fn parse_settled(metadata: &str) -> BTreeSet<i64> {
    let mut out = BTreeSet::new();
    // librdkafka may hand the metadata back with the C string's terminating NUL.
    let Some(list) = metadata.trim_end_matches('\0').strip_prefix(SETTLED) else { return out };
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<i64>().ok()),
        }
    }
    out
}

fn format_settled(offsets: &BTreeSet<i64>) -> String {
    let mut parts = Vec::new();
    let mut iter = offsets.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().expect("peeked");
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
    }
    format!("{SETTLED}{}", parts.join(","))
}

fn classify(e: &KafkaError) -> Failure {
    match e.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::UnknownPartition,
        ) => Failure::Permanent,
        _ => Failure::Transient,
    }
}

#[async_trait]
impl Broker for KafkaBroker {
    fn backend(&self) -> &'static str {
        "Kafka"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { peek: true, peek_cost: None, consume: true, server_move: false, rereads_settled: true }
    }

    async fn describe(&self) -> Result<Description> {
        let topic = self.topic()?.to_owned();
        Ok(self.describe_topic(&topic, false).await?)
    }

    async fn list(&self) -> Result<Vec<Description>> {
        if let Some(topic) = &self.target.topic {
            return Ok(vec![self.describe_topic(topic, true).await?]);
        }
        let mut out = Vec::new();
        for name in self.dead_letter_topics()? {
            out.push(self.describe_topic(&name, true).await?);
        }
        Ok(out)
    }

    async fn peek(&self, limit: Option<u64>) -> Result<LetterStream<'_>> {
        let reader = self.start_read().await?;
        let remaining = limit.unwrap_or(u64::MAX);
        Ok(futures::stream::unfold((reader, remaining), move |(mut reader, remaining)| async move {
            if remaining == 0 {
                return None;
            }
            let Some(next) = reader.next(|m, topic| self.normalize(m, topic)).await else {
                self.read_ended(&reader);
                return None;
            };
            let item = next.map_err(|e| self.read_error(e));
            self.read.fetch_add(1, Ordering::Relaxed);
            Some((item, (reader, remaining - 1)))
        })
        .boxed())
    }

    /// Each record shown where librdkafka holds it: no body or header is copied, and the
    /// strings a letter owns are the previous letter's, written over.
    async fn peek_each(&self, limit: Option<u64>, visit: &mut Visit<'_>) -> Result<()> {
        let mut reader = self.start_read().await?;
        let consumer = Arc::clone(&reader.consumer);
        let mut messages = consumer.stream();
        let mut owned = Owned::default();
        for _ in 0..limit.unwrap_or(u64::MAX) {
            let shown = |m: &BorrowedMessage<'_>, topic: Topic<'_>| {
                let letter = self.record_letter(m, topic, &mut owned);
                let visited = visit(&letter.view());
                letter.hand_back();
                visited
            };
            let Some(next) = reader.next_from(&mut messages, shown).await else {
                self.read_ended(&reader);
                break;
            };
            next.map_err(|e| self.read_error(e))??;
            self.read.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn receive(&self, max: usize) -> Result<Vec<Received>> {
        let topic = self.topic()?.to_owned();
        let mut slot = self.taker.lock().await;
        if slot.is_none() {
            let reader = self.reader(&topic, true).await?;
            let partitions: Vec<i32> = reader.positions.keys().copied().collect();
            let committed = self.committed(&reader.consumer, &topic, &partitions)?;
            let mut commits = self.commits.lock().expect("not poisoned");
            let mut watch = self.watch.lock().expect("not poisoned");
            for (p, (start, _)) in &reader.positions {
                // Commits go on from where this read starts, keeping what earlier runs settled beyond it.
                let beyond = committed.get(p).map(|c| c.beyond.clone()).unwrap_or_default();
                commits.insert(*p, Commit { next: *start, beyond });
                watch.expected.insert(*p, committed.get(p).map(|c| c.next));
            }
            *slot = Some(reader);
        }
        let reader = slot.as_mut().expect("set above");
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let Some(next) = reader.next(|m, topic| ((m.partition(), m.offset()), self.normalize(m, topic))).await
            else {
                break;
            };
            let (position, letter) = next.map_err(|e| Error::Runtime(format!("reading {}: {e}", self.shown)))?;
            out.push(Received { handle: self.handed.issue(position), letter });
        }
        Ok(out)
    }

    async fn settle(&self, handles: &[Handle]) -> Result<()> {
        let topic = self.topic()?.to_owned();
        let settled = self.handed.take(handles);
        let mut tpl = TopicPartitionList::new();
        {
            let mut commits = self.commits.lock().expect("not poisoned");
            let mut touched = BTreeSet::new();
            for (p, o) in settled {
                let c = commits.entry(p).or_default();
                c.beyond.insert(o);
                while c.beyond.remove(&c.next) {
                    c.next += 1;
                }
                touched.insert(p);
            }
            for p in touched {
                let c = &commits[&p];
                tpl.add_partition_offset(&topic, p, Offset::Offset(c.next))
                    .map_err(|e| Error::Runtime(format!("committing {topic}/{p}: {e}")))?;
                if let Some(mut e) = tpl.find_partition(&topic, p) {
                    e.set_metadata(format_settled(&c.beyond));
                }
            }
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        let consumer = self
            .taker
            .lock()
            .await
            .as_ref()
            .ok_or_else(|| Error::Runtime("settle before receive".into()))?
            .consumer
            .clone();
        let expected = {
            let watch = self.watch.lock().expect("not poisoned");
            let due = watch.last_check.is_none_or(|t| t.elapsed() >= WATCH_EVERY);
            due.then(|| watch.expected.clone())
        };
        let checked = expected.is_some();
        let committing = tpl.clone();
        let group = self.target.group.clone();
        let watched_topic = topic.clone();
        // A synchronous commit waits for the group coordinator as long as librdkafka likes: off
        // the async thread, so that --timeout can give up on it (the offsets then stay
        // uncommitted, and a later run reads those records again).
        tokio::task::spawn_blocking(move || {
            if let Some(expected) = &expected {
                let mut partitions = TopicPartitionList::new();
                for p in expected.keys() {
                    partitions.add_partition(&watched_topic, *p);
                }
                let now = consumer.committed_offsets(partitions, TIMEOUT).map_err(|e| e.to_string())?;
                for e in now.elements_for_topic(&watched_topic) {
                    let now = match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    };
                    if expected.get(&e.partition()).is_some_and(|want| *want != now) {
                        return Err(format!(
                            "another run is settling {watched_topic} for group {group:?} at the same time \
                             (partition {}'s committed offset moved under this run): this run stops here; run \
                             one redrive per topic and group at a time",
                            e.partition()
                        ));
                    }
                }
            }
            consumer
                .commit(&committing, CommitMode::Sync)
                .map_err(|e| format!("committing offsets of group {group:?}: {e}"))
        })
        .await
        .map_err(|e| Error::Runtime(format!("committing offsets: {e}")))?
        .map_err(Error::Runtime)?;
        let mut watch = self.watch.lock().expect("not poisoned");
        if checked {
            watch.last_check = Some(std::time::Instant::now());
        }
        for e in tpl.elements_for_topic(&topic) {
            if let Offset::Offset(o) = e.offset() {
                watch.expected.insert(e.partition(), Some(o));
            }
        }
        Ok(())
    }

    async fn release(&self, handles: &[Handle]) -> Result<()> {
        // Nothing to undo: an uncommitted offset is still pending for the group.
        self.handed.take(handles);
        Ok(())
    }

    async fn lint_inventory(&self) -> Result<Inventory> {
        let mut queues = Vec::new();
        for topic in self.dead_letter_topics()? {
            let (retention, cleanup) = self.topic_config(&topic).await;
            queues.push(QueueFacts {
                broker: "kafka",
                name: topic,
                is_dlq: true,
                retention: retention.filter(|ms| *ms >= 0).map(|ms| Duration::from_millis(ms as u64)),
                cleanup_policy: cleanup,
                ..QueueFacts::default()
            });
        }
        Ok(Inventory { queues, alarms: Vec::new() })
    }

    fn source_destination(&self, letter: &DeadLetter) -> Option<Destination> {
        let topic = letter.source.name.clone()?;
        let partition = if self.options.keep_partition { letter.source.partition } else { None };
        let label = match partition {
            Some(p) => format!("topic {topic} partition {p}"),
            None => format!("topic {topic}"),
        };
        Some(Destination { label, route: Route::Kafka { topic, partition } })
    }

    fn source_sink(&self) -> Option<&dyn Sink> {
        Some(self)
    }

    fn read_notes(&self) -> Vec<String> {
        let mut notes = match self.read.load(Ordering::Relaxed) {
            0 => Vec::new(),
            n => vec![format!(
                "read {n} record(s) by assigning partitions, without joining group {:?} or committing: no side effects",
                self.target.group
            )],
        };
        notes.extend(self.stopped_short.lock().expect("not poisoned").iter().cloned());
        notes
    }
}

impl KafkaBroker {
    /// The topics whose names say they are dead-letter topics (`?pattern=` or the default rule).
    fn dead_letter_topics(&self) -> Result<Vec<String>> {
        let consumer = self.consumer()?;
        let metadata = consumer
            .fetch_metadata(None, TIMEOUT)
            .map_err(|e| Error::Runtime(format!("cannot list topics of {}: {e}", self.shown)))?;
        let pattern = Regex::new(self.target.pattern.as_deref().unwrap_or(DEFAULT_DLT_PATTERN))
            .map_err(|e| Error::Usage(format!("?pattern= is not a regular expression: {e}")))?;
        let mut names: Vec<String> =
            metadata.topics().iter().map(|t| t.name().to_owned()).filter(|n| pattern.is_match(n)).collect();
        names.sort();
        Ok(names)
    }

    async fn describe_topic(&self, topic: &str, sample_sources: bool) -> Result<Description> {
        let consumer = self.consumer()?;
        let marks = self.watermarks(&consumer, topic).await?;
        let partitions: Vec<i32> = marks.keys().copied().collect();
        let committed = self.committed(&consumer, topic, &partitions)?;
        let mut pending = 0i64;
        let mut retained = 0i64;
        let mut per_partition = Vec::new();
        for (p, (low, high)) in &marks {
            let start = committed.get(p).map_or(*low, |c| c.next.max(*low));
            let settled_beyond = self.settled_beyond(*p, committed.get(p)).len() as i64;
            let waiting = (high - start - settled_beyond).max(0);
            pending += waiting;
            retained += high - low;
            per_partition.push(format!("p{p}:{waiting}"));
        }
        let (retention, cleanup) = self.topic_config(topic).await;
        let mut notes = vec![
            format!(
                "{pending} pending for group {:?} ({}), {retained} retained",
                self.target.group,
                per_partition.join(" ")
            ),
            format!("cleanup.policy {}", cleanup.as_deref().unwrap_or("?")),
        ];
        let (oldest, sources) = self.sample(topic, &marks, sample_sources).await;
        if let Some(t) = oldest {
            notes.push(format!("oldest retained {}", crate::model::format_time(&t)));
        }
        Ok(Description {
            target: format!("kafka://{}/{topic}", self.target.bootstrap.join(",")),
            name: topic.to_owned(),
            kind: "kafka topic",
            depth: Some(pending.max(0) as u64),
            oldest_age: oldest.map(|t| (Utc::now() - t).to_std().unwrap_or_default()),
            retention: retention.filter(|ms| *ms >= 0).map(|ms| Duration::from_millis(ms as u64)),
            sources,
            capabilities: self.capabilities(),
            notes,
        })
    }

    async fn topic_config(&self, topic: &str) -> (Option<i64>, Option<String>) {
        let Ok(admin) = self.config().create::<AdminClient<DefaultClientContext>>() else { return (None, None) };
        let admin = Detached::new(admin);
        let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
        let Ok(results) = admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &options).await else {
            return (None, None);
        };
        let Some(Ok(resource)) = results.into_iter().next() else { return (None, None) };
        let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
        (value("retention.ms").and_then(|v| v.parse().ok()), value("cleanup.policy"))
    }

    /// The oldest retained record's time, and the source topics named in the first records'
    /// headers.
    async fn sample(
        &self,
        topic: &str,
        marks: &BTreeMap<i32, (i64, i64)>,
        with_sources: bool,
    ) -> (Option<chrono::DateTime<Utc>>, Vec<String>) {
        let Ok(consumer) = self.consumer() else { return (None, Vec::new()) };
        let mut tpl = TopicPartitionList::new();
        for (p, (low, _)) in marks {
            let _ = tpl.add_partition_offset(topic, *p, Offset::Offset(*low));
        }
        if consumer.assign(&tpl).is_err() {
            return (None, Vec::new());
        }
        // From each partition's first retained record to its end.
        let mut reader = Reader::new(consumer, topic, marks.clone(), BTreeMap::new());
        let mut oldest: Option<chrono::DateTime<Utc>> = None;
        let mut sources = BTreeSet::new();
        let want = if with_sources { SOURCE_SAMPLE } else { marks.len() };
        for _ in 0..want {
            let Some(Ok((partition, letter))) = reader.next(|m, topic| (m.partition(), self.normalize(m, topic))).await
            else {
                break;
            };
            if let Some(t) = letter.last_failed_at {
                oldest = Some(oldest.map_or(t, |o| o.min(t)));
            }
            if let Some(s) = letter.source.name {
                sources.insert(s);
            }
            if !with_sources {
                // One record per partition is enough for the oldest time.
                if let Some((next, end)) = reader.positions.get_mut(&partition) {
                    *next = *end;
                }
            }
        }
        (oldest, sources.into_iter().collect())
    }
}

#[async_trait]
impl Sink for KafkaBroker {
    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<std::result::Result<(), PublishError>> {
        let producer = match self.producer().await {
            Ok(p) => p,
            Err(e) => return vec![Err(e); batch.len()],
        };
        let mut missing = BTreeMap::new();
        for (_, destination) in batch {
            if let Route::Kafka { topic, .. } = &destination.route
                && !missing.contains_key(topic)
            {
                missing.insert(topic.clone(), self.check_topic(producer, topic));
            }
        }
        let missing = &missing;
        let sends = batch.iter().map(|(letter, destination)| async move {
            let Route::Kafka { topic, partition } = &destination.route else {
                return Err(PublishError {
                    failure: Failure::Permanent,
                    message: format!("Kafka cannot publish to {}", destination.label),
                });
            };
            if let Some(Err(e)) = missing.get(topic) {
                return Err(e.clone());
            }
            let headers = record_headers(&letter.headers);
            let key = letter.extras.get("key").map(value_bytes);
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
            if let Some(k) = &key {
                record = record.key(k.as_slice());
            }
            if let Some(body) = &letter.body {
                record = record.payload(body.as_slice());
            }
            if let Some(p) = partition {
                record = record.partition(*p);
            }
            producer
                .send(record, TIMEOUT)
                .await
                .map(|_| ())
                .map_err(|(e, _)| PublishError { failure: classify(&e), message: format!("producing to {topic}: {e}") })
        });
        futures::future::join_all(sends).await
    }
}

impl KafkaBroker {
    /// Whether `topic` exists: a produce to a missing topic would only time out.
    fn check_topic(&self, producer: &FutureProducer, topic: &str) -> std::result::Result<(), PublishError> {
        if self.topics_seen.lock().expect("not poisoned").contains(topic) {
            return Ok(());
        }
        let metadata = producer.client().fetch_metadata(Some(topic), TIMEOUT).map_err(|e| PublishError {
            failure: Failure::Transient,
            message: format!("metadata for topic {topic}: {e}"),
        })?;
        let exists =
            metadata.topics().iter().any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
        if !exists {
            return Err(PublishError {
                failure: Failure::Permanent,
                message: format!("topic {topic} does not exist on {}", self.shown),
            });
        }
        self.topics_seen.lock().expect("not poisoned").insert(topic.to_owned());
        Ok(())
    }
}

/// Whether `--to` names the DLQ itself: the same topic on a cluster the two bootstrap lists
/// share a broker of.
pub fn names_the_dlq(dlq: &KafkaTarget, to: &KafkaTarget) -> bool {
    dlq.topic.is_some()
        && dlq.topic == to.topic
        && dlq.bootstrap.iter().any(|a| to.bootstrap.iter().any(|b| crate::target::same_address(a, b)))
}

/// The destination `--to kafka://HOST:PORT/TOPIC` names.
pub fn destination_for(target: &KafkaTarget, shown: &str) -> Result<Destination> {
    let topic = target
        .topic
        .clone()
        .ok_or_else(|| Error::Usage(format!("--to {shown} names no topic: use kafka://HOST:PORT/TOPIC")))?;
    Ok(Destination { label: format!("topic {topic}"), route: Route::Kafka { topic, partition: None } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Header;

    fn record(headers: &[(&str, Option<&[u8]>)]) -> OwnedHeaders {
        headers.iter().fold(OwnedHeaders::new(), |all, &(key, value)| all.insert(Header { key, value }))
    }

    /// What a record's headers decode to, held the same whether the letter keeps its headers
    /// (export) or not (summarize), and whether or not it is written over a previous
    /// letter's, every field of which was set.
    fn decoded(headers: &[(&str, Option<&[u8]>)]) -> Decoded {
        let record = record(headers);
        let decode = |into: &mut Decoded| {
            decode_record_headers(&record, into);
            std::mem::take(into)
        };
        let in_place = decode(&mut Decoded::default());
        let old = || {
            let old = Some("old".to_owned());
            Decoded {
                reason: Reason {
                    kind: ReasonKind::Rejected,
                    raw: old.clone(),
                    code: old.clone(),
                    exception_class: old.clone(),
                    cause_class: old.clone(),
                    message: old.clone(),
                },
                source: Source {
                    name: old.clone(),
                    address: old.clone(),
                    exchange: old.clone(),
                    routing_keys: vec!["old".into()],
                    partition: Some(9),
                    offset: Some(9),
                },
            }
        };
        let shown = |mut into: Decoded| {
            letter_headers(&record, &mut into, &mut Vec::new());
            into
        };
        assert_eq!(decode(&mut old()), in_place, "{headers:?}");
        assert_eq!(shown(Decoded::default()), in_place, "{headers:?}");
        assert_eq!(shown(old()), in_place, "{headers:?}");
        in_place
    }

    #[test]
    fn spring_headers_with_binary_partition_and_offset() {
        let d = decoded(&[
            ("kafka_dlt-exception-fqcn", Some(b"org.springframework.kafka.listener.ListenerExecutionFailedException")),
            ("kafka_dlt-exception-cause-fqcn", Some(b"java.lang.IllegalStateException")),
            ("kafka_dlt-exception-message", Some(b"boom")),
            ("kafka_dlt-original-topic", Some(b"orders")),
            ("kafka_dlt-original-partition", Some(&2i32.to_be_bytes())),
            ("kafka_dlt-original-offset", Some(&1234i64.to_be_bytes())),
        ]);
        assert_eq!(d.reason.kind, ReasonKind::Exception);
        assert_eq!(d.reason.cause_class.as_deref(), Some("java.lang.IllegalStateException"));
        assert_eq!(d.reason.message.as_deref(), Some("boom"));
        assert_eq!(
            (d.source.name.as_deref(), d.source.partition, d.source.offset),
            (Some("orders"), Some(2), Some(1234))
        );
    }

    #[test]
    fn key_side_exceptions_and_connect_headers() {
        let d = decoded(&[(
            "kafka_dlt-key-exception-fqcn",
            Some(b"org.apache.kafka.common.errors.SerializationException"),
        )]);
        assert_eq!(d.reason.raw.as_deref(), Some("key: org.apache.kafka.common.errors.SerializationException"));
        let d = decoded(&[
            ("__connect.errors.topic", Some(b"orders")),
            ("__connect.errors.partition", Some(b"1")),
            ("__connect.errors.offset", Some(b"77")),
            ("__connect.errors.stage", Some(b"VALUE_CONVERTER")),
            ("__connect.errors.exception.class.name", Some(b"org.apache.kafka.connect.errors.DataException")),
            ("__connect.errors.exception.message", Some(&[0xff, 0x00])),
        ]);
        assert_eq!(d.reason.exception_class.as_deref(), Some("org.apache.kafka.connect.errors.DataException"));
        assert_eq!(d.reason.code.as_deref(), Some("VALUE_CONVERTER"));
        assert_eq!(d.reason.message, None, "not text");
        assert_eq!((d.source.partition, d.source.offset), (Some(1), Some(77)));
        assert_eq!(decoded(&[]), Decoded::default());
        assert_eq!(decoded(&[("seq", Some(b"1")), ("tenant", None)]), Decoded::default());
    }

    #[test]
    fn the_first_value_under_a_name_decides_and_numbers_may_be_text() {
        let d = decoded(&[
            ("kafka_dlt-exception-fqcn", Some(b"java.lang.IllegalStateException")),
            ("kafka_dlt-exception-message", Some(b"boom\n\tat line 3")),
            ("kafka_dlt-original-topic", None),
            ("kafka_dlt-original-topic", Some(b"hidden")),
            ("kafka_dlt-original-partition", Some(b"1234")),
            ("kafka_dlt-original-offset", Some(b" 99 ")),
        ]);
        assert_eq!(d.reason.message.as_deref(), Some("boom\n\tat line 3"));
        assert_eq!(d.source.name, None, "a null first value hides the second");
        assert_eq!((d.source.partition, d.source.offset), (Some(1234), Some(99)), "text, not big-endian");
    }

    /// A letter's headers go back onto a record (a redrive) and decode to the same failure.
    #[test]
    fn a_letters_headers_decode_as_the_record_they_came_from() {
        let original = record(&[
            ("kafka_dlt-exception-fqcn", Some(b"java.lang.IllegalStateException")),
            ("kafka_dlt-original-topic", Some(b"orders")),
            ("kafka_dlt-original-partition", Some(&7i32.to_be_bytes())),
            ("kafka_dlt-original-offset", Some(b"99")),
            ("tenant", None),
        ]);
        let mut pairs = listed(&original);
        let extras_at = pairs.len();
        pairs.push((Text::plain("partition"), ValueView::Int(3)));
        let letter = RecordLetter {
            extras_at,
            pairs,
            owned: &mut Owned::default(),
            topic: Topic { name: "orders.DLT", plain: true },
            time: None,
            body: None,
        }
        .into_letter();
        assert_eq!(letter.headers.len(), 5);
        assert_eq!(letter.extras, Headers::from_iter([("partition", Value::Int(3))]));
        let mut decoded = Decoded::default();
        decode_record_headers(&original, &mut decoded);
        assert_eq!(decode_failure_headers(&letter.headers), decoded);
        assert_eq!(decode_failure_headers(&letter.headers).source.partition, Some(7));
    }

    #[test]
    fn a_letter_keeps_every_header_in_order() {
        let record = record(&[
            ("seq", Some(b"1")),
            ("tenant", None),
            ("kafka_dlt-original-partition", Some(&7i32.to_be_bytes())),
            ("seq", Some(b"2")),
        ]);
        let headers = listed(&record);
        assert_eq!(
            headers,
            [
                (Text::new("seq"), ValueView::Text(Text::new("1"))),
                (Text::new("tenant"), ValueView::Null),
                (Text::new("kafka_dlt-original-partition"), ValueView::Bytes(&[0, 0, 0, 7])),
                (Text::new("seq"), ValueView::Text(Text::new("2"))),
            ]
        );
        // As an export lists them: in the vector an earlier, longer record's were listed in.
        let earlier = self::record(&[("a", Some(b"x")), ("b", None), ("c", Some(b"y")), ("d", None), ("e", None)]);
        let mut reused = recycled(listed(&earlier));
        letter_headers(&record, &mut Decoded::default(), &mut reused);
        assert_eq!(reused, headers);
    }

    /// A record's headers as a letter lists them.
    fn listed(record: &OwnedHeaders) -> Vec<(Text<'_>, ValueView<'_>)> {
        let mut headers = Vec::new();
        letter_headers(record, &mut Decoded::default(), &mut headers);
        headers
    }

    #[test]
    fn control_characters_are_found_on_the_bytes_as_on_the_chars() {
        let by_chars = |s: &str| s.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'));
        let mut cases: Vec<String> =
            ["", "orders", "a\tb\r\n", "é", "\u{a0}", "¿", "日本", "\u{10ffff}"].map(str::to_owned).into();
        cases.extend((0..=0x2000u32).filter_map(char::from_u32).map(|c| format!("x{c}y")));
        for s in &cases {
            assert_eq!(has_control_character(s.as_bytes()), by_chars(s), "{s:?}");
        }
    }

    #[test]
    fn header_values_are_text_only_when_printable() {
        assert_eq!(Raw::of(b"orders").view(), ValueView::Text(Text::new("orders")));
        assert_eq!(Raw::of(&[0, 0, 0, 2]).view(), ValueView::Bytes(&[0, 0, 0, 2]));
        assert_eq!(Raw::of("a\tb é".as_bytes()).view(), ValueView::Text(Text::new("a\tb é")));
        assert_eq!(Raw::of(b"a\x7fb").view(), ValueView::Bytes(b"a\x7fb"));
        assert_eq!(Raw::of(&[b'a', 0xff]).view(), ValueView::Bytes(&[b'a', 0xff]));
        assert_eq!(value_bytes(&Value::Bytes(vec![0, 0, 0, 2])), vec![0, 0, 0, 2]);
    }

    #[test]
    fn framework_names_are_written_without_the_escaper() {
        for name in FRAMEWORK_NAMES {
            assert_eq!(AsciiClass::of(name.as_bytes()), AsciiClass::Plain, "{name}");
        }
    }

    #[test]
    fn settled_offsets_round_trip_as_ranges() {
        let offsets: BTreeSet<i64> = [5, 7, 8, 9, 12].into();
        let text = format_settled(&offsets);
        assert_eq!(text, "dlqctl-settled:5,7-9,12");
        assert_eq!(parse_settled(&text), offsets);
        assert!(parse_settled("other metadata").is_empty());
    }

    #[test]
    fn redrive_copies_are_acknowledged_and_kept_in_order_without_the_idempotent_producer() {
        let settings: BTreeMap<_, _> = PRODUCER_SETTINGS.into_iter().collect();
        assert_eq!(settings["acks"], "all", "a copy counts only once every in-sync replica has it");
        assert_eq!(settings["max.in.flight.requests.per.connection"], "1", "a retry must not reorder copies");
        assert_eq!(settings["enable.idempotence"], "false", "librdkafka's idempotent producer spins while it waits");
    }

    #[test]
    fn the_default_pattern_finds_dead_letter_topics() {
        let re = Regex::new(DEFAULT_DLT_PATTERN).unwrap();
        for yes in [
            "orders.DLT",
            "orders-dlt",
            "orders.dlq",
            "orders-dlq",
            "dlq.orders",
            "dlq-orders-jdbc-sink",
            "orders-dead-letter",
        ] {
            assert!(re.is_match(yes), "{yes}");
        }
        for no in ["orders", "dlqctl", "orders.retry"] {
            assert!(!re.is_match(no), "{no}");
        }
    }
}
