//! Hostile input from the command line (#30): what a message, a file or a flag carries ends
//! in a safe rendering or one clear line, never a raw control sequence, a hang, unbounded
//! memory, a panic or a leaked secret. Archives only: no broker is needed.

mod support;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use dlqctl::model::{DeadLetter, Headers, Reason, ReasonKind, Source};

/// What no human-readable view may contain: ESC, BEL, NUL, CR, the C1 CSI and a right-to-left
/// override.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars().filter(|c| matches!(c, '\u{1b}' | '\u{7}' | '\0' | '\r' | '\u{9b}' | '\u{202e}')).collect()
}

const EVIL: &str = "\u{1b}]0;pwned\u{7}\u{1b}[2J\0\r\u{9b}1m\u{202e}";

fn hostile_archive(dir: &std::path::Path) -> std::path::PathBuf {
    let letter = DeadLetter {
        id: format!("id{EVIL}"),
        dlq: Some(format!("dlq{EVIL}")),
        source: Source { name: Some(format!("orders{EVIL}")), ..Source::default() },
        reason: Reason {
            exception_class: Some(format!("com.acme.Boom{EVIL}")),
            message: Some(format!("failed{EVIL}")),
            ..Reason::new(ReasonKind::Exception)
        },
        headers: Headers::new().with(format!("h{EVIL}"), format!("v{EVIL}")),
        body: Some(format!("{{\"a\":\"{}\"}}", EVIL.escape_unicode()).into_bytes()),
        ..DeadLetter::default()
    };
    let mut raw_body = letter.clone();
    raw_body.id = "raw-body".into();
    raw_body.body = Some(format!("text{EVIL}").into_bytes());
    let path = dir.join("evil.jsonl");
    std::fs::write(&path, support::jsonl(&[letter, raw_body])).unwrap();
    path
}

#[test]
fn control_bytes_in_a_message_never_reach_the_terminal_raw() {
    let dir = tempfile::tempdir().unwrap();
    let archive = hostile_archive(dir.path());
    let archive = archive.to_str().unwrap();
    let views: [&[&str]; 6] = [
        &["peek", archive],
        &["peek", archive, "--full"],
        &["summarize", archive],
        &["summarize", archive, "--by", "source"],
        &["list", archive],
        &["redrive", archive, "--to", "/dev/null/x.jsonl", "--dry-run"],
    ];
    for args in views {
        let o = support::run(args);
        let (out, err) = (support::text(&o.stdout), support::text(&o.stderr));
        assert!(raw_controls(&out).is_empty() && raw_controls(&err).is_empty(), "{args:?}:\n{out}\n{err}");
        assert!(out.contains("\\u{1b}") || err.contains("\\u{1b}"), "{args:?} shows the escape: {out}");
    }
    // JSON stays exact: the same bytes come back.
    let o = support::ok(&["peek", archive, "-o", "json"]);
    let back = support::records(&o);
    assert_eq!(back[0].id, format!("id{EVIL}"));
}

#[test]
fn a_huge_id_is_shown_cut_and_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.jsonl");
    let letter = DeadLetter { id: "x".repeat(10 << 20), ..DeadLetter::default() };
    std::fs::write(&path, support::jsonl(&[letter])).unwrap();
    let started = Instant::now();
    let o = support::ok(&["peek", path.to_str().unwrap()]);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(support::text(&o.stdout).lines().all(|l| l.chars().count() < 2000));
}

#[test]
fn a_line_that_never_ends_stops_the_read_with_one_line() {
    let o = support::run(&["peek", "/dev/zero", "--max-line-mib", "4"]);
    assert_eq!(o.status.code(), Some(1));
    let err = support::text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("longer than 4 MiB") && err.contains("--max-line-mib"), "{err}");
}

#[test]
fn run_files_are_private_and_never_written_through_a_planted_symlink() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/orders-dlq.jsonl"), dir.path().join("dlq.jsonl"))
        .unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("audit.jsonl")).unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("plan.jsonl")).unwrap();
    let state = dir.path().join("state");
    let dlq = dir.path().join("dlq.jsonl");
    let dlq = dlq.to_str().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let plan = dir.path().join("plan.jsonl");
    let out = dir.path().join("out.jsonl");
    for extra in [["--audit-log", audit.to_str().unwrap()], ["--plan-out", plan.to_str().unwrap()]] {
        let o = support::output(
            support::dlqctl(&state).args(["redrive", dlq, "--to", out.to_str().unwrap(), "--yes"]).args(extra),
        );
        assert_eq!(o.status.code(), Some(2), "{}", support::text(&o.stderr));
        assert!(support::text(&o.stderr).contains("symbolic link"), "{}", support::text(&o.stderr));
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    let export = dir.path().join("export.jsonl");
    support::ok(&["export", dlq, "--file", export.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&export).unwrap().permissions().mode() & 0o777, 0o600);
}

