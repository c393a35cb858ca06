//! The offline lint inputs: CloudFormation (YAML or JSON), Prometheus rule files and dlqctl
//! alert files. The first byte picks the reader; errors are fine, panics are not.
#![no_main]
use std::path::Path;

use dlqctl::lint::offline;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((which, text)) = input.split_first() else { return };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let path = Path::new("fuzz-input");
    let _ = match which % 3 {
        0 => offline::cloudformation_text(path, text),
        1 => offline::prometheus_text(path, text),
        _ => offline::alert_file_text(path, text),
    };
});
