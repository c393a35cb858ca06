//! The real binary, run the way people and scripts run it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/orders-dlq.jsonl");
const SAMPLE_COUNT: u64 = 300;

fn dlqctl() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlqctl"));
    // Keep the user's own config and colour settings out of the tests.
    cmd.env("XDG_CONFIG_HOME", "/nonexistent").env_remove("DLQCTL_CONFIG").env_remove("NO_COLOR");
    cmd
}

fn run(args: &[&str]) -> Output {
    dlqctl().args(args).output().unwrap()
}

fn run_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child =
        dlqctl().args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[track_caller]
fn assert_exit(o: &Output, code: i32) {
    assert_eq!(o.status.code(), Some(code), "stdout:\n{}\nstderr:\n{}", stdout(o), stderr(o));
}

/// A one-line error: exactly one line on stderr, prefixed, no panic or backtrace.
#[track_caller]
fn assert_one_line_error(o: &Output) -> String {
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "expected one line, got:\n{err}");
    assert!(err.starts_with("dlqctl: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn temp_file(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

fn sample_lines() -> Vec<String> {
    std::fs::read_to_string(SAMPLE).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn summarize_the_sample_as_a_table() {
    let o = run(&["summarize", SAMPLE]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.starts_with("REASON "), "{out}");
    for reason in ["rejected", "expired", "maxlen", "delivery_limit", "max_receive_count", "exception", "error_code"] {
        assert!(out.contains(reason), "{reason} missing from:\n{out}");
    }
    assert!(out.lines().last().unwrap().starts_with("total  "), "{out}");
    assert!(out.contains(&SAMPLE_COUNT.to_string()));
    assert!(!out.contains('\x1b'), "no colour when stdout is not a terminal");
    assert!(stderr(&o).is_empty(), "quiet by default: {}", stderr(&o));
}

#[test]
fn summarize_json_is_the_documented_shape() {
    let o = run(&["summarize", SAMPLE, "-o", "json", "--by", "source"]);
    assert_exit(&o, 0);
    let report = json(&o);
    assert_eq!(report["target"], SAMPLE);
    assert_eq!(report["by"], "source");
    assert_eq!(report["total"], SAMPLE_COUNT);
    let groups = report["groups"].as_array().unwrap();
    let sum: u64 = groups.iter().map(|g| g["count"].as_u64().unwrap()).sum();
    assert_eq!(sum, SAMPLE_COUNT);
    let first = &groups[0];
    for field in ["source", "count", "share", "first_seen", "last_seen", "example_id"] {
        assert!(first.get(field).is_some(), "{field} missing from {first}");
    }
    let counts: Vec<u64> = groups.iter().map(|g| g["count"].as_u64().unwrap()).collect();
    assert!(counts.windows(2).all(|w| w[0] >= w[1]), "largest group first: {counts:?}");
}

#[test]
fn summarize_by_every_dimension() {
    for by in ["reason", "source", "exception", "age"] {
        let o = run(&["summarize", SAMPLE, "--by", by, "-o", "json"]);
        assert_exit(&o, 0);
        assert_eq!(json(&o)["total"], SAMPLE_COUNT, "--by {by}");
    }
    let o = run(&["summarize", SAMPLE, "--by", "exception", "-o", "json"]);
    let groups = json(&o)["groups"].clone();
    assert!(
        groups
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["exception"] == "java.sql.SQLIntegrityConstraintViolationException"),
        "Kafka Connect exception classes are grouped: {groups}"
    );
}

#[test]
fn export_then_summarize_stdin_gives_the_same_totals() {
    let exported = run(&["export", SAMPLE]);
    assert_exit(&exported, 0);
    let from_pipe = run_with_stdin(&["summarize", "-", "-o", "json"], &exported.stdout);
    assert_exit(&from_pipe, 0);
    let from_file = run(&["summarize", SAMPLE, "-o", "json"]);
    let (a, b) = (json(&from_pipe), json(&from_file));
    assert_eq!(a["total"], b["total"]);
    assert_eq!(a["groups"], b["groups"]);
}

#[test]
fn export_is_lossless_byte_for_byte() {
    // The sample is written by the same serializer, so an export must reproduce it exactly:
    // binary bodies, typed headers, null values and all.
    let o = run(&["export", SAMPLE]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o), std::fs::read_to_string(SAMPLE).unwrap());
}

#[test]
fn export_to_a_file_appears_only_when_complete() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("copy.jsonl");
    let o = run(&["export", SAMPLE, "--file", out.to_str().unwrap()]);
    assert_exit(&o, 0);
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(SAMPLE).unwrap());
    assert!(stderr(&o).contains("exported 300 dead letters"), "{}", stderr(&o));

    let mut lines = sample_lines();
    lines[150] = "{not json".into();
    let bad = temp_file(dir.path(), "bad.jsonl", lines.join("\n").as_bytes());
    let failed = dir.path().join("failed.jsonl");
    let o = run(&["export", bad.to_str().unwrap(), "--file", failed.to_str().unwrap()]);
    assert_exit(&o, 1);
    assert!(!failed.exists(), "a failed export leaves no file behind");
    let partial =
        std::fs::read_dir(dir.path()).unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".partial"));
    assert!(!partial, "nor its temporary file");
}

