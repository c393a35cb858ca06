//! `dlqctl lint`: checks DLQ configuration and alerting, live (from the backends) or offline
//! (CloudFormation templates, Prometheus rule files, dlqctl alert files), with stable rule ids,
//! waivers, and text, JSON or SARIF output.
//!
//! Every input becomes the same inventory of queues and alarms; the rules only see that.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Names that mark a queue or topic as a dead-letter queue even when nothing points at it
/// (a Lambda or EventBridge DLQ, a Kafka DLT).
pub const DLQ_NAME: &str = r"(?i)(dlq|dead[._-]?letter|\.dlt$|-dlt$)";

pub mod offline;
pub mod report;
pub mod rules;

/// Where a fact came from in a file, for messages and SARIF locations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
}

/// One queue or topic, as the rules need to see it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueFacts {
    /// `sqs`, `rabbitmq`, `kafka`.
    pub broker: &'static str,
    pub name: String,
    /// Something dead-letters into it (or its name says it is a DLQ).
    pub is_dlq: bool,
    /// The DLQ this queue dead-letters to, if any.
    pub dlq: Option<String>,
    /// Whether it is expected to have a DLQ (SQS and RabbitMQ queues that are not DLQs).
    pub needs_dlq: bool,
    pub retention: Option<Duration>,
    pub max_receive_count: Option<u64>,
    pub fifo: bool,
    pub quorum: bool,
    pub delivery_limit: Option<i64>,
    /// RabbitMQ `dead-letter-strategy` (`at-most-once` when unset).
    pub dead_letter_strategy: Option<String>,
    /// Why its dead letters go nowhere (RabbitMQ DLX missing or unbound).
    pub dead_letters_dropped: Option<String>,
    /// Kafka `cleanup.policy`.
    pub cleanup_policy: Option<String>,
    pub location: Option<Location>,
    /// Waivers written next to the definition (inline comment or template metadata).
    pub inline_waivers: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlarmKind {
    Depth,
    Age,
}

/// An alarm or alerting rule that watches one queue (or the queues a pattern matches).
#[derive(Debug, Clone, Serialize)]
pub struct AlarmFacts {
    pub name: String,
    /// A queue name, or a regular expression when `pattern` is set.
    pub queue: String,
    pub pattern: bool,
    pub kind: AlarmKind,
    /// It fires when the value exceeds this.
    pub threshold: Option<f64>,
    /// How long the condition must hold before it fires.
    pub window: Option<Duration>,
    pub location: Option<Location>,
    pub inline_waivers: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Inventory {
    pub queues: Vec<QueueFacts>,
    pub alarms: Vec<AlarmFacts>,
}

impl Inventory {
    pub fn extend(&mut self, other: Inventory) {
        self.queues.extend(other.queues);
        self.alarms.extend(other.alarms);
    }
}

/// The `[lint]` table of the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LintConfig {
    /// Shortest acceptable DLQ retention (`4d`).
    pub min_retention: String,
    /// Highest acceptable `maxReceiveCount`.
    pub max_receive_count: u64,
    /// A depth alarm must fire above this many messages, or fewer.
    pub depth_alarm_max_threshold: f64,
    /// A depth alarm must fire within this long (`1h`).
    pub depth_alarm_max_window: String,
    /// Per-rule severity: `error`, `warning`, `note` or `off`.
    pub severity: std::collections::BTreeMap<String, String>,
    pub waive: Vec<Waiver>,
}

impl Default for LintConfig {
    fn default() -> Self {
        LintConfig {
            min_retention: "4d".into(),
            max_receive_count: 10,
            depth_alarm_max_threshold: 0.0,
            depth_alarm_max_window: "1h".into(),
            severity: Default::default(),
            waive: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Waiver {
    pub rule: String,
    /// The queue (or topic) name the waiver covers.
    pub queue: String,
    pub justification: String,
}
