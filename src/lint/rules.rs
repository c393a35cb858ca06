//! The rules: stable ids, each with why it matters and how to fix it, and the checks.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::{AlarmFacts, AlarmKind, Inventory, LintConfig, Location, QueueFacts};
use crate::error::{Error, Result};
use crate::redrive::select::parse_duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Note,
    Warning,
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Note => "note",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Rule {
    pub id: &'static str,
    pub name: &'static str,
    pub severity: Severity,
    pub summary: &'static str,
    pub why: &'static str,
    pub fix: &'static str,
}

pub const RULES: &[Rule] = &[
    Rule {
        id: "DLQ001",
        name: "dlq-without-depth-alarm",
        severity: Severity::Error,
        summary: "A DLQ has no alarm on its depth.",
        why: "Nobody learns that messages are dying: a DLQ without an alarm is a graveyard.",
        fix: "Alarm when the DLQ holds more than 0 messages (SQS: ApproximateNumberOfMessagesVisible; RabbitMQ: \
              rabbitmq_queue_messages; Kafka: consumer lag of the DLT).",
    },
    Rule {
        id: "DLQ002",
        name: "dlq-without-age-alarm",
        severity: Severity::Warning,
        summary: "A DLQ has no alarm on the age of its oldest message.",
        why: "A depth alarm that was acknowledged and forgotten lets messages age out of retention unseen.",
        fix: "Alarm when the oldest message is older than a fraction of the retention (SQS: \
              ApproximateAgeOfOldestMessage).",
    },
    Rule {
        id: "DLQ003",
        name: "depth-alarm-too-lax",
        severity: Severity::Warning,
        summary: "A DLQ's depth alarm lets dead letters sit unnoticed.",
        why: "A threshold above zero, or a long evaluation window, means the first dead letters raise nothing.",
        fix: "Fire on more than 0 messages within an hour (thresholds: [lint] depth_alarm_max_threshold and \
              depth_alarm_max_window).",
    },
    Rule {
        id: "DLQ004",
        name: "dlq-retention-too-short",
        severity: Severity::Error,
        summary: "A DLQ keeps messages for less than the minimum.",
        why: "Dead letters expire before anyone can look at them or redrive them.",
        fix: "Raise the retention (SQS MessageRetentionPeriod up to 14 days; RabbitMQ x-message-ttl; Kafka \
              retention.ms) to at least [lint] min_retention (default 4 days).",
    },
    Rule {
        id: "DLQ005",
        name: "dlq-retention-not-longer-than-source",
        severity: Severity::Error,
        summary: "An SQS standard DLQ does not keep messages longer than its source.",
        why: "A standard queue keeps a message's original enqueue time when it dead-letters it, so a message \
              that spent days failing in the source expires in the DLQ soon after, or at once.",
        fix: "Give the DLQ a longer retention than every source (the maximum, 14 days, is usual).",
    },
    Rule {
        id: "DLQ006",
        name: "source-without-dlq",
        severity: Severity::Warning,
        summary: "A queue has no dead-letter queue.",
        why: "A poison message is retried forever (or dropped) instead of being set aside.",
        fix: "Give it a DLQ (SQS RedrivePolicy; RabbitMQ x-dead-letter-exchange or a policy).",
    },
    Rule {
        id: "DLQ007",
        name: "shared-dlq",
        severity: Severity::Note,
        summary: "One DLQ takes dead letters from several sources.",
        why: "Alarms cannot say which consumer fails, and a redrive must sort messages by source.",
        fix: "Give each source its own DLQ, or make sure dead letters record their source.",
    },
    Rule {
        id: "DLQ008",
        name: "max-receive-count-out-of-range",
        severity: Severity::Warning,
        summary: "maxReceiveCount is 1, or above the ceiling.",
        why: "1 dead-letters a message on its first transient failure; a high count keeps a poison message \
              blocking consumers for a long time.",
        fix: "Use a small count above 1 (3 to 5 is usual; ceiling: [lint] max_receive_count, default 10).",
    },
    Rule {
        id: "DLQ009",
        name: "dead-letters-dropped",
        severity: Severity::Error,
        summary: "A RabbitMQ queue dead-letters to an exchange that is missing or routes nowhere.",
        why: "RabbitMQ drops dead letters it cannot route, silently.",
        fix: "Declare the dead-letter exchange and bind a DLQ to it for the dead-letter routing key.",
    },
    Rule {
        id: "DLQ010",
        name: "quorum-without-delivery-limit",
        severity: Severity::Warning,
        summary: "A quorum queue has no explicit delivery limit.",
        why: "A poison message is redelivered without end (RabbitMQ before 4.0 sets no limit).",
        fix: "Set x-delivery-limit (or a delivery-limit policy) and a dead-letter exchange.",
    },
    Rule {
        id: "DLQ011",
        name: "quorum-at-most-once-dead-lettering",
        severity: Severity::Warning,
        summary: "A quorum queue dead-letters at most once.",
        why: "With the default at-most-once strategy a dead letter that cannot be delivered to the DLX is lost.",
        fix: "Set dead-letter-strategy at-least-once (with overflow reject-publish) in its policy or arguments.",
    },
    Rule {
        id: "DLQ012",
        name: "compacted-dlt",
        severity: Severity::Error,
        summary: "A Kafka dead-letter topic is compacted.",
        why: "Compaction keeps only the last record per key: dead letters with the same key replace each other.",
        fix: "Use cleanup.policy=delete on dead-letter topics.",
    },
];