#[test]
fn export_redacts_headers_and_body_fields() {
    let o = run(&["export", SAMPLE, "--redact", "body.customer.email", "--redact", "header.tenant"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(!out.contains("@example.com"), "emails redacted");
    assert!(!out.contains("\"tenant\":\"acme\""), "tenant header redacted");
    assert!(out.contains("[REDACTED]"));
    assert_eq!(out.lines().count() as u64, SAMPLE_COUNT);
}

#[test]
fn redaction_rules_from_the_config_apply_to_peek() {
    let dir = tempfile::tempdir().unwrap();
    let config = temp_file(dir.path(), "config.toml", b"[redact]\nfields = [\"body.customer.email\"]\n");
    let o = run(&["peek", SAMPLE, "-n", "300", "-o", "json", "--config", config.to_str().unwrap()]);
    assert_exit(&o, 0);
    assert!(!stdout(&o).contains("@example.com"));
}

#[test]
fn peek_shows_a_table_and_json_lines() {
    let o = run(&["peek", SAMPLE, "-n", "3"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 4, "header and three rows:\n{out}");
    assert!(out.starts_with("ID "), "{out}");

    let o = run(&["peek", SAMPLE, "-n", "5", "-o", "json"]);
    assert_exit(&o, 0);
    let lines: Vec<&str> = std::str::from_utf8(&o.stdout).unwrap().lines().collect();
    assert_eq!(lines, &sample_lines()[..5]);
}

#[test]
fn peek_full_shows_headers_and_whole_bodies() {
    let o = run(&["peek", SAMPLE, "-n", "2", "--full"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("x-death: [{count:"), "{out}");
    assert!(out.contains("\n---\n"), "records are separated: {out}");
    assert!(out.contains("\"items\":[{"), "whole body shown: {out}");
}

#[test]
fn peek_zero_is_a_usage_error() {
    let o = run(&["peek", SAMPLE, "-n", "0"]);
    assert_exit(&o, 2);
    assert!(!stderr(&o).contains("panicked"));
}

#[test]
fn list_describes_an_archive_in_one_line() {
    let o = run(&["list", SAMPLE]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.contains("archive") && out.contains("300"), "{out}");
    let o = run(&["list", SAMPLE, "-o", "json"]);
    let report = json(&o);
    assert_eq!(report["dlqs"][0]["depth"], SAMPLE_COUNT);
    assert_eq!(report["dlqs"][0]["capabilities"]["consume"], true);
}

#[test]
fn invalid_line_is_named_and_can_be_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = sample_lines();
    lines[16] = r#"{"schema":"dlqctl/dead-letter/v1","body":"no id"}"#.into();
    lines[40] = "garbage".into();
    let path = temp_file(dir.path(), "bad.jsonl", lines.join("\n").as_bytes());
    let path = path.to_str().unwrap();

    let o = run(&["summarize", path]);
    assert_exit(&o, 1);
    let err = assert_one_line_error(&o);
    assert!(err.contains("bad.jsonl:17:") && err.contains("id"), "{err}");
    assert!(err.contains("--skip-invalid"), "{err}");

    let o = run(&["summarize", path, "--skip-invalid", "-o", "json"]);
    assert_exit(&o, 0);
    assert_eq!(json(&o)["total"], SAMPLE_COUNT - 2);
    let err = stderr(&o);
    assert!(err.contains("skipped 2 invalid line(s)") && err.contains("first at line 17"), "{err}");
}

#[test]
fn summarize_reads_no_body_unless_asked_and_export_still_checks_each() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = sample_lines();
    let mut letter: serde_json::Value = serde_json::from_str(&lines[3]).unwrap();
    letter["body"] = "!!".into();
    letter["body_encoding"] = "base64".into();
    lines[3] = letter.to_string();
    let path = temp_file(dir.path(), "body.jsonl", lines.join("\n").as_bytes());
    let path = path.to_str().unwrap();

    // Summarize shows no body, so it decodes none: the line still counts.
    let o = run(&["summarize", path, "-o", "json"]);
    assert_exit(&o, 0);
    assert_eq!(json(&o)["total"], SAMPLE_COUNT);
    // A filter that looks into bodies decodes them, as export does.
    for args in [&["summarize", path, "--where", "body.type=x"][..], &["export", path]] {
        let o = run(args);
        assert_exit(&o, 1);
        let err = assert_one_line_error(&o);
        assert!(err.contains("body.jsonl:4:") && err.contains("base64"), "{err}");
    }
}

#[test]
fn blank_lines_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let lines = sample_lines();
    let text = format!("\n{}\n\n{}\n\n", lines[0], lines[1]);
    let path = temp_file(dir.path(), "blank.jsonl", text.as_bytes());
    let o = run(&["summarize", path.to_str().unwrap(), "-o", "json"]);
    assert_exit(&o, 0);
    assert_eq!(json(&o)["total"], 2);
}

#[test]
fn empty_archive_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = temp_file(dir.path(), "empty.jsonl", b"");
    let path = path.to_str().unwrap();
    let o = run(&["summarize", path, "-o", "json"]);
    assert_exit(&o, 0);
    assert_eq!(json(&o)["total"], 0);
    assert_eq!(json(&o)["groups"], serde_json::json!([]));
    let o = run(&["peek", path]);
    assert_exit(&o, 0);
    assert!(o.stdout.is_empty());
    assert!(stderr(&o).contains("no dead letters"), "{}", stderr(&o));
    assert_exit(&run(&["export", path]), 0);
}

