//! The Kafka backend against Tansu started by `scripts/brokers up`, from the command line.
//! The seeded topics are only read; tests that move records use topics of their own.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::process::Output;
use std::time::{Duration, Instant};

use dlqctl::model::{DeadLetter, Headers};
use support::{Namespace, TestBroker, counts, json, ok, records, require, seed_counts, text};

fn dlqctl(args: &[&str], state: &std::path::Path) -> Output {
    support::output(support::dlqctl(state).args(args))
}

const KAFKA: &str = "kafka://127.0.0.1:9092";

fn letters(n: usize) -> Vec<DeadLetter> {
    (0..n)
        .map(|i| DeadLetter {
            id: format!("l{i}"),
            headers: Headers::new().with("seq", i as i64),
            body: Some(format!("{{\"order\":{i},\"keep\":{}}}", i % 4 != 1).into_bytes()),
            ..DeadLetter::default()
        })
        .collect()
}

/// The namespace's source topic (the DLT's original topic), read from the beginning.
fn source_records(ns: &Namespace) -> Vec<DeadLetter> {
    let source = ns.target.trim_end_matches(".DLT");
    records(&ok(&["export", source, "--from-beginning", "-q"]))
}

fn pending(target: &str) -> u64 {
    json(&ok(&["list", target, "-o", "json"]))["dlqs"][0]["depth"].as_u64().unwrap()
}

#[test]
fn spring_headers_decode_with_binary_partition_and_offset() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let dlt = format!("{KAFKA}/orders.DLT");
    let seed = &seed_counts()["kafka"]["dlts"]["orders.DLT"];
    let by_exception = json(&ok(&["summarize", &dlt, "--by", "exception", "-o", "json", "-q", "--from-beginning"]));
    let expected: BTreeMap<String, u64> = serde_json::from_value(seed["by_exception"].clone()).unwrap();
    assert_eq!(counts(&by_exception, "exception"), expected);
    let all = records(&ok(&["export", &dlt, "-q", "--from-beginning"]));
    assert_eq!(all.len() as u64, seed["total"].as_u64().unwrap());
    for l in &all {
        assert_eq!(l.source.name.as_deref(), Some("orders"));
        assert_eq!(l.source.partition, l.extras.get("partition").map(|p| p.to_string().parse().unwrap()));
        assert!(l.source.offset.is_some_and(|o| o >= 1000), "{:?}", l.source);
        assert!(l.reason.cause_class.is_some());
    }
    let nulls = all.iter().filter(|l| l.body.is_none()).count() as u64;
    assert_eq!(nulls, seed["null_values"].as_u64().unwrap(), "null values stay null");
    let keyless = all.iter().filter(|l| l.extras.get("key").is_none()).count() as u64;
    assert_eq!(keyless, seed["null_keys"].as_u64().unwrap(), "null keys stay absent");
    let partitions: HashSet<String> = all.iter().map(|l| l.extras.get("partition").unwrap().to_string()).collect();
    assert_eq!(partitions.len(), 3);
}

#[test]
fn connect_headers_decode() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let dlt = format!("{KAFKA}/dlq-orders-jdbc-sink");
    let by_exception = json(&ok(&["summarize", &dlt, "--by", "exception", "-o", "json", "-q", "--from-beginning"]));
    let expected: BTreeMap<String, u64> =
        serde_json::from_value(seed_counts()["kafka"]["dlts"]["dlq-orders-jdbc-sink"]["by_exception"].clone()).unwrap();
    assert_eq!(counts(&by_exception, "exception"), expected);
    let by_source = json(&ok(&["summarize", &dlt, "--by", "source", "-o", "json", "-q", "--from-beginning"]));
    assert_eq!(counts(&by_source, "source"), BTreeMap::from([("orders".into(), 10)]));
}

/// With nothing to select or change, export writes each record as librdkafka holds it; with a
/// redaction it goes through whole letters. Spring and Connect headers, null values, null keys
/// and binary values come out the same either way.
#[test]
fn export_writes_the_same_lines_from_records_as_from_letters() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    for dlt in ["orders.DLT", "dlq-orders-jdbc-sink"] {
        let target = format!("{KAFKA}/{dlt}");
        let as_shown = ok(&["export", &target, "-q", "--from-beginning"]).stdout;
        let redacted = ok(&["export", &target, "-q", "--from-beginning", "--redact", "header.no-such-header"]).stdout;
        assert!(!as_shown.is_empty(), "{dlt}");
        assert_eq!(text(&as_shown), text(&redacted), "{dlt}");
    }
}

