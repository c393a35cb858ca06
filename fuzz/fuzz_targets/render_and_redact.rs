//! What a message carries, on its way to a terminal or a file: redaction never panics, keeps
//! a JSON body JSON and replaces every top-level field it names; what is shown on a terminal
//! never holds a control character, and a table cell is always cut.
//! Input: redact fields (comma-separated) on the first line, then the body.
#![no_main]
use dlqctl::model::DeadLetter;
use dlqctl::output::{CELL_CHARS, ColorChoice, Format, Output, printable, printable_lines};
use dlqctl::redact::{REDACTED, Redactor};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let (fields, body) = match input.iter().position(|&b| b == b'\n') {
        Some(i) => (&input[..i], &input[i + 1..]),
        None => (&input[..0], input),
    };
    let fields: Vec<String> =
        String::from_utf8_lossy(fields).split(',').filter(|f| !f.is_empty()).map(str::to_owned).collect();
    let mut letter = DeadLetter { id: "m".into(), body: Some(body.to_vec()), ..DeadLetter::default() };
    Redactor::new(&fields).apply(&mut letter);
    if let Ok(serde_json::Value::Object(before)) = serde_json::from_slice::<serde_json::Value>(body) {
        let after: serde_json::Value = serde_json::from_slice(letter.body_bytes()).expect("a JSON body stays JSON");
        for field in &fields {
            let key = field.strip_prefix("body.").unwrap_or(field);
            if field.starts_with("header.") || key.contains('.') || !before.contains_key(key) {
                continue;
            }
            // Either the field is replaced, or the whole body is withheld.
            let replaced = after.get(key).is_some_and(|v| v == REDACTED);
            let withheld = after.as_str().is_some_and(|s| s.starts_with(REDACTED));
            assert!(replaced || withheld, "{key} got through: {after}");
        }
    }
    let text = String::from_utf8_lossy(body);
    assert!(!printable(&text).chars().any(char::is_control));
    assert!(!printable_lines(&text).chars().any(|c| c.is_control() && c != '\n' && c != '\t'));
    let mut table = Output::new(Format::Table, ColorChoice::Never, true).table(&["cell"]);
    table.add_row([text.as_ref()]);
    for line in table.render() {
        assert!(line.chars().count() <= CELL_CHARS + 1, "a cell was not cut");
        assert!(!line.chars().any(char::is_control));
    }
});
