//! Writes the sample archive `examples/orders-dlq.jsonl`: dead letters of one failing
//! `orders` flow, shaped as RabbitMQ, SQS and Kafka produce them, then normalized.
//! Deterministic (fixed seed, fixed clock), so the committed file can be checked for staleness.
//!
//!     cargo run --example gen_sample > examples/orders-dlq.jsonl
//!     cargo run --release --example gen_sample -- --count 1000000 > /tmp/big.jsonl

use std::io::{BufWriter, Write};

use chrono::{DateTime, Duration, TimeZone, Utc};
use dlqctl::model::{BrokerKind, DeadLetter, Headers, Reason, ReasonKind, Source, Value};

/// The sample's own clock: every time in it is before this.
const EPOCH_SECONDS: i64 = 1_795_910_400; // 2026-11-29T00:00:00Z
const DEFAULT_COUNT: u64 = 300;
const ACCOUNT: &str = "123456789012";

/// splitmix64: tiny, fast and fully deterministic, which is all a fixture needs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

fn main() {
    let count = parse_count();
    let out = std::io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 20, out);
    let mut rng = Rng(0x0D1C_C71D);
    let mut line = Vec::new();
    for i in 0..count {
        out.write_all(make(i, &mut rng).json_line(&mut line)).expect("stdout");
    }
    out.flush().expect("stdout");
}

fn parse_count() -> u64 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => DEFAULT_COUNT,
        [flag, n] if flag == "--count" => n.parse().expect("--count takes a number"),
        _ => panic!("usage: gen_sample [--count N]"),
    }
}

/// Records cycle through the three brokers' shapes in a fixed proportion (2:5 RabbitMQ,
/// 1:3 SQS, the rest Kafka) so any prefix of the archive has all of them.
fn make(i: u64, rng: &mut Rng) -> DeadLetter {
    // Failures spread over the ten days before the epoch, so every age bucket is used.
    let failed = Utc.timestamp_opt(EPOCH_SECONDS, 0).unwrap() - Duration::seconds(rng.below(10 * 86_400) as i64);
    match i % 15 {
        0..=5 => rabbitmq(i, rng, failed),
        6..=10 => sqs(i, rng, failed),
        _ => kafka(i, rng, failed),
    }
}