#[test]
fn list_finds_dead_letter_topics_by_name() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let report = json(&ok(&["list", KAFKA, "-o", "json"]));
    let names: HashSet<&str> = report["dlqs"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert!(names.contains("orders.DLT") && names.contains("dlq-orders-jdbc-sink"), "{names:?}");
    assert!(!names.contains("orders"), "a source topic is not a DLT");
    let dlt = report["dlqs"].as_array().unwrap().iter().find(|d| d["name"] == "orders.DLT").unwrap();
    assert_eq!(dlt["retention"], 14 * 86_400);
    assert_eq!(dlt["sources"], serde_json::json!(["orders"]));
    let custom = json(&ok(&["list", &format!("{KAFKA}?pattern=^orders$"), "-o", "json"]));
    assert_eq!(custom["dlqs"].as_array().unwrap().len(), 1, "the pattern is configurable");
}

#[test]
fn peek_has_no_side_effects_and_says_so() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let ns = Namespace::create(TestBroker::Kafka, &letters(5));
    let before = pending(&ns.target);
    let state = tempfile::tempdir().unwrap();
    let o = dlqctl(&["peek", &ns.target, "-n", "3"], state.path());
    assert!(text(&o.stderr).contains("without joining group"), "{}", text(&o.stderr));
    assert_eq!(pending(&ns.target), before);
    assert_eq!(before, 5);
}

#[test]
fn summarize_reads_bodies_and_headers_only_when_where_or_reason_from_looks_into_them() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let ns = Namespace::create(TestBroker::Kafka, &letters(8));
    let total = |args: &[&str]| {
        let mut all = vec!["summarize", ns.target.as_str(), "-o", "json", "-q"];
        all.extend_from_slice(args);
        json(&ok(&all))
    };
    assert_eq!(total(&[])["total"], 8);
    // letters() marks every fourth body from the second on "keep": false.
    assert_eq!(total(&["--where", "body.keep=false"])["total"], 2, "a body predicate still sees the bodies");
    let by_keep = total(&["--reason-from", "body.keep", "--by", "exception"]);
    assert_eq!(counts(&by_keep, "exception"), BTreeMap::from([("false".into(), 2), ("true".into(), 6)]));
    // Without such a predicate the headers are left in the record, not the failure they describe.
    assert_eq!(total(&["--where", "header.seq~^[5-7]$"])["total"], 3, "a header predicate still sees the headers");
    assert_eq!(total(&["--where", "header.partition=0"])["total"], 8, "and dlqctl's extras");
    let by_seq = total(&["--reason-from", "header:seq", "--by", "exception"]);
    assert_eq!(counts(&by_seq, "exception").len(), 8);
    // The Spring headers are still decoded: every letter names the namespace's source topic.
    let source = ns.target.rsplit('/').next().unwrap().trim_end_matches(".DLT");
    assert_eq!(counts(&total(&["--by", "source"]), "source"), BTreeMap::from([(source.to_owned(), 8)]));
}

#[test]
fn a_thousand_records_at_200_per_second_none_lost_offsets_committed() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let ns = Namespace::create_kind(TestBroker::Kafka, "kafka-3", &letters(1000));
    let started = Instant::now();
    let o = ok(&["redrive", &ns.target, "--yes", "--rate", "200", "-o", "json", "-q"]);
    assert_eq!(json(&o)["summary"]["moved"], 1000);
    assert!(started.elapsed() >= Duration::from_millis(4_500), "the pace held: {:?}", started.elapsed());
    assert_eq!(pending(&ns.target), 0, "offsets committed past every settled record");
    let back = source_records(&ns);
    let seqs: HashSet<String> = back.iter().map(|l| l.headers.get("seq").unwrap().to_string()).collect();
    assert_eq!((back.len(), seqs.len()), (1000, 1000), "each record once");
}

#[test]
fn keep_partition_sends_each_copy_to_its_original_partition() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let ns = Namespace::create_kind(TestBroker::Kafka, "kafka-3", &letters(9));
    ok(&["redrive", &ns.target, "--yes", "--keep-partition", "--rate", "unlimited", "-q"]);
    for l in source_records(&ns) {
        assert_eq!(l.extras.get("partition").unwrap().to_string(), "0", "the fixture's original partition is 0");
    }
}

