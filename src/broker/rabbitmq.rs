//! RabbitMQ: AMQP 0-9-1 through lapin for messages, the management HTTP API for discovery.
//!
//! RabbitMQ records why and where a message died in its `x-death` header; this module turns
//! that into the normalized reason and source, and sends redriven copies back to the first
//! death's exchange with its original routing keys (never the DLX's routing key).
//!
//! Three channels, each for one job: peeking, taking messages (`receive`, held unacked until
//! settled or released), and publishing with confirms. Publishing to a missing exchange
//! closes its channel; keeping it apart means the dead letters are untouched when that happens.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::bounded::ready_or_timeout;
use super::{
    Broker, Capabilities, Description, Destination, Failure, Handle, LetterStream, OpenOptions, PublishError, Received,
    Route, Sink,
};
use crate::error::{Error, Result};
use crate::lint::{Inventory, QueueFacts};
use crate::model::{BrokerKind, DeadLetter, Headers, Reason, ReasonKind, Source, Value};
use crate::target::{RabbitmqTarget, TlsFiles};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const HTTP_TIMEOUT: Duration = Duration::from_secs(15);
/// How many `basic.get`s a receive keeps in flight.
const GET_WINDOW: usize = 64;
/// Messages one peek channel holds; at most this many wait in memory.
const SCAN_PREFETCH: u16 = 5000;
/// How long a peek's consumer may stay quiet before the read checks whether the queue is empty.
const SCAN_QUIET: Duration = Duration::from_millis(50);
/// How long a redrive's consumer may stay quiet before gets take over: the broker streams in
/// bursts (paging from disk), and a get while it streams costs more than the wait.
const TAKE_QUIET: Duration = Duration::from_millis(250);
const PEEK_COST: &str = "RabbitMQ has no true peek: each message is fetched and requeued, which sets its \
                         redelivered flag (and counts toward a quorum queue's delivery limit)";

pub struct RabbitmqBroker {
    target: RabbitmqTarget,
    /// The target as printed, password masked.
    shown: String,
    connection: Connection,
    http: reqwest::Client,
    management: String,
    options: OpenOptions,
    /// The channel that holds received, not yet settled, deliveries.
    consumer: Mutex<Option<Taker>>,
    /// The confirm-mode channel copies are published on; replaced after a channel error.
    publisher: Mutex<Option<Channel>>,
    /// The channels a read holds its messages on; closing them puts the messages back.
    reader: Mutex<Vec<Channel>>,
}

impl RabbitmqBroker {
    pub async fn open(target: &RabbitmqTarget, shown: String, options: &OpenOptions) -> Result<Self> {
        let uri = format!(
            "{}://{}:{}@{}:{}/{}",
            if target.tls.is_some() { "amqps" } else { "amqp" },
            encode(&target.user),
            encode(target.password.as_ref().map_or("", |p| p.expose())),
            target.host,
            target.port,
            encode(&target.vhost)
        );
        let properties = ConnectionProperties::default().with_connection_name("dlqctl".into());
        let tls = tls_config(target.tls.as_ref())?;
        let runtime = lapin::runtime::default_runtime()
            .map_err(|e| Error::Runtime(format!("cannot start the AMQP client: {}", amqp_error(&e))))?;
        let connect = Connection::connect_with_config(&uri, properties, tls, runtime);
        let connection = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| Error::Runtime(format!("cannot connect to {shown}: no answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| {
                Error::Runtime(format!(
                    "cannot connect to {shown}: {} (check host, port, credentials and that the vhost exists)",
                    amqp_error(&e)
                ))
            })?;
        let http = reqwest::Client::builder()
            .timeout(HTTP_TIMEOUT)
            .build()
            .map_err(|e| Error::Runtime(format!("cannot build an HTTP client: {e}")))?;
        let management = target
            .management
            .clone()
            .unwrap_or_else(|| format!("http://{}:15672", target.host))
            .trim_end_matches('/')
            .to_owned();
        Ok(RabbitmqBroker {
            target: target.clone(),
            shown,
            connection,
            http,
            management,
            options: options.clone(),
            consumer: Mutex::new(None),
            publisher: Mutex::new(None),
            reader: Mutex::new(Vec::new()),
        })
    }

    fn queue(&self) -> Result<&str> {
        self.target.queue.as_deref().ok_or_else(|| {
            Error::Usage(format!(
                "{} names a vhost, not a queue: add /QUEUE to read or move messages (list shows the DLQs)",
                self.shown
            ))
        })
    }

    async fn channel(&self, purpose: &str) -> Result<Channel> {
        self.connection.create_channel().await.map_err(|e| {
            Error::Runtime(format!("cannot open a channel to {} for {purpose}: {}", self.shown, amqp_error(&e)))
        })
    }

    /// A GET on the management API, decoded.
    async fn api<T: for<'de> Deserialize<'de>>(&self, path: &str) -> Result<T> {
        let url = format!("{}/api/{path}", self.management);
        let response = self
            .http
            .get(&url)
            .basic_auth(&self.target.user, self.target.password.as_ref().map(|p| p.expose()))
            .send()
            .await
            .map_err(|e| {
                Error::Runtime(format!(
                    "cannot reach the RabbitMQ management API at {}: {} (is the management plugin enabled? \
                     ?management=URL sets its address)",
                    self.management,
                    without_url(&e)
                ))
            })?;
        match response.status() {
            s if s.is_success() => response.json().await.map_err(|e| {
                Error::Runtime(format!("unexpected answer from the management API at {url}: {}", without_url(&e)))
            }),
            reqwest::StatusCode::UNAUTHORIZED => Err(Error::Runtime(format!(
                "the management API at {} refused user {:?}: check the credentials (the user needs the \
                 management or monitoring tag)",
                self.management, self.target.user
            ))),
            reqwest::StatusCode::NOT_FOUND => Err(Error::Runtime(format!("not found on {}: {path}", self.shown))),
            s => Err(Error::Runtime(format!("the management API answered {s} for {path}"))),
        }
    }

    async fn queues(&self) -> Result<Vec<ApiQueue>> {
        let columns = "name,type,arguments,policy,effective_policy_definition,operator_policy,messages,consumers";
        self.api(&format!("queues/{}?columns={columns}", encode(&self.target.vhost))).await
    }