pub fn rule(id: &str) -> &'static Rule {
    RULES.iter().find(|r| r.id == id).expect("rule ids in the checks are in the catalog")
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub rule: &'static str,
    pub severity: Severity,
    pub broker: &'static str,
    pub queue: String,
    pub message: String,
    pub fix: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// The written justification, when the finding is waived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waived: Option<String>,
}

struct Limits {
    min_retention: Duration,
    max_window: Duration,
}

pub fn check(inventory: &Inventory, config: &LintConfig) -> Result<Vec<Finding>> {
    let duration = |text: &str, what: &str| {
        parse_duration(text).ok_or_else(|| Error::Usage(format!("[lint] {what} {text:?} is not a duration such as 4d")))
    };
    let limits = Limits {
        min_retention: duration(&config.min_retention, "min_retention")?,
        max_window: duration(&config.depth_alarm_max_window, "depth_alarm_max_window")?,
    };
    for (id, level) in &config.severity {
        if !RULES.iter().any(|r| r.id == id) || !matches!(level.as_str(), "error" | "warning" | "note" | "off") {
            return Err(Error::Usage(format!(
                "[lint.severity] {id} = {level:?}: expected a rule id DLQ001..DLQ012 set to error, warning, note or off"
            )));
        }
    }
    let index = Index::new(inventory);
    let mut raw = Vec::new();
    for q in &inventory.queues {
        check_queue(q, &index, config, &limits, &mut raw);
    }
    let mut findings = Vec::new();
    for (id, q, message, location) in raw {
        let rule = rule(id);
        let severity = match config.severity.get(id).map(String::as_str) {
            Some("off") => continue,
            Some("error") => Severity::Error,
            Some("warning") => Severity::Warning,
            Some("note") => Severity::Note,
            _ => rule.severity,
        };
        let waived = config
            .waive
            .iter()
            .find(|w| w.rule == id && w.queue == q.name)
            .map(|w| w.justification.clone())
            .or_else(|| q.inline_waivers.iter().find(|(r, _)| r == id).map(|(_, j)| j.clone()));
        findings.push(Finding {
            rule: id,
            severity,
            broker: q.broker,
            queue: q.name.clone(),
            message,
            fix: rule.fix,
            location: location.or_else(|| q.location.clone()),
            waived,
        });
    }
    findings.sort_by(|a, b| (a.broker, &a.queue, a.rule).cmp(&(b.broker, &b.queue, b.rule)));
    Ok(findings)
}

type Raw<'a> = (&'static str, &'a QueueFacts, String, Option<Location>);

/// What checking a queue asks of the whole inventory, looked up once: scanning every alarm
/// (and compiling its pattern) and every queue for each queue made a lint of thousands of
/// queues take minutes.
struct Index<'a> {
    /// Alarms on one queue by name, with their place in the inventory (findings keep its order).
    by_queue: HashMap<&'a str, Vec<(usize, &'a AlarmFacts)>>,
    /// Alarms on the queues a pattern matches, each pattern compiled once (an invalid one
    /// watches nothing).
    patterns: Vec<(usize, regex::Regex, &'a AlarmFacts)>,
    /// (broker, DLQ name) -> the queues that dead-letter into it.
    sources: HashMap<(&'a str, &'a str), Vec<&'a QueueFacts>>,
}

impl<'a> Index<'a> {
    fn new(inventory: &'a Inventory) -> Self {
        let mut index = Index { by_queue: HashMap::new(), patterns: Vec::new(), sources: HashMap::new() };
        for (i, a) in inventory.alarms.iter().enumerate() {
            if !a.pattern {
                index.by_queue.entry(a.queue.as_str()).or_default().push((i, a));
            } else if let Ok(re) = regex::Regex::new(&format!("^(?:{})$", a.queue)) {
                index.patterns.push((i, re, a));
            }
        }
        for q in &inventory.queues {
            if let Some(dlq) = &q.dlq {
                index.sources.entry((q.broker, dlq.as_str())).or_default().push(q);
            }
        }
        index
    }