fn order_json(i: u64, rng: &mut Rng) -> Vec<u8> {
    let items = 1 + rng.below(4);
    let lines: Vec<String> =
        (0..items).map(|n| format!(r#"{{"sku":"SKU-{:05}","qty":{}}}"#, rng.below(99_999), n + 1)).collect();
    format!(
        r#"{{"type":"{}","order_id":"ord-{i:07}","customer":{{"id":{},"email":"customer{}@example.com"}},"total":{}.{:02},"items":[{}]}}"#,
        rng.pick(&["order.created", "order.updated", "refund.requested"]),
        rng.below(5_000),
        rng.below(5_000),
        rng.below(900) + 5,
        rng.below(100),
        lines.join(",")
    )
    .into_bytes()
}

/// Some producers send protobuf: bytes that are not UTF-8.
fn binary_body(rng: &mut Rng) -> Vec<u8> {
    let mut body = vec![0x0a, 0x80, 0xff];
    body.extend((0..20).map(|_| rng.below(256) as u8));
    body
}

fn body(i: u64, rng: &mut Rng) -> Option<Vec<u8>> {
    match rng.below(20) {
        0 => Some(binary_body(rng)),
        1 => Some(format!("order {i} could not be parsed: unexpected end of input").into_bytes()),
        _ => Some(order_json(i, rng)),
    }
}

fn rabbitmq(i: u64, rng: &mut Rng, last: DateTime<Utc>) -> DeadLetter {
    let (reason, queue, expiration) = *rng.pick(&[
        ("rejected", "orders", None),
        ("rejected", "orders", None),
        ("rejected", "orders", None),
        ("expired", "orders.delayed", Some("60000")),
        ("maxlen", "orders.priority", None),
        ("delivery_limit", "payments", None),
    ]);
    let kind = match reason {
        "rejected" => ReasonKind::Rejected,
        "expired" => ReasonKind::Expired,
        "maxlen" => ReasonKind::Maxlen,
        _ => ReasonKind::DeliveryLimit,
    };
    let routing_key = *rng.pick(&["order.created", "order.updated"]);
    let count = 1 + (rng.below(4) == 0) as i64; // a quarter died twice
    let first = last - Duration::minutes(5 * (count - 1));
    let mut death = Headers::new()
        .with("count", count)
        .with("reason", reason)
        .with("queue", queue)
        .with("time", last)
        .with("exchange", "orders")
        .with("routing-keys", vec![Value::from(routing_key)]);
    if let Some(e) = expiration {
        death.push("original-expiration", e);
    }
    let message_id = format!("ord-msg-{i:07}");
    DeadLetter {
        id: message_id.clone(),
        broker: Some(BrokerKind::Rabbitmq),
        dlq: Some("orders.dlq".into()),
        source: Source {
            name: Some(queue.into()),
            exchange: Some("orders".into()),
            routing_keys: vec![routing_key.into()],
            ..Source::default()
        },
        reason: Reason { raw: Some(reason.into()), ..Reason::new(kind) },
        failure_count: Some(count as u64),
        first_failed_at: Some(first),
        last_failed_at: Some(last),
        enqueued_at: None,
        headers: Headers::new()
            .with("x-death", vec![Value::Table(death)])
            .with("x-first-death-exchange", "orders")
            .with("x-first-death-queue", queue)
            .with("x-first-death-reason", reason)
            .with("tenant", *rng.pick(&["acme", "globex", "initech"])),
        extras: Headers::new().with(
            "properties",
            Headers::new()
                .with("message_id", message_id)
                .with("correlation_id", format!("corr-{}", rng.below(1_000_000)))
                .with("content_type", "application/json")
                .with("delivery_mode", 2i64)
                .with("app_id", "orders-api")
                .with("timestamp", first - Duration::seconds(2)),
        ),
        body: body(i, rng),
    }
}

fn sqs(i: u64, rng: &mut Rng, failed: DateTime<Utc>) -> DeadLetter {
    let message_id = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        rng.next() as u32,
        rng.below(1 << 16),
        rng.below(4096),
        rng.below(4096),
        rng.below(1 << 48)
    );
    let sent = failed - Duration::seconds(30 + rng.below(600) as i64);
    let mut attributes = Headers::new();
    let mut extras = Headers::new()
        .with("SentTimestamp", (sent.timestamp_millis()).to_string())
        .with("ApproximateFirstReceiveTimestamp", (sent.timestamp_millis() + 1_000).to_string());
    let (source, reason, receive_count) = match rng.below(10) {
        // Lambda asynchronous invocation DLQ: the function's error rides in attributes.
        0..=2 => {
            let (code, message) = *rng.pick(&[
                ("200", "Task timed out after 30.00 seconds"),
                ("200", "Unhandled: TypeError: Cannot read properties of undefined (reading 'sku')"),
                ("429", "Rate Exceeded."),
            ]);
            attributes.push("RequestID", format!("{:032x}", rng.next() as u128 * 7919));
            attributes.push("ErrorCode", code);
            attributes.push("ErrorMessage", message);
            let reason = Reason {
                raw: Some(code.into()),
                code: Some(code.into()),
                message: Some(message.into()),
                ..Reason::new(ReasonKind::ErrorCode)
            };
            ("orders-fulfilment-fn", reason, 1)
        }
        // EventBridge target DLQ.
        3..=4 => {
            let (code, message) = *rng.pick(&[
                ("SDK_CLIENT_ERROR", "Unable to invoke Lambda function: the function does not exist"),
                ("NO_PERMISSIONS", "EventBridge is not authorized to invoke the target"),
            ]);
            attributes.push("RULE_ARN", format!("arn:aws:events:us-east-1:{ACCOUNT}:rule/orders-to-fulfilment"));
            attributes.push("TARGET_ARN", format!("arn:aws:lambda:us-east-1:{ACCOUNT}:function:orders-fulfilment-fn"));
            attributes.push("ERROR_CODE", code);
            attributes.push("ERROR_MESSAGE", message);
            attributes.push("EXHAUSTED_RETRY_CONDITION", "MaximumRetryAttempts");
            attributes.push("RETRY_ATTEMPTS", "185");
            let reason = Reason {
                raw: Some(code.into()),
                code: Some(code.into()),
                message: Some(message.into()),
                ..Reason::new(ReasonKind::ErrorCode)
            };
            ("orders-events", reason, 1)
        }
        // Plain redrive: the only evidence is the receive count and the source ARN.
        _ => {
            let receive_count = 3 + rng.below(2);
            let reason = Reason {
                raw: Some(format!("ApproximateReceiveCount={receive_count}")),
                ..Reason::new(ReasonKind::MaxReceiveCount)
            };
            ("orders-queue", reason, receive_count)
        }
    };
    let source_arn = format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{source}");
    if reason.kind == ReasonKind::MaxReceiveCount {
        extras.push("DeadLetterQueueSourceArn", source_arn.clone());
    }
    extras.push("ApproximateReceiveCount", receive_count.to_string());
    attributes.push("tenant", *rng.pick(&["acme", "globex", "initech"]));
    DeadLetter {
        id: message_id,
        broker: Some(BrokerKind::Sqs),
        dlq: Some("orders-dlq".into()),
        source: Source {
            name: Some(source.into()),
            address: (reason.kind == ReasonKind::MaxReceiveCount).then_some(source_arn),
            ..Source::default()
        },
        reason,
        failure_count: Some(receive_count),
        first_failed_at: None,
        last_failed_at: Some(failed),
        enqueued_at: Some(sent),
        headers: attributes,
        extras,
        body: body(i, rng),
    }
}

fn kafka(i: u64, rng: &mut Rng, failed: DateTime<Utc>) -> DeadLetter {
    let partition = rng.below(3) as i32;
    // Offsets only need to be unique and rising within a partition; the record index is both.
    let dlt_offset = i as i64;
    let original_offset = 10_000 + rng.below(90_000) as i64;
    let key = format!("customer-{}", rng.below(5_000));
    let mut extras =
        Headers::new().with("partition", partition as i64).with("offset", dlt_offset).with("timestamp", failed);
    // A few records have no key, as many producers send.
    if rng.below(10) != 0 {
        extras.push("key", key);
    }
    let (dlq, headers, reason) = if rng.below(4) == 0 {
        connect_headers(rng, partition, original_offset)
    } else {
        spring_headers(rng, partition, original_offset, failed)
    };
    // Tombstones (null values) reach DLTs too.
    let body = if rng.below(25) == 0 { None } else { body(i, rng) };
    DeadLetter {
        id: format!("{dlq}-{partition}@{dlt_offset}"),
        broker: Some(BrokerKind::Kafka),
        dlq: Some(dlq.into()),
        source: Source {
            name: Some("orders".into()),
            partition: Some(partition),
            offset: Some(original_offset),
            ..Source::default()
        },
        reason,
        failure_count: None,
        first_failed_at: None,
        last_failed_at: Some(failed),
        enqueued_at: None,
        headers,
        extras,
        body,
    }
}

fn spring_headers(
    rng: &mut Rng,
    partition: i32,
    offset: i64,
    failed: DateTime<Utc>,
) -> (&'static str, Headers, Reason) {
    let (class, cause, message) = *rng.pick(&[
        (
            "org.springframework.kafka.listener.ListenerExecutionFailedException",
            "com.fasterxml.jackson.databind.exc.MismatchedInputException",
            "Listener method could not be invoked with the incoming message: Cannot deserialize value of type `java.math.BigDecimal`",
        ),
        (
            "org.springframework.kafka.listener.ListenerExecutionFailedException",
            "java.lang.IllegalStateException",
            "Listener failed; nested exception is java.lang.IllegalStateException: inventory service returned 503",
        ),
        (
            "org.springframework.kafka.support.serializer.DeserializationException",
            "org.apache.kafka.common.errors.SerializationException",
            "failed to deserialize; nested exception is org.apache.kafka.common.errors.SerializationException: Unknown magic byte!",
        ),
    ]);
    let headers = Headers::new()
        .with("kafka_dlt-exception-fqcn", class)
        .with("kafka_dlt-exception-cause-fqcn", cause)
        .with("kafka_dlt-exception-message", message)
        .with(
            "kafka_dlt-exception-stacktrace",
            format!("{class}: {message}\n\tat com.example.orders.OrderListener.onMessage(OrderListener.java:42)\n"),
        )
        .with("kafka_dlt-original-topic", "orders")
        .with("kafka_dlt-original-partition", partition.to_be_bytes().to_vec())
        .with("kafka_dlt-original-offset", offset.to_be_bytes().to_vec())
        .with("kafka_dlt-original-timestamp", (failed.timestamp_millis() - 1_500).to_string())
        .with("kafka_dlt-original-timestamp-type", "CreateTime")
        .with("kafka_dlt-original-consumer-group", "orders-service");
    let reason = Reason {
        raw: Some(class.into()),
        exception_class: Some(class.into()),
        cause_class: Some(cause.into()),
        message: Some(message.into()),
        ..Reason::new(ReasonKind::Exception)
    };
    ("orders.DLT", headers, reason)
}

fn connect_headers(rng: &mut Rng, partition: i32, offset: i64) -> (&'static str, Headers, Reason) {
    let (stage, class, exception, message) = *rng.pick(&[
        (
            "VALUE_CONVERTER",
            "org.apache.kafka.connect.json.JsonConverter",
            "org.apache.kafka.connect.errors.DataException",
            "Converting byte[] to Kafka Connect data failed due to serialization error",
        ),
        (
            "TASK_PUT",
            "io.confluent.connect.jdbc.sink.JdbcSinkTask",
            "java.sql.SQLIntegrityConstraintViolationException",
            "Duplicate entry for key 'orders.PRIMARY'",
        ),
    ]);
    let headers = Headers::new()
        .with("__connect.errors.topic", "orders")
        .with("__connect.errors.partition", partition.to_string())
        .with("__connect.errors.offset", offset.to_string())
        .with("__connect.errors.connector.name", "orders-jdbc-sink")
        .with("__connect.errors.task.id", rng.below(2).to_string())
        .with("__connect.errors.stage", stage)
        .with("__connect.errors.class.name", class)
        .with("__connect.errors.exception.class.name", exception)
        .with("__connect.errors.exception.message", message)
        .with("__connect.errors.exception.stacktrace", format!("{exception}: {message}\n\tat {class}.put\n"));
    let reason = Reason {
        raw: Some(exception.into()),
        exception_class: Some(exception.into()),
        message: Some(message.into()),
        ..Reason::new(ReasonKind::Exception)
    };
    ("dlq-orders-jdbc-sink", headers, reason)
}
