//! Redaction: replace the values of named header/attribute fields and JSON body fields
//! before anything is written, by every verb that shows or writes messages.
//!
//! Syntax (shared by `--redact` and the config file's `[redact] fields`):
//! `header.NAME` a header, attribute or extra named NAME, at any depth;
//! `body.a.b` the field `a.b` of a JSON body; a bare `NAME` means both.

mod json;

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
                r.header_names.push(name.to_lowercase());
            } else if let Some(path) = field.strip_prefix("body.") {
                r.body_paths.push(path.split('.').map(str::to_owned).collect());
            } else {
                r.header_names.push(field.to_lowercase());
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
        let mut hidden = Vec::new();
        self.redact_headers(&mut letter.headers, &mut hidden);
        self.redact_headers(&mut letter.extras, &mut hidden);
        // A failure message often repeats what it failed on: a redacted header's value goes from
        // it too.
        let reason = &mut letter.reason;
        let texts = [
            &mut reason.message,
            &mut reason.raw,
            &mut reason.exception_class,
            &mut reason.cause_class,
            &mut reason.code,
        ];
        for text in texts.into_iter().flatten() {
            for secret in &hidden {
                // The whole text, whatever its length (a value --reason-from took as the
                // exception); inside a longer text, values of four characters or more (a
                // shorter one would match by chance).
                if text == secret {
                    *text = REDACTED.into();
                } else if secret.chars().count() >= 4 && text.contains(secret.as_str()) {
                    *text = text.replace(secret.as_str(), REDACTED);
                }
            }
        }
        if !self.body_paths.is_empty()
            && let Some(body) = &mut letter.body
        {
            self.redact_body(body);
        }
    }

    /// Redact matching headers at any depth, keeping in `hidden` the text they held, to take
    /// out of the failure reason too.
    fn redact_headers(&self, headers: &mut Headers, hidden: &mut Vec<String>) {
        for (name, value) in headers.iter_mut() {
            // Header names are case-insensitive in practice (HTTP-style producers vary).
            let name = name.to_lowercase();
            if self.header_names.contains(&name) {
                let text = match value {
                    Value::String(s) => Some(s.clone()),
                    Value::Bytes(b) => std::str::from_utf8(b).ok().map(str::to_owned),
                    _ => None,
                };
                hidden.extend(text.filter(|t| !t.is_empty()));
                *value = Value::String(REDACTED.into());
            } else {
                self.redact_value(value, hidden);
            }
        }
    }

    fn redact_value(&self, value: &mut Value, hidden: &mut Vec<String>) {
        match value {
            Value::Table(t) => self.redact_headers(t, hidden),
            Value::List(items) => items.iter_mut().for_each(|v| self.redact_value(v, hidden)),
            _ => {}
        }
    }

    /// Only a JSON body has fields: the values at the paths are replaced where they stand, and
    /// every other byte is kept. A body that opens like JSON but cannot be read as JSON could
    /// hold a field anywhere, so it is withheld whole; any other body passes through untouched.
    fn redact_body(&self, body: &mut Vec<u8>) {
        match json::value_spans(body, &self.body_paths) {
            Some(spans) if spans.is_empty() => {}
            Some(spans) => {
                let mut out = Vec::with_capacity(body.len());
                let mut at = 0;
                for span in spans {
                    out.extend_from_slice(&body[at..span.start]);
                    out.extend_from_slice(format!("\"{REDACTED}\"").as_bytes());
                    at = span.end;
                }
                out.extend_from_slice(&body[at..]);
                *body = out;
            }
            None if json::looks_like_json(body) => {
                *body = format!("\"{REDACTED}: a body that opens as JSON but could not be read as JSON\"").into_bytes();
            }
            None => {}
        }
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

    #[test]
    fn what_is_not_redacted_keeps_every_byte_and_secrets_leave_the_failure_message() {
        let body = "\u{feff}{\"n\": 123456789012345678901234567890, \"card\":\"4111\"}\n{\"card\": 1}";
        let mut l = letter(body);
        l.reason.message = Some("auth failed for Bearer abc".into());
        Redactor::new(["card", "header.AUTHORIZATION"]).apply(&mut l);
        assert_eq!(
            std::str::from_utf8(l.body_bytes()).unwrap(),
            "\u{feff}{\"n\": 123456789012345678901234567890, \"card\":\"[REDACTED]\"}\n{\"card\": \"[REDACTED]\"}"
        );
        assert_eq!(l.reason.message.as_deref(), Some("auth failed for [REDACTED]"));
    }

    #[test]
    fn a_json_body_that_cannot_be_read_is_withheld() {
        let deep = format!("{{\"card\":{}1{}", "[".repeat(300), "]".repeat(300));
        let mut l = letter(&format!("{deep}}}"));
        Redactor::new(["body.card.x"]).apply(&mut l);
        assert!(l.body_bytes().starts_with(b"\"[REDACTED]"), "{}", String::from_utf8_lossy(l.body_bytes()));
        let mut l = letter("{\"card\": \"4111\"");
        Redactor::new(["card"]).apply(&mut l);
        assert!(!String::from_utf8_lossy(l.body_bytes()).contains("4111"));
    }
}
