//! Just enough of a JSON reader to find where the values at some paths stand in a body:
//! iterative where it steps over values, so no nesting depth overflows it, and byte-exact, so
//! what it does not replace is kept as it was (numbers of any length, spacing, key order).

use std::ops::Range;

/// How deep paths may lead (through arrays of arrays) before a body is withheld instead.
const MAX_DESCENT: usize = 256;

/// Whether a body opens like JSON (after a byte-order mark and white space).
pub fn looks_like_json(body: &[u8]) -> bool {
    matches!(strip_bom(body).trim_ascii_start().first(), Some(b'{' | b'['))
}

fn strip_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body)
}

/// The byte ranges, in order, of the values at `paths` in `body`: one JSON value, or several
/// separated by white space (NDJSON), after an optional byte-order mark. A path through an
/// array applies to each element. `None` when the body is not JSON.
pub fn value_spans(body: &[u8], paths: &[Vec<String>]) -> Option<Vec<Range<usize>>> {
    let start = body.len() - strip_bom(body).len();
    let mut reader = Reader { text: body, at: start, spans: Vec::new() };
    reader.skip_ws();
    if reader.at == body.len() {
        return None;
    }
    let all: Vec<&[String]> = paths.iter().map(Vec::as_slice).collect();
    while reader.at < body.len() {
        reader.value(&all, 0)?;
        reader.skip_ws();
    }
    Some(reader.spans)
}

struct Reader<'a> {
    text: &'a [u8],
    at: usize,
    spans: Vec<Range<usize>>,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// The value here, given the rests of the paths that lead to it: an empty rest means this
    /// value is replaced; no rest at all, that it is only stepped over.
    fn value(&mut self, paths: &[&[String]], descent: usize) -> Option<()> {
        self.skip_ws();
        let start = self.at;
        if paths.iter().any(|p| p.is_empty()) {
            self.skip_value()?;
            self.spans.push(start..self.at);
            return Some(());
        }
        if paths.is_empty() {
            return self.skip_value();
        }
        if descent > MAX_DESCENT {
            return None;
        }
        match self.peek()? {
            b'{' => self.members(paths, descent),
            b'[' => self.elements(paths, descent),
            _ => self.skip_value(),
        }
    }

    fn members(&mut self, paths: &[&[String]], descent: usize) -> Option<()> {
        self.at += 1;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Some(());
        }
        loop {
            self.skip_ws();
            let key = self.string()?;
            self.skip_ws();
            (self.peek() == Some(b':')).then(|| self.at += 1)?;
            let rests: Vec<&[String]> = paths
                .iter()
                .filter_map(|p| p.split_first())
                .filter(|(first, _)| **first == key)
                .map(|(_, rest)| rest)
                .collect();
            self.value(&rests, descent + 1)?;
            if self.close(b'}')? {
                return Some(());
            }
        }
    }

    fn elements(&mut self, paths: &[&[String]], descent: usize) -> Option<()> {
        self.at += 1;
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Some(());
        }
        loop {
            self.value(paths, descent + 1)?;
            if self.close(b']')? {
                return Some(());
            }
        }
    }

    /// After a member or element: `Some(true)` at the closing bracket, `Some(false)` after a
    /// comma, `None` at anything else.
    fn close(&mut self, bracket: u8) -> Option<bool> {
        self.skip_ws();
        let next = self.peek()?;
        self.at += 1;
        match next {
            b',' => Some(false),
            b if b == bracket => Some(true),
            _ => None,
        }
    }

    /// A string here, unescaped (so `"\u0063ard"` is the key `card`).
    fn string(&mut self) -> Option<String> {
        let start = self.at;
        self.skip_string()?;
        serde_json::from_slice(&self.text[start..self.at]).ok()
    }

    fn skip_string(&mut self) -> Option<()> {
        (self.peek() == Some(b'"')).then_some(())?;
        self.at += 1;
        loop {
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                b'\\' => self.at += 2,
                _ => self.at += 1,
            }
        }
    }

    /// Step over one value of any depth, counting brackets rather than recursing.
    fn skip_value(&mut self) -> Option<()> {
        self.skip_ws();
        let mut open: Vec<u8> = Vec::new();
        loop {
            match self.peek()? {
                b'"' => self.skip_string()?,
                b @ (b'{' | b'[') => {
                    open.push(if b == b'{' { b'}' } else { b']' });
                    self.at += 1;
                }
                b @ (b'}' | b']') => {
                    (open.pop()? == b).then_some(())?;
                    self.at += 1;
                }
                _ if !open.is_empty() => self.at += 1,
                _ => {
                    // A scalar: up to the next delimiter, and it must be JSON.
                    let end = self.text[self.at..]
                        .iter()
                        .position(|b| matches!(b, b',' | b']' | b'}') || b.is_ascii_whitespace())
                        .map_or(self.text.len(), |n| self.at + n);
                    serde_json::from_slice::<serde::de::IgnoredAny>(&self.text[self.at..end]).ok()?;
                    self.at = end;
                    return Some(());
                }
            }
            if open.is_empty() {
                return Some(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(body: &str, paths: &[&str]) -> Option<Vec<String>> {
        let paths: Vec<Vec<String>> = paths.iter().map(|p| p.split('.').map(str::to_owned).collect()).collect();
        value_spans(body.as_bytes(), &paths).map(|s| s.into_iter().map(|r| body[r].to_owned()).collect())
    }

    #[test]
    fn finds_values_at_paths_through_objects_arrays_and_escaped_keys() {
        let body = r#"{"a":{"card":"4111","n":123456789012345678901234567890},"items":[{"card":[1,{"x":2}]},{"\u0063ard":"x"}]}"#;
        assert_eq!(spans(body, &["a.card", "items.card"]).unwrap(), [r#""4111""#, r#"[1,{"x":2}]"#, r#""x""#]);
    }

    #[test]
    fn reads_ndjson_and_a_byte_order_mark_and_any_depth_it_steps_over() {
        assert_eq!(spans("{\"k\":1}\n{\"k\":2}\n", &["k"]).unwrap(), ["1", "2"]);
        assert_eq!(spans("\u{feff}{\"k\": \"v\"}", &["k"]).unwrap(), ["\"v\""]);
        let deep = format!("{{\"k\":1,\"d\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(spans(&deep, &["k"]).unwrap(), ["1"]);
    }

    #[test]
    fn what_is_not_json_is_none() {
        for body in ["{\"k\":", "{\"k\":1]", "{\"k\" 1}", "[1,,2]", "{\"k\":tru}", "", "   "] {
            assert_eq!(spans(body, &["k"]), None, "{body:?}");
        }
    }
}