    /// Every queue that receives dead letters, with the queues that feed it, and the
    /// sources whose dead letters go nowhere.
    async fn topology(&self) -> Result<Topology> {
        let vhost = encode(&self.target.vhost);
        let queues = self.queues().await?;
        let exchanges: Vec<ApiExchange> = self.api(&format!("exchanges/{vhost}?columns=name,type")).await?;
        let exchange_types: BTreeMap<&str, &str> =
            exchanges.iter().map(|e| (e.name.as_str(), e.kind.as_str())).collect();
        let mut topology = Topology::default();
        let mut bindings_cache: BTreeMap<String, Vec<ApiBinding>> = BTreeMap::new();
        for source in &queues {
            let quorum_without_limit =
                source.kind == "quorum" && source.setting("x-delivery-limit", "delivery-limit").is_none();
            if quorum_without_limit {
                topology.problems.push(format!(
                    "quorum queue {} has no delivery limit: a poison message is redelivered forever",
                    source.name
                ));
            }
            let Some(dlx) = source.setting("x-dead-letter-exchange", "dead-letter-exchange") else {
                continue;
            };
            let dlx = dlx.as_str().unwrap_or_default().to_owned();
            let dl_key = source
                .setting("x-dead-letter-routing-key", "dead-letter-routing-key")
                .and_then(|v| v.as_str().map(str::to_owned));
            let targets: Vec<String> = if dlx.is_empty() {
                // The default exchange delivers to the queue named by the key.
                dl_key.iter().filter(|k| queues.iter().any(|q| &q.name == *k)).cloned().collect()
            } else if let Some(kind) = exchange_types.get(dlx.as_str()) {
                if !bindings_cache.contains_key(&dlx) {
                    let b = self.api(&format!("exchanges/{vhost}/{}/bindings/source", encode(&dlx))).await?;
                    bindings_cache.insert(dlx.clone(), b);
                }
                bindings_cache[&dlx]
                    .iter()
                    .filter(|b| b.destination_type == "queue" && routes(kind, &b.routing_key, dl_key.as_deref()))
                    .map(|b| b.destination.clone())
                    .collect()
            } else {
                let why =
                    format!("dead-letters to exchange {dlx:?}, which does not exist: its dead letters are dropped");
                topology.problems.push(format!("{} {why}", source.name));
                topology.dropped.insert(source.name.clone(), why);
                continue;
            };
            if targets.is_empty() {
                let why = format!(
                    "dead-letters to {} but no queue is bound for its messages: they are dropped",
                    if dlx.is_empty() { "the default exchange".to_owned() } else { format!("exchange {dlx:?}") }
                );
                topology.problems.push(format!("{} {why}", source.name));
                topology.dropped.insert(source.name.clone(), why);
            }
            if let Some(first) = targets.first() {
                topology.dlq_of.insert(source.name.clone(), first.clone());
            }
            for t in targets {
                topology.sources.entry(t).or_default().insert(source.name.clone());
            }
        }
        topology.queues = queues;
        Ok(topology)
    }

    fn describe_queue(&self, q: &ApiQueue, sources: Vec<String>, extra_notes: Vec<String>) -> Description {
        let mut notes = extra_notes;
        if let Some(max) = q.setting("x-max-length", "max-length") {
            notes.push(format!("max-length {max}"));
        }
        if let Some(policy) = q.policy.as_deref().filter(|p| !p.is_empty()) {
            notes.push(format!("policy {policy}"));
        }
        if q.consumers.unwrap_or(0) > 0 {
            notes.push(format!("{} consumer(s)", q.consumers.unwrap_or(0)));
        }
        let retention = q.setting("x-message-ttl", "message-ttl").and_then(|v| v.as_u64()).map(Duration::from_millis);
        Description {
            target: crate::target::Target::Rabbitmq(RabbitmqTarget {
                queue: Some(q.name.clone()),
                ..self.target.clone()
            })
            .to_string(),
            name: q.name.clone(),
            kind: if q.kind == "quorum" { "rabbitmq quorum queue" } else { "rabbitmq queue" },
            depth: q.messages,
            oldest_age: None,
            retention,
            sources,
            capabilities: self.capabilities(),
            notes,
        }
    }

    /// Reading a quorum DLQ with a delivery limit can dead-letter its messages again.
    async fn guard_quorum_read(&self, queue: &str) -> Result<()> {
        if self.options.force {
            return Ok(());
        }
        // A queue the management API does not list yet is seconds old: nothing to guard.
        let Some(q) = self.queues().await?.into_iter().find(|q| q.name == queue) else {
            return Ok(());
        };
        if q.kind == "quorum" && q.setting("x-delivery-limit", "delivery-limit").is_some() {
            return Err(Error::Usage(format!(
                "{queue} is a quorum queue with a delivery limit: every read counts as a delivery and can \
                 dead-letter its messages again; pass --force to read anyway"
            )));
        }
        Ok(())
    }

    /// Starts a read that sees every message without consuming any. A consumer is far faster
    /// than one `basic.get` per message, but nothing may be acked, so each channel stops at its
    /// prefetch: the read then moves on to a fresh channel, and the old one keeps holding its
    /// messages until `end_read` closes them all, which puts everything back in order. Memory
    /// stays bounded by one prefetch window.
    async fn open_scan(&self, queue: &str) -> Result<Scan> {
        let channel = self.channel("peeking").await?;
        self.reader.lock().await.push(channel.clone());
        let failed = |e| read_failed(queue, e);
        channel.basic_qos(SCAN_PREFETCH, BasicQosOptions::default()).await.map_err(failed)?;
        let consumer = channel
            .basic_consume(short(queue)?, "".into(), BasicConsumeOptions::default(), FieldTable::default())
            .await
            .map_err(failed)?;
        Ok(Scan { channel, consumer, delivered: 0 })
    }

    /// The next message of a scan, or None at the end of the queue. When the consumer goes
    /// quiet a `basic.get` on the same channel tells an empty queue from a slow broker: the
    /// broker sends everything it delivered to the consumer before it answers get-empty.
    async fn scan_next(&self, scan: &mut Scan, queue: &str) -> Result<Option<lapin::message::Delivery>> {
        let failed = |e| read_failed(queue, e);
        if scan.delivered == SCAN_PREFETCH {
            *scan = self.open_scan(queue).await?;
        }
        let delivery = match ready_or_timeout(SCAN_QUIET, scan.consumer.next()).await {
            Ok(delivery) => delivery,
            Err(_quiet) => {
                let got =
                    scan.channel.basic_get(short(queue)?, BasicGetOptions { no_ack: false }).await.map_err(failed)?;
                if let Some(message) = got {
                    return Ok(Some(message.delivery));
                }
                match scan.consumer.next().now_or_never() {
                    Some(delivery) => delivery,
                    None => return Ok(None),
                }
            }
        };
        match delivery {
            Some(delivery) => {
                scan.delivered += 1;
                delivery.map(Some).map_err(failed)
            }
            None => Err(Error::Runtime(format!("reading {queue}: the broker cancelled the read"))),
        }
    }