    /// The alarms of `kind` that watch `queue`, in inventory order.
    fn alarms(&self, queue: &str, kind: AlarmKind) -> Vec<&'a AlarmFacts> {
        let mut found: Vec<(usize, &AlarmFacts)> = self.by_queue.get(queue).cloned().unwrap_or_default();
        found.extend(self.patterns.iter().filter(|(_, re, _)| re.is_match(queue)).map(|(i, _, a)| (*i, *a)));
        found.sort_by_key(|(i, _)| *i);
        found.into_iter().map(|(_, a)| a).filter(|a| a.kind == kind).collect()
    }

    fn sources(&self, broker: &'a str, dlq: &'a str) -> &[&'a QueueFacts] {
        self.sources.get(&(broker, dlq)).map_or(&[], Vec::as_slice)
    }
}

fn check_queue<'a>(q: &'a QueueFacts, inv: &Index<'a>, config: &LintConfig, limits: &Limits, out: &mut Vec<Raw<'a>>) {
    let name = &q.name;
    if q.is_dlq {
        let depth = inv.alarms(name, AlarmKind::Depth);
        if depth.is_empty() {
            out.push(("DLQ001", q, format!("{} DLQ {name} has no alarm on its depth", q.broker), None));
        }
        for a in &depth {
            let lax_threshold = a.threshold.is_some_and(|t| t > config.depth_alarm_max_threshold);
            let lax_window = a.window.is_some_and(|w| w > limits.max_window);
            if lax_threshold || lax_window {
                let mut what = Vec::new();
                if let (true, Some(t)) = (lax_threshold, a.threshold) {
                    what.push(format!("fires only above {t} messages"));
                }
                if let (true, Some(w)) = (lax_window, a.window) {
                    what.push(format!("waits {} before firing", crate::commands::format_age(w)));
                }
                let waived = a.inline_waivers.iter().find(|(r, _)| r == "DLQ003");
                if waived.is_none() {
                    let message = format!("depth alarm {} on {name} {}", a.name, what.join(" and "));
                    out.push(("DLQ003", q, message, a.location.clone()));
                }
            }
        }
        if inv.alarms(name, AlarmKind::Age).is_empty() {
            out.push((
                "DLQ002",
                q,
                format!("{} DLQ {name} has no alarm on the age of its oldest message", q.broker),
                None,
            ));
        }
        if let Some(r) = q.retention.filter(|r| *r < limits.min_retention) {
            out.push((
                "DLQ004",
                q,
                format!(
                    "DLQ {name} keeps messages for {}, less than {}",
                    crate::commands::format_age(r),
                    crate::commands::format_age(limits.min_retention)
                ),
                None,
            ));
        }
        let sources = inv.sources(q.broker, name);
        if sources.len() > 1 {
            let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
            out.push((
                "DLQ007",
                q,
                format!("DLQ {name} takes dead letters from {} sources: {}", names.len(), names.join(", ")),
                None,
            ));
        }
        if q.broker == "sqs" && !q.fifo {
            for s in sources {
                if let (Some(dlq), Some(src)) = (q.retention, s.retention)
                    && dlq <= src
                {
                    out.push((
                        "DLQ005",
                        q,
                        format!(
                            "DLQ {name} keeps messages {} but its source {} keeps them {}: a message that failed \
                             late in the source expires in the DLQ at once",
                            crate::commands::format_age(dlq),
                            s.name,
                            crate::commands::format_age(src)
                        ),
                        None,
                    ));
                }
            }
        }
        if q.cleanup_policy.as_deref().is_some_and(|p| p.contains("compact")) {
            out.push((
                "DLQ012",
                q,
                format!("dead-letter topic {name} is compacted ({})", q.cleanup_policy.as_deref().unwrap_or("")),
                None,
            ));
        }
    }
    if q.needs_dlq && !q.is_dlq && q.dlq.is_none() && q.dead_letters_dropped.is_none() {
        out.push(("DLQ006", q, format!("{} queue {name} has no dead-letter queue", q.broker), None));
    }
    if let Some(n) = q.max_receive_count.filter(|n| *n == 1 || *n > config.max_receive_count) {
        out.push(("DLQ008", q, format!("{name} has maxReceiveCount {n}"), None));
    }
    if let Some(why) = &q.dead_letters_dropped {
        out.push(("DLQ009", q, format!("{name}: {why}"), None));
    }
    if q.quorum && q.delivery_limit.is_none() {
        out.push(("DLQ010", q, format!("quorum queue {name} has no delivery limit"), None));
    }
    if q.quorum && q.dlq.is_some() && q.dead_letter_strategy.as_deref() != Some("at-least-once") {
        out.push((
            "DLQ011",
            q,
            format!(
                "quorum queue {name} dead-letters {}",
                q.dead_letter_strategy.as_deref().unwrap_or("at-most-once (the default)")
            ),
            None,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lint::{AlarmFacts, Waiver};

    fn dlq(broker: &'static str, name: &str) -> QueueFacts {
        QueueFacts {
            broker,
            name: name.into(),
            is_dlq: true,
            retention: Some(Duration::from_secs(14 * 86_400)),
            ..Default::default()
        }
    }

    fn alarm(queue: &str, kind: AlarmKind) -> AlarmFacts {
        AlarmFacts {
            name: format!("{queue}-{kind:?}"),
            queue: queue.into(),
            pattern: false,
            kind,
            threshold: Some(0.0),
            window: Some(Duration::from_secs(300)),
            location: None,
            inline_waivers: Vec::new(),
        }
    }

    fn ids(inventory: &Inventory, config: &LintConfig) -> Vec<(String, String)> {
        check(inventory, config).unwrap().into_iter().map(|f| (f.rule.to_owned(), f.queue)).collect()
    }

    fn watched(queues: Vec<QueueFacts>) -> Inventory {
        let alarms = queues
            .iter()
            .filter(|q| q.is_dlq)
            .flat_map(|q| [alarm(&q.name, AlarmKind::Depth), alarm(&q.name, AlarmKind::Age)])
            .collect();
        Inventory { queues, alarms }
    }

    #[test]
    fn a_well_kept_dlq_is_clean() {
        assert!(ids(&watched(vec![dlq("rabbitmq", "orders.dlq")]), &LintConfig::default()).is_empty());
    }

    #[test]
    fn rabbitmq_rules_fire_and_stay_quiet() {
        let dropped = QueueFacts {
            broker: "rabbitmq",
            name: "lost".into(),
            needs_dlq: true,
            dead_letters_dropped: Some("dead-letters to a missing exchange".into()),
            ..Default::default()
        };
        let quorum = QueueFacts {
            broker: "rabbitmq",
            name: "q".into(),
            quorum: true,
            dlq: Some("orders.dlq".into()),
            ..Default::default()
        };
        let quorum_ok = QueueFacts {
            broker: "rabbitmq",
            name: "q2".into(),
            quorum: true,
            delivery_limit: Some(5),
            dlq: Some("orders.dlq".into()),
            dead_letter_strategy: Some("at-least-once".into()),
            ..Default::default()
        };
        let found =
            ids(&watched(vec![dlq("rabbitmq", "orders.dlq"), dropped, quorum, quorum_ok]), &LintConfig::default());
        assert!(found.contains(&("DLQ009".into(), "lost".into())), "{found:?}");
        assert!(!found.iter().any(|(r, _)| r == "DLQ006"), "a source whose DLX is broken has DLQ009, not DLQ006");
        assert!(found.contains(&("DLQ010".into(), "q".into())) && found.contains(&("DLQ011".into(), "q".into())));
        assert!(!found.iter().any(|(_, q)| q == "q2"), "{found:?}");
    }

    #[test]
    fn kafka_compaction_and_retention() {
        let compacted = QueueFacts { cleanup_policy: Some("compact,delete".into()), ..dlq("kafka", "orders.DLT") };
        let short = QueueFacts { retention: Some(Duration::from_secs(3600)), ..dlq("kafka", "short.DLT") };
        let found = ids(&watched(vec![compacted, short, dlq("kafka", "fine.DLT")]), &LintConfig::default());
        assert_eq!(found, [("DLQ012".into(), "orders.DLT".into()), ("DLQ004".into(), "short.DLT".into())]);
    }

    #[test]
    fn pattern_alarms_cover_the_queues_they_match() {
        let mut inventory =
            Inventory { queues: vec![dlq("kafka", "a.DLT"), dlq("kafka", "b.DLT")], alarms: Vec::new() };
        for kind in [AlarmKind::Depth, AlarmKind::Age] {
            inventory.alarms.push(AlarmFacts { queue: r".*\.DLT".into(), pattern: true, ..alarm("x", kind) });
        }
        assert!(ids(&inventory, &LintConfig::default()).is_empty());
    }

    #[test]
    fn severities_can_be_changed_or_turned_off_and_findings_waived() {
        let inventory = Inventory { queues: vec![dlq("sqs", "d")], alarms: Vec::new() };
        let config = LintConfig {
            severity: [("DLQ001".to_owned(), "note".to_owned()), ("DLQ002".to_owned(), "off".to_owned())].into(),
            waive: vec![Waiver { rule: "DLQ001".into(), queue: "d".into(), justification: "drained by a job".into() }],
            ..LintConfig::default()
        };
        let findings = check(&inventory, &config).unwrap();
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].severity, Severity::Note);
        assert_eq!(findings[0].waived.as_deref(), Some("drained by a job"));
        let bad = LintConfig { severity: [("DLQ999".to_owned(), "error".to_owned())].into(), ..LintConfig::default() };
        assert!(matches!(check(&inventory, &bad), Err(Error::Usage(_))));
    }
}
