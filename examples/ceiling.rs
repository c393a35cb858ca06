//! The brokers' ceilings for `scripts/bench`: the plainest, fastest client loop that only
//! does the transfer (no decoding, no output, no bookkeeping), using the same client library
//! dlqctl uses. Nothing dlqctl does can beat these on the same machine. For Kafka, also the
//! leanest export (kafka-export): dlqctl's output with none of dlqctl.
//!
//!     ceiling rabbitmq-read AMQP_URL QUEUE N [PREFETCH]   every message, none consumed
//!     ceiling rabbitmq-move AMQP_URL FROM TO N      publish with confirms, then ack
//!     ceiling kafka-read BROKERS TOPIC N [+HEADERS] from the beginning, every partition; with
//!                                                   +HEADERS, also read every header (librdkafka
//!                                                   parses them only when asked)
//!     ceiling kafka-export BROKERS TOPIC N          the leanest export: for each record of the
//!                                                   bench's topic, the line `dlqctl export`
//!                                                   writes, byte for byte, straight from
//!                                                   librdkafka's buffers (nothing allocated per
//!                                                   record; Spring's value-side headers only).
//!                                                   What it spends above +HEADERS is what
//!                                                   writing the lines costs, whatever the design
//!     ceiling kafka-move BROKERS FROM TO N [+ID]    produce with delivery reports; with +ID,
//!                                                   add the two headers a redrive must add
//!                                                   (what they cost the broker, told apart)
//!     ceiling sqs-read QUEUE_URL N                  receive, then make visible again
//!     ceiling sqs-move FROM_URL TO_URL N            send batch, then delete batch
//!
//! SQS loops take the endpoint and credentials from the usual AWS_* variables.

use std::io::Write;
use std::time::Duration;

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry};
use base64_simd::STANDARD as BASE64;
use chrono::{DateTime, SecondsFormat};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The bench's records carry six headers (kafka-export).
const MAX_HEADERS: usize = 16;

/// Messages published between waits for confirms (RabbitMQ) or delivery reports (Kafka).
const WINDOW: usize = 1000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = |i: usize| -> usize { args[i].parse().expect("N is a count") };
    match args.first().map(String::as_str) {
        Some("rabbitmq-read") => {
            let prefetch = args.get(4).map(|p| p.parse().expect("PREFETCH is a count up to 65535"));
            rabbitmq_read(&args[1], &args[2], n(3), prefetch).await
        }
        Some("rabbitmq-move") => rabbitmq_move(&args[1], &args[2], &args[3], n(4)).await,
        Some("kafka-read") => kafka_read(&args[1], &args[2], n(3), args.get(4).is_some_and(|a| a == "+HEADERS")),
        Some("kafka-export") => kafka_export(&args[1], &args[2], n(3)),
        Some("kafka-move") => {
            let with_id = args.get(5).is_some_and(|a| a == "+ID");
            kafka_move(&args[1], &args[2], &args[3], n(4), with_id).await
        }
        Some("sqs-read") => sqs_read(&args[1], n(2)).await,
        Some("sqs-move") => sqs_move(&args[1], &args[2], n(3)).await,
        _ => Err("usage: see the comment at the top of examples/ceiling.rs".into()),
    }
}

/// A consumer that never acks: the broker streams every message as fast as it can, and
/// closing the connection puts them all back. With no PREFETCH there is no limit; with one,
/// each channel stops at PREFETCH unacked messages and the loop moves on to a fresh channel,
/// as dlqctl's bounded-memory reads do (this tells the broker's cost of the limit from ours).
async fn rabbitmq_read(url: &str, queue: &str, n: usize, prefetch: Option<u16>) -> Result<()> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let mut read = 0;
    while read < n {
        let channel = connection.create_channel().await?;
        let per_channel = match prefetch {
            Some(prefetch) => {
                channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
                usize::from(prefetch)
            }
            None => n,
        };
        let mut consumer = channel
            .basic_consume(queue.into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
            .await?;
        for _ in 0..per_channel.min(n - read) {
            consumer.next().await.ok_or("consumer ended")??;
            read += 1;
        }
    }
    connection.close(200, "done".into()).await?;
    Ok(())
}

async fn rabbitmq_move(url: &str, from: &str, to: &str, n: usize) -> Result<()> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let reader = connection.create_channel().await?;
    reader.basic_qos(WINDOW as u16, BasicQosOptions::default()).await?;
    let publisher = connection.create_channel().await?;
    publisher.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut consumer = reader
        .basic_consume(from.into(), "ceiling".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    let mut moved = 0;
    while moved < n {
        let mut confirms = Vec::with_capacity(WINDOW);
        let mut last_tag = 0;
        while confirms.len() < WINDOW.min(n - moved) {
            let delivery = consumer.next().await.ok_or("consumer ended")??;
            let properties = delivery.properties.clone();
            confirms.push(
                publisher
                    .basic_publish("".into(), to.into(), BasicPublishOptions::default(), &delivery.data, properties)
                    .await?,
            );
            last_tag = delivery.delivery_tag;
        }
        moved += confirms.len();
        for confirm in confirms {
            if !confirm.await?.is_ack() {
                return Err("broker refused a copy".into());
            }
        }
        reader.basic_ack(last_tag, BasicAckOptions { multiple: true }).await?;
    }
    connection.close(200, "done".into()).await?;
    Ok(())
}

