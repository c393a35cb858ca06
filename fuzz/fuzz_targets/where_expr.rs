//! `--where` expressions: parsing never panics, and a parsed selection can be evaluated.
#![no_main]
use chrono::TimeZone;
use dlqctl::model::{DeadLetter, Headers};
use dlqctl::redrive::select::Selection;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &str| {
    let expressions: Vec<&str> = input.split('\n').collect();
    let Ok(selection) = Selection::parse(&expressions) else { return };
    let letter = DeadLetter {
        id: "m1".into(),
        headers: Headers::new().with("tenant", "acme").with("attempt", 3i64),
        body: Some(br#"{"order":1}"#.to_vec()),
        ..DeadLetter::default()
    };
    let now = chrono::Utc.timestamp_opt(1_800_000_000, 0).unwrap();
    let _ = selection.matches(&letter, now);
});
