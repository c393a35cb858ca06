//! One JSONL archive line: any input is a dead letter or an error, every dead letter
//! survives a write and a read unchanged (the archive is lossless), and export's fast line
//! writer writes exactly what serde writes.
#![no_main]
use dlqctl::model::DeadLetter;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(letter) = serde_json::from_slice::<DeadLetter>(input) else { return };
    let line = serde_json::to_vec(&letter).expect("a dead letter always serializes");
    let mut fast = Vec::new();
    letter.write_json(&mut fast).expect("a dead letter always serializes");
    assert_eq!(fast, line, "the line writer and serde disagree");
    let again: DeadLetter = serde_json::from_slice(&line).expect("what we write, we read");
    assert_eq!(letter, again);
});
