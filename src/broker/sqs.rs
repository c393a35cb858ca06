//! Amazon SQS through aws-sdk-sqs: region, endpoint and credentials from the standard AWS
//! chain (profiles, SSO, environment, `AWS_ENDPOINT_URL`), with `?region=` and `?endpoint=`.
//!
//! SQS has no peek and no reason field. A read receives messages with a visibility timeout
//! and makes them visible again when done; the reason comes from `DeadLetterQueueSourceArn`
//! and `ApproximateReceiveCount`, or from the error attributes real producers set (Lambda
//! asynchronous invocation, EventBridge targets). Redrive is hybrid: the server-side move
//! task when everything goes back to its source, a filtered client-side move otherwise.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageAttributeValue,
    MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry,
};
use chrono::{DateTime, TimeZone, Utc};
use futures::StreamExt;
use tokio::sync::OnceCell;

use super::{
    Broker, Capabilities, Description, Destination, Failure, Handle, LetterStream, MoveTask, OpenOptions, PublishError,
    Received, Route, Sink, Tokens,
};
use crate::error::{Error, Result};
use crate::lint::{AlarmFacts, AlarmKind, DLQ_NAME, Inventory, QueueFacts};
use crate::model::{BrokerKind, DeadLetter, Headers, Reason, ReasonKind, Source, Value};
use crate::target::{SqsQueue, SqsTarget};

/// An AWS SDK error as one line: each cause's own words, in order, without repeats and without
/// the SDK's debug dump of the raw response (which `DisplayErrorContext` appends).
fn one_line(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut add = |text: String| {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    };
    add(e.to_string());
    let mut cause = e.source();
    while let Some(err) = cause {
        add(err.to_string());
        cause = err.source();
    }
    parts.join(": ")
}

const PEEK_COST: &str = "SQS has no peek: each message read is received and made visible again at once, \
                         which raises its ApproximateReceiveCount";
/// How long a read keeps messages invisible, so one read sees each message once.
const READ_HOLD_SECONDS: i32 = 300;
/// How long a redrive holds a received batch before it must be settled or released: long
/// enough to publish and delete a batch, short enough that what a killed run held comes back
/// soon.
const RECEIVE_HOLD_SECONDS: i32 = 30;
/// SQS limits: entries per batch call, bytes per message (and per batch), attributes per message.
const BATCH: usize = 10;
const MAX_BYTES: usize = 262_144;
const MAX_ATTRIBUTES: usize = 10;
/// The move task's own ceiling.
pub const MOVE_TASK_MAX_RATE: u32 = 500;

/// Message attributes whose value is a number or a custom type, recorded so a copy gets the
/// same data type back (`String` and `Binary` are known from the value itself).
const ATTRIBUTE_TYPES: &str = "attribute_types";

pub struct SqsBroker {
    target: SqsTarget,
    shown: String,
    /// Kept for the CloudWatch client `lint` needs.
    config: aws_config::SdkConfig,
    client: Client,
    queue_url: OnceCell<String>,
    /// Receipt handles of received messages, by the token their `Handle` carries.
    receipts: Tokens<String>,
    /// Ids of the messages `receive` has handed out in this run.
    handed_out: std::sync::Mutex<HashSet<String>>,
    /// The DLQ's only source queue's ARN, if it has exactly one (the fallback destination).
    single_source: OnceCell<Option<String>>,
    /// Queue URLs by name or ARN, for publishing.
    urls: tokio::sync::Mutex<HashMap<String, String>>,
    /// What a read learned: messages read, and how many SQS said there were.
    read: Mutex<Option<(u64, u64, bool)>>,
    /// Receipt handles a read holds invisible, given back by `end_read`.
    held: Mutex<Vec<String>>,
}

