//! The selection language of `--where`, shared by redrive, peek, summarize and export.
//!
//! One expression is `FIELD OP VALUE`; several `--where` are ANDed.
//!
//! | field | meaning |
//! |---|---|
//! | `reason` | the reason kind (`rejected`, `max_receive_count`, ...) |
//! | `exception` | exception class, else error code |
//! | `source` | the source queue or topic |
//! | `dlq`, `id` | the DLQ read from, the message id |
//! | `count` | failure/receive count (numeric) |
//! | `age` | time since it last died: `age>2h`, `age<=30m` (units s, m, h, d) |
//! | `header.NAME` | a header/attribute (then a broker extra) rendered as text |
//! | `body.PATH` | a field of a JSON body, dotted: `body.customer.id` |
//!
//! Operators: `=` `!=` (text), `~` `!~` (regex), and `>` `>=` `<` `<=` for `age` and `count`.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use regex::Regex;

use crate::error::{Error, Result};
use crate::model::{DeadLetter, Value};

#[derive(Debug, Clone, Default)]
pub struct Selection {
    predicates: Vec<Predicate>,
}

#[derive(Debug, Clone)]
struct Predicate {
    text: String,
    field: Field,
    test: Test,
}

#[derive(Debug, Clone, PartialEq)]
enum Field {
    Reason,
    Exception,
    Source,
    Dlq,
    Id,
    Count,
    Age,
    Header(String),
    Body(Vec<String>),
}

#[derive(Debug, Clone)]
enum Test {
    Equals(String, bool),
    Matches(Regex, bool),
    Compare(Ordering, f64),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ordering {
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
}

const FORMS: &str = "FIELD=VALUE, FIELD!=VALUE, FIELD~REGEX, FIELD!~REGEX, age>2h, count>=3; \
                     fields: reason, exception, source, dlq, id, count, age, header.NAME, body.PATH";

impl Selection {
    pub fn parse<S: AsRef<str>>(expressions: &[S]) -> Result<Selection> {
        let predicates = expressions.iter().map(|e| Predicate::parse(e.as_ref())).collect::<Result<_>>()?;
        Ok(Selection { predicates })
    }

    pub fn is_everything(&self) -> bool {
        self.predicates.is_empty()
    }

    /// Whether any predicate looks into the body.
    pub fn reads_bodies(&self) -> bool {
        self.predicates.iter().any(|p| matches!(p.field, Field::Body(_)))
    }

    /// Whether any predicate looks at a header (or an extra, such as Kafka's partition).
    pub fn reads_headers(&self) -> bool {
        self.predicates.iter().any(|p| matches!(p.field, Field::Header(_)))
    }

    pub fn matches(&self, letter: &DeadLetter, now: DateTime<Utc>) -> bool {
        if self.predicates.is_empty() {
            return true;
        }
        // Parse a JSON body at most once per letter, and only when a predicate needs it.
        let mut body: Option<Option<serde_json::Value>> = None;
        self.predicates.iter().all(|p| p.matches(letter, now, &mut body))
    }
}

/// The expressions as given, for plans and audit logs.
impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<&str> = self.predicates.iter().map(|p| p.text.as_str()).collect();
        f.write_str(&if texts.is_empty() { "everything".into() } else { texts.join(" AND ") })
    }
}

impl Predicate {
    fn parse(text: &str) -> Result<Predicate> {
        let bad = |why: &str| Error::Usage(format!("--where {text:?}: {why} (expected {FORMS})"));
        let at = text.find(['=', '!', '~', '>', '<']).ok_or_else(|| bad("no operator"))?;
        let (name, rest) = text.split_at(at);
        let name = name.trim();
        let (op, value) = ["!=", "!~", ">=", "<=", "=", "~", ">", "<"]
            .iter()
            .find_map(|op| rest.strip_prefix(op).map(|v| (*op, v.trim())))
            .ok_or_else(|| bad("unknown operator"))?;
        let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
        let field = match name {
            "reason" => Field::Reason,
            "exception" => Field::Exception,
            "source" => Field::Source,
            "dlq" => Field::Dlq,
            "id" => Field::Id,
            "count" => Field::Count,
            "age" => Field::Age,
            _ => match (name.strip_prefix("header."), name.strip_prefix("body.")) {
                (Some(h), _) if !h.is_empty() => Field::Header(h.to_owned()),
                (_, Some(b)) if !b.is_empty() => Field::Body(b.split('.').map(str::to_owned).collect()),
                _ => return Err(bad(&format!("unknown field {name:?}"))),
            },
        };
        let numeric = matches!(field, Field::Age | Field::Count);
        let test = match op {
            "=" | "!=" if field == Field::Age => return Err(bad("age compares with > >= < <=")),
            "=" | "!=" => Test::Equals(value.to_owned(), op == "="),
            "~" | "!~" => Test::Matches(
                Regex::new(value)
                    .map_err(|e| bad(&format!("bad regex: {}", e.to_string().lines().last().unwrap_or(""))))?,
                op == "~",
            ),
            _ if !numeric => return Err(bad(&format!("{op} compares only age and count"))),
            _ => {
                let number = if field == Field::Age {
                    parse_duration(value)
                        .ok_or_else(|| bad("age takes a duration such as 90s, 30m, 2h or 7d"))?
                        .as_secs_f64()
                } else {
                    value.parse::<f64>().map_err(|_| bad("count takes a number"))?
                };
                let ordering = match op {
                    ">" => Ordering::Greater,
                    ">=" => Ordering::GreaterOrEqual,
                    "<" => Ordering::Less,
                    _ => Ordering::LessOrEqual,
                };
                Test::Compare(ordering, number)
            }
        };
        Ok(Predicate { text: text.to_owned(), field, test })
    }

