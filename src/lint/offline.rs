//! Offline inputs, for CI on infrastructure code: CloudFormation templates (YAML with
//! short-form intrinsics, or JSON), Prometheus rule files, and dlqctl alert files.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;
use serde_norway::Value;

use super::{AlarmFacts, AlarmKind, DLQ_NAME, Inventory, Location, QueueFacts};
use crate::error::{Error, Result};
use crate::redrive::select::parse_duration;

/// SQS keeps messages four days unless told otherwise.
const SQS_DEFAULT_RETENTION: Duration = Duration::from_secs(4 * 86_400);

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(format!("cannot read {}", path.display()), e))
}

/// How deeply a template or rule file may nest: real ones nest a dozen levels; the YAML
/// parser took seconds on a few hundred levels before it gave up.
const MAX_NESTING: usize = 128;

/// Refuse absurd nesting at once, before any parser sees it: brackets of JSON and YAML flow
/// style (outside quotes), and block indentation.
fn check_nesting(path: &Path, text: &str) -> Result<()> {
    let (mut depth, mut deepest, mut quote) = (0usize, 0usize, None::<u8>);
    let mut escaped = false;
    for &b in text.as_bytes() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if b == b'\\' && q == b'"' {
                    escaped = true;
                } else if b == q || b == b'\n' {
                    quote = None;
                }
            }
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    let indented = text.lines().map(|l| (l.len() - l.trim_start().len()) / 2).max().unwrap_or(0);
    if deepest.max(indented) > MAX_NESTING {
        return Err(Error::Usage(format!(
            "{}: nested more than {MAX_NESTING} levels deep: not a template or rule file dlqctl reads",
            path.display()
        )));
    }
    Ok(())
}

/// The lines of a file, held once, and where mapping keys are first defined, found in one
/// pass: a template of thousands of resources was searched once per resource before.
struct Lines<'a> {
    lines: Vec<&'a str>,
    first_key: HashMap<String, usize>,
    /// The waiver each line holds, read once (a one-line JSON template would otherwise be
    /// searched whole for each of its resources).
    waivers: Vec<Option<(String, String)>>,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        let key = Regex::new(r#"^\s*(?:-\s*)?["']?([^"'\s:#][^"':]*?)["']?\s*:"#).expect("valid");
        let lines: Vec<&str> = text.lines().collect();
        let mut first_key = HashMap::new();
        for (i, l) in lines.iter().enumerate() {
            if let Some(c) = key.captures(l) {
                first_key.entry(c[1].to_owned()).or_insert(i + 1);
            }
        }
        let waiver = Regex::new(r"dlqctl:\s*waive\s+(DLQ\d{3})\s+(.+)$").expect("valid");
        let waivers =
            lines.iter().map(|l| waiver.captures(l).map(|c| (c[1].to_owned(), c[2].trim().to_owned()))).collect();
        Lines { lines, first_key, waivers }
    }

    /// The 1-based line where `key` is first defined as a mapping key (YAML or JSON).
    fn of_key(&self, key: &str) -> Option<usize> {
        self.first_key.get(key).copied()
    }

    /// Where each `key: value` (YAML) or `key = value` (TOML) first stands, by value.
    fn values_of(&self, key: &str) -> HashMap<&'a str, usize> {
        let pattern = format!(r#"^\s*(?:-\s*)?{}\s*[:=]\s*["']?(.*?)["']?\s*$"#, regex::escape(key));
        let re = Regex::new(&pattern).expect("valid");
        let mut found = HashMap::new();
        for (i, l) in self.lines.iter().enumerate() {
            if let Some(value) = re.captures(l).and_then(|c| c.get(1)) {
                found.entry(value.as_str()).or_insert(i + 1);
            }
        }
        found
    }

    /// One past the last line.
    fn end(&self) -> usize {
        self.lines.len() + 1
    }

    /// `# dlqctl: waive DLQ001 reason` comments between lines `from` (1-based) and `to`.
    fn waivers(&self, from: usize, to: usize) -> Vec<(String, String)> {
        let start = from.saturating_sub(1).min(self.lines.len());
        let end = (start + to.saturating_sub(from).max(1)).min(self.lines.len());
        self.waivers[start..end].iter().flatten().cloned().collect()
    }
}