impl SqsBroker {
    pub async fn open(target: &SqsTarget, shown: String, _options: &OpenOptions) -> Result<Self> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::standard().with_max_attempts(3))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_timeout(Duration::from_secs(60))
                    .build(),
            );
        if let Some(region) = &target.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(endpoint) = &target.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(Error::Usage(format!(
                "no AWS region for {shown}: set AWS_REGION (or a profile's region), or add ?region=REGION"
            )));
        }
        Ok(SqsBroker {
            target: target.clone(),
            shown,
            client: Client::new(&config),
            config,
            queue_url: OnceCell::new(),
            receipts: Tokens::default(),
            handed_out: Default::default(),
            single_source: OnceCell::new(),
            urls: tokio::sync::Mutex::new(HashMap::new()),
            read: Mutex::new(None),
            held: Mutex::new(Vec::new()),
        })
    }

    fn failed<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
        &self,
        doing: &str,
        e: SdkError<E, R>,
    ) -> Error {
        let code = e.code().unwrap_or_default().to_owned();
        if code.contains("NonExistentQueue") || code.contains("QueueDoesNotExist") {
            return Error::Runtime(format!(
                "{}: the queue does not exist (check the name, the region and the account)",
                self.shown
            ));
        }
        Error::Runtime(format!("{doing} {}: {}", self.shown, one_line(&e)))
    }

    async fn url(&self) -> Result<&str> {
        let queue = self.target.queue.as_ref().ok_or_else(|| {
            Error::Usage(format!("{} names no queue: use sqs://QUEUE (list shows the DLQs)", self.shown))
        })?;
        self.queue_url
            .get_or_try_init(|| async {
                match queue {
                    SqsQueue::Url(url) => Ok(url.clone()),
                    SqsQueue::Name(name) => self.resolve(name, None).await,
                    SqsQueue::Arn(arn) => {
                        let (account, name) = arn_parts(arn);
                        self.resolve(name, account).await
                    }
                }
            })
            .await
            .map(String::as_str)
    }

    async fn resolve(&self, name: &str, account: Option<&str>) -> Result<String> {
        let mut request = self.client.get_queue_url().queue_name(name);
        if let Some(account) = account {
            request = request.queue_owner_aws_account_id(account);
        }
        let out = request.send().await.map_err(|e| self.failed("finding", e))?;
        Ok(out.queue_url().unwrap_or_default().to_owned())
    }

    async fn attributes(&self, url: &str) -> Result<HashMap<QueueAttributeName, String>> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(|e| self.failed("reading the attributes of", e))?;
        Ok(out.attributes().cloned().unwrap_or_default())
    }

    async fn sources_of(&self, url: &str) -> Result<Vec<String>> {
        let mut sources = Vec::new();
        let mut token = None;
        loop {
            let out = self
                .client
                .list_dead_letter_source_queues()
                .queue_url(url)
                .set_next_token(token)
                .max_results(1000)
                .send()
                .await
                .map_err(|e| self.failed("listing the sources of", e))?;
            sources.extend(out.queue_urls().iter().cloned());
            token = out.next_token().map(str::to_owned);
            if token.is_none() {
                return Ok(sources);
            }
        }
    }

    async fn receive_batch(&self, url: &str, max: usize, hold: i32) -> Result<Vec<Message>> {
        let out = self
            .client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(max.clamp(1, BATCH) as i32)
            .visibility_timeout(hold)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| self.failed("receiving from", e))?;
        Ok(out.messages().to_vec())
    }

    /// Make messages visible again at once.
    async fn make_visible(&self, url: &str, receipts: &[String]) -> Result<()> {
        for chunk in receipts.chunks(BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r)
                        .visibility_timeout(0)
                        .build()
                        .expect("id and receipt handle are set")
                })
                .collect();
            // A message whose hold already ran out is visible anyway: its failure is harmless.
            self.client
                .change_message_visibility_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| self.failed("releasing messages in", e))?;
        }
        Ok(())
    }

    fn normalize(&self, url: &str, m: &Message) -> DeadLetter {
        let system: BTreeMap<&str, &str> =
            m.attributes().map(|a| a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()).unwrap_or_default();
        let mut headers = Headers::new();
        let mut types = Headers::new();
        let mut names: Vec<&String> = m.message_attributes().map(|a| a.keys().collect()).unwrap_or_default();
        names.sort();
        for name in names {
            let value = &m.message_attributes().expect("names came from here")[name];
            let data_type = value.data_type();
            let v = match (value.string_value(), value.binary_value()) {
                (Some(s), _) => Value::String(s.to_owned()),
                (None, Some(b)) => Value::Bytes(b.as_ref().to_vec()),
                _ => Value::Null,
            };
            if data_type != "String" && data_type != "Binary" {
                types.push(name.clone(), data_type);
            }
            headers.push(name.clone(), v);
        }
        let mut extras: Headers =
            system.iter().map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned()))).collect();
        if !types.is_empty() {
            extras.push(ATTRIBUTE_TYPES, types);
        }
        let receive_count = system.get("ApproximateReceiveCount").and_then(|n| n.parse::<u64>().ok());
        let source_arn = system.get("DeadLetterQueueSourceArn").map(|s| (*s).to_owned());
        let text = |name: &str| headers.get(name).and_then(Value::as_str).map(str::to_owned);
        let reason = match (text("ErrorCode"), text("ERROR_CODE")) {
            // Lambda asynchronous invocation.
            (Some(code), _) => error_reason(code, text("ErrorMessage")),
            // EventBridge target.
            (None, Some(code)) => error_reason(code, text("ERROR_MESSAGE")),
            (None, None) if source_arn.is_some() => Reason {
                raw: receive_count.map(|n| format!("ApproximateReceiveCount={n}")),
                ..Reason::new(ReasonKind::MaxReceiveCount)
            },
            (None, None) => Reason::default(),
        };
        let source = match &source_arn {
            Some(arn) => {
                Source { name: Some(arn_parts(arn).1.to_owned()), address: Some(arn.clone()), ..Source::default() }
            }
            None => Source::default(),
        };
        DeadLetter {
            id: m.message_id().unwrap_or_default().to_owned(),
            broker: Some(BrokerKind::Sqs),
            dlq: Some(queue_name(url).to_owned()),
            source,
            reason,
            failure_count: receive_count,
            first_failed_at: None,
            last_failed_at: None,
            enqueued_at: system.get("SentTimestamp").and_then(|ms| millis(ms)),
            headers,
            extras,
            body: Some(m.body().unwrap_or_default().as_bytes().to_vec()),
        }
    }

    async fn url_for(&self, queue: &SqsQueue) -> std::result::Result<String, PublishError> {
        let key = match queue {
            SqsQueue::Url(url) => return Ok(url.clone()),
            SqsQueue::Name(n) | SqsQueue::Arn(n) => n.clone(),
        };
        let mut urls = self.urls.lock().await;
        if let Some(url) = urls.get(&key) {
            return Ok(url.clone());
        }
        let (account, name) = match queue {
            SqsQueue::Arn(arn) => arn_parts(arn),
            _ => (None, key.as_str()),
        };
        let url = self
            .resolve(name, account)
            .await
            .map_err(|e| PublishError { failure: Failure::Permanent, message: e.to_string() })?;
        urls.insert(key, url.clone());
        Ok(url)
    }

    async fn send(
        &self,
        url: &str,
        batch: &[(DeadLetter, Destination)],
        results: &mut [Option<std::result::Result<(), PublishError>>],
        indices: &[usize],
    ) {
        let fifo = url.ends_with(".fifo");
        let mut entries = Vec::new();
        let mut bytes = 0usize;
        let mut pending: Vec<usize> = Vec::new();
        for &i in indices {
            let (letter, _) = &batch[i];
            match entry(letter, i, fifo) {
                Ok((e, size)) => {
                    if entries.len() == BATCH || bytes + size > MAX_BYTES {
                        self.send_entries(url, std::mem::take(&mut entries), &pending, results).await;
                        pending.clear();
                        bytes = 0;
                    }
                    bytes += size;
                    entries.push(e);
                    pending.push(i);
                }
                Err(message) => results[i] = Some(Err(PublishError { failure: Failure::Permanent, message })),
            }
        }
        if !entries.is_empty() {
            self.send_entries(url, entries, &pending, results).await;
        }
    }

    async fn send_entries(
        &self,
        url: &str,
        entries: Vec<SendMessageBatchRequestEntry>,
        indices: &[usize],
        results: &mut [Option<std::result::Result<(), PublishError>>],
    ) {
        match self.client.send_message_batch().queue_url(url).set_entries(Some(entries)).send().await {
            Ok(out) => {
                for ok in out.successful() {
                    if let Ok(i) = ok.id().parse::<usize>() {
                        results[i] = Some(Ok(()));
                    }
                }
                for failed in out.failed() {
                    if let Ok(i) = failed.id().parse::<usize>() {
                        results[i] = Some(Err(PublishError {
                            failure: if failed.sender_fault() { Failure::Permanent } else { Failure::Transient },
                            message: format!(
                                "{} refused it: {} {}",
                                queue_name(url),
                                failed.code(),
                                failed.message().unwrap_or_default()
                            ),
                        }));
                    }
                }
            }
            Err(e) => {
                let failure = classify(&e);
                let message = format!("sending to {} failed: {}", queue_name(url), one_line(&e));
                for &i in indices {
                    results[i] = Some(Err(PublishError { failure, message: message.clone() }));
                }
            }
        }
        for &i in indices {
            // An entry SQS neither accepted nor refused was not confirmed.
            results[i].get_or_insert_with(|| {
                Err(PublishError { failure: Failure::Transient, message: "no confirmation from SQS".into() })
            });
        }
    }
}

