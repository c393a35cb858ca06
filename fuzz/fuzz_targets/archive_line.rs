//! One JSONL archive line: any input is a dead letter or an error, every dead letter
//! survives a write and a read unchanged (the archive is lossless), and the line dlqctl
//! writes is serde_json's own JSON (read and written again by serde_json, the same bytes).
#![no_main]
use std::collections::HashSet;

use dlqctl::model::{DeadLetter, Headers, Value};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(letter) = serde_json::from_slice::<DeadLetter>(input) else { return };
    let mut line = Vec::new();
    letter.write_json(&mut line);
    let again: DeadLetter = serde_json::from_slice(&line).expect("what we write, we read");
    assert_eq!(letter, again);
    // serde_json's objects keep one of repeated names, so only lines without them compare.
    if !repeats_a_name(&letter.headers) && !repeats_a_name(&letter.extras) {
        let json: serde_json::Value = serde_json::from_slice(&line).expect("the line is JSON");
        let rewritten = serde_json::to_vec(&json).expect("JSON always serializes");
        assert_eq!(line, rewritten, "the line writer and serde_json disagree");
    }
});

fn repeats_a_name(headers: &Headers) -> bool {
    let mut seen = HashSet::new();
    headers.iter().any(|(name, value)| !seen.insert(name) || value_repeats_a_name(value))
}

fn value_repeats_a_name(value: &Value) -> bool {
    match value {
        Value::Table(table) => repeats_a_name(table),
        Value::List(items) => items.iter().any(value_repeats_a_name),
        _ => false,
    }
}