fn yaml(path: &Path, text: &str) -> Result<Value> {
    check_nesting(path, text)?;
    serde_norway::from_str(text).map_err(|e| {
        let at = e.location().map(|l| format!(":{}", l.line())).unwrap_or_default();
        Error::Usage(format!("{}{at}: not valid YAML or JSON: {e}", path.display()))
    })
}

/// A scalar as text (strings, numbers, booleans).
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn number(v: Option<&Value>) -> Option<f64> {
    v.and_then(scalar).and_then(|s| s.parse().ok())
}

/// The logical id an intrinsic points at: `!GetAtt X.Arn`, `!Ref X`, `{"Fn::GetAtt": ["X", "Arn"]}`,
/// `{"Ref": "X"}`; a plain string (a name or ARN) is returned as its last `:` part.
fn reference(v: &Value) -> Option<String> {
    match v {
        Value::Tagged(t) => match (t.tag.to_string().as_str(), &t.value) {
            ("!GetAtt", Value::String(s)) => s.split('.').next().map(str::to_owned),
            ("!GetAtt", Value::Sequence(parts)) => parts.first().and_then(scalar),
            ("!Ref", Value::String(s)) => Some(s.clone()),
            _ => None,
        },
        Value::Mapping(m) => {
            if let Some(Value::Sequence(parts)) = m.get("Fn::GetAtt") {
                return parts.first().and_then(scalar);
            }
            if let Some(Value::String(s)) = m.get("Fn::GetAtt") {
                return s.split('.').next().map(str::to_owned);
            }
            m.get("Ref").and_then(scalar)
        }
        Value::String(s) => s.rsplit(':').next().map(str::to_owned),
        _ => None,
    }
}

/// SQS queues and CloudWatch alarms declared in a CloudFormation template.
pub fn cloudformation(path: &Path) -> Result<Inventory> {
    cloudformation_text(path, &read(path)?)
}