#[test]
fn binary_bodies_survive_export() {
    let o = run(&["export", SAMPLE]);
    let binary: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["body_encoding"] == "base64")
        .collect();
    assert!(!binary.is_empty(), "the sample has non-UTF-8 bodies");
    let o = run(&["peek", SAMPLE, "-n", "300"]);
    assert!(stdout(&o).contains("<binary, "), "peek says a body is binary instead of printing it");
}

#[test]
fn missing_file_is_a_one_line_error() {
    let o = run(&["summarize", "no/such/file.jsonl"]);
    assert_exit(&o, 1);
    let err = assert_one_line_error(&o);
    assert!(err.contains("no/such/file.jsonl") && err.contains("No such file"), "{err}");
}

#[test]
fn malformed_targets_are_usage_errors_naming_the_bad_part() {
    let o = run(&["peek", "redis://localhost/q"]);
    assert_exit(&o, 2);
    assert!(assert_one_line_error(&o).contains("\"redis\""));

    let o = run(&["peek", "rabbitmq://ops:hunter2@mq:99999/%2f/q"]);
    assert_exit(&o, 2);
    let err = assert_one_line_error(&o);
    assert!(err.contains("99999") && !err.contains("hunter2"), "{err}");
}

#[test]
fn named_targets_come_from_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = temp_file(
        dir.path(),
        "config.toml",
        format!(
            "[targets.sample]\nurl = \"{SAMPLE}\"\n\n[targets.prod]\nurl = \"rabbitmq://ops@mq:5672/%2f/orders.dlq\"\npassword = \"hunter2\"\n"
        )
        .as_bytes(),
    );
    let o = dlqctl().args(["summarize", "sample", "-o", "json"]).env("DLQCTL_CONFIG", &config).output().unwrap();
    assert_exit(&o, 0);
    assert_eq!(json(&o)["total"], SAMPLE_COUNT);

    let o = run(&["peek", "prod", "--config", config.to_str().unwrap()]);
    assert_exit(&o, 1);
    let err = assert_one_line_error(&o);
    assert!(err.contains("rabbitmq://ops:****@mq:5672"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn a_closed_pipe_exits_quietly() {
    // Big enough that the writer is still going when the reader leaves.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(SAMPLE).unwrap().repeat(40);
    let path = temp_file(dir.path(), "big.jsonl", text.as_bytes());
    let mut child = dlqctl()
        .args(["export", path.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    drop(stdout);
    let o = child.wait_with_output().unwrap();
    assert_exit(&o, 0);
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
}

#[test]
fn help_documents_targets_and_exit_codes() {
    let o = run(&["--help"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("EXIT CODES") && out.contains("rabbitmq://USER:PASS@HOST:PORT/VHOST/QUEUE"), "{out}");
}

#[test]
fn colour_only_when_asked_or_on_a_terminal() {
    let o = run(&["summarize", SAMPLE, "--color", "always"]);
    assert!(stdout(&o).contains('\x1b'), "--color always colours even into a pipe");
    let o = run(&["summarize", SAMPLE]);
    assert!(!stdout(&o).contains('\x1b'));
}

#[test]
fn where_selects_in_every_reading_verb() {
    let o = run(&["summarize", SAMPLE, "--where", "reason=rejected", "--where", "header.tenant=acme", "-o", "json"]);
    assert_exit(&o, 0);
    let report = json(&o);
    assert_eq!(report["groups"].as_array().unwrap().len(), 1);
    assert_eq!(report["groups"][0]["reason"], "rejected");
    let selected = report["total"].as_u64().unwrap();
    assert!(selected > 0 && selected < SAMPLE_COUNT);

    let o = run(&["export", SAMPLE, "--where", "reason=rejected", "--where", "header.tenant=acme"]);
    assert_eq!(stdout(&o).lines().count() as u64, selected);

    let o = run(&["peek", SAMPLE, "--where", "body.type~^refund", "-n", "4", "-o", "json"]);
    let lines: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4, "the limit counts matching messages");
    assert!(lines.iter().all(|l| l["body"].as_str().unwrap().contains("\"type\":\"refund")));
}

#[test]
fn a_bad_where_is_a_usage_error_naming_it() {
    let o = run(&["summarize", SAMPLE, "--where", "colour=red"]);
    assert_exit(&o, 2);
    let err = assert_one_line_error(&o);
    assert!(err.contains("colour=red") && err.contains("unknown field"), "{err}");
}