fn error_reason(code: String, message: Option<String>) -> Reason {
    Reason { raw: Some(code.clone()), code: Some(code), message, ..Reason::new(ReasonKind::ErrorCode) }
}

/// A copy as a batch entry, with its size toward SQS's limits.
fn entry(
    letter: &DeadLetter,
    index: usize,
    fifo: bool,
) -> std::result::Result<(SendMessageBatchRequestEntry, usize), String> {
    let body = std::str::from_utf8(letter.body_bytes())
        .map_err(|_| "the body is not text, and SQS bodies must be".to_owned())?;
    let types = match letter.extras.get(ATTRIBUTE_TYPES) {
        Some(Value::Table(t)) => t.clone(),
        _ => Headers::new(),
    };
    let mut size = body.len();
    let mut builder = SendMessageBatchRequestEntry::builder().id(index.to_string()).message_body(body);
    let mut count = 0;
    for (name, value) in letter.headers.iter() {
        let declared = types.get(name).and_then(Value::as_str);
        let attribute = match value {
            Value::Bytes(b) => MessageAttributeValue::builder()
                .data_type(declared.unwrap_or("Binary"))
                .binary_value(Blob::new(b.clone())),
            Value::Int(n) => {
                MessageAttributeValue::builder().data_type(declared.unwrap_or("Number")).string_value(n.to_string())
            }
            other => {
                MessageAttributeValue::builder().data_type(declared.unwrap_or("String")).string_value(other.to_string())
            }
        }
        .build()
        .map_err(|e| format!("attribute {name}: {e}"))?;
        size += name.len() + attribute.data_type().len() + value.to_string().len();
        builder = builder.message_attributes(name, attribute);
        count += 1;
    }
    if count > MAX_ATTRIBUTES {
        return Err(format!("the copy would carry {count} message attributes; SQS allows {MAX_ATTRIBUTES}"));
    }
    if size > MAX_BYTES {
        return Err(format!("the copy is {size} bytes with its attributes; SQS allows {MAX_BYTES} (MessageTooLong)"));
    }
    if fifo {
        let group = letter.extras.get("MessageGroupId").and_then(Value::as_str).unwrap_or("dlqctl");
        let id = letter.headers.get(crate::redrive::REDRIVE_ID_HEADER).map(Value::to_string).unwrap_or_default();
        let count = crate::redrive::redrive_count(letter);
        builder = builder.message_group_id(group).message_deduplication_id(format!("{id}-{count}"));
    }
    Ok((builder.build().map_err(|e| e.to_string())?, size))
}