/// The same, for a CloudFormation template already read; `path` only names it in messages.
pub fn cloudformation_text(path: &Path, text: &str) -> Result<Inventory> {
    let doc = yaml(path, text)?;
    let Some(Value::Mapping(resources)) = doc.get("Resources") else {
        return Err(Error::Usage(format!(
            "{}: no Resources section: is this a CloudFormation template?",
            path.display()
        )));
    };
    let dlq_name = Regex::new(DLQ_NAME).expect("valid");
    let lines = Lines::new(text);
    // Where each resource starts, so inline waivers belong to the resource they sit in.
    let mut starts: Vec<(String, usize)> = resources
        .keys()
        .filter_map(scalar)
        .map(|id| {
            let line = lines.of_key(&id).unwrap_or(1);
            (id, line)
        })
        .collect();
    starts.sort_by_key(|(_, l)| *l);
    let position: HashMap<&str, usize> = starts.iter().enumerate().map(|(i, (id, _))| (id.as_str(), i)).collect();
    let block = |id: &str| {
        let i = position.get(id).copied().unwrap_or(0);
        let from = starts.get(i).map_or(1, |(_, l)| *l);
        let to = starts.get(i + 1).map_or(lines.end(), |(_, l)| *l);
        (from, to)
    };
    let waivers_of = |id: &str, res: &Value| {
        let (from, to) = block(id);
        let mut w = lines.waivers(from, to);
        if let Some(Value::Mapping(m)) = res.get("Metadata").and_then(|m| m.get("dlqctl")).and_then(|d| d.get("waive"))
        {
            w.extend(m.iter().filter_map(|(k, v)| Some((scalar(k)?, scalar(v)?))));
        }
        w
    };
    let location = |id: &str| Some(Location { file: path.to_path_buf(), line: block(id).0 });
    // Logical id -> queue name.
    let mut names = std::collections::BTreeMap::new();
    for (id, res) in resources {
        let (Some(id), Some("AWS::SQS::Queue")) = (scalar(id), res.get("Type").and_then(Value::as_str)) else {
            continue;
        };
        let props = res.get("Properties");
        let name = props.and_then(|p| p.get("QueueName")).and_then(scalar).unwrap_or_else(|| id.clone());
        names.insert(id, name);
    }
    let name_of = |reference_id: String| names.get(&reference_id).cloned().unwrap_or(reference_id);
    let mut inventory = Inventory::default();
    for (id, res) in resources {
        let Some(id) = scalar(id) else { continue };
        let props = res.get("Properties");
        let prop = |k: &str| props.and_then(|p| p.get(k));
        match res.get("Type").and_then(Value::as_str) {
            Some("AWS::SQS::Queue") => {
                let redrive = prop("RedrivePolicy");
                inventory.queues.push(QueueFacts {
                    broker: "sqs",
                    name: names[&id].clone(),
                    dlq: redrive.and_then(|r| r.get("deadLetterTargetArn")).and_then(reference).map(name_of),
                    retention: Some(
                        number(prop("MessageRetentionPeriod"))
                            .map_or(SQS_DEFAULT_RETENTION, |s| Duration::from_secs(s as u64)),
                    ),
                    max_receive_count: number(redrive.and_then(|r| r.get("maxReceiveCount"))).map(|n| n as u64),
                    fifo: prop("FifoQueue").and_then(scalar).is_some_and(|f| f == "true"),
                    location: location(&id),
                    inline_waivers: waivers_of(&id, res),
                    ..QueueFacts::default()
                });
            }
            Some("AWS::CloudWatch::Alarm") => {
                let metric = prop("MetricName").and_then(scalar).unwrap_or_default();
                let kind = match metric.as_str() {
                    "ApproximateNumberOfMessagesVisible" | "ApproximateNumberOfMessages" => AlarmKind::Depth,
                    "ApproximateAgeOfOldestMessage" => AlarmKind::Age,
                    _ => continue,
                };
                let Some(Value::Sequence(dimensions)) = prop("Dimensions") else { continue };
                let Some(queue) = dimensions
                    .iter()
                    .find(|d| d.get("Name").and_then(Value::as_str) == Some("QueueName"))
                    .and_then(|d| d.get("Value"))
                    .and_then(reference)
                else {
                    continue;
                };
                let threshold = number(prop("Threshold")).map(|t| {
                    // `>= 1` is `> 0`: compare every alarm as "fires above".
                    let inclusive = prop("ComparisonOperator").and_then(scalar).is_some_and(|c| c.contains("OrEqual"));
                    if inclusive { t - 1.0 } else { t }
                });
                let window = match (number(prop("Period")), number(prop("EvaluationPeriods"))) {
                    (Some(p), Some(n)) => Some(Duration::from_secs((p * n) as u64)),
                    (Some(p), None) => Some(Duration::from_secs(p as u64)),
                    _ => None,
                };
                inventory.alarms.push(AlarmFacts {
                    name: prop("AlarmName").and_then(scalar).unwrap_or_else(|| id.clone()),
                    queue: name_of(queue),
                    pattern: false,
                    kind,
                    threshold,
                    window,
                    location: location(&id),
                    inline_waivers: waivers_of(&id, res),
                });
            }
            _ => {}
        }
    }
    let targets: std::collections::BTreeSet<String> = inventory.queues.iter().filter_map(|q| q.dlq.clone()).collect();
    for q in &mut inventory.queues {
        q.is_dlq = targets.contains(&q.name) || dlq_name.is_match(&q.name);
        q.needs_dlq = !q.is_dlq;
    }
    Ok(inventory)
}

#[derive(Deserialize)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Deserialize)]
struct RuleGroup {
    #[serde(default)]
    rules: Vec<PromRule>,
}

#[derive(Deserialize)]
struct PromRule {
    #[serde(default)]
    alert: Option<String>,
    #[serde(default)]
    expr: Option<Value>,
    #[serde(default, rename = "for")]
    for_: Option<String>,
}

/// Alerting rules of a Prometheus rule file that watch a DLQ by label (`queue`, `queue_name`,
/// `topic`, `dlq`): depth unless the metric is about age.
pub fn prometheus(path: &Path) -> Result<Inventory> {
    prometheus_text(path, &read(path)?)
}

