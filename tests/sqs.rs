//! The SQS backend against LocalStack started by `scripts/brokers up`, from the command line.
//! The seeded queues are only read; tests that move messages use queues of their own.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Output;

use dlqctl::model::{DeadLetter, Headers, Value};
use support::{Namespace, TestBroker, counts, json, ok, records, require, seed_counts, text};

fn dlqctl_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let state = tempfile::tempdir().unwrap();
    support::output(support::dlqctl(state.path()).args(args).envs(env.iter().copied()))
}

fn letters(n: usize) -> Vec<DeadLetter> {
    (0..n)
        .map(|i| DeadLetter {
            id: format!("l{i}"),
            headers: Headers::new().with("seq", i as i64).with("group", format!("g{}", i % 3)),
            body: Some(format!("{{\"order\":{i}}}").into_bytes()),
            ..DeadLetter::default()
        })
        .collect()
}

/// Everything in a queue, read through dlqctl.
fn all(target: &str) -> Vec<DeadLetter> {
    records(&ok(&["export", target, "-q"]))
}

fn source_of(dlq_target: &str) -> String {
    dlq_target.replacen("-dlq", "-src", 1)
}

#[test]
fn seeded_dlqs_are_listed_with_their_sources() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let report = json(&ok(&["list", "sqs://", "-o", "json"]));
    let dlqs = report["dlqs"].as_array().unwrap();
    let find = |name: &str| dlqs.iter().find(|d| d["name"] == name).unwrap_or_else(|| panic!("{name} listed"));
    let standard = find("orders-dlq");
    assert_eq!(standard["sources"][0], "orders-queue (maxReceiveCount 3, retention 4d0h)");
    assert_eq!(standard["retention"], 14 * 86_400);
    assert_eq!(standard["depth"], seed_counts()["sqs"]["dlqs"]["orders-dlq"]);
    assert_eq!(find("orders-dlq.fifo")["kind"], "sqs fifo queue");
    let prefixed = json(&ok(&["list", "sqs://?prefix=orders-dlq", "-o", "json"]));
    assert!(prefixed["dlqs"].as_array().unwrap().iter().all(|d| d["name"].as_str().unwrap().starts_with("orders-dlq")));
}

#[test]
fn reasons_from_receive_counts_and_producer_attributes() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let standard = json(&ok(&["summarize", "sqs://orders-dlq", "-o", "json", "-q"]));
    assert_eq!(counts(&standard, "reason"), BTreeMap::from([("max_receive_count".into(), 10)]));
    let by_source = json(&ok(&["summarize", "sqs://orders-dlq", "--by", "source", "-o", "json", "-q"]));
    assert_eq!(counts(&by_source, "source"), BTreeMap::from([("orders-queue".into(), 10)]));
    let lambda = json(&ok(&["summarize", "sqs://orders-fulfilment-dlq", "--by", "exception", "-o", "json", "-q"]));
    let expected: BTreeMap<String, u64> =
        serde_json::from_value(seed_counts()["sqs"]["lambda_error_codes"].clone()).unwrap();
    assert_eq!(counts(&lambda, "exception"), expected);
    let events = json(&ok(&["summarize", "sqs://orders-events-dlq", "--by", "exception", "-o", "json", "-q"]));
    assert_eq!(counts(&events, "exception"), BTreeMap::from([("SDK_CLIENT_ERROR".into(), 3)]));
    let by_attr = json(&ok(&[
        "summarize",
        "sqs://orders-dlq",
        "--by",
        "exception",
        "--reason-from",
        "attr:tenant",
        "-o",
        "json",
        "-q",
    ]));
    assert_eq!(counts(&by_attr, "exception").values().sum::<u64>(), 10);
}

#[test]
fn peek_says_what_it_costs_and_gives_everything_back() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let ns = Namespace::create(TestBroker::Sqs, &letters(5));
    let o = dlqctl_env(&["peek", &ns.target, "-n", "2", "-o", "json"], &[]);
    assert_eq!(records(&o).len(), 2);
    assert!(text(&o.stderr).contains("ApproximateReceiveCount"), "{}", text(&o.stderr));
    // Nothing is left invisible: a full read right after sees all five.
    let o = ok(&["export", &ns.target]);
    assert_eq!(records(&o).len(), 5);
    assert!(text(&o.stderr).contains("read 5 message(s); SQS reported about 5"), "{}", text(&o.stderr));
}