    async fn depth(&self, queue: &str) -> Result<u64> {
        let channel = self.channel("counting").await?;
        let q = channel
            .queue_declare(
                short(queue)?,
                QueueDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                Error::Runtime(format!("queue {queue:?} in vhost {:?}: {}", self.target.vhost, amqp_error(&e)))
            })?;
        let _ = channel.close(200, "done".into()).await;
        Ok(u64::from(q.message_count()))
    }

    async fn publisher(&self) -> std::result::Result<Channel, PublishError> {
        let mut slot = self.publisher.lock().await;
        if let Some(ch) = slot.as_ref().filter(|c| c.status().connected()) {
            return Ok(ch.clone());
        }
        let transient = |e: lapin::Error| PublishError {
            failure: Failure::Transient,
            message: format!("cannot open a publishing channel: {}", amqp_error(&e)),
        };
        let ch = self.connection.create_channel().await.map_err(transient)?;
        ch.confirm_select(ConfirmSelectOptions::default()).await.map_err(transient)?;
        *slot = Some(ch.clone());
        Ok(ch)
    }

    /// Publish one copy; the returned future resolves to the broker's confirm.
    async fn send(
        &self,
        letter: &DeadLetter,
        destination: &Destination,
    ) -> std::result::Result<lapin::PublisherConfirm, PublishError> {
        let Route::Amqp { exchange, routing_key, cc } = &destination.route else {
            return Err(PublishError {
                failure: Failure::Permanent,
                message: format!("RabbitMQ cannot publish to {}", destination.label),
            });
        };
        let permanent = |message: String| PublishError { failure: Failure::Permanent, message };
        let mut properties = to_properties(letter).map_err(permanent)?;
        if !cc.is_empty() {
            // Sender-selected distribution: the broker routes to the CC keys as it did the first time.
            let mut headers = properties.headers().clone().unwrap_or_default();
            let keys = cc.iter().map(|k| AMQPValue::LongString(k.as_str().into())).collect::<Vec<_>>();
            headers.insert("CC".into(), AMQPValue::FieldArray(FieldArray::from(keys)));
            properties = properties.with_headers(headers);
        }
        let (exchange_name, key) = match (short(exchange), short(routing_key)) {
            (Ok(x), Ok(k)) => (x, k),
            (Err(e), _) | (_, Err(e)) => return Err(permanent(e.to_string())),
        };
        let channel = self.publisher().await?;
        let options = BasicPublishOptions { mandatory: true, ..Default::default() };
        match channel.basic_publish(exchange_name, key, options, letter.body_bytes(), properties).await {
            Ok(confirm) => Ok(confirm),
            Err(e) => Err(self.channel_failed(exchange, &e).await),
        }
    }

    /// What the broker's confirm says: delivered only when acked and not returned.
    async fn confirmed(
        &self,
        confirm: lapin::PublisherConfirm,
        destination: &Destination,
    ) -> std::result::Result<(), PublishError> {
        let Route::Amqp { exchange, routing_key, .. } = &destination.route else { unreachable!("checked by send") };
        match confirm.await {
            Ok(confirm) if confirm.is_ack() => match confirm.take_message() {
                None => Ok(()),
                Some(returned) => Err(PublishError {
                    failure: Failure::Permanent,
                    message: format!(
                        "unroutable: {} returned it ({} {}): no queue is bound for key {routing_key:?}",
                        describe_exchange(exchange),
                        returned.reply_code,
                        returned.reply_text
                    ),
                }),
            },
            Ok(_) => Err(PublishError {
                failure: Failure::Transient,
                message: format!("{} refused the message (nack)", describe_exchange(exchange)),
            }),
            Err(e) => Err(self.channel_failed(exchange, &e).await),
        }
    }

    /// A channel-level error (404 for a missing exchange) closes the publishing channel: drop
    /// it so the next publish opens a new one, and say whether trying again can help.
    async fn channel_failed(&self, exchange: &str, e: &lapin::Error) -> PublishError {
        let text = amqp_error(e);
        let failure = if text.contains("NOT_FOUND") || text.contains("ACCESS_REFUSED") || text.contains("not allowed") {
            Failure::Permanent
        } else {
            Failure::Transient
        };
        *self.publisher.lock().await = None;
        PublishError { failure, message: format!("publishing to {} failed: {text}", describe_exchange(exchange)) }
    }
}

/// The destination a `--to rabbitmq://...` target names: `?exchange=` (with `?routing_key=`),
/// else the queue in the path, reached through the default exchange.
pub fn destination_for(target: &RabbitmqTarget, shown: &str) -> Result<Destination> {
    let (exchange, routing_key) = match (&target.exchange, &target.routing_key, &target.queue) {
        (Some(x), key, _) => (x.clone(), key.clone().unwrap_or_default()),
        (None, _, Some(queue)) => (String::new(), queue.clone()),
        (None, _, None) => {
            return Err(Error::Usage(format!(
                "--to {shown} names neither a queue nor ?exchange=: add /QUEUE or ?exchange=NAME&routing_key=KEY"
            )));
        }
    };
    Ok(amqp_destination(exchange, vec![routing_key]))
}

/// Whether `--to` names the DLQ itself: the same queue on the same broker and vhost, straight
/// or through the default exchange. (An exchange that routes back into the DLQ cannot be told
/// from here; such copies are noticed as they come back, and left in the DLQ.)
pub fn names_the_dlq(dlq: &RabbitmqTarget, to: &RabbitmqTarget) -> bool {
    let queue_to = match to.exchange.as_deref() {
        None => to.queue.as_deref(),
        Some("") => to.routing_key.as_deref().or(to.queue.as_deref()),
        Some(_) => None,
    };
    queue_to.is_some()
        && queue_to == dlq.queue.as_deref()
        && dlq.vhost == to.vhost
        && crate::target::same_address(&format!("{}:{}", dlq.host, dlq.port), &format!("{}:{}", to.host, to.port))
}

fn amqp_destination(exchange: String, mut keys: Vec<String>) -> Destination {
    let routing_key = if keys.is_empty() { String::new() } else { keys.remove(0) };
    let label = match (exchange.as_str(), keys.is_empty()) {
        ("", _) => format!("queue {routing_key}"),
        (x, true) => format!("exchange {x}, key {routing_key}"),
        (x, false) => format!("exchange {x}, keys {routing_key},{}", keys.join(",")),
    };
    Destination { label, route: Route::Amqp { exchange, routing_key, cc: keys } }
}

