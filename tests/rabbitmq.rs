//! The RabbitMQ backend against the real broker started by `scripts/brokers up`, from the
//! command line. Tests that change things work on a copy of the seeded story in a vhost of
//! their own; the seeded vhost is only read.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use dlqctl::model::{DeadLetter, Headers, Value};
use dlqctl::redrive::REDRIVE_COUNT_HEADER;
use support::{Namespace, TestBroker, counts, json, ok, records, require, run as dlqctl, seed_counts, text};

const SEED: &str = "rabbitmq://guest:guest@127.0.0.1:5672/seed";

fn seeded(field: &str) -> BTreeMap<String, u64> {
    serde_json::from_value(seed_counts()["rabbitmq"][field].clone()).unwrap()
}

/// A queue's messages, read (and requeued) through dlqctl itself.
fn queue(target: &str, queue: &str) -> Vec<DeadLetter> {
    let base = target.rsplit_once('/').unwrap().0;
    records(&ok(&["peek", &format!("{base}/{queue}"), "-n", "100000", "-o", "json", "-q"]))
}

fn management(method: &str, path: &str, body: Option<&str>) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sf", "-u", "guest:guest", "-X", method, "-H", "content-type: application/json"]);
    if let Some(b) = body {
        cmd.args(["-d", b]);
    }
    let status = cmd.arg(format!("http://127.0.0.1:15672/api/{path}")).status().unwrap();
    assert!(status.success(), "{method} {path}");
}

/// The vhost a fixture namespace lives in (its name, percent-encoded as in its target).
fn vhost_of(ns: &Namespace) -> String {
    ns.target.trim_end_matches("/dlq").rsplit('/').next().unwrap().to_owned()
}

fn letters(n: usize) -> Vec<DeadLetter> {
    (0..n)
        .map(|i| DeadLetter {
            id: format!("l{i}"),
            headers: Headers::new().with("seq", i as i64),
            body: Some(format!("{{\"order\":{i}}}").into_bytes()),
            ..DeadLetter::default()
        })
        .collect()
}

#[test]
fn every_reason_the_broker_wrote_is_decoded() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let dlq = format!("{SEED}/orders.dlq");
    let by_reason = json(&ok(&["summarize", &dlq, "-o", "json", "-q"]));
    assert_eq!(by_reason["total"], seed_counts()["rabbitmq"]["total"]);
    assert_eq!(counts(&by_reason, "reason"), seeded("by_first_reason"));
    let by_source = json(&ok(&["summarize", &dlq, "--by", "source", "-o", "json", "-q"]));
    assert_eq!(counts(&by_source, "source"), seeded("by_source"));
}

#[test]
fn x_death_properties_and_headers_land_in_the_record() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let all = records(&ok(&["export", &format!("{SEED}/orders.dlq"), "-q"]));
    let twice: Vec<&DeadLetter> = all.iter().filter(|l| l.id.starts_with("twice-")).collect();
    assert_eq!(twice.len(), 2);
    for l in &twice {
        let Some(Value::List(deaths)) = l.headers.get("x-death") else { panic!("no x-death") };
        assert_eq!(deaths.len(), 2, "two deaths, newest first");
        assert_eq!(l.failure_count, Some(2));
        assert_eq!(l.source.name.as_deref(), Some("orders.validate"));
        assert!(l.first_failed_at <= l.last_failed_at);
    }
    let expired = all.iter().find(|l| l.id.starts_with("expired-")).unwrap();
    let Some(Value::List(deaths)) = expired.headers.get("x-death") else { panic!() };
    let Value::Table(entry) = &deaths[0] else { panic!() };
    assert_eq!(entry.get("original-expiration"), Some(&Value::String("100".into())));
    let policy = all.iter().find(|l| l.id.starts_with("policy-")).unwrap();
    assert_eq!(policy.source.routing_keys, ["invoice.created"], "x-death keeps the original key");
    assert_eq!(policy.extras.get("routing_key"), Some(&Value::String("dead.invoices".into())));
    let Some(Value::Table(props)) = policy.extras.get("properties") else { panic!() };
    for p in ["message_id", "correlation_id", "content_type", "app_id", "delivery_mode", "timestamp"] {
        assert!(props.get(p).is_some(), "property {p}");
    }
    assert!(all.iter().any(|l| l.body.as_deref() == Some(&[][..])), "an empty body");
    assert!(all.iter().any(|l| std::str::from_utf8(l.body_bytes()).is_err()), "a binary body");
}