    fn matches(&self, letter: &DeadLetter, now: DateTime<Utc>, body: &mut Option<Option<serde_json::Value>>) -> bool {
        if let Test::Compare(ordering, bound) = self.test {
            let actual = match self.field {
                Field::Age => letter.failed_at().map(|t| (now - t).to_std().unwrap_or(Duration::ZERO).as_secs_f64()),
                _ => letter.failure_count.map(|n| n as f64),
            };
            return actual.is_some_and(|a| match ordering {
                Ordering::Greater => a > bound,
                Ordering::GreaterOrEqual => a >= bound,
                Ordering::Less => a < bound,
                Ordering::LessOrEqual => a <= bound,
            });
        }
        let actual: Option<String> = match &self.field {
            Field::Reason => Some(letter.reason.kind.as_str().to_owned()),
            Field::Exception => letter.reason.failure_class().map(str::to_owned),
            Field::Source => letter.source.name.clone(),
            Field::Dlq => letter.dlq.clone(),
            Field::Id => Some(letter.id.clone()),
            Field::Count => letter.failure_count.map(|n| n.to_string()),
            Field::Age => None,
            Field::Header(name) => letter.headers.get(name).or_else(|| letter.extras.get(name)).map(Value::to_string),
            Field::Body(path) => {
                let json = body.get_or_insert_with(|| serde_json::from_slice(letter.body_bytes()).ok());
                json.as_ref().and_then(|j| lookup(j, path)).map(json_text)
            }
        };
        match (&self.test, actual) {
            (Test::Equals(expected, positive), Some(a)) => (a == *expected) == *positive,
            (Test::Matches(re, positive), Some(a)) => re.is_match(&a) == *positive,
            // A missing field matches only negative tests: `header.x!=1` holds when there is no x.
            (Test::Equals(_, positive) | Test::Matches(_, positive), None) => !positive,
            (Test::Compare(..), _) => unreachable!("handled above"),
        }
    }
}

/// `--reason-from`: an application's own field that names the failure, such as a header
/// its error handler sets or an `error.type` in a JSON body.
#[derive(Debug, Clone)]
pub enum ReasonFrom {
    Header(String),
    Body(Vec<String>),
}

impl ReasonFrom {
    pub fn parse(text: &str) -> Result<ReasonFrom> {
        let header = text.strip_prefix("header:").or_else(|| text.strip_prefix("attr:"));
        if let Some(name) = header.filter(|n| !n.is_empty()) {
            return Ok(ReasonFrom::Header(name.to_owned()));
        }
        if let Some(path) = text.strip_prefix("body.").filter(|p| !p.is_empty()) {
            return Ok(ReasonFrom::Body(path.split('.').map(str::to_owned).collect()));
        }
        Err(Error::Usage(format!("--reason-from {text:?}: expected header:NAME, attr:NAME or body.PATH")))
    }

    pub fn reads_bodies(&self) -> bool {
        matches!(self, ReasonFrom::Body(_))
    }

    pub fn reads_headers(&self) -> bool {
        matches!(self, ReasonFrom::Header(_))
    }

    /// Record the field's value as the exception class; a letter without it is unchanged.
    pub fn apply(&self, letter: &mut DeadLetter) {
        let found = match self {
            ReasonFrom::Header(name) => {
                letter.headers.get(name).or_else(|| letter.extras.get(name)).map(Value::to_string)
            }
            ReasonFrom::Body(path) => serde_json::from_slice::<serde_json::Value>(letter.body_bytes())
                .ok()
                .and_then(|json| lookup(&json, path).map(json_text)),
        };
        if let Some(class) = found {
            letter.reason.exception_class = Some(class);
        }
    }
}

