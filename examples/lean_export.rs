//! The leanest Kafka export, for `scripts/bench`: for each record of the bench's topic, the
//! same JSONL line `dlqctl export` writes, byte for byte, written straight from librdkafka's
//! buffers into the output: no dead letter in between, nothing allocated per record, and the
//! same escaping, base64 and UTF-8 crates dlqctl uses. It decodes only what the bench's
//! records carry (Spring's value-side headers); the bench checks that its output is dlqctl's.
//! What it spends above the loop that reads headers is what writing the lines costs in
//! itself, whatever the export's design.
//!
//!     lean_export BROKERS TOPIC N    > lines.jsonl

use std::io::Write;
use std::time::Duration;

use base64_simd::STANDARD as BASE64;
use chrono::{DateTime, SecondsFormat};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers as _;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The bench's records carry six headers.
const MAX_HEADERS: usize = 16;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [brokers, topic, n] = &args[..] else { return Err("usage: lean_export BROKERS TOPIC N".into()) };
    let n: usize = n.parse()?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "dlqctl-lean-export")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut assignment = TopicPartitionList::new();
    for partition in metadata.topics()[0].partitions() {
        assignment.add_partition_offset(topic, partition.id(), Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;

    let mut stdout = std::io::stdout().lock();
    let mut out = Vec::with_capacity(256 * 1024);
    // The last record time and its text: records written together share one.
    let mut time = (i64::MIN, String::new());
    let mut read = 0;
    while read < n {
        let Some(message) = consumer.poll(Duration::from_secs(10)) else { continue };
        let m = message?;
        let ms = m.timestamp().to_millis().ok_or("a record without a timestamp")?;
        if time.0 != ms {
            let t = DateTime::from_timestamp_millis(ms).ok_or("a timestamp out of range")?;
            time = (ms, t.to_rfc3339_opts(SecondsFormat::AutoSi, true));
        }
        write_line(&mut out, &m, &time.1)?;
        if out.len() >= 128 * 1024 {
            stdout.write_all(&out)?;
            out.clear();
        }
        read += 1;
    }
    stdout.write_all(&out)?;
    Ok(())
}

fn write_line(out: &mut Vec<u8>, m: &impl Message, time: &str) -> Result<()> {
    // Every header once, on the stack, for the decoding and then the writing.
    let mut headers = [("", None); MAX_HEADERS];
    let count = m.headers().map_or(0, |h| h.count());
    for (slot, h) in headers.iter_mut().zip(m.headers().iter().flat_map(|h| h.iter())) {
        *slot = (h.key, h.value);
    }
    let headers = headers.get(..count).ok_or("more headers than the bench's records carry")?;
    let header = |name: &str| headers.iter().find(|(key, _)| *key == name).and_then(|(_, value)| *value);
    let (mut partition, mut offset) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (partition, offset) = (partition.format(m.partition()), offset.format(m.offset()));
    let topic = m.topic();

    out.extend_from_slice(b"{\"schema\":\"dlqctl/dead-letter/v1\",\"id\":\"");
    for part in [topic, "-", partition, "@", offset] {
        out.extend_from_slice(part.as_bytes());
    }
    out.extend_from_slice(b"\",\"broker\":\"kafka\",\"dlq\":");
    json_escape_simd::escape_into(topic, out);
    out.extend_from_slice(b",\"source\":{");
    if let Some(name) = header("kafka_dlt-original-topic") {
        out.extend_from_slice(b"\"name\":");
        json_escape_simd::escape_into(std::str::from_utf8(name).unwrap_or_default(), out);
    }
    let number = |name: &str| match header(name) {
        Some(b) if b.len() == 4 => Some(i64::from(i32::from_be_bytes(b.try_into().ok()?))),
        Some(b) if b.len() == 8 => Some(i64::from_be_bytes(b.try_into().ok()?)),
        _ => None,
    };
    for (key, value) in [
        (&b",\"partition\":"[..], number("kafka_dlt-original-partition")),
        (b",\"offset\":", number("kafka_dlt-original-offset")),
    ] {
        if let Some(value) = value {
            out.extend_from_slice(key);
            out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        }
    }
    out.extend_from_slice(b"},\"reason\":");
    let class = header("kafka_dlt-exception-fqcn").and_then(|b| std::str::from_utf8(b).ok());
    let class = class.ok_or("a record without Spring's exception header")?;
    out.extend_from_slice(b"{\"kind\":\"exception\",\"raw\":");
    json_escape_simd::escape_into(class, out);
    out.extend_from_slice(b",\"exception_class\":");
    json_escape_simd::escape_into(class, out);
    out.push(b'}');
    out.extend_from_slice(b",\"last_failed_at\":\"");
    out.extend_from_slice(time.as_bytes());
    out.extend_from_slice(b"\",\"headers\":{");
    for (i, (key, value)) in headers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_escape_simd::escape_into(key, out);
        out.push(b':');
        write_value(out, *value);
    }
    out.extend_from_slice(b"},\"extras\":{\"partition\":");
    out.extend_from_slice(partition.as_bytes());
    out.extend_from_slice(b",\"offset\":");
    out.extend_from_slice(offset.as_bytes());
    out.extend_from_slice(b",\"timestamp\":{\"$timestamp\":\"");
    out.extend_from_slice(time.as_bytes());
    out.extend_from_slice(b"\"}");
    if let Some(key) = m.key() {
        out.extend_from_slice(b",\"key\":");
        write_value(out, Some(key));
    }
    out.extend_from_slice(b"},\"body\":");
    match m.payload().map(|body| simdutf8::basic::from_utf8(body).map_err(|_| body)) {
        None => out.extend_from_slice(b"null"),
        Some(Ok(text)) => {
            json_escape_simd::escape_into(text, out);
            out.extend_from_slice(b",\"body_encoding\":\"utf8\"");
        }
        Some(Err(binary)) => {
            out.push(b'"');
            BASE64.encode_append(binary, out);
            out.extend_from_slice(b"\",\"body_encoding\":\"base64\"");
        }
    }
    out.extend_from_slice(b"}\n");
    Ok(())
}

/// A header value as dlqctl writes one: text when printable UTF-8, else `{"$bytes":...}`.
fn write_value(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value.map(|b| std::str::from_utf8(b).map_err(|_| b)) {
        None => out.extend_from_slice(b"null"),
        Some(Ok(text)) if printable(text) => json_escape_simd::escape_into(text, out),
        Some(Ok(text)) => write_bytes(out, text.as_bytes()),
        Some(Err(bytes)) => write_bytes(out, bytes),
    }
}

fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(b"{\"$bytes\":\"");
    BASE64.encode_append(bytes, out);
    out.extend_from_slice(b"\"}");
}

/// No control characters but tab and line breaks; most values are printable ASCII.
fn printable(text: &str) -> bool {
    text.bytes().all(|b| (b' '..=b'~').contains(&b))
        || !text.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
}