#[test]
fn skipped_records_stay_pending_and_the_others_are_not_sent_twice() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let ns = Namespace::create(TestBroker::Kafka, &letters(12));
    let state = tempfile::tempdir().unwrap();
    // Every fourth record (keep=false) is left behind; it holds its partition's commit back.
    let o = dlqctl(&["redrive", &ns.target, "--where", "body.keep=true", "--yes", "-o", "json", "-q"], state.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json(&o)["summary"]["moved"], 9);
    assert_eq!(source_records(&ns).len(), 9);
    let checkpoint = support::run_file(state.path(), ".checkpoint.jsonl");
    // The next run (resuming from the checkpoint) sends only the three left behind.
    let o = dlqctl(
        &["redrive", &ns.target, "--yes", "-o", "json", "-q", "--resume", checkpoint.to_str().unwrap()],
        state.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let back = source_records(&ns);
    let seqs: HashSet<String> = back.iter().map(|l| l.headers.get("seq").unwrap().to_string()).collect();
    assert_eq!((back.len(), seqs.len()), (12, 12), "nothing sent twice");
    assert_eq!(pending(&ns.target), 0);
}

/// Records of several MB (a topic configured for them) are read, exported and redriven byte
/// for byte: dlqctl's producer leaves the size limit to the broker.
#[test]
fn records_of_several_megabytes_are_read_and_redriven_intact() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let mut letters = letters(3);
    let big: Vec<u8> = (0..3 * 1024 * 1024).map(|i: u32| (i % 251) as u8).collect();
    letters[1].body = Some(big.clone());
    let ns = Namespace::create(TestBroker::Kafka, &letters);
    let read = records(&ok(&["export", &ns.target, "-q"]));
    assert_eq!(read.len(), 3);
    assert!(read.iter().any(|l| l.body_bytes() == big.as_slice()), "the 3 MB record exports intact");
    let state = tempfile::tempdir().unwrap();
    let o = dlqctl(&["redrive", &ns.target, "--yes", "--rate", "unlimited", "-o", "json"], state.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json(&o)["summary"]["moved"], 3);
    let copies = source_records(&ns);
    assert!(copies.iter().any(|l| l.body_bytes() == big.as_slice()), "the 3 MB copy arrived intact");
}

#[test]
fn a_missing_destination_topic_stops_the_run_and_commits_nothing_past_it() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let ns = Namespace::create_kind(TestBroker::Kafka, "kafka-orphan", &letters(20));
    let state = tempfile::tempdir().unwrap();
    let o = dlqctl(&["redrive", &ns.target, "--yes", "-o", "json"], state.path());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("in a row"), "{err}");
    assert_eq!(json(&o)["summary"]["moved"], 0);
    assert_eq!(pending(&ns.target), 20, "nothing committed");
}

#[test]
fn an_unreachable_bootstrap_is_a_one_line_error_in_bounded_time() {
    let state = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let o = dlqctl(&["peek", "kafka://127.0.0.1:1/orders.DLT"], state.path());
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach Kafka") && err.contains("127.0.0.1:1"), "{err}");
}

#[test]
fn a_missing_topic_is_a_one_line_error() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let state = tempfile::tempdir().unwrap();
    let o = dlqctl(&["peek", &format!("{KAFKA}/no-such-topic.DLT")], state.path());
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("does not exist"), "{}", text(&o.stderr));
}

/// librdkafka properties from the config file reach the client, and a SASL password given as
/// `password_env` never shows. Tansu has no SASL listener, so the SASL target cannot connect;
/// what it must do is fail in bounded time with one line and no password in it.
#[test]
fn client_properties_from_the_config_file_reach_librdkafka() {
    let Some(_) = require(TestBroker::Kafka) else { return };
    let ns = Namespace::create(TestBroker::Kafka, &letters(3));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[targets.plain]
url = "{t}"
[targets.plain.kafka]
"client.id" = "dlqctl-config-test"

[targets.sasl]
url = "{t}"
password_env = "DLQCTL_TEST_KAFKA_PASSWORD"
[targets.sasl.kafka]
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "PLAIN"
"sasl.username" = "dlqctl"

[targets.ssl]
url = "{t}"
[targets.ssl.kafka]
"security.protocol" = "SSL"
"#,
            t = ns.target
        ),
    )
    .unwrap();
    let peek = |name: &str| {
        support::output(
            support::dlqctl(dir.path())
                .args(["--config", config.to_str().unwrap(), "--timeout", "20", "peek", name, "-o", "json", "-q"])
                .env("DLQCTL_TEST_KAFKA_PASSWORD", "never-print-kafka-sasl"),
        )
    };
    let o = peek("plain");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(records(&o).len(), 3);
    for name in ["sasl", "ssl"] {
        let started = Instant::now();
        let o = peek(name);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: one line: {err}");
        assert!(started.elapsed() < Duration::from_secs(60), "{name}: bounded");
        assert!(!err.contains("never-print") && !text(&o.stdout).contains("never-print"), "{err}");
    }
}