/// The same, for a Prometheus rule file already read; `path` only names it in messages.
pub fn prometheus_text(path: &Path, text: &str) -> Result<Inventory> {
    check_nesting(path, text)?;
    let file: RuleFile = serde_norway::from_str(text).map_err(|e| {
        let at = e.location().map(|l| format!(":{}", l.line())).unwrap_or_default();
        Error::Usage(format!("{}{at}: not a Prometheus rule file: {e}", path.display()))
    })?;
    let label =
        Regex::new(r#"\b(?:queue|queue_name|topic|dlq|dead_letter_queue)\s*(=~|=)\s*"([^"]*)""#).expect("valid");
    let compare = Regex::new(r"(>=|>)\s*([0-9.]+)\s*\)?\s*$").expect("valid");
    // "age" as a word of the metric's name, not inside "messages".
    let age = Regex::new(r"(?i)(oldest|(^|[^a-z])age([^a-z]|$))").expect("valid");
    let alert_lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| {
            l.trim_start().trim_start_matches("- ").starts_with("alert:")
                || l.trim_start().trim_start_matches("- ").starts_with("record:")
        })
        .map(|(i, _)| i + 1)
        .collect();
    let lines = Lines::new(text);
    let alert_at = lines.values_of("alert");
    let mut inventory = Inventory::default();
    for rule in file.groups.iter().flat_map(|g| &g.rules) {
        let (Some(name), Some(expr)) = (&rule.alert, rule.expr.as_ref().and_then(scalar)) else { continue };
        let Some(labels) = label.captures(&expr) else { continue };
        let line = alert_at.get(name.as_str()).copied().unwrap_or(1);
        let next = alert_lines.get(alert_lines.partition_point(|l| *l <= line)).copied().unwrap_or(lines.end());
        let threshold = compare.captures(expr.trim()).and_then(|c| {
            let n: f64 = c[2].parse().ok()?;
            Some(if &c[1] == ">=" { n - 1.0 } else { n })
        });
        inventory.alarms.push(AlarmFacts {
            name: name.clone(),
            queue: labels[2].to_owned(),
            pattern: &labels[1] == "=~",
            kind: if age.is_match(&expr) { AlarmKind::Age } else { AlarmKind::Depth },
            threshold,
            window: Some(rule.for_.as_deref().and_then(parse_duration).unwrap_or(Duration::ZERO)),
            location: Some(Location { file: path.to_path_buf(), line }),
            inline_waivers: lines.waivers(line, next),
        });
    }
    Ok(inventory)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertFile {
    alert: Vec<AlertEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertEntry {
    name: String,
    #[serde(default)]
    queue: Option<String>,
    /// A regular expression over queue names, instead of `queue`.
    #[serde(default)]
    pattern: Option<String>,
    kind: String,
    #[serde(default)]
    threshold: Option<f64>,
    #[serde(default)]
    window: Option<String>,
    /// `{ DLQ003 = "why" }`
    #[serde(default)]
    waive: std::collections::BTreeMap<String, String>,
}

/// dlqctl's own alert file, for teams that alert elsewhere (TOML):
///
/// ```toml
/// [[alert]]
/// name = "orders dead letters"
/// queue = "orders.dlq"        # or pattern = "orders\\..*"
/// kind = "depth"              # depth | age
/// threshold = 0               # fires above this
/// window = "5m"               # after this long
/// ```
pub fn alert_file(path: &Path) -> Result<Inventory> {
    alert_file_text(path, &read(path)?)
}

/// The same, for a dlqctl alert file already read; `path` only names it in messages.
pub fn alert_file_text(path: &Path, text: &str) -> Result<Inventory> {
    let file: AlertFile = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| format!(":{}", text[..s.start].matches('\n').count() + 1)).unwrap_or_default();
        Error::Usage(format!("{}{line}: {}", path.display(), e.message().lines().next().unwrap_or_default()))
    })?;
    let lines = Lines::new(text);
    let name_at = lines.values_of("name");
    let mut inventory = Inventory::default();
    for a in file.alert {
        let (queue, pattern) = match (a.queue, a.pattern) {
            (Some(q), None) => (q, false),
            (None, Some(p)) => (p, true),
            _ => {
                return Err(Error::Usage(format!(
                    "{}: alert {:?} needs exactly one of queue and pattern",
                    path.display(),
                    a.name
                )));
            }
        };
        let kind = match a.kind.as_str() {
            "depth" => AlarmKind::Depth,
            "age" => AlarmKind::Age,
            other => {
                return Err(Error::Usage(format!(
                    "{}: alert {:?} has kind {other:?}: use depth or age",
                    path.display(),
                    a.name
                )));
            }
        };
        let window = a
            .window
            .map(|w| {
                parse_duration(&w)
                    .ok_or_else(|| Error::Usage(format!("{}: window {w:?} is not a duration", path.display())))
            })
            .transpose()?;
        let line = name_at.get(a.name.as_str()).copied().unwrap_or(1);
        inventory.alarms.push(AlarmFacts {
            name: a.name,
            queue,
            pattern,
            kind,
            threshold: a.threshold,
            window,
            location: Some(Location { file: path.to_path_buf(), line }),
            inline_waivers: a.waive.into_iter().collect(),
        });
    }
    Ok(inventory)
}