#[test]
fn list_shows_dead_letter_queues_and_their_sources() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let report = json(&ok(&["list", SEED, "-o", "json"]));
    let dlqs = report["dlqs"].as_array().unwrap();
    let dlq = dlqs.iter().find(|d| d["name"] == "orders.dlq").expect("orders.dlq listed");
    let sources: HashSet<&str> = dlq["sources"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    for s in ["orders", "orders.delayed", "orders.priority", "payments", "invoices", "orders.retry"] {
        assert!(sources.contains(s), "{s} feeds orders.dlq: {sources:?}");
    }
    assert_eq!(dlq["retention"], 14 * 86_400);
    assert!(dlqs.iter().any(|d| d["name"] == "orders.retry"), "the retry queue receives dead letters too");
}

#[test]
fn a_missing_dlx_and_an_unbounded_quorum_queue_are_flagged() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let ns = Namespace::create(TestBroker::Rabbitmq, &letters(1));
    let vhost = vhost_of(&ns);
    management(
        "PUT",
        &format!("queues/{vhost}/lost"),
        Some(r#"{"durable":true,"arguments":{"x-dead-letter-exchange":"no-such-dlx"}}"#),
    );
    management(
        "PUT",
        &format!("queues/{vhost}/loop"),
        Some(r#"{"durable":true,"arguments":{"x-queue-type":"quorum"}}"#),
    );
    let base = ns.target.trim_end_matches("/dlq");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let notes = json(&ok(&["list", base, "-o", "json"]))["dlqs"].to_string();
        if notes.contains("no-such-dlx") && notes.contains("quorum queue loop has no delivery limit") {
            assert!(notes.contains("dropped"), "{notes}");
            break;
        }
        // The management API needs a few seconds to see new queues.
        assert!(Instant::now() < deadline, "not flagged: {notes}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn peek_leaves_the_queue_as_it_was() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let ns = Namespace::create(TestBroker::Rabbitmq, &letters(5));
    let first = records(&ok(&["peek", &ns.target, "-n", "3", "-o", "json", "-q"]));
    assert_eq!(first.len(), 3);
    let o = ok(&["peek", &ns.target, "-n", "10", "-o", "json"]);
    assert!(text(&o.stderr).contains("redelivered"), "the cost is stated: {}", text(&o.stderr));
    let again = records(&o);
    assert_eq!(again.len(), 5, "nothing consumed");
    assert_eq!(again[0].id, first[0].id, "order kept");
}

#[test]
fn redrive_returns_each_message_to_its_first_death_with_its_original_key() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let story = Namespace::create_kind(TestBroker::Rabbitmq, "rabbitmq-story", &[]);
    let before = records(&ok(&["export", &story.target, "-q"]));
    // orders.priority holds at most 2: what goes back there overflows and dies again.
    let o = ok(&[
        "redrive",
        &story.target,
        "--where",
        "source!=orders.priority",
        "--yes",
        "--rate",
        "unlimited",
        "-q",
        "-o",
        "json",
    ]);
    assert_eq!(json(&o)["summary"]["moved"], 25);
    let left: Vec<String> = queue(&story.target, "orders.dlq").into_iter().map(|m| m.id).collect();
    assert_eq!(left.len(), 4, "only the overflow messages stay: {left:?}");
    assert!(left.iter().all(|id| id.starts_with("maxlen-")));

    // The policy DLX delivered them as dead.invoices; they go back as invoice.created.
    let invoices = queue(&story.target, "invoices");
    assert_eq!(invoices.len(), 3);
    for m in &invoices {
        assert_eq!(m.extras.get("routing_key"), Some(&Value::String("invoice.created".into())));
        assert_eq!(m.extras.get("exchange"), Some(&Value::String("orders".into())));
        assert_eq!(m.headers.get(REDRIVE_COUNT_HEADER), Some(&Value::Int(1)));
    }
    // Died twice: back to where it first died, not to the retry queue.
    assert_eq!(queue(&story.target, "orders.validate").len(), 2);
    // Bodies (binary and empty too) and properties survive the trip.
    let back = queue(&story.target, "orders");
    assert_eq!(back.len(), 12);
    for m in &back {
        let original = before.iter().find(|o| o.id == m.id).expect("same message id");
        assert_eq!(m.body, original.body, "{}", m.id);
        assert_eq!(m.extras.get("properties"), original.extras.get("properties"));
        assert_eq!(m.headers.get("tenant"), original.headers.get("tenant"));
    }
}

#[test]
fn a_thousand_messages_at_200_per_second_none_lost() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let ns = Namespace::create(TestBroker::Rabbitmq, &letters(1000));
    let audit = tempfile::NamedTempFile::new().unwrap();
    let started = Instant::now();
    let o = ok(&[
        "redrive",
        &ns.target,
        "--yes",
        "--rate",
        "200",
        "-o",
        "json",
        "-q",
        "--audit-log",
        audit.path().to_str().unwrap(),
    ]);
    let elapsed = started.elapsed();
    assert_eq!(json(&o)["summary"]["moved"], 1000);
    let source = queue(&ns.target, "source");
    let seqs: HashSet<String> = source.iter().map(|m| m.headers.get("seq").unwrap().to_string()).collect();
    assert_eq!(seqs.len(), 1000, "every message is back in its source, once");
    assert!(queue(&ns.target, "dlq").is_empty());
    // The pace held: 1,000 at 200/s cannot finish in much under five seconds.
    assert!(elapsed >= Duration::from_millis(4_500), "{elapsed:?}");
    let times: Vec<f64> = std::fs::read_to_string(audit.path())
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["outcome"] == "moved")
        .map(|l| dlqctl::model::parse_time(l["time"].as_str().unwrap()).unwrap().timestamp_micros() as f64 / 1e6)
        .collect();
    let busiest = times.iter().map(|t| times.iter().filter(|u| **u >= *t && **u < t + 1.0).count()).max().unwrap();
    assert!(busiest <= 220, "no second above 110% of the rate: {busiest}");
}