/// A JSON value as text: strings bare, everything else as JSON.
fn json_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn lookup<'a>(json: &'a serde_json::Value, path: &[String]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(json, |node, key| match node {
        serde_json::Value::Object(map) => map.get(key),
        serde_json::Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// `90s`, `30m`, `2h`, `7d`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len()));
    let n: f64 = number.parse().ok()?;
    let seconds = match unit {
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3_600.0,
        "d" => n * 86_400.0,
        _ => return None,
    };
    // try_: a number of hours past u64 seconds must be refused, not panic (found by fuzzing).
    Duration::try_from_secs_f64(seconds).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Headers, Reason, ReasonKind, Source};

    fn letter() -> DeadLetter {
        DeadLetter {
            id: "m-1".into(),
            source: Source { name: Some("orders".into()), ..Source::default() },
            reason: Reason {
                exception_class: Some("java.lang.IllegalStateException".into()),
                ..Reason::new(ReasonKind::Exception)
            },
            failure_count: Some(3),
            last_failed_at: Some(now() - chrono::Duration::hours(3)),
            headers: Headers::new().with("tenant", "acme").with("attempt", 2i64),
            extras: Headers::new().with("ApproximateReceiveCount", "4"),
            body: Some(br#"{"type":"refund.requested","customer":{"id":42},"items":[{"sku":"A"}]}"#.to_vec()),
            ..DeadLetter::default()
        }
    }

    fn now() -> DateTime<Utc> {
        crate::model::parse_time("2026-11-30T12:00:00Z").unwrap()
    }

    fn holds(exprs: &[&str]) -> bool {
        Selection::parse(exprs).unwrap().matches(&letter(), now())
    }

    #[test]
    fn fields_and_operators() {
        assert!(holds(&["reason=exception", "source=orders", "id=m-1"]));
        assert!(!holds(&["reason=rejected"]));
        assert!(holds(&["reason!=rejected"]));
        assert!(holds(&["exception~IllegalState"]));
        assert!(holds(&["header.tenant=acme", "header.attempt=2"]));
        assert!(holds(&["header.ApproximateReceiveCount=4"]), "extras are searched after headers");
        assert!(holds(&["header.missing!=x"]));
        assert!(!holds(&["header.missing=x"]));
        assert!(holds(&["body.customer.id=42", "body.type~^refund", "body.items.0.sku=A"]));
        assert!(!holds(&["body.customer.id=43"]));
        assert!(holds(&["count>=3", "count<4"]));
        assert!(holds(&["age>2h", "age<1d"]));
        assert!(!holds(&["age>4h"]));
        assert!(holds(&[r#"source="orders""#]), "quoted values");
    }

    #[test]
    fn everything_matches_an_empty_selection() {
        let s = Selection::parse::<&str>(&[]).unwrap();
        assert!(s.is_everything() && s.matches(&letter(), now()));
        assert_eq!(s.to_string(), "everything");
        let two = Selection::parse(&["reason=exception", "source=orders"]).unwrap();
        assert_eq!(two.to_string(), "reason=exception AND source=orders");
    }

    #[test]
    fn bad_expressions_are_usage_errors_that_name_them() {
        for (expr, why) in [
            ("reason", "no operator"),
            ("colour=red", "unknown field"),
            ("source>3", "compares only age and count"),
            ("age=2h", "age compares with"),
            ("age>2y", "duration"),
            ("body.x~(", "bad regex"),
            ("header.=x", "unknown field"),
        ] {
            let err = Selection::parse(&[expr]).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, Error::Usage(_)), "{expr}");
            assert!(msg.contains(expr) && msg.contains(why), "{expr}: {msg}");
        }
    }

    #[test]
    fn only_body_fields_read_bodies_and_only_header_fields_headers() {
        let body = Selection::parse(&["reason=expired", "body.customer.id=42"]).unwrap();
        assert!(body.reads_bodies() && !body.reads_headers());
        let header = Selection::parse(&["reason=expired", "header.body=x", "age>2h"]).unwrap();
        assert!(!header.reads_bodies() && header.reads_headers());
        let neither = Selection::parse(&["exception~Timeout", "source=orders", "dlq=x", "id=1", "count>1"]).unwrap();
        assert!(!neither.reads_bodies() && !neither.reads_headers());
        let from_body = ReasonFrom::parse("body.error.type").unwrap();
        assert!(from_body.reads_bodies() && !from_body.reads_headers());
        let from_header = ReasonFrom::parse("header:x-error").unwrap();
        assert!(!from_header.reads_bodies() && from_header.reads_headers());
        assert!(ReasonFrom::parse("attr:x-error").unwrap().reads_headers());
    }

    #[test]
    fn reason_from_a_header_or_a_body_field() {
        let mut l = letter();
        ReasonFrom::parse("header:tenant").unwrap().apply(&mut l);
        assert_eq!(l.reason.exception_class.as_deref(), Some("acme"));
        ReasonFrom::parse("body.type").unwrap().apply(&mut l);
        assert_eq!(l.reason.exception_class.as_deref(), Some("refund.requested"));
        ReasonFrom::parse("attr:missing").unwrap().apply(&mut l);
        assert_eq!(l.reason.exception_class.as_deref(), Some("refund.requested"), "unchanged");
        assert!(ReasonFrom::parse("tenant").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(604_800)));
        assert_eq!(parse_duration("x"), None);
        assert_eq!(parse_duration("88888888888888888888888888882h"), None, "too long for a Duration");
        assert_eq!(parse_duration("-5m"), None);
    }
}