fn kafka_consumer(brokers: &str, topic: &str) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "dlqctl-ceiling")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut assignment = TopicPartitionList::new();
    for partition in metadata.topics()[0].partitions() {
        assignment.add_partition_offset(topic, partition.id(), Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    Ok(consumer)
}

fn kafka_read(brokers: &str, topic: &str, n: usize, with_headers: bool) -> Result<()> {
    let consumer = kafka_consumer(brokers, topic)?;
    let mut read = 0;
    while read < n {
        if let Some(message) = consumer.poll(Duration::from_secs(10)) {
            let message = message?;
            if with_headers && let Some(headers) = message.headers() {
                for header in headers.iter() {
                    std::hint::black_box((header.key, header.value));
                }
            }
            read += 1;
        }
    }
    Ok(())
}

fn kafka_export(brokers: &str, topic: &str, n: usize) -> Result<()> {
    let consumer = kafka_consumer(brokers, topic)?;
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

async fn kafka_move(brokers: &str, from: &str, to: &str, n: usize, with_id: bool) -> Result<()> {
    let consumer = kafka_consumer(brokers, from)?;
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (name, value) in dlqctl::broker::kafka::PRODUCER_SETTINGS {
        config.set(name, value);
    }
    let producer: FutureProducer = config.create()?;
    let mut moved = 0;
    while moved < n {
        let mut reports = Vec::with_capacity(WINDOW);
        while reports.len() < WINDOW.min(n - moved) {
            let Some(message) = consumer.poll(Duration::from_secs(10)) else { continue };
            let message = message?;
            let mut record = FutureRecord::<[u8], [u8]>::to(to).payload(message.payload().unwrap_or_default());
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            if let Some(headers) = message.headers() {
                let mut headers = headers.detach();
                if with_id {
                    // Same names and sizes as dlqctl's: a 32-hex-digit id and a count.
                    headers = headers
                        .insert(Header { key: "dlqctl-redrive-id", value: Some("0123456789abcdef0123456789abcdef") })
                        .insert(Header { key: "dlqctl-redrive-count", value: Some("1") });
                }
                record = record.headers(headers);
            }
            reports.push(producer.send_result(record).map_err(|(e, _)| e)?);
        }
        moved += reports.len();
        for report in reports {
            report.await?.map_err(|(e, _)| e)?;
        }
        // Settle the window, as every move must before it takes more.
        consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync)?;
    }
    Ok(())
}

async fn sqs_client() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&aws_config::load_from_env().await)
}

/// Up to ten messages with their attributes, held for five minutes.
async fn sqs_receive(client: &aws_sdk_sqs::Client, url: &str) -> Result<Vec<aws_sdk_sqs::types::Message>> {
    let out = client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .visibility_timeout(300)
        .message_attribute_names("All")
        .send()
        .await?;
    Ok(out.messages.unwrap_or_default())
}

async fn sqs_read(url: &str, n: usize) -> Result<()> {
    let client = sqs_client().await;
    let mut receipts = Vec::with_capacity(n);
    while receipts.len() < n {
        let messages = sqs_receive(&client, url).await?;
        receipts.extend(messages.iter().filter_map(|m| m.receipt_handle().map(str::to_owned)));
    }
    for chunk in receipts.chunks(10) {
        let entries = chunk.iter().enumerate().map(|(i, r)| {
            aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(r)
                .visibility_timeout(0)
                .build()
        });
        client
            .change_message_visibility_batch()
            .queue_url(url)
            .set_entries(Some(entries.collect::<std::result::Result<_, _>>()?))
            .send()
            .await?;
    }
    Ok(())
}

async fn sqs_move(from: &str, to: &str, n: usize) -> Result<()> {
    let client = sqs_client().await;
    let mut moved = 0;
    while moved < n {
        let messages = sqs_receive(&client, from).await?;
        if messages.is_empty() {
            continue;
        }
        let sends = messages.iter().enumerate().map(|(i, m)| {
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(m.body().unwrap_or_default())
                .set_message_attributes(m.message_attributes().cloned())
                .build()
        });
        let sent = client
            .send_message_batch()
            .queue_url(to)
            .set_entries(Some(sends.collect::<std::result::Result<_, _>>()?))
            .send()
            .await?;
        if !sent.failed().is_empty() {
            return Err("SQS refused a copy".into());
        }
        let deletes = messages.iter().enumerate().map(|(i, m)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .build()
        });
        client
            .delete_message_batch()
            .queue_url(from)
            .set_entries(Some(deletes.collect::<std::result::Result<_, _>>()?))
            .send()
            .await?;
        moved += messages.len();
    }
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
    let Some(bytes) = value else { return out.extend_from_slice(b"null") };
    // Most values are printable ASCII, told in one pass and so needing no UTF-8 check.
    if bytes.iter().fold(true, |printable, &b| printable & (b' '..=b'~').contains(&b)) {
        // SAFETY: printable ASCII is valid UTF-8.
        return json_escape_simd::escape_into(unsafe { std::str::from_utf8_unchecked(bytes) }, out);
    }
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) => {
            json_escape_simd::escape_into(text, out)
        }
        _ => write_bytes(out, bytes),
    }
}

fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(b"{\"$bytes\":\"");
    BASE64.encode_append(bytes, out);
    out.extend_from_slice(b"\"}");
}