fn classify<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> Failure {
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => Failure::Transient,
        _ => match e.code().unwrap_or_default() {
            "RequestThrottled"
            | "ThrottlingException"
            | "ServiceUnavailable"
            | "InternalError"
            | "InternalFailure"
            | "KmsThrottled" => Failure::Transient,
            _ => Failure::Permanent,
        },
    }
}

fn queue_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// (account, name) of `arn:PARTITION:sqs:REGION:ACCOUNT:NAME`.
fn arn_parts(arn: &str) -> (Option<&str>, &str) {
    let fields: Vec<&str> = arn.split(':').collect();
    match fields.as_slice() {
        [_, _, _, _, account, name] => (Some(*account), *name),
        _ => (None, arn),
    }
}

fn millis(ms: &str) -> Option<DateTime<Utc>> {
    ms.parse::<i64>().ok().and_then(|ms| Utc.timestamp_millis_opt(ms).single())
}

fn seconds_attr(attrs: &HashMap<QueueAttributeName, String>, name: QueueAttributeName) -> Option<Duration> {
    attrs.get(&name).and_then(|v| v.parse::<u64>().ok()).map(Duration::from_secs)
}

fn count_attr(attrs: &HashMap<QueueAttributeName, String>, name: QueueAttributeName) -> u64 {
    attrs.get(&name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// `maxReceiveCount` arrives as a number or a string, depending on who wrote the policy.
fn max_receive_count(policy: &serde_json::Value) -> Option<u64> {
    match &policy["maxReceiveCount"] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

#[async_trait]
impl Broker for SqsBroker {
    fn backend(&self) -> &'static str {
        "SQS"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            peek: true,
            peek_cost: Some(PEEK_COST),
            consume: true,
            server_move: true,
            rereads_settled: false,
        }
    }

    async fn describe(&self) -> Result<Description> {
        let url = self.url().await?.to_owned();
        let attrs = self.attributes(&url).await?;
        let sources = self.sources_of(&url).await?;
        let mut notes = vec![format!(
            "{} visible, {} in flight, {} delayed (approximate)",
            count_attr(&attrs, QueueAttributeName::ApproximateNumberOfMessages),
            count_attr(&attrs, QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            count_attr(&attrs, QueueAttributeName::ApproximateNumberOfMessagesDelayed),
        )];
        if attrs.contains_key(&QueueAttributeName::RedrivePolicy) {
            notes.push("this DLQ has a RedrivePolicy of its own: reading it can move messages onward".into());
        }
        Ok(Description {
            target: self.shown.clone(),
            name: queue_name(&url).to_owned(),
            kind: if url.ends_with(".fifo") { "sqs fifo queue" } else { "sqs queue" },
            depth: Some(
                count_attr(&attrs, QueueAttributeName::ApproximateNumberOfMessages)
                    + count_attr(&attrs, QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                    + count_attr(&attrs, QueueAttributeName::ApproximateNumberOfMessagesDelayed),
            ),
            oldest_age: None,
            retention: seconds_attr(&attrs, QueueAttributeName::MessageRetentionPeriod),
            sources: sources.iter().map(|s| queue_name(s).to_owned()).collect(),
            capabilities: self.capabilities(),
            notes,
        })
    }

    async fn list(&self) -> Result<Vec<Description>> {
        if self.target.queue.is_some() {
            return Ok(vec![self.describe().await?]);
        }
        let queues = self.all_queues().await?;
        // DLQ ARN -> its sources' "name (maxReceiveCount N, retention R)".
        let mut sources: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (url, attrs) in queues.values() {
            let Some(policy) = attrs
                .get(&QueueAttributeName::RedrivePolicy)
                .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
            else {
                continue;
            };
            let Some(dlq) = policy["deadLetterTargetArn"].as_str() else { continue };
            let retention = seconds_attr(attrs, QueueAttributeName::MessageRetentionPeriod)
                .map_or("?".into(), crate::commands::format_age);
            let max = max_receive_count(&policy).map_or("?".into(), |n| n.to_string());
            sources
                .entry(dlq.to_owned())
                .or_default()
                .push(format!("{} (maxReceiveCount {max}, retention {retention})", queue_name(url)));
        }
        let mut out = Vec::new();
        for (arn, srcs) in sources {
            let Some((url, attrs)) = queues.get(&arn) else {
                out.push(Description {
                    target: arn.clone(),
                    name: arn_parts(&arn).1.to_owned(),
                    kind: "sqs queue (missing)",
                    depth: None,
                    oldest_age: None,
                    retention: None,
                    sources: srcs,
                    capabilities: self.capabilities(),
                    notes: vec!["the RedrivePolicy names a DLQ that does not exist".into()],
                });
                continue;
            };
            let visible = count_attr(attrs, QueueAttributeName::ApproximateNumberOfMessages);
            let in_flight = count_attr(attrs, QueueAttributeName::ApproximateNumberOfMessagesNotVisible);
            let delayed = count_attr(attrs, QueueAttributeName::ApproximateNumberOfMessagesDelayed);
            let mut notes = vec![format!("{visible} visible, {in_flight} in flight, {delayed} delayed")];
            if let Some(allow) = attrs.get(&QueueAttributeName::RedriveAllowPolicy) {
                notes.push(format!("RedriveAllowPolicy {allow}"));
            }
            out.push(Description {
                target: format!("sqs://{}", queue_name(url)),
                name: queue_name(url).to_owned(),
                kind: if url.ends_with(".fifo") { "sqs fifo queue" } else { "sqs queue" },
                depth: Some(visible + in_flight + delayed),
                oldest_age: None,
                retention: seconds_attr(attrs, QueueAttributeName::MessageRetentionPeriod),
                sources: srcs,
                capabilities: self.capabilities(),
                notes,
            });
        }
        Ok(out)
    }

    async fn peek(&self, limit: Option<u64>) -> Result<LetterStream<'_>> {
        let url = self.url().await?.to_owned();
        let attrs = self.attributes(&url).await?;
        let approximate = count_attr(&attrs, QueueAttributeName::ApproximateNumberOfMessages);
        let onward = attrs.contains_key(&QueueAttributeName::RedrivePolicy);
        // A limited read says nothing about completeness; a full one is compared with the count.
        *self.read.lock().expect("not poisoned") = Some((0, limit.map_or(approximate, |_| 0), onward));
        struct Scan {
            url: String,
            remaining: u64,
            buffer: std::collections::VecDeque<DeadLetter>,
            seen: HashSet<String>,
            exhausted: bool,
        }
        let scan = Scan {
            url,
            remaining: limit.unwrap_or(u64::MAX),
            buffer: Default::default(),
            seen: HashSet::new(),
            exhausted: false,
        };
        Ok(futures::stream::unfold(Some(scan), move |state| async move {
            let mut scan = state?;
            loop {
                if scan.remaining > 0
                    && let Some(letter) = scan.buffer.pop_front()
                {
                    scan.remaining -= 1;
                    if let Some((read, _, _)) = self.read.lock().expect("not poisoned").as_mut() {
                        *read += 1;
                    }
                    return Some((Ok(letter), Some(scan)));
                }
                if scan.remaining == 0 || scan.exhausted {
                    // Done: everything held becomes visible again.
                    return self.end_read().await.err().map(|e| (Err(e), None));
                }
                let want = scan.remaining.min(BATCH as u64) as usize;
                match self.receive_batch(&scan.url, want, READ_HOLD_SECONDS).await {
                    Ok(messages) if messages.is_empty() => scan.exhausted = true,
                    Ok(messages) => {
                        for m in messages {
                            self.held
                                .lock()
                                .expect("not poisoned")
                                .push(m.receipt_handle().unwrap_or_default().to_owned());
                            // A hold that ran out mid-read hands a message out twice: show it once.
                            if scan.seen.insert(m.message_id().unwrap_or_default().to_owned()) {
                                scan.buffer.push_back(self.normalize(&scan.url, &m));
                            }
                        }
                    }
                    Err(e) => {
                        let _ = self.end_read().await;
                        return Some((Err(e), None));
                    }
                }
            }
        })
        .boxed())
    }

    async fn receive(&self, max: usize) -> Result<Vec<Received>> {
        let url = self.url().await?.to_owned();
        self.single_source
            .get_or_try_init(|| async {
                let sources = self.sources_of(&url).await?;
                Ok::<_, Error>(match sources.as_slice() {
                    [only] => {
                        let attrs = self.attributes(only).await?;
                        attrs.get(&QueueAttributeName::QueueArn).cloned()
                    }
                    _ => None,
                })
            })
            .await?;
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let messages = self.receive_batch(&url, max - out.len(), RECEIVE_HOLD_SECONDS).await?;
            if messages.is_empty() {
                break;
            }
            // A message this run holds comes back once its hold runs out: it is not new, and
            // when nothing new comes, this run has seen the whole queue.
            let mut again = Vec::new();
            for m in messages {
                let receipt = m.receipt_handle().unwrap_or_default().to_owned();
                let first_time =
                    m.message_id().is_none_or(|id| self.handed_out.lock().expect("not poisoned").insert(id.to_owned()));
                if first_time {
                    out.push(Received { handle: self.receipts.issue(receipt), letter: self.normalize(&url, &m) });
                } else {
                    again.push(receipt);
                }
            }
            if !again.is_empty() {
                self.make_visible(&url, &again).await?;
                break;
            }
        }
        Ok(out)
    }

    async fn settle(&self, handles: &[Handle]) -> Result<()> {
        let url = self.url().await?.to_owned();
        let receipts = self.receipts.take(handles);
        for chunk in receipts.chunks(BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r)
                        .build()
                        .expect("id and receipt handle are set")
                })
                .collect();
            let out = self
                .client
                .delete_message_batch()
                .queue_url(&url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| self.failed("deleting from", e))?;
            if let Some(failed) = out.failed().first() {
                return Err(Error::Runtime(format!(
                    "{} of {} deletes failed in {}: {} {}",
                    out.failed().len(),
                    chunk.len(),
                    self.shown,
                    failed.code(),
                    failed.message().unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    async fn release(&self, handles: &[Handle]) -> Result<()> {
        let url = self.url().await?.to_owned();
        let receipts = self.receipts.take(handles);
        self.make_visible(&url, &receipts).await
    }

    fn source_destination(&self, letter: &DeadLetter) -> Option<Destination> {
        let arn = letter
            .extras
            .get("DeadLetterQueueSourceArn")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| self.single_source.get().cloned().flatten())?;
        Some(Destination { label: format!("queue {}", arn_parts(&arn).1), route: Route::Sqs(SqsQueue::Arn(arn)) })
    }

    fn source_sink(&self) -> Option<&dyn Sink> {
        Some(self)
    }

    async fn end_read(&self) -> Result<()> {
        let held = std::mem::take(&mut *self.held.lock().expect("not poisoned"));
        if held.is_empty() {
            return Ok(());
        }
        let url = self.url().await?.to_owned();
        self.make_visible(&url, &held).await
    }

    async fn lint_inventory(&self) -> Result<Inventory> {
        let queues = self.all_queues().await?;
        let dlq_name = regex::Regex::new(DLQ_NAME).expect("valid");
        let name_of_arn =
            |arn: &str| queues.get(arn).map_or_else(|| arn_parts(arn).1.to_owned(), |(u, _)| queue_name(u).to_owned());
        let mut facts: Vec<QueueFacts> = queues
            .values()
            .map(|(url, attrs)| {
                let policy = attrs
                    .get(&QueueAttributeName::RedrivePolicy)
                    .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok());
                QueueFacts {
                    broker: "sqs",
                    name: queue_name(url).to_owned(),
                    dlq: policy.as_ref().and_then(|p| p["deadLetterTargetArn"].as_str()).map(name_of_arn),
                    retention: seconds_attr(attrs, QueueAttributeName::MessageRetentionPeriod),
                    max_receive_count: policy.as_ref().and_then(max_receive_count),
                    fifo: url.ends_with(".fifo"),
                    ..QueueFacts::default()
                }
            })
            .collect();
        let targets: HashSet<String> = facts.iter().filter_map(|q| q.dlq.clone()).collect();
        for q in &mut facts {
            q.is_dlq = targets.contains(&q.name) || dlq_name.is_match(&q.name);
            q.needs_dlq = !q.is_dlq;
        }
        Ok(Inventory { queues: facts, alarms: self.alarms().await? })
    }

    fn read_notes(&self) -> Vec<String> {
        let Some((read, approximate, onward)) = *self.read.lock().expect("not poisoned") else { return Vec::new() };
        let mut notes = Vec::new();
        if approximate > 0 {
            notes.push(format!(
                "read {read} message(s); SQS reported about {approximate} visible when the read began \
                 (SQS does not guarantee a complete scan)"
            ));
        }
        if self.queue_url.get().is_some_and(|u| u.ends_with(".fifo")) && approximate > read {
            notes.push(
                "FIFO queue: while a read holds a group's messages SQS hands out no more of that group, \
                 so a read sees only the first messages of each group"
                    .into(),
            );
        }
        if onward {
            notes.push("this DLQ has a RedrivePolicy of its own: reading it raises receive counts toward moving messages onward".into());
        }
        notes
    }

    async fn start_move_task(&self, rate: Option<u32>) -> Result<String> {
        let url = self.url().await?.to_owned();
        let arn = self
            .attributes(&url)
            .await?
            .remove(&QueueAttributeName::QueueArn)
            .ok_or_else(|| Error::Runtime(format!("{} reported no ARN", self.shown)))?;
        let out = self
            .client
            .start_message_move_task()
            .source_arn(arn)
            .set_max_number_of_messages_per_second(rate.map(|r| r.min(MOVE_TASK_MAX_RATE) as i32))
            .send()
            .await
            .map_err(|e| self.failed("starting a move task on", e))?;
        Ok(out.task_handle().unwrap_or_default().to_owned())
    }

    async fn move_task(&self) -> Result<Option<MoveTask>> {
        let url = self.url().await?.to_owned();
        let arn = self.attributes(&url).await?.remove(&QueueAttributeName::QueueArn).unwrap_or_default();
        let out = self
            .client
            .list_message_move_tasks()
            .source_arn(arn)
            .max_results(1)
            .send()
            .await
            .map_err(|e| self.failed("listing move tasks of", e))?;
        Ok(out.results().first().map(|t| MoveTask {
            handle: t.task_handle().map(str::to_owned),
            status: t.status().unwrap_or_default().to_owned(),
            moved: t.approximate_number_of_messages_moved().max(0) as u64,
            to_move: t.approximate_number_of_messages_to_move().map(|n| n.max(0) as u64),
            failure: t.failure_reason().map(str::to_owned),
        }))
    }

    async fn cancel_move_task(&self) -> Result<MoveTask> {
        let task = self
            .move_task()
            .await?
            .filter(|t| t.status == "RUNNING")
            .ok_or_else(|| Error::Runtime(format!("no move task is running on {}", self.shown)))?;
        let handle = task.handle.clone().unwrap_or_default();
        self.client
            .cancel_message_move_task()
            .task_handle(handle)
            .send()
            .await
            .map_err(|e| self.failed("cancelling the move task of", e))?;
        Ok(task)
    }
}

impl SqsBroker {
    /// Every queue of the account and region (under `?prefix=`), by ARN, with its attributes.
    async fn all_queues(&self) -> Result<BTreeMap<String, (String, HashMap<QueueAttributeName, String>)>> {
        let mut urls = Vec::new();
        let mut token = None;
        loop {
            let out = self
                .client
                .list_queues()
                .set_queue_name_prefix(self.target.prefix.clone())
                .set_next_token(token)
                .max_results(1000)
                .send()
                .await
                .map_err(|e| self.failed("listing queues of", e))?;
            urls.extend(out.queue_urls().iter().cloned());
            token = out.next_token().map(str::to_owned);
            if token.is_none() {
                break;
            }
        }
        let mut queues = BTreeMap::new();
        for url in urls {
            let attrs = self.attributes(&url).await?;
            let arn = attrs.get(&QueueAttributeName::QueueArn).cloned().unwrap_or_default();
            queues.insert(arn, (url, attrs));
        }
        Ok(queues)
    }

    /// The CloudWatch alarms on SQS queue metrics that `lint` understands.
    async fn alarms(&self) -> Result<Vec<AlarmFacts>> {
        let cloudwatch = aws_sdk_cloudwatch::Client::new(&self.config);
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = cloudwatch
                .describe_alarms()
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| Error::Runtime(format!("listing CloudWatch alarms: {}", one_line(&e))))?;
            for a in page.metric_alarms() {
                if a.namespace() != Some("AWS/SQS") {
                    continue;
                }
                let kind = match a.metric_name().unwrap_or_default() {
                    "ApproximateNumberOfMessagesVisible" | "ApproximateNumberOfMessages" => AlarmKind::Depth,
                    "ApproximateAgeOfOldestMessage" => AlarmKind::Age,
                    _ => continue,
                };
                let Some(queue) = a.dimensions().iter().find(|d| d.name() == Some("QueueName")).and_then(|d| d.value())
                else {
                    continue;
                };
                let inclusive = a.comparison_operator().is_some_and(|c| c.as_str().contains("OrEqual"));
                out.push(AlarmFacts {
                    name: a.alarm_name().unwrap_or_default().to_owned(),
                    queue: queue.to_owned(),
                    pattern: false,
                    kind,
                    threshold: a.threshold().map(|t| if inclusive { t - 1.0 } else { t }),
                    window: a.period().map(|p| {
                        Duration::from_secs((p.max(0) as u64) * a.evaluation_periods().unwrap_or(1).max(1) as u64)
                    }),
                    location: None,
                    inline_waivers: Vec::new(),
                });
            }
            token = page.next_token().map(str::to_owned);
            if token.is_none() {
                return Ok(out);
            }
        }
    }
}