fn describe_exchange(exchange: &str) -> String {
    if exchange.is_empty() { "the default exchange".into() } else { format!("exchange {exchange:?}") }
}

#[async_trait]
impl Broker for RabbitmqBroker {
    fn backend(&self) -> &'static str {
        "RabbitMQ"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            peek: true,
            peek_cost: Some(PEEK_COST),
            consume: true,
            server_move: false,
            rereads_settled: false,
        }
    }

    async fn describe(&self) -> Result<Description> {
        let queue = self.queue()?.to_owned();
        // AMQP answers exactly and at once (and says if the queue is missing); the management
        // API lags a few seconds behind a new queue, so it only adds what it knows.
        let depth = self.depth(&queue).await?;
        let topology = self.topology().await?;
        let known = ApiQueue { name: queue.clone(), ..ApiQueue::default() };
        let q = topology.queues.iter().find(|q| q.name == queue).unwrap_or(&known);
        let sources = topology.sources.get(&queue).map(|s| s.iter().cloned().collect()).unwrap_or_default();
        let mut description = self.describe_queue(q, sources, Vec::new());
        description.depth = Some(depth);
        Ok(description)
    }

    async fn list(&self) -> Result<Vec<Description>> {
        let topology = self.topology().await?;
        let mut out: Vec<Description> = topology
            .queues
            .iter()
            .filter(|q| topology.sources.contains_key(&q.name) || self.target.queue.as_deref() == Some(q.name.as_str()))
            .map(|q| {
                let sources = topology.sources.get(&q.name).map(|s| s.iter().cloned().collect()).unwrap_or_default();
                self.describe_queue(q, sources, Vec::new())
            })
            .collect();
        if !topology.problems.is_empty() {
            out.push(Description {
                target: self.shown.clone(),
                name: "(sources)".into(),
                kind: "rabbitmq problems",
                depth: None,
                oldest_age: None,
                retention: None,
                sources: Vec::new(),
                capabilities: self.capabilities(),
                notes: topology.problems,
            });
        }
        Ok(out)
    }

    async fn peek(&self, limit: Option<u64>) -> Result<LetterStream<'_>> {
        let queue = self.queue()?.to_owned();
        self.guard_quorum_read(&queue).await?;
        self.end_read().await?;
        let remaining = limit.unwrap_or(u64::MAX);
        Ok(futures::stream::unfold(Some((None, remaining)), move |state| {
            let queue = queue.clone();
            async move {
                let (scan, remaining) = state?;
                if remaining == 0 {
                    return self.end_read().await.err().map(|e| (Err(e), None));
                }
                let mut scan = match scan {
                    Some(scan) => scan,
                    None => match self.open_scan(&queue).await {
                        Ok(scan) => scan,
                        Err(e) => return Some((Err(e), None)),
                    },
                };
                match self.scan_next(&mut scan, &queue).await {
                    Ok(Some(delivery)) => {
                        let letter = self.normalize(&queue, delivery);
                        Some((Ok(letter), Some((Some(scan), remaining - 1))))
                    }
                    Ok(None) => self.end_read().await.err().map(|e| (Err(e), None)),
                    Err(e) => Some((Err(e), None)),
                }
            }
        })
        .boxed())
    }

    async fn end_read(&self) -> Result<()> {
        let channels = std::mem::take(&mut *self.reader.lock().await);
        // Each close makes the broker put back a prefetch window: asked all at once, it does
        // them in one go instead of one round trip after another.
        let closed = futures::future::join_all(channels.iter().map(|c| c.close(200, "peek done".into()))).await;
        closed
            .into_iter()
            .collect::<std::result::Result<(), _>>()
            .map_err(|e| Error::Runtime(format!("putting peeked messages back in {}: {}", self.shown, amqp_error(&e))))
    }

    /// Takes up to `max` messages, unacked. A consumer with a prefetch of two batches streams
    /// them (far cheaper for the broker than a `basic.get` each); when it goes quiet, pipelined
    /// gets fill the batch, which also covers a consumer stalled by messages the run holds back,
    /// and an empty get marks the end of the queue.
    async fn receive(&self, max: usize) -> Result<Vec<Received>> {
        let queue = self.queue()?.to_owned();
        let failed = |e| read_failed(&queue, e);
        let mut slot = self.consumer.lock().await;
        if slot.is_none() {
            self.guard_quorum_read(&queue).await?;
            let channel = self.channel("taking messages").await?;
            // Room for the next batch: the broker sends it while this one is being published.
            let prefetch = u16::try_from(max.saturating_mul(2)).unwrap_or(u16::MAX);
            channel.basic_qos(prefetch, BasicQosOptions::default()).await.map_err(failed)?;
            *slot = Some(Taker { channel, consumer: None, prefetch, tags: Unsettled::default() });
        }
        let taker = slot.as_mut().expect("set above");
        if taker.consumer.is_none() {
            let consumer = taker
                .channel
                .basic_consume(short(&queue)?, "".into(), BasicConsumeOptions::default(), FieldTable::default())
                .await
                .map_err(failed)?;
            taker.consumer = Some(consumer);
        }
        let consumer = taker.consumer.as_mut().expect("set above");
        let mut deliveries = Vec::with_capacity(max);
        while deliveries.len() < max {
            // Messages the run holds back use up the consumer's prefetch: then only gets help.
            let starved = taker.tags.outstanding.len() + deliveries.len() >= usize::from(taker.prefetch);
            let next = if starved { None } else { ready_or_timeout(TAKE_QUIET, consumer.next()).await.ok() };
            match next {
                Some(Some(delivery)) => deliveries.push(delivery.map_err(failed)?),
                Some(None) => return Err(Error::Runtime(format!("reading {queue}: the broker cancelled the read"))),
                None => {
                    let wanted = max - deliveries.len();
                    let got = fetch(&taker.channel, &queue, wanted).await?;
                    let dry = got.len() < wanted;
                    deliveries.extend(got.into_iter().map(|message| message.delivery));
                    if dry {
                        // The broker sends what it gave the consumer before it answers get-empty.
                        while deliveries.len() < max {
                            match consumer.next().now_or_never() {
                                Some(Some(delivery)) => deliveries.push(delivery.map_err(failed)?),
                                _ => break,
                            }
                        }
                        break;
                    }
                }
            }
        }
        Ok(deliveries
            .into_iter()
            .map(|delivery| {
                let tag = delivery.delivery_tag;
                taker.tags.took(tag);
                Received { handle: Handle::Delivery(tag), letter: self.normalize(&queue, delivery) }
            })
            .collect())
    }

    async fn settle(&self, handles: &[Handle]) -> Result<()> {
        let mut slot = self.consumer.lock().await;
        let taker = slot.as_mut().ok_or_else(|| Error::Runtime("settle before receive".into()))?;
        let tags: Vec<u64> = delivery_tags(handles).collect();
        let failed = |e: lapin::Error| Error::Runtime(format!("acknowledging in {}: {}", self.shown, amqp_error(&e)));
        match taker.tags.covering_tag(&tags) {
            Some(last) => {
                let options = BasicAckOptions { multiple: true };
                taker.channel.basic_ack(last, options).await.map_err(failed)?;
            }
            None => {
                let acks = tags.iter().map(|&tag| taker.channel.basic_ack(tag, BasicAckOptions::default()));
                for ack in futures::future::join_all(acks).await {
                    ack.map_err(failed)?;
                }
            }
        }
        taker.tags.forget(&tags);
        Ok(())
    }

    async fn release(&self, handles: &[Handle]) -> Result<()> {
        let mut slot = self.consumer.lock().await;
        let Some(taker) = slot.as_mut() else {
            return Ok(());
        };
        let mut tags: Vec<u64> = delivery_tags(handles).collect();
        if tags.is_empty() {
            return Ok(());
        }
        let failed = |e: lapin::Error| Error::Runtime(format!("requeueing in {}: {}", self.shown, amqp_error(&e)));
        // A live consumer would take the requeued messages straight back: cancel it, and put
        // back what it had received but not handed out; the next receive starts a new one.
        if let Some(mut consumer) = taker.consumer.take() {
            let cancel = BasicCancelOptions::default();
            taker.channel.basic_cancel(consumer.tag(), cancel).await.map_err(failed)?;
            while let Some(Some(delivery)) = consumer.next().now_or_never() {
                let tag = delivery.map_err(failed)?.delivery_tag;
                taker.tags.took(tag);
                tags.push(tag);
            }
        }
        taker.tags.forget(&tags);
        let channel = &taker.channel;
        let requeue = BasicRejectOptions { requeue: true };
        let rejects = tags.iter().map(|&tag| channel.basic_reject(tag, requeue));
        for reject in futures::future::join_all(rejects).await {
            reject.map_err(failed)?;
        }
        Ok(())
    }

    async fn lint_inventory(&self) -> Result<Inventory> {
        let topology = self.topology().await?;
        let queues = topology
            .queues
            .iter()
            .map(|q| {
                let is_dlq = topology.sources.contains_key(&q.name);
                let text = |arg: &str, policy: &str| q.setting(arg, policy).and_then(|v| v.as_str().map(str::to_owned));
                QueueFacts {
                    broker: "rabbitmq",
                    name: q.name.clone(),
                    is_dlq,
                    dlq: topology.dlq_of.get(&q.name).cloned(),
                    needs_dlq: !is_dlq,
                    retention: q
                        .setting("x-message-ttl", "message-ttl")
                        .and_then(|v| v.as_u64())
                        .map(Duration::from_millis),
                    quorum: q.kind == "quorum",
                    delivery_limit: q.setting("x-delivery-limit", "delivery-limit").and_then(|v| v.as_i64()),
                    dead_letter_strategy: text("x-dead-letter-strategy", "dead-letter-strategy"),
                    dead_letters_dropped: topology.dropped.get(&q.name).cloned(),
                    ..QueueFacts::default()
                }
            })
            .collect();
        Ok(Inventory { queues, alarms: Vec::new() })
    }

    fn source_destination(&self, letter: &DeadLetter) -> Option<Destination> {
        let exchange = letter.source.exchange.clone()?;
        if letter.source.routing_keys.is_empty() {
            return None;
        }
        Some(amqp_destination(exchange, letter.source.routing_keys.clone()))
    }

    fn source_sink(&self) -> Option<&dyn Sink> {
        Some(self)
    }
}

