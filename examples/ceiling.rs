//! The brokers' ceilings for `scripts/bench`: the plainest, fastest client loop that only
//! does the transfer (no decoding, no output, no bookkeeping), using the same client library
//! dlqctl uses. Nothing dlqctl does can beat these on the same machine.
//!
//!     ceiling rabbitmq-read AMQP_URL QUEUE N [PREFETCH]   every message, none consumed
//!     ceiling rabbitmq-move AMQP_URL FROM TO N      publish with confirms, then ack
//!     ceiling kafka-read BROKERS TOPIC N [+HEADERS] from the beginning, every partition; with
//!                                                   +HEADERS, also read every header (librdkafka
//!                                                   parses them only when asked)
//!     ceiling kafka-move BROKERS FROM TO N [+ID]    produce with delivery reports; with +ID,
//!                                                   add the two headers a redrive must add
//!                                                   (what they cost the broker, told apart)
//!     ceiling sqs-read QUEUE_URL N                  receive, then make visible again
//!     ceiling sqs-move FROM_URL TO_URL N            send batch, then delete batch
//!
//! SQS loops take the endpoint and credentials from the usual AWS_* variables.

use std::time::Duration;

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry};
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

async fn kafka_move(brokers: &str, from: &str, to: &str, n: usize, with_id: bool) -> Result<()> {
    let consumer = kafka_consumer(brokers, from)?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
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