#[async_trait]
impl Sink for SqsBroker {
    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<std::result::Result<(), PublishError>> {
        let mut results: Vec<Option<std::result::Result<(), PublishError>>> = vec![None; batch.len()];
        // One batch call per destination queue.
        let mut by_queue: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, (_, destination)) in batch.iter().enumerate() {
            let Route::Sqs(queue) = &destination.route else {
                results[i] = Some(Err(PublishError {
                    failure: Failure::Permanent,
                    message: format!("SQS cannot publish to {}", destination.label),
                }));
                continue;
            };
            match self.url_for(queue).await {
                Ok(url) => by_queue.entry(url).or_default().push(i),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        for (url, indices) in by_queue {
            self.send(&url, batch, &mut results, &indices).await;
        }
        results.into_iter().map(|r| r.expect("every entry has a result")).collect()
    }
}

/// Whether `--to` names the DLQ itself: the same queue name, in the same account and region
/// where both say theirs (a bare name says neither, and is taken to be the same).
pub fn names_the_dlq(dlq: &SqsTarget, to: &SqsTarget) -> bool {
    /// (account, region, name) as far as the target says them.
    fn identity(t: &SqsTarget) -> Option<(Option<String>, Option<String>, String)> {
        Some(match t.queue.as_ref()? {
            SqsQueue::Name(n) => (None, t.region.clone(), n.clone()),
            SqsQueue::Url(u) => {
                let mut segments = u.trim_end_matches('/').rsplit('/');
                let name = segments.next().unwrap_or_default().to_owned();
                let account = segments.next().filter(|a| a.chars().all(|c| c.is_ascii_digit())).map(str::to_owned);
                (account, t.region.clone(), name)
            }
            SqsQueue::Arn(a) => {
                let region = a.split(':').nth(3).filter(|r| !r.is_empty()).map(str::to_owned);
                let (account, name) = arn_parts(a);
                (account.map(str::to_owned), region.or_else(|| t.region.clone()), name.to_owned())
            }
        })
    }
    let agree = |a: &Option<String>, b: &Option<String>| a.is_none() || b.is_none() || a == b;
    match (identity(dlq), identity(to)) {
        (Some((account_a, region_a, a)), Some((account_b, region_b, b))) => {
            a == b && agree(&account_a, &account_b) && agree(&region_a, &region_b)
        }
        _ => false,
    }
}

/// The destination `--to sqs://QUEUE` (or a URL or ARN) names.
pub fn destination_for(target: &SqsTarget, shown: &str) -> Result<Destination> {
    let queue =
        target.queue.clone().ok_or_else(|| Error::Usage(format!("--to {shown} names no queue: use sqs://QUEUE")))?;
    let name = match &queue {
        SqsQueue::Name(n) => n.clone(),
        SqsQueue::Url(u) => queue_name(u).to_owned(),
        SqsQueue::Arn(a) => arn_parts(a).1.to_owned(),
    };
    Ok(Destination { label: format!("queue {name}"), route: Route::Sqs(queue) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arns_and_urls() {
        assert_eq!(arn_parts("arn:aws:sqs:us-east-1:123456789012:orders-dlq"), (Some("123456789012"), "orders-dlq"));
        assert_eq!(queue_name("http://127.0.0.1:4566/queue/us-east-1/000000000000/orders-dlq"), "orders-dlq");
    }

    #[test]
    fn max_receive_count_as_number_or_string() {
        assert_eq!(max_receive_count(&serde_json::json!({"maxReceiveCount": 3})), Some(3));
        assert_eq!(max_receive_count(&serde_json::json!({"maxReceiveCount": "5"})), Some(5));
        assert_eq!(max_receive_count(&serde_json::json!({})), None);
    }

    fn letter(body: &str) -> DeadLetter {
        DeadLetter {
            headers: Headers::new()
                .with("tenant", "acme")
                .with("attempt", "3")
                .with("trace", vec![0u8, 255])
                .with(crate::redrive::REDRIVE_ID_HEADER, "abc")
                .with(crate::redrive::REDRIVE_COUNT_HEADER, 1i64),
            extras: Headers::new()
                .with("MessageGroupId", "customer-1")
                .with(ATTRIBUTE_TYPES, Headers::new().with("attempt", "Number")),
            body: Some(body.as_bytes().to_vec()),
            ..DeadLetter::default()
        }
    }

    #[test]
    fn entries_keep_attribute_types_and_fifo_fields() {
        let (e, _) = entry(&letter("{}"), 3, true).unwrap();
        assert_eq!(e.id(), "3");
        let attrs = e.message_attributes().unwrap();
        assert_eq!(attrs["attempt"].data_type(), "Number");
        assert_eq!(attrs["tenant"].data_type(), "String");
        assert_eq!(attrs["trace"].data_type(), "Binary");
        assert_eq!(attrs[crate::redrive::REDRIVE_COUNT_HEADER].data_type(), "Number");
        assert_eq!(e.message_group_id(), Some("customer-1"));
        assert_eq!(e.message_deduplication_id(), Some("abc-1"));
    }

    #[test]
    fn oversized_copies_and_binary_bodies_are_refused_per_message() {
        let big = "x".repeat(MAX_BYTES);
        assert!(entry(&letter(&big), 0, false).unwrap_err().contains("MessageTooLong"));
        let mut binary = letter("");
        binary.body = Some(vec![0xff]);
        assert!(entry(&binary, 0, false).unwrap_err().contains("not text"));
    }
}