/// The SCRAM user `scripts/brokers up` creates on its TLS and SASL Tansu (a test credential).
const SCRAM_PASSWORD: &str = "never-print-kafka-scram";

/// A production-style cluster: TLS with the cluster's CA and a client certificate, then
/// SASL/SCRAM-SHA-512, all as librdkafka properties in the config file with the password from
/// the environment. Reads and a redrive go through; a wrong password, a missing client
/// certificate and an unknown CA each fail in one line, in bounded time, naming no secret.
#[test]
fn sasl_ssl_with_scram_and_a_client_certificate() {
    let Some(addr) = support::require_kafka_secure() else { return };
    let tls = support::brokers_dir().join("tls");
    let file = |name: &str| tls.join(name).display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    // A consumer group of this run's own: a redrive commits its offsets, and the fixture's DLT
    // must hold the same three letters for the next run.
    let group = format!("tls-{}-{}", std::process::id(), chrono::Utc::now().timestamp_millis());
    let target = |name: &str, properties: &str| {
        format!(
            "[targets.{name}]\nurl = \"kafka://{addr}/secure.DLT?group={group}\"\npassword_env = \"DLQCTL_TEST_SCRAM\"\n\
             [targets.{name}.kafka]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"SCRAM-SHA-512\"\n\
             \"sasl.username\" = \"dlqctl\"\n{properties}\n"
        )
    };
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let full = format!(
        "\"ssl.ca.location\" = \"{ca}\"\n\"ssl.certificate.location\" = \"{cert}\"\n\"ssl.key.location\" = \"{key}\""
    );
    let no_cert = format!("\"ssl.ca.location\" = \"{ca}\"");
    let no_ca = format!("\"ssl.certificate.location\" = \"{cert}\"\n\"ssl.key.location\" = \"{key}\"");
    std::fs::write(&config, [target("secure", &full), target("no_cert", &no_cert), target("no_ca", &no_ca)].concat())
        .unwrap();
    let run = |args: &[&str], password: &str| {
        support::output(
            support::dlqctl(dir.path())
                .args(["--config", config.to_str().unwrap(), "--timeout", "20"])
                .args(args)
                .env("DLQCTL_TEST_SCRAM", password),
        )
    };

    let o = run(&["export", "secure", "-q", "--from-beginning"], SCRAM_PASSWORD);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let read = records(&o);
    assert_eq!(read.len(), 3, "the fixture's three letters, read over SASL_SSL");
    assert_eq!(read[0].source.name.as_deref(), Some("secure"));

    let o = run(&["redrive", "secure", "--yes", "-o", "json"], SCRAM_PASSWORD);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json(&o)["summary"]["moved"], 3, "moved over SASL_SSL");

    // librdkafka's own reason, at once rather than after the timeout: nothing to retry.
    for (why, name, password, cause) in [
        ("a wrong password", "secure", "never-print-wrong", "SASL authentication error"),
        ("no client certificate", "no_cert", SCRAM_PASSWORD, "certificate required"),
        ("an unknown CA", "no_ca", SCRAM_PASSWORD, "certificate verify failed"),
    ] {
        let started = Instant::now();
        let o = run(&["peek", name, "-q"], password);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{why}: {err}");
        assert_eq!(err.lines().count(), 1, "{why}: one line: {err}");
        assert!(err.starts_with("dlqctl: cannot connect to Kafka at kafka://") && err.contains(cause), "{why}: {err}");
        assert!(started.elapsed() < Duration::from_secs(8), "{why}: within seconds, not the timeout");
        assert!(!err.contains("never-print") && !text(&o.stdout).contains("never-print"), "{why}: {err}");
    }
}