/// `dlqctl redrive … 2>&1 | head -c 1`: the reader of stderr goes away at once; the run still
/// moves everything (its status line every 5 s must not stop it).
#[test]
fn a_closed_stderr_never_stops_a_redrive() {
    let dir = tempfile::tempdir().unwrap();
    let dlq = dir.path().join("dlq.jsonl");
    let letters: Vec<DeadLetter> =
        (0..1300).map(|i| DeadLetter { id: format!("m{i}"), ..DeadLetter::default() }).collect();
    std::fs::write(&dlq, support::jsonl(&letters)).unwrap();
    let out = dir.path().join("out.jsonl");
    let mut child = support::dlqctl(&dir.path().join("state"))
        .args(["redrive", dlq.to_str().unwrap(), "--to", out.to_str().unwrap(), "--yes", "--rate", "200"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    child.stderr.as_mut().unwrap().read_exact(&mut first).unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 1300);
}

#[test]
fn secrets_in_urls_and_config_files_are_never_echoed() {
    for target in ["sqs://q?endpoint=http://user:never-print@127.0.0.1:1", "https://AK:never-print@127.0.0.1:1/000/q"] {
        let o = support::run(&["peek", target]);
        assert_eq!(o.status.code(), Some(2));
        assert!(support::text(&o.stderr).contains("credential chain"), "{}", support::text(&o.stderr));
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[targets.prod]\nurl = \"rabbitmq://u@h/v/q\"\npassword = 98765never-print\n").unwrap();
    let o = support::run(&["--config", config.to_str().unwrap(), "peek", "prod"]);
    assert_eq!(o.status.code(), Some(2));
    let err = support::text(&o.stderr);
    assert!(err.contains("config.toml:3") && err.contains("password"), "{err}");
}

#[test]
fn a_hostile_file_name_is_escaped_too() {
    let dir = tempfile::tempdir().unwrap();
    // A file name can hold anything but NUL and `/`.
    let name = dir.path().join(format!("ev{}.jsonl", EVIL.replace('\0', "")));
    std::fs::copy(hostile_archive(dir.path()), &name).unwrap();
    let to = dir.path().join("o.jsonl");
    let o = support::run(&["redrive", name.to_str().unwrap(), "--to", to.to_str().unwrap(), "--dry-run"]);
    let (out, err) = (support::text(&o.stdout), support::text(&o.stderr));
    assert!(raw_controls(&out).is_empty() && raw_controls(&err).is_empty(), "{out}\n{err}");
}

#[test]
fn redrive_into_a_file_writes_only_a_private_archive() {
    let dir = tempfile::tempdir().unwrap();
    let dlq = hostile_archive(dir.path());
    let state = dir.path().join("state");
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "victim\n").unwrap();
    let o = support::output(
        support::dlqctl(&state).args(["redrive", dlq.to_str().unwrap(), "--to"]).arg(&notes).arg("--yes"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", support::text(&o.stderr));
    assert!(support::text(&o.stderr).contains("not a dlqctl archive"), "{}", support::text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "victim\n");
    let fresh = dir.path().join("fresh.jsonl");
    let o = support::output(
        support::dlqctl(&state).args(["redrive", dlq.to_str().unwrap(), "--to"]).arg(&fresh).arg("--yes"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", support::text(&o.stderr));
    assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o600);
}

/// A group key `--reason-from` takes from a header the config file redacts is redacted.
#[test]
fn summarize_keeps_the_config_files_redaction() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[redact]\nfields = [\"header.tenant\"]\n").unwrap();
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/orders-dlq.jsonl");
    let o = support::ok(&[
        "--config",
        config.to_str().unwrap(),
        "summarize",
        sample,
        "--by",
        "exception",
        "--reason-from",
        "header:tenant",
        "-o",
        "json",
    ]);
    let report = support::json(&o);
    let keys: Vec<&str> =
        report["groups"].as_array().unwrap().iter().map(|g| g["exception"].as_str().unwrap()).collect();
    let tenants: std::collections::BTreeSet<String> = support::records(&support::ok(&["export", sample]))
        .iter()
        .filter_map(|l| l.headers.get("tenant").map(|t| t.to_string()))
        .collect();
    assert!(!tenants.is_empty());
    assert!(keys.contains(&"[REDACTED]") && keys.iter().all(|k| !tenants.contains(*k)), "{keys:?}");
}
