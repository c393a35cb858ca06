//! One JSONL archive line: any input is a dead letter or an error, and every dead letter
//! survives a write and a read unchanged (the archive is lossless).
#![no_main]
use dlqctl::model::DeadLetter;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(letter) = serde_json::from_slice::<DeadLetter>(input) else { return };
    let line = serde_json::to_vec(&letter).expect("a dead letter always serializes");
    let again: DeadLetter = serde_json::from_slice(&line).expect("what we write, we read");
    assert_eq!(letter, again);
});