#[test]
fn large_bodies_and_binary_attributes_round_trip() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let big = "x".repeat(250_000);
    let mut letters = letters(2);
    letters[0].body = Some(big.clone().into_bytes());
    letters[1].headers.push("blob", vec![0u8, 1, 254, 255]);
    let ns = Namespace::create(TestBroker::Sqs, &letters);
    let read = all(&ns.target);
    let large = read.iter().find(|l| l.body_bytes().len() == big.len()).expect("the 250 KB body");
    assert_eq!(large.body_bytes(), big.as_bytes());
    let binary = read.iter().find(|l| l.headers.get("blob").is_some()).expect("binary attribute");
    assert_eq!(binary.headers.get("blob"), Some(&Value::Bytes(vec![0, 1, 254, 255])));
    // Through a client-side redrive too: the copy in the source keeps both.
    ok(&["redrive", &ns.target, "--mode", "client", "--yes", "--rate", "unlimited", "-q"]);
    let back = all(&source_of(&ns.target));
    assert!(back.iter().any(|l| l.body_bytes() == big.as_bytes()));
    let copy = back.iter().find(|l| l.headers.get("blob").is_some()).unwrap();
    assert_eq!(copy.headers.get("blob"), Some(&Value::Bytes(vec![0, 1, 254, 255])));
    assert_eq!(copy.headers.get("seq"), binary.headers.get("seq"), "number attributes keep their type and value");
}

#[test]
fn fifo_redrive_keeps_order_within_each_group() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let ns = Namespace::create_kind(TestBroker::Sqs, "sqs-fifo", &letters(12));
    let o =
        ok(&["redrive", &ns.target, "--where", "header.seq!=-1", "--yes", "--rate", "unlimited", "-o", "json", "-q"]);
    assert_eq!(json(&o)["summary"]["moved"], 12);
    // A FIFO read cannot look past messages it holds (their groups lock), so take them out
    // to an archive, which keeps the order they arrive in.
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("fifo.jsonl");
    ok(&["redrive", &source_of(&ns.target), "--to", archive.to_str().unwrap(), "--yes", "--rate", "unlimited", "-q"]);
    let back: Vec<DeadLetter> =
        std::fs::read_to_string(&archive).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(back.len(), 12);
    let mut by_group: HashMap<String, Vec<i64>> = HashMap::new();
    for l in &back {
        let group = l.extras.get("MessageGroupId").unwrap().to_string();
        let seq: i64 = l.headers.get("seq").unwrap().to_string().parse().unwrap();
        by_group.entry(group).or_default().push(seq);
    }
    assert_eq!(by_group.len(), 3, "{by_group:?}");
    for (group, seqs) in by_group {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "group {group} out of order: {seqs:?}");
    }
}

#[test]
fn a_thousand_messages_by_each_path_none_lost() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    for mode in ["client", "server"] {
        let ns = Namespace::create(TestBroker::Sqs, &letters(1000));
        let o = ok(&["redrive", &ns.target, "--mode", mode, "--yes", "--rate", "unlimited", "-o", "json", "-q"]);
        let report = json(&o);
        let moved = if mode == "client" { &report["summary"]["moved"] } else { &report["move_task"]["moved"] };
        assert_eq!(*moved, 1000, "{mode}: {report}");
        let back = all(&source_of(&ns.target));
        let seqs: HashSet<String> = back.iter().map(|l| l.headers.get("seq").unwrap().to_string()).collect();
        assert_eq!(seqs.len(), 1000, "{mode}: every message back in its source, once");
        assert!(all(&ns.target).is_empty(), "{mode}: the DLQ is empty");
    }
}

