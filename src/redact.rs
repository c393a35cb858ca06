//! Redaction: replace the values of named header/attribute fields and JSON body fields
//! before anything is written, by every verb that shows or writes messages.
//!
//! Syntax (shared by `--redact` and the config file's `[redact] fields`):
//! `header.NAME` a header, attribute or extra named NAME, at any depth;
//! `body.a.b` the field `a.b` of a JSON body; a bare `NAME` means both.

use crate::model::{DeadLetter, Headers, Value};

pub const REDACTED: &str = "[REDACTED]";

#[derive(Debug, Clone, Default)]
pub struct Redactor {
    header_names: Vec<String>,
    body_paths: Vec<Vec<String>>,
}

impl Redactor {
    pub fn new<S: AsRef<str>>(fields: impl IntoIterator<Item = S>) -> Self {
        let mut r = Redactor::default();
        for field in fields {
            let field = field.as_ref();
            if let Some(name) = field.strip_prefix("header.") {
                r.header_names.push(name.to_ascii_lowercase());
            } else if let Some(path) = field.strip_prefix("body.") {
                r.body_paths.push(path.split('.').map(str::to_owned).collect());
            } else {
                r.header_names.push(field.to_ascii_lowercase());
                r.body_paths.push(field.split('.').map(str::to_owned).collect());
            }
        }
        r
    }

    pub fn is_empty(&self) -> bool {
        self.header_names.is_empty() && self.body_paths.is_empty()
    }

    pub fn apply(&self, letter: &mut DeadLetter) {
        if self.is_empty() {
            return;
        }
        self.redact_headers(&mut letter.headers);
        self.redact_headers(&mut letter.extras);
        if !self.body_paths.is_empty()
            && let Some(body) = &mut letter.body
        {
            self.redact_body(body);
        }
    }

    fn redact_headers(&self, headers: &mut Headers) {
        for (name, value) in headers.iter_mut() {
            // Header names are case-insensitive in practice (HTTP-style producers vary).
            if self.header_names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
                *value = Value::String(REDACTED.into());
            } else {
                self.redact_value(value);
            }
        }
    }

    fn redact_value(&self, value: &mut Value) {
        match value {
            Value::Table(t) => self.redact_headers(t),
            Value::List(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            _ => {}
        }
    }

    /// Only a JSON body has fields; any other body passes through untouched.
    fn redact_body(&self, body: &mut Vec<u8>) {
        let Ok(mut json) = serde_json::from_slice::<serde_json::Value>(body) else {
            return;
        };
        let mut changed = false;
        for path in &self.body_paths {
            changed |= redact_path(&mut json, path);
        }
        if changed {
            *body = serde_json::to_vec(&json).expect("a JSON value always serializes");
        }
    }
}

fn redact_path(json: &mut serde_json::Value, path: &[String]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    match json {
        serde_json::Value::Object(map) => match map.get_mut(first.as_str()) {
            Some(slot) if rest.is_empty() => {
                *slot = serde_json::Value::String(REDACTED.into());
                true
            }
            Some(child) => redact_path(child, rest),
            None => false,
        },
        // A path through an array applies to each element: `items.card` hides every card.
        serde_json::Value::Array(items) => items.iter_mut().fold(false, |acc, item| redact_path(item, path) | acc),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(body: &str) -> DeadLetter {
        DeadLetter {
            id: "1".into(),
            headers: Headers::new()
                .with("Authorization", "Bearer abc")
                .with("x-death", vec![Value::Table(Headers::new().with("authorization", "nested"))])
                .with("trace", "keep"),
            body: Some(body.as_bytes().to_vec()),
            ..DeadLetter::default()
        }
    }

    #[test]
    fn headers_are_redacted_at_any_depth_case_insensitively() {
        let mut l = letter("{}");
        Redactor::new(["header.authorization"]).apply(&mut l);
        let mut json = Vec::new();
        l.headers.write_json(&mut json);
        let json = String::from_utf8(json).unwrap();
        assert!(!json.contains("Bearer") && !json.contains("nested"), "{json}");
        assert!(json.contains("keep"));
    }

    #[test]
    fn body_paths_are_redacted_and_key_order_kept() {
        let mut l = letter(r#"{"z":1,"card":{"number":"4111","exp":"12/30"},"items":[{"pan":"1"},{"pan":"2"}]}"#);
        Redactor::new(["body.card.number", "body.items.pan"]).apply(&mut l);
        assert_eq!(
            std::str::from_utf8(l.body_bytes()).unwrap(),
            r#"{"z":1,"card":{"number":"[REDACTED]","exp":"12/30"},"items":[{"pan":"[REDACTED]"},{"pan":"[REDACTED]"}]}"#
        );
    }

    #[test]
    fn bare_names_cover_headers_and_body() {
        let mut l = letter(r#"{"trace":"secret-body"}"#);
        Redactor::new(["trace"]).apply(&mut l);
        assert_eq!(l.headers.get("trace"), Some(&Value::String(REDACTED.into())));
        assert!(!String::from_utf8_lossy(l.body_bytes()).contains("secret-body"));
    }

    #[test]
    fn non_json_bodies_and_missing_paths_are_left_alone() {
        let mut l = letter("plain text card.number");
        Redactor::new(["body.card.number"]).apply(&mut l);
        assert_eq!(l.body_bytes(), b"plain text card.number");
        let mut l = letter(r#"{ "a": 1 }"#);
        Redactor::new(["body.b"]).apply(&mut l);
        assert_eq!(l.body_bytes(), br#"{ "a": 1 }"#, "untouched bodies keep their formatting");
    }
}