#[async_trait]
impl Sink for RabbitmqBroker {
    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<std::result::Result<(), PublishError>> {
        // Publish the whole batch, then collect the confirms: one round trip, not one a message.
        // Joined, not awaited one by one: each await is a hand-off to lapin's I/O thread.
        let sent = futures::future::join_all(batch.iter().map(|(letter, destination)| self.send(letter, destination)));
        let confirms = sent.await.into_iter().zip(batch).map(|(outcome, (_, destination))| async move {
            match outcome {
                Ok(confirm) => self.confirmed(confirm, destination).await,
                Err(e) => Err(e),
            }
        });
        futures::future::join_all(confirms).await
    }
}

impl RabbitmqBroker {
    fn normalize(&self, queue: &str, delivery: lapin::message::Delivery) -> DeadLetter {
        let p = &delivery.properties;
        let headers = p.headers().as_ref().map(from_table).unwrap_or_default();
        let death = decode_x_death(&headers);
        let mut properties = Headers::new();
        let text = |v: &Option<ShortString>| v.as_ref().map(|s| Value::String(s.as_str().to_owned()));
        for (name, value) in [
            ("message_id", text(p.message_id())),
            ("correlation_id", text(p.correlation_id())),
            ("content_type", text(p.content_type())),
            ("content_encoding", text(p.content_encoding())),
            ("type", text(p.kind())),
            ("app_id", text(p.app_id())),
            ("user_id", text(p.user_id())),
            ("reply_to", text(p.reply_to())),
            ("expiration", text(p.expiration())),
            ("cluster_id", text(p.cluster_id())),
            ("priority", p.priority().map(|n| Value::Int(i64::from(n)))),
            ("delivery_mode", p.delivery_mode().map(|n| Value::Int(i64::from(n)))),
            ("timestamp", p.timestamp().and_then(|t| seconds(t as i64)).map(Value::Timestamp)),
        ] {
            if let Some(v) = value {
                properties.push(name, v);
            }
        }
        let extras = Headers::new()
            .with("properties", properties)
            .with("exchange", delivery.exchange.as_str())
            .with("routing_key", delivery.routing_key.as_str())
            .with("redelivered", delivery.redelivered);
        let id = p
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned())
            .unwrap_or_else(|| content_id(&delivery.data, &headers));
        let mut letter = DeadLetter {
            id,
            broker: Some(BrokerKind::Rabbitmq),
            dlq: Some(queue.to_owned()),
            source: death.source,
            reason: death.reason,
            failure_count: death.count,
            first_failed_at: death.first,
            last_failed_at: death.last,
            enqueued_at: p.timestamp().and_then(|t| seconds(t as i64)),
            headers,
            extras,
            body: Some(delivery.data),
        };
        if letter.reason.kind == ReasonKind::Unknown && letter.source.name.is_none() {
            letter.reason.raw = Some("no x-death header: not dead-lettered by RabbitMQ".into());
        }
        letter
    }
}