#[test]
fn a_deleted_destination_exchange_stops_the_run_and_loses_nothing() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let ns = Namespace::create_kind(TestBroker::Rabbitmq, "rabbitmq-exchange", &letters(200));
    let vhost = vhost_of(&ns);
    let state = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_dlqctl"))
        .args(["redrive", &ns.target, "--yes", "--rate", "50", "-o", "json", "-q"])
        .env("XDG_STATE_HOME", state.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    management("DELETE", &format!("exchanges/{vhost}/orders"), None);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("in a row"), "{}", text(&o.stderr));
    let summary = &json(&o)["summary"];
    let moved = summary["moved"].as_u64().unwrap();
    assert!(moved > 0 && moved < 200, "stopped part way: {summary}");
    // Everything not delivered is still in the DLQ; what was delivered is in the source.
    let in_dlq = queue(&ns.target, "dlq").len() as u64;
    let in_source = queue(&ns.target, "source").len() as u64;
    assert_eq!(in_dlq + in_source, 200, "{summary}");
    assert_eq!(in_source, moved);
    let audit_line = std::fs::read_to_string(support::run_file(state.path(), ".audit.jsonl")).unwrap();
    assert!(audit_line.contains("NOT_FOUND"), "the reason is recorded");
}

#[test]
fn credentials_never_appear_in_output_or_errors() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let ns = Namespace::create(TestBroker::Rabbitmq, &letters(3));
    let vhost = vhost_of(&ns);
    let password = "pw-9f3c1e-never-print";
    let user = format!("user-{vhost}");
    management("PUT", &format!("users/{user}"), Some(&format!(r#"{{"password":"{password}","tags":"management"}}"#)));
    management("PUT", &format!("permissions/{vhost}/{user}"), Some(r#"{"configure":".*","write":".*","read":".*"}"#));
    let dlq = format!("rabbitmq://{user}:{password}@127.0.0.1:5672/{vhost}/dlq");
    let base = format!("rabbitmq://{user}:{password}@127.0.0.1:5672/{vhost}");
    let wrong = format!("rabbitmq://{user}:{password}-wrong@127.0.0.1:5672/{vhost}/dlq");
    let out = tempfile::tempdir().unwrap();
    let replay = out.path().join("replay.jsonl");
    let runs: Vec<Vec<String>> = vec![
        vec!["list".into(), base.clone()],
        vec!["peek".into(), dlq.clone(), "--full".into()],
        vec!["summarize".into(), dlq.clone(), "-o".into(), "json".into()],
        vec!["export".into(), dlq.clone()],
        vec!["redrive".into(), dlq.clone(), "--dry-run".into()],
        vec!["redrive".into(), dlq.clone(), "--yes".into(), "--to".into(), replay.to_str().unwrap().into()],
        vec!["peek".into(), wrong],
        vec!["peek".into(), format!("rabbitmq://{user}:{password}@127.0.0.1:1/{vhost}/dlq")],
    ];
    for args in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = dlqctl(&args);
        let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
        assert!(!all.contains(password), "{args:?} printed the password:\n{all}");
    }
    let state_files = std::fs::read_to_string(&replay).unwrap_or_default();
    assert!(!state_files.contains(password));
    management("DELETE", &format!("users/{user}"), None);
}

#[test]
fn a_quorum_dlq_with_a_delivery_limit_is_read_only_with_force() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let ns = Namespace::create(TestBroker::Rabbitmq, &letters(1));
    let vhost = vhost_of(&ns);
    management(
        "PUT",
        &format!("queues/{vhost}/qdlq"),
        Some(r#"{"durable":true,"arguments":{"x-queue-type":"quorum","x-delivery-limit":3}}"#),
    );
    let target = format!("{}/qdlq", ns.target.trim_end_matches("/dlq"));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let o = dlqctl(&["peek", &target]);
        if o.status.code() == Some(2) {
            assert!(text(&o.stderr).contains("--force"), "{}", text(&o.stderr));
            break;
        }
        // Until the management API sees the new queue it cannot tell its type.
        assert!(Instant::now() < deadline, "never refused: {}", text(&o.stderr));
        std::thread::sleep(Duration::from_millis(500));
    }
    ok(&["peek", &target, "--force"]);
}

#[test]
fn summarize_by_exchange_routing_key_and_an_application_header() {
    let Some(_) = require(TestBroker::Rabbitmq) else {
        return;
    };
    let dlq = format!("{SEED}/orders.dlq");
    let by_exchange = counts(&json(&ok(&["summarize", &dlq, "--by", "exchange", "-o", "json", "-q"])), "exchange");
    assert_eq!(by_exchange.get("orders"), Some(&15));
    assert_eq!(by_exchange.get("(default exchange)"), Some(&14));
    let by_key = counts(&json(&ok(&["summarize", &dlq, "--by", "routing-key", "-o", "json", "-q"])), "routing_key");
    assert_eq!(by_key.get("invoice.created"), Some(&3), "the original key, not the DLX's: {by_key:?}");
    let by_header =
        json(&ok(&["summarize", &dlq, "--by", "exception", "--reason-from", "header:tenant", "-o", "json", "-q"]));
    let tenants = counts(&by_header, "exception");
    assert_eq!(tenants.keys().collect::<Vec<_>>(), ["acme", "globex"]);
    assert_eq!(tenants.values().sum::<u64>(), 29);
}

#[test]
fn a_destination_the_user_may_not_write_to_leaves_every_message_in_the_dlq() {
    let Some(_) = require(TestBroker::Rabbitmq) else { return };
    let ns = Namespace::create_kind(TestBroker::Rabbitmq, "rabbitmq-exchange", &letters(6));
    let vhost = vhost_of(&ns);
    let user = format!("reader-{vhost}");
    management("PUT", &format!("users/{user}"), Some(r#"{"password":"reader-pw-never-print","tags":"management"}"#));
    // May read and acknowledge in the DLQ, may not publish to the `orders` exchange.
    management("PUT", &format!("permissions/{vhost}/{user}"), Some(r#"{"configure":"","write":"^$","read":".*"}"#));
    let target = ns.target.replacen("guest:guest", &format!("{user}:reader-pw-never-print"), 1);
    let o = dlqctl(&["redrive", &target, "--yes", "-o", "json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let summary = &json(&o)["summary"];
    assert_eq!(summary["moved"], 0, "{summary}");
    assert_eq!(queue(&ns.target, "dlq").len(), 6, "every message stays");
    assert!(queue(&ns.target, "source").is_empty());
    management("DELETE", &format!("users/{user}"), None);
}

/// Hostile letters from an archive redriven into RabbitMQ: empty, non-UTF-8, 2 MB, deeply
/// nested headers and duplicated ids all arrive intact; a header name AMQP cannot carry (over
/// 255 bytes) is refused for that message alone, which stays in the archive with its reason.
#[test]
fn hostile_letters_arrive_intact_or_are_refused_one_by_one() {
    let Some(_) = require(TestBroker::Rabbitmq) else { return };
    let ns = Namespace::create(TestBroker::Rabbitmq, &[]);
    let mut nested = Value::String("bottom".into());
    for _ in 0..32 {
        nested = Value::Table(Headers::new().with("inner", nested));
    }
    let letter = |id: &str, body: Vec<u8>, headers: Headers| DeadLetter {
        id: id.into(),
        headers,
        body: Some(body),
        ..DeadLetter::default()
    };
    let hostile = [
        letter("empty", Vec::new(), Headers::new().with("seq", 0i64)),
        letter("binary", vec![0xff, 0xfe, 0x00, 0xc3, 0x28], Headers::new().with("seq", 1i64)),
        letter("big", vec![b'x'; 2 << 20], Headers::new().with("seq", 2i64)),
        letter("deep", b"{}".to_vec(), Headers::new().with("seq", 3i64).with("nested", nested)),
        letter("twice", b"first".to_vec(), Headers::new().with("seq", 4i64)),
        letter("twice", b"second".to_vec(), Headers::new().with("seq", 5i64)),
        letter("long-name", b"{}".to_vec(), Headers::new().with("seq", 6i64).with("h".repeat(300), "v")),
    ];
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("hostile.jsonl");
    std::fs::write(&archive, support::jsonl(&hostile)).unwrap();
    let source = format!("{}/source", ns.target.trim_end_matches("/dlq"));

    let o = dlqctl(&["redrive", archive.to_str().unwrap(), "--to", &source, "--yes", "-o", "json", "-q"]);
    assert!(!o.stdout.is_empty(), "{}", text(&o.stderr));
    let summary = &json(&o)["summary"];
    assert_eq!((summary["moved"].as_u64(), summary["failed"].as_u64()), (Some(6), Some(1)), "{summary}");
    let left = std::fs::read_to_string(&archive).unwrap();
    assert!(left.contains("long-name") && left.lines().count() == 1, "only the refused one stays: {left}");

    let arrived = queue(&ns.target, "source");
    let by_seq = |seq: i64| arrived.iter().find(|l| l.headers.get("seq") == Some(&Value::Int(seq))).unwrap();
    for (seq, original) in hostile.iter().enumerate().take(6) {
        let copy = by_seq(seq as i64);
        assert_eq!(copy.body_bytes(), original.body_bytes(), "{} body", original.id);
        assert_eq!(copy.headers.get("nested"), original.headers.get("nested"), "{} nested header", original.id);
    }
}

/// AMQPS on the listener `scripts/brokers up` opens with its test CA: it requires a client
/// certificate. With the CA and the certificate, dlqctl reads and redrives over TLS; without
/// either, it stops at the handshake with one line.
#[test]
fn amqps_with_a_ca_and_a_client_certificate() {
    let Some(_) = require(TestBroker::Rabbitmq) else { return };
    let tls = support::brokers_dir().join("tls");
    let port = std::env::var("DLQCTL_RABBITMQ_TLS_PORT").unwrap_or_else(|_| "5671".into());
    let ns = Namespace::create(TestBroker::Rabbitmq, &letters(5));
    let plain_port = format!(":{}/", TestBroker::Rabbitmq.addr().port());
    let base = ns.target.replacen("rabbitmq://", "rabbitmqs://", 1).replacen(&plain_port, &format!(":{port}/"), 1);
    let file = |name: &str| tls.join(name).display().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let full = format!("{base}?cacert={ca}&cert={cert}&key={key}");

    let read = records(&ok(&["export", &full, "-q"]));
    assert_eq!(read.len(), 5, "read over TLS");
    let o = dlqctl(&["redrive", &full, "--yes", "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json(&o)["summary"]["moved"], 5, "moved over TLS");

    for (why, target) in [
        ("no client certificate", format!("{base}?cacert={ca}")),
        ("a server signed by an unknown CA", format!("{base}?cert={cert}&key={key}")),
    ] {
        let o = dlqctl(&["peek", &target, "-q"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{why}: {err}");
        assert_eq!(err.lines().count(), 1, "{why}: one line: {err}");
        assert!(err.starts_with("dlqctl: cannot connect to rabbitmqs://guest:****@"), "{why}: {err}");
    }
}
