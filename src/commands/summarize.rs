//! `dlqctl summarize`: how many dead letters, why, from where, since when. Streams the
//! DLQ once and keeps only one small record per group, whatever the DLQ's size.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use serde_json::{Map, Value as Json, json};

use super::Context;
use crate::cli::{GroupBy, SummarizeArgs};
use crate::error::Result;
use crate::model::{DeadLetter, format_time};

/// Age buckets, upper bounds in seconds; the last one is open-ended.
const AGE_BUCKETS: [(&str, u64); 6] = [
    ("<1h", 3_600),
    ("1h-6h", 6 * 3_600),
    ("6h-24h", 24 * 3_600),
    ("1d-3d", 3 * 86_400),
    ("3d-7d", 7 * 86_400),
    (">7d", u64::MAX),
];
const NO_TIME: &str = "unknown";
const NONE: &str = "(none)";

#[derive(Debug)]
struct Group {
    count: u64,
    first_seen: Option<DateTime<Utc>>,
    last_seen: Option<DateTime<Utc>>,
    example_id: String,
}

impl GroupBy {
    fn name(self) -> &'static str {
        match self {
            GroupBy::Reason => "reason",
            GroupBy::Source => "source",
            GroupBy::Exception => "exception",
            GroupBy::Age => "age",
            GroupBy::Exchange => "exchange",
            GroupBy::RoutingKey => "routing_key",
        }
    }

    fn key(self, letter: &DeadLetter, now: DateTime<Utc>) -> Cow<'_, str> {
        let key = match self {
            GroupBy::Reason => letter.reason.kind.as_str(),
            GroupBy::Source => letter.source.name.as_deref().unwrap_or(NONE),
            GroupBy::Exception => letter.reason.failure_class().unwrap_or(NONE),
            GroupBy::Age => match letter.failed_at() {
                None => NO_TIME,
                Some(t) => {
                    let age = (now - t).to_std().unwrap_or(Duration::ZERO).as_secs();
                    AGE_BUCKETS.iter().find(|(_, max)| age < *max).expect("open-ended last bucket").0
                }
            },
            GroupBy::Exchange => match letter.source.exchange.as_deref() {
                Some("") => "(default exchange)",
                Some(x) => x,
                None => NONE,
            },
            GroupBy::RoutingKey if letter.source.routing_keys.is_empty() => NONE,
            GroupBy::RoutingKey => return letter.source.routing_keys.join(",").into(),
        };
        key.into()
    }
}

pub async fn run(ctx: &mut Context, args: &SummarizeArgs) -> Result<()> {
    let (target, broker) = ctx.open_for_summary(&args.read).await?;
    let now = Utc::now();
    let mut groups: HashMap<String, Group> = HashMap::new();
    let mut total = 0u64;
    let redactor = ctx.config_redactor();
    let mut letters = ctx.letters(broker.as_ref(), &args.read, None).await?;
    while let Some(mut letter) = letters.try_next().await? {
        // After --where and --reason-from: a group key taken from a redacted header is redacted.
        redactor.apply(&mut letter);
        total += 1;
        let key = args.by.key(&letter, now);
        let seen = letter.failed_at();
        match groups.get_mut(key.as_ref()) {
            Some(g) => {
                g.count += 1;
                g.first_seen = min_time(g.first_seen, seen);
                g.last_seen = g.last_seen.max(seen);
            }
            None => {
                groups.insert(
                    key.into_owned(),
                    Group { count: 1, first_seen: seen, last_seen: seen, example_id: letter.id },
                );
            }
        }
    }
    drop(letters);
    broker.end_read().await?;

    let mut rows: Vec<(String, Group)> = groups.into_iter().collect();
    match args.by {
        GroupBy::Age => rows.sort_by_key(|(k, _)| AGE_BUCKETS.iter().position(|(b, _)| b == k).unwrap_or(usize::MAX)),
        _ => rows.sort_by(|(ka, a), (kb, b)| b.count.cmp(&a.count).then_with(|| ka.cmp(kb))),
    }
    let share = |count: u64| {
        if total == 0 { 0.0 } else { count as f64 / total as f64 }
    };
    let field = args.by.name();

    if ctx.out.is_json() {
        let groups: Vec<Json> = rows
            .iter()
            .map(|(key, g)| {
                let mut obj = Map::new();
                obj.insert(field.into(), key.as_str().into());
                obj.insert("count".into(), g.count.into());
                obj.insert("share".into(), json!((share(g.count) * 10_000.0).round() / 10_000.0));
                obj.insert("first_seen".into(), g.first_seen.as_ref().map(format_time).into());
                obj.insert("last_seen".into(), g.last_seen.as_ref().map(format_time).into());
                obj.insert("example_id".into(), g.example_id.as_str().into());
                Json::Object(obj)
            })
            .collect();
        let report = json!({ "target": target.to_string(), "by": field, "total": total, "groups": groups });
        ctx.out.json_line(&report)?;
    } else {
        let mut table = ctx.out.table(&[field, "count", "share", "first seen", "last seen", "example id"]);
        let time =
            |t: &Option<DateTime<Utc>>| t.as_ref().map_or("-".into(), |t| t.format("%Y-%m-%d %H:%M").to_string());
        for (key, g) in &rows {
            table.add_row(vec![
                key.clone(),
                g.count.to_string(),
                format!("{:.1}%", share(g.count) * 100.0),
                time(&g.first_seen),
                time(&g.last_seen),
                g.example_id.clone(),
            ]);
        }
        table.add_row(vec!["total".to_string(), total.to_string(), if total > 0 { "100.0%" } else { "-" }.into()]);
        ctx.out.print_table(&mut table)?;
    }
    ctx.report_read_notes(broker.as_ref());
    Ok(())
}

fn min_time(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