/// What `x-death` says, decoded.
#[derive(Debug, Default, PartialEq)]
pub struct Death {
    pub reason: Reason,
    pub source: Source,
    /// Deaths in all, summed over the entries.
    pub count: Option<u64>,
    pub first: Option<DateTime<Utc>>,
    pub last: Option<DateTime<Utc>>,
}

/// Decode `x-death` (newest entry first) and `x-first-death-*`. The reason and source are the
/// first death's: the original failure, and where the message goes back to. Integers of any
/// width and times in seconds are accepted; a malformed header yields what can be read.
pub fn decode_x_death(headers: &Headers) -> Death {
    let entries: Vec<&Headers> = match headers.get("x-death") {
        Some(Value::List(items)) => items
            .iter()
            .filter_map(|v| match v {
                Value::Table(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut death = Death::default();
    let text = |t: &Headers, k: &str| t.get(k).and_then(Value::as_str).map(str::to_owned);
    // The oldest entry is last; x-first-death-* confirm it when the list was truncated.
    let first = entries.last();
    let first_reason = headers
        .get("x-first-death-reason")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| first.and_then(|t| text(t, "reason")));
    if let Some(raw) = first_reason {
        death.reason = Reason {
            kind: match raw.as_str() {
                "rejected" => ReasonKind::Rejected,
                "expired" => ReasonKind::Expired,
                "maxlen" => ReasonKind::Maxlen,
                "delivery_limit" => ReasonKind::DeliveryLimit,
                _ => ReasonKind::Unknown,
            },
            raw: Some(raw),
            ..Reason::default()
        };
    }
    death.source = Source {
        name: headers
            .get("x-first-death-queue")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| first.and_then(|t| text(t, "queue"))),
        exchange: headers
            .get("x-first-death-exchange")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| first.and_then(|t| text(t, "exchange"))),
        routing_keys: first
            .and_then(|t| match t.get("routing-keys") {
                Some(Value::List(keys)) => Some(keys.iter().filter_map(Value::as_str).map(str::to_owned).collect()),
                _ => None,
            })
            .unwrap_or_default(),
        ..Source::default()
    };
    let counts: Vec<u64> = entries
        .iter()
        .filter_map(|t| match t.get("count") {
            Some(Value::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        })
        .collect();
    if !counts.is_empty() {
        death.count = Some(counts.iter().sum());
    }
    let times: Vec<DateTime<Utc>> = entries
        .iter()
        .filter_map(|t| match t.get("time") {
            Some(Value::Timestamp(t)) => Some(*t),
            Some(Value::Int(secs)) => seconds(*secs),
            _ => None,
        })
        .collect();
    death.first = times.iter().min().copied();
    death.last = times.iter().max().copied();
    death
}

fn seconds(secs: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_opt(secs, 0).single()
}

/// A stable id for a message that has no message-id property.
fn content_id(body: &[u8], headers: &Headers) -> String {
    let mut digest = Sha256::new();
    digest.update(body);
    let mut json = Vec::new();
    headers.write_json(&mut json);
    digest.update(json);
    let hex: String = digest.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha-{hex}")
}

pub fn from_table(table: &FieldTable) -> Headers {
    table.into_iter().map(|(k, v)| (k.as_str().to_owned(), from_amqp(v))).collect()
}

fn from_amqp(value: &AMQPValue) -> Value {
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => Value::Int(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Value::Int(i64::from(*n)),
        AMQPValue::ShortInt(n) => Value::Int(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Value::Int(i64::from(*n)),
        AMQPValue::LongInt(n) => Value::Int(i64::from(*n)),
        AMQPValue::LongUInt(n) => Value::Int(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Value::Int(*n),
        AMQPValue::Float(x) => Value::Float(f64::from(*x)),
        AMQPValue::Double(x) => Value::Float(*x),
        AMQPValue::DecimalValue(d) => Value::Float(f64::from(d.value) / 10f64.powi(i32::from(d.scale))),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_owned()),
        AMQPValue::LongString(s) => match std::str::from_utf8(s.as_bytes()) {
            Ok(text) => Value::String(text.to_owned()),
            Err(_) => Value::Bytes(s.as_bytes().to_vec()),
        },
        AMQPValue::ByteArray(b) => Value::Bytes(b.as_slice().to_vec()),
        AMQPValue::FieldArray(items) => Value::List(items.as_slice().iter().map(from_amqp).collect()),
        AMQPValue::Timestamp(t) => {
            i64::try_from(*t).ok().and_then(seconds).map_or(Value::Int(*t as i64), Value::Timestamp)
        }
        AMQPValue::FieldTable(t) => Value::Table(from_table(t)),
        AMQPValue::Void => Value::Null,
    }
}

fn to_table(headers: &Headers) -> std::result::Result<FieldTable, String> {
    let mut table = FieldTable::default();
    for (k, v) in headers.iter() {
        let key = ShortString::try_new(k).map_err(|_| format!("header name {k:?} is over 255 bytes, AMQP's limit"))?;
        table.insert(key, to_amqp(v)?);
    }
    Ok(table)
}

fn to_amqp(value: &Value) -> std::result::Result<AMQPValue, String> {
    Ok(match value {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Int(n) => AMQPValue::LongLongInt(*n),
        Value::Float(x) => AMQPValue::Double(*x),
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes())),
        Value::Bytes(b) => AMQPValue::LongString(LongString::from(b.as_slice())),
        Value::Timestamp(t) => AMQPValue::Timestamp(u64::try_from(t.timestamp()).unwrap_or(0)),
        Value::List(items) => AMQPValue::FieldArray(FieldArray::from(
            items.iter().map(to_amqp).collect::<std::result::Result<Vec<_>, _>>()?,
        )),
        Value::Table(t) => AMQPValue::FieldTable(to_table(t)?),
    })
}

/// The AMQP properties of a copy: those recorded in `extras.properties`, headers as they were.
fn to_properties(letter: &DeadLetter) -> std::result::Result<BasicProperties, String> {
    let mut p = BasicProperties::default().with_headers(to_table(&letter.headers)?);
    let Some(Value::Table(props)) = letter.extras.get("properties") else {
        return Ok(p);
    };
    for (name, value) in props.iter() {
        let text = || -> std::result::Result<ShortString, String> {
            let s = value.as_str().unwrap_or_default();
            ShortString::try_new(s).map_err(|_| format!("property {name} is over 255 bytes"))
        };
        let small = || match value {
            Value::Int(n) => u8::try_from(*n).ok(),
            _ => None,
        };
        p = match name {
            "message_id" => p.with_message_id(text()?),
            "correlation_id" => p.with_correlation_id(text()?),
            "content_type" => p.with_content_type(text()?),
            "content_encoding" => p.with_content_encoding(text()?),
            "type" => p.with_type(text()?),
            "app_id" => p.with_app_id(text()?),
            "user_id" => p.with_user_id(text()?),
            "reply_to" => p.with_reply_to(text()?),
            "cluster_id" => p.with_cluster_id(text()?),
            // A redriven copy must not expire on its way back as its original did.
            "expiration" => p,
            "priority" => small().map_or(p.clone(), |n| p.with_priority(n)),
            "delivery_mode" => small().map_or(p.clone(), |n| p.with_delivery_mode(n)),
            "timestamp" => match value {
                Value::Timestamp(t) => p.with_timestamp(u64::try_from(t.timestamp()).unwrap_or(0)),
                _ => p,
            },
            _ => p,
        };
    }
    Ok(p)
}

/// Fetches up to `max` messages, unacked, with up to `GET_WINDOW` `basic.get`s in flight:
/// a read is bound by round trips, not by the broker or by us. Stops asking at the first empty
/// reply but keeps whatever the gets already in flight bring (they are held on the channel
/// like the rest), so nothing fetched goes untracked.
async fn fetch(channel: &Channel, queue: &str, max: usize) -> Result<Vec<BasicGetMessage>> {
    let name = short(queue)?;
    let get = || channel.basic_get(name.clone(), BasicGetOptions { no_ack: false });
    let mut in_flight = FuturesOrdered::new();
    let mut asked = 0;
    let mut dry = false;
    let mut out = Vec::with_capacity(max.min(GET_WINDOW));
    loop {
        while !dry && asked < max && in_flight.len() < GET_WINDOW {
            in_flight.push_back(get());
            asked += 1;
        }
        let Some(reply) = in_flight.next().await else {
            return Ok(out);
        };
        match reply.map_err(|e| read_failed(queue, e))? {
            Some(message) => out.push(message),
            None => dry = true,
        }
    }
}

fn delivery_tags(handles: &[Handle]) -> impl Iterator<Item = u64> + '_ {
    handles.iter().filter_map(|h| match h {
        Handle::Delivery(tag) => Some(*tag),
        _ => None,
    })
}