#[test]
fn the_plan_says_which_path_and_why() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let o = ok(&["redrive", "sqs://orders-dlq", "--dry-run"]);
    assert!(text(&o.stdout).contains("server-side move task (nothing is filtered"), "{}", text(&o.stdout));
    let o = dlqctl_env(&["redrive", "sqs://orders-dlq", "--mode", "server", "--where", "reason=x", "--dry-run"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--where need(s) --mode client"), "{}", text(&o.stderr));
}

#[test]
fn a_refused_entry_stays_in_the_dlq_while_the_rest_of_its_batch_moves() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let ns = Namespace::create(TestBroker::Sqs, &letters(1));
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("replay.jsonl");
    let mut batch = letters(5);
    // SQS refuses bodies with control characters such as U+0001; the other four are fine.
    batch[2].body = Some("bad \u{1} body".as_bytes().to_vec());
    std::fs::write(&archive, support::jsonl(&batch)).unwrap();
    let o = dlqctl_env(&["redrive", archive.to_str().unwrap(), "--to", &ns.target, "--yes", "-o", "json"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let summary = &json(&o)["summary"];
    assert_eq!((summary["moved"].as_u64(), summary["failed"].as_u64()), (Some(4), Some(1)), "{summary}");
    let left = std::fs::read_to_string(&archive).unwrap();
    assert_eq!(left.lines().count(), 1);
    assert!(left.contains("bad \\u0001 body"));
}

/// SQS counts the body and every attribute against its 256 KB limit. A dead letter that fits
/// with room for less than the redrive's two attributes cannot be copied: it stays, with why.
#[test]
fn a_copy_too_large_for_sqs_stays_in_the_dlq_with_its_reason() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let mut letters = letters(3);
    letters[1].body = Some("y".repeat(262_144 - 40).into_bytes());
    let ns = Namespace::create(TestBroker::Sqs, &letters);
    let read = all(&ns.target);
    assert!(read.iter().any(|l| l.body_bytes().len() == 262_104), "the near-limit letter reads intact");
    let o = dlqctl_env(&["redrive", &ns.target, "--mode", "client", "--yes", "--rate", "unlimited", "-o", "json"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let summary = &json(&o)["summary"];
    assert_eq!((summary["moved"].as_u64(), summary["failed"].as_u64()), (Some(2), Some(1)), "{summary}");
    let left = all(&ns.target);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].body_bytes().len(), 262_104, "the large one stayed, whole");
}

#[test]
fn a_missing_queue_is_a_one_line_error() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let o = dlqctl_env(&["peek", "sqs://no-such-queue-here"], &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no-such-queue-here") && err.contains("does not exist"), "{err}");
}

#[test]
fn credentials_and_session_tokens_never_appear() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let ns = Namespace::create(TestBroker::Sqs, &letters(2));
    let secret = "wJalrXUtnFEMI-never-print-9f3c";
    let token = "FwoGZXIvYXdzE-session-never-print";
    let env =
        [("AWS_SECRET_ACCESS_KEY", secret), ("AWS_SESSION_TOKEN", token), ("AWS_ACCESS_KEY_ID", "AKIATESTNEVERPRINT")];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    for args in [
        vec!["list", "sqs://"],
        vec!["peek", &ns.target, "--full"],
        vec!["summarize", &ns.target],
        vec!["export", &ns.target],
        vec!["redrive", &ns.target, "--dry-run"],
        vec!["redrive", &ns.target, "--to", out.to_str().unwrap(), "--yes"],
        vec!["peek", "sqs://nope?endpoint=http://127.0.0.1:1"],
    ] {
        let o = dlqctl_env(&args, &env);
        let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
        assert!(!all.contains(secret) && !all.contains(token), "{args:?} printed a credential:\n{all}");
    }
}

/// A profile that assumes a role from another profile's keys, resolved by aws-config as in
/// production (LocalStack's STS answers AssumeRole): dlqctl reads with the role's temporary
/// credentials, and neither the source keys nor anything else secret is printed.
#[test]
fn a_profile_that_assumes_a_role_reads_the_dlq() {
    let Some(_) = require(TestBroker::Sqs) else { return };
    let ns = Namespace::create(TestBroker::Sqs, &letters(2));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aws-config");
    std::fs::write(
        &config,
        "[profile source]\naws_access_key_id = AKIASOURCENEVERPRINT\n\
         aws_secret_access_key = source-never-print-secret\nregion = us-east-1\n\n\
         [profile dlqctl-role]\nrole_arn = arn:aws:iam::000000000000:role/dlqctl-redrive\n\
         source_profile = source\nregion = us-east-1\n",
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let o = support::output(
        support::dlqctl(state.path())
            .args(["peek", &ns.target, "-o", "json", "-q"])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_REGION")
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"))
            .env("AWS_PROFILE", "dlqctl-role"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(records(&o).len(), 2);
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(!all.contains("never-print") && !all.contains("NEVERPRINT"), "{all}");
}