/// The channel a redrive takes messages on, its consumer, and what it has not settled.
struct Taker {
    channel: Channel,
    /// None until the first receive, and again after a release cancelled it.
    consumer: Option<lapin::Consumer>,
    prefetch: u16,
    tags: Unsettled,
}

/// Delivery tags handed to the engine and not settled yet.
#[derive(Debug, Default)]
struct Unsettled {
    outstanding: BTreeSet<u64>,
    /// Deliveries handed out so far, and the highest tag among them: equal when no delivery
    /// below that tag is still waiting in the consumer's buffer (tags count up from 1).
    taken: u64,
    highest: u64,
}

impl Unsettled {
    fn took(&mut self, tag: u64) {
        self.outstanding.insert(tag);
        self.taken += 1;
        self.highest = self.highest.max(tag);
    }

    /// The tag one `multiple` ack can settle `tags` with: their highest, when no other
    /// delivery lies below it, outstanding or still buffered (the ack would settle it too).
    fn covering_tag(&self, tags: &[u64]) -> Option<u64> {
        let tags: BTreeSet<u64> = tags.iter().copied().collect();
        let last = *tags.last()?;
        let covered = tags.iter().all(|t| self.outstanding.contains(t));
        let no_gap = self.taken == self.highest;
        (covered && no_gap && self.outstanding.range(..=last).count() == tags.len()).then_some(last)
    }

    fn forget(&mut self, tags: &[u64]) {
        for tag in tags {
            self.outstanding.remove(tag);
        }
    }
}

/// A peek in progress: the channel it reads on now and that channel's consumer.
struct Scan {
    channel: Channel,
    consumer: lapin::Consumer,
    delivered: u16,
}

/// The CA to trust besides the system's, and the client certificate, read from their PEM files.
fn tls_config(files: Option<&TlsFiles>) -> Result<OwnedTLSConfig> {
    let Some(files) = files else { return Ok(OwnedTLSConfig::default()) };
    let read = |path: &Path, what: &str| {
        std::fs::read(path).map_err(|e| Error::io(format!("cannot read the {what} {}", path.display()), e))
    };
    let cert_chain = match &files.ca {
        Some(ca) => Some(String::from_utf8_lossy(&read(ca, "CA certificate")?).into_owned()),
        None => None,
    };
    let identity = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => {
            Some(OwnedIdentity::PKCS8 { pem: read(cert, "client certificate")?, key: read(key, "client key")? })
        }
        _ => None,
    };
    Ok(OwnedTLSConfig { identity, cert_chain })
}

fn short(name: &str) -> Result<ShortString> {
    ShortString::try_new(name).map_err(|_| Error::Usage(format!("{name:?} is over 255 bytes, AMQP's limit for names")))
}

fn read_failed(queue: &str, e: lapin::Error) -> Error {
    Error::Runtime(format!("reading {queue}: {}", amqp_error(&e)))
}

/// lapin's error text, which never includes the URI or password.
fn amqp_error(e: &lapin::Error) -> String {
    e.to_string()
}

/// reqwest's error text and its cause, with any password in the URL masked.
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), &crate::target::mask_input(url.as_str()));
    }
    if let Some(source) = std::error::Error::source(e) {
        text = format!("{text}: {source}");
    }
    text
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Whether a binding with `binding_key` on an exchange of `kind` takes dead letters sent with
/// `dl_key` (`None`: the original keys, unknown here, so any binding may match).
fn routes(kind: &str, binding_key: &str, dl_key: Option<&str>) -> bool {
    let Some(key) = dl_key else { return true };
    match kind {
        "direct" => binding_key == key,
        "topic" => topic_matches(binding_key, key),
        _ => true, // fanout, headers and plugin types: assume it routes
    }
}

fn topic_matches(pattern: &str, key: &str) -> bool {
    fn go(p: &[&str], k: &[&str]) -> bool {
        match (p.first(), k.first()) {
            (None, None) => true,
            (Some(&"#"), _) => go(&p[1..], k) || (!k.is_empty() && go(p, &k[1..])),
            (Some(&"*"), Some(_)) => go(&p[1..], &k[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &k[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = key.split('.').collect();
    go(&p, &k)
}

#[derive(Debug, Default)]
struct Topology {
    queues: Vec<ApiQueue>,
    /// DLQ name -> the queues that dead-letter into it.
    sources: BTreeMap<String, BTreeSet<String>>,
    /// Source -> the (first) DLQ its dead letters reach.
    dlq_of: BTreeMap<String, String>,
    /// Source -> why its dead letters are dropped.
    dropped: BTreeMap<String, String>,
    problems: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ApiQueue {
    name: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    arguments: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    effective_policy_definition: Option<serde_json::Value>,
    #[serde(default)]
    messages: Option<u64>,
    #[serde(default)]
    consumers: Option<u64>,
}

impl ApiQueue {
    /// A setting from the queue's arguments, else its effective policy.
    fn setting(&self, argument: &str, policy_key: &str) -> Option<serde_json::Value> {
        self.arguments
            .get(argument)
            .cloned()
            .or_else(|| self.effective_policy_definition.as_ref().and_then(|d| d.get(policy_key)).cloned())
    }
}

#[derive(Debug, Deserialize)]
struct ApiExchange {
    name: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct ApiBinding {
    destination: String,
    destination_type: String,
    routing_key: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        crate::model::parse_time(s).unwrap()
    }

    fn entry(reason: &str, queue: &str, exchange: &str, key: &str, count: i64, time: &str) -> Value {
        Value::Table(
            Headers::new()
                .with("count", count)
                .with("reason", reason)
                .with("queue", queue)
                .with("time", t(time))
                .with("exchange", exchange)
                .with("routing-keys", vec![Value::from(key)]),
        )
    }

    #[test]
    fn the_first_death_gives_reason_and_source() {
        let headers = Headers::new()
            .with(
                "x-death",
                vec![
                    entry("expired", "orders.retry", "", "orders.retry", 1, "2026-11-30T10:00:05Z"),
                    entry("rejected", "orders.validate", "orders", "order.created", 2, "2026-11-30T10:00:00Z"),
                ],
            )
            .with("x-first-death-reason", "rejected")
            .with("x-first-death-queue", "orders.validate")
            .with("x-first-death-exchange", "orders");
        let d = decode_x_death(&headers);
        assert_eq!(d.reason.kind, ReasonKind::Rejected);
        assert_eq!(d.source.name.as_deref(), Some("orders.validate"));
        assert_eq!(d.source.exchange.as_deref(), Some("orders"));
        assert_eq!(d.source.routing_keys, ["order.created"]);
        assert_eq!(d.count, Some(3));
        assert_eq!(d.first, Some(t("2026-11-30T10:00:00Z")));
        assert_eq!(d.last, Some(t("2026-11-30T10:00:05Z")));
    }

    #[test]
    fn every_reason_and_integer_width_decodes() {
        for (raw, kind) in [
            ("rejected", ReasonKind::Rejected),
            ("expired", ReasonKind::Expired),
            ("maxlen", ReasonKind::Maxlen),
            ("delivery_limit", ReasonKind::DeliveryLimit),
            ("something-new", ReasonKind::Unknown),
        ] {
            let h = Headers::new().with("x-death", vec![entry(raw, "q", "x", "k", 1, "2026-11-30T10:00:00Z")]);
            assert_eq!(decode_x_death(&h).reason.kind, kind, "{raw}");
        }
        let mut table = FieldTable::default();
        table.insert("count".into(), AMQPValue::LongInt(7));
        table.insert("time".into(), AMQPValue::Timestamp(1_795_910_400));
        table.insert("reason".into(), AMQPValue::LongString("rejected".into()));
        let mut outer = FieldTable::default();
        outer.insert("x-death".into(), AMQPValue::FieldArray(vec![AMQPValue::FieldTable(table)].into()));
        let d = decode_x_death(&from_table(&outer));
        assert_eq!(d.count, Some(7));
        assert_eq!(d.first, Some(t("2026-11-29T00:00:00Z")));
    }

    #[test]
    fn a_message_without_x_death_decodes_to_unknown() {
        let d = decode_x_death(&Headers::new().with("x-death", "garbage"));
        assert_eq!(d, Death::default());
    }

    #[test]
    fn amqp_values_round_trip_through_the_model() {
        let headers = Headers::new()
            .with("s", "text")
            .with("b", vec![0xffu8, 0])
            .with("n", -5i64)
            .with("f", Value::Float(1.5))
            .with("flag", true)
            .with("when", t("2026-11-30T10:00:00Z"))
            .with("nested", Headers::new().with("list", vec![Value::from(1i64), Value::Null]));
        let table = to_table(&headers).unwrap();
        let back = from_table(&table);
        for (k, v) in headers.iter() {
            assert_eq!(back.get(k), Some(v), "{k}");
        }
        let long = "k".repeat(256);
        assert!(to_table(&Headers::new().with(long, 1i64)).unwrap_err().contains("255"));
    }

    #[test]
    fn one_multiple_ack_only_when_it_settles_nothing_else() {
        let mut tags = Unsettled::default();
        (1..=5).for_each(|t| tags.took(t));
        assert_eq!(tags.covering_tag(&[3, 1, 2]), Some(3));
        // 2 is held back: acking up to 3 would settle it too.
        assert_eq!(tags.covering_tag(&[1, 3]), None);
        tags.forget(&[1, 2, 3]);
        assert_eq!(tags.covering_tag(&[4, 5]), Some(5));
        // 7 was handed out but 6 still waits in the consumer's buffer.
        tags.took(7);
        assert_eq!(tags.covering_tag(&[4, 5, 7]), None);
        tags.took(6);
        assert_eq!(tags.covering_tag(&[4, 5, 6, 7]), Some(7));
        assert_eq!(tags.covering_tag(&[8]), None, "never handed out");
        assert_eq!(tags.covering_tag(&[]), None);
    }

    #[test]
    fn topic_routing() {
        assert!(topic_matches("#", "a.b"));
        assert!(topic_matches("order.*", "order.created"));
        assert!(!topic_matches("order.*", "order.created.eu"));
        assert!(topic_matches("order.#", "order.created.eu"));
        assert!(topic_matches("dead.#", "dead"));
        assert!(!topic_matches("invoice.*", "dead.invoices"));
    }

    #[test]
    fn destinations_name_what_they_route_to() {
        assert_eq!(amqp_destination(String::new(), vec!["q".into()]).label, "queue q");
        let d = amqp_destination("orders".into(), vec!["a".into(), "b".into()]);
        assert_eq!(d.label, "exchange orders, keys a,b");
        assert_eq!(d.route, Route::Amqp { exchange: "orders".into(), routing_key: "a".into(), cc: vec!["b".into()] });
    }
}
