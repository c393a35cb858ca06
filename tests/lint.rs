//! `dlqctl lint` from the command line: offline fixtures for every rule, SARIF checked against
//! the 2.1.0 schema, config thresholds and waivers, exit codes, and the seeded brokers live.

mod support;

use std::collections::BTreeSet;
use std::process::Output;

use support::{TestBroker, json, require, run as dlqctl, text};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/lint");

fn fixture(name: &str) -> String {
    format!("{FIXTURES}/{name}")
}

/// (rule, queue, waived) of every finding.
fn findings(report: &serde_json::Value) -> BTreeSet<(String, String, bool)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["rule"].as_str().unwrap().into(), f["queue"].as_str().unwrap().into(), f.get("waived").is_some()))
        .collect()
}

fn set(items: &[(&str, &str, bool)]) -> BTreeSet<(String, String, bool)> {
    items.iter().map(|(r, q, w)| ((*r).into(), (*q).into(), *w)).collect()
}

fn offline_args(format: &str) -> Vec<String> {
    let mut args = vec!["lint".to_owned(), "--format".into(), format.into()];
    for (flag, file) in [
        ("--template", "template.yaml"),
        ("--template", "template.json"),
        ("--rules", "rules.yml"),
        ("--alerts", "alerts.toml"),
    ] {
        args.push(flag.into());
        args.push(fixture(file));
    }
    args
}

fn run(args: &[String]) -> Output {
    dlqctl(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn offline_inputs_report_exactly_their_problems() {
    let o = run(&offline_args("json"));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert_eq!(
        findings(&json(&o)),
        set(&[
            ("DLQ006", "audit", false),
            ("DLQ001", "fulfilment-dlq", true),
            ("DLQ002", "invoices-dlq", true),
            ("DLQ008", "orders", false),
            ("DLQ002", "orders-dlq", false),
            ("DLQ003", "orders-dlq", false),
            ("DLQ004", "orders-dlq", false),
            ("DLQ005", "orders-dlq", false),
            ("DLQ007", "orders-dlq", false),
            ("DLQ008", "refunds", false),
        ])
    );
    // payments-dlq is set up well (depth alarm `>= 1` within a minute, an age alarm): no finding.
}

#[test]
fn text_names_file_line_rule_queue_and_fix() {
    let o = run(&offline_args("text"));
    assert_eq!(o.status.code(), Some(3));
    let out = text(&o.stdout);
    assert!(
        out.contains("template.yaml:66: warning DLQ003 depth alarm OrdersDlqDepth on orders-dlq fires only above 50 messages and waits 3h0m"),
        "{out}"
    );
    assert!(out.contains("fix: Give the DLQ a longer retention"), "{out}");
    assert!(out.contains("(waived: drained daily by the fulfilment batch job"), "{out}");
    assert!(out.lines().last().unwrap().contains("2 waived"), "{out}");
}

#[test]
fn prometheus_rules_cover_rabbitmq_and_kafka_dlqs() {
    // The rule file alone has no queues; with a template whose DLQs it names by label it counts.
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("t.yaml");
    std::fs::write(
        &template,
        "Resources:\n  OrdersDlq:\n    Type: AWS::SQS::Queue\n    Properties:\n      QueueName: orders.dlq\n      MessageRetentionPeriod: 1209600\n",
    )
    .unwrap();
    let o = dlqctl(&["lint", "--template", template.to_str().unwrap(), "--rules", &fixture("rules.yml"), "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "depth and age alerts by queue label: {}", text(&o.stdout));
}

#[test]
fn sarif_is_valid_2_1_0_with_rules_locations_and_suppressions() {
    let o = run(&offline_args("sarif"));
    assert_eq!(o.status.code(), Some(3));
    let sarif = json(&o);
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("../sarif-schema-2.1.0.json")).unwrap()).unwrap();
    let validator = jsonschema::draft4::new(&schema).unwrap();
    let errors: Vec<String> =
        validator.iter_errors(&sarif).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let run = &sarif["runs"][0];
    assert_eq!(run["tool"]["driver"]["rules"].as_array().unwrap().len(), 12, "every rule documented");
    let results = run["results"].as_array().unwrap();
    assert_eq!(results.len(), 11, "DLQ005 fires once per source of orders-dlq");
    let located = results.iter().find(|r| r["ruleId"] == "DLQ003").unwrap();
    let region = &located["locations"][0]["physicalLocation"];
    assert!(region["artifactLocation"]["uri"].as_str().unwrap().ends_with("template.yaml"));
    assert_eq!(region["region"]["startLine"], 66);
    assert_eq!(results.iter().filter(|r| r.get("suppressions").is_some()).count(), 2);
}

#[test]
fn config_sets_thresholds_severities_and_waivers() {
    let o = dlqctl(&[
        "lint",
        "--template",
        &fixture("template.yaml"),
        "--config",
        &fixture("lint-config.toml"),
        "--format",
        "json",
    ]);
    let found = findings(&json(&o));
    assert!(found.contains(&("DLQ006".into(), "audit".into(), true)), "waived in the config: {found:?}");
    assert!(!found.iter().any(|(r, _, _)| r == "DLQ007"), "turned off");
    assert!(found.contains(&("DLQ004".into(), "orders-dlq".into(), false)), "1 day is still under 2 days");
    let report = json(&o);
    let audit = report["findings"].as_array().unwrap().iter().find(|f| f["queue"] == "audit").unwrap();
    assert_eq!(audit["waived"], "audit events are idempotent and replayed from the event store");
}

#[test]
fn exit_codes_follow_fail_on() {
    // template.json's only finding is waived: clean.
    let clean = dlqctl(&["lint", "--template", &fixture("template.json")]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean.stdout));
    let mut args = offline_args("text");
    args.extend(["--fail-on".into(), "error".into()]);
    assert_eq!(run(&args).status.code(), Some(3), "errors remain");
    let warnings_only = dlqctl(&[
        "lint",
        "--template",
        &fixture("template.yaml"),
        "--config",
        &fixture("lint-config.toml"),
        "--fail-on",
        "error",
    ]);
    assert_eq!(warnings_only.status.code(), Some(3), "DLQ004 and DLQ005 are errors");
    let notes = dlqctl(&["lint", "--template", &fixture("template.json"), "--fail-on", "note"]);
    assert_eq!(notes.status.code(), Some(0));
    assert_eq!(dlqctl(&["lint"]).status.code(), Some(2), "nothing to lint is a usage error");
}

#[test]
fn malformed_inputs_name_file_and_line() {
    let o = dlqctl(&["lint", "--template", &fixture("malformed.yaml")]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(err.contains("malformed.yaml:5:"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yml");
    std::fs::write(&rules, "groups:\n  - name: x\n    rules: {not: a list\n").unwrap();
    let o = dlqctl(&["lint", "--template", &fixture("template.json"), "--rules", rules.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("rules.yml:3"), "{}", text(&o.stderr));
    let alerts = dir.path().join("alerts.toml");
    std::fs::write(&alerts, "[[alert]]\nname = \"x\"\nqueue = \"q\"\nkind = \"depth\"\nbogus = 1\n").unwrap();
    let o = dlqctl(&["lint", "--template", &fixture("template.json"), "--alerts", alerts.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("alerts.toml:5"), "{}", text(&o.stderr));
}

#[test]
fn live_seeded_brokers_report_exactly_the_seeded_problems() {
    for broker in TestBroker::ALL {
        if require(broker).is_none() {
            return;
        }
    }
    // The seeded SQS queues only (tests make queues of their own beside them).
    let mut found = BTreeSet::new();
    for target in ["sqs://?prefix=orders", "sqs://?prefix=audit", "rabbitmq://guest:guest@127.0.0.1:5672/seed"] {
        let o = dlqctl(&["lint", "--broker", target, "--format", "json"]);
        assert_eq!(o.status.code(), Some(3), "{target}: {}", text(&o.stderr));
        found.extend(findings(&json(&o)));
    }
    let kafka = dlqctl(&[
        "lint",
        "--broker",
        "kafka://127.0.0.1:9092?pattern=^(orders\\.DLT|dlq-orders-jdbc-sink)$",
        "--format",
        "json",
    ]);
    found.extend(findings(&json(&kafka)));
    assert_eq!(
        found,
        set(&[
            // SQS: alarms on orders-dlq only, a lax one on orders-fulfilment-dlq, audit-queue without a DLQ.
            ("DLQ001", "orders-dlq.fifo", false),
            ("DLQ002", "orders-dlq.fifo", false),
            ("DLQ001", "orders-events-dlq", false),
            ("DLQ002", "orders-events-dlq", false),
            ("DLQ002", "orders-fulfilment-dlq", false),
            ("DLQ003", "orders-fulfilment-dlq", false),
            ("DLQ006", "audit-queue", false),
            // RabbitMQ: no alerting given, one DLQ for six sources, a 200 ms retry queue, a quorum
            // queue dead-lettering at most once.
            ("DLQ001", "orders.dlq", false),
            ("DLQ002", "orders.dlq", false),
            ("DLQ007", "orders.dlq", false),
            ("DLQ001", "orders.retry", false),
            ("DLQ002", "orders.retry", false),
            ("DLQ004", "orders.retry", false),
            ("DLQ011", "payments", false),
            // Kafka: no alerting given.
            ("DLQ001", "dlq-orders-jdbc-sink", false),
            ("DLQ002", "dlq-orders-jdbc-sink", false),
            ("DLQ001", "orders.DLT", false),
            ("DLQ002", "orders.DLT", false),
        ])
    );
}

/// Linear in its input (#30): a template of 10,000 queues with their DLQs and alarms and 4,000
/// Prometheus rules lint in seconds; absurd nesting is refused at once.
#[test]
fn large_inputs_lint_in_linear_time_and_absurd_nesting_is_refused_at_once() {
    use std::fmt::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let mut template = String::from("AWSTemplateFormatVersion: \"2010-09-09\"\nResources:\n");
    for i in 0..5000 {
        write!(
            template,
            "  Q{i}Dlq:\n    Type: AWS::SQS::Queue\n    Properties:\n      QueueName: q{i}-dlq\n      \
             MessageRetentionPeriod: 1209600\n  Q{i}:\n    Type: AWS::SQS::Queue\n    Properties:\n      \
             QueueName: q{i}\n      RedrivePolicy:\n        deadLetterTargetArn: !GetAtt Q{i}Dlq.Arn\n        \
             maxReceiveCount: 5\n  Q{i}Depth:\n    Type: AWS::CloudWatch::Alarm\n    Properties:\n      \
             Namespace: AWS/SQS\n      MetricName: ApproximateNumberOfMessagesVisible\n      Dimensions:\n        \
             - Name: QueueName\n          Value: q{i}-dlq\n      Threshold: 0\n      \
             ComparisonOperator: GreaterThanThreshold\n      Period: 60\n      EvaluationPeriods: 1\n"
        )
        .unwrap();
    }
    let template_path = dir.path().join("big.yaml");
    std::fs::write(&template_path, template).unwrap();
    let mut rules = String::from("groups:\n  - name: dlq\n    rules:\n");
    for i in 0..4000 {
        writeln!(rules, "      - alert: Q{i}Old\n        expr: max(age_seconds{{queue=\"q{i}-dlq\"}}) > 60").unwrap();
    }
    let rules_path = dir.path().join("rules.yml");
    std::fs::write(&rules_path, rules).unwrap();
    let started = std::time::Instant::now();
    let o = dlqctl(&[
        "lint",
        "--format",
        "json",
        "--template",
        template_path.to_str().unwrap(),
        "--rules",
        rules_path.to_str().unwrap(),
    ]);
    let took = started.elapsed();
    assert!(matches!(o.status.code(), Some(0 | 3)), "{}", text(&o.stderr));
    let report = json(&o);
    let missing_age = report["findings"].as_array().unwrap().iter().filter(|f| f["rule"] == "DLQ002").count();
    assert_eq!(missing_age, 1000, "the DLQs without an age rule, and only those");
    assert!(took < std::time::Duration::from_secs(20), "10,000 queues and 4,000 rules took {took:?}");

    let deep = dir.path().join("deep.json");
    std::fs::write(&deep, format!("{{\"Resources\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000))).unwrap();
    let started = std::time::Instant::now();
    let o = dlqctl(&["lint", "--template", deep.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("nested more than"), "{}", text(&o.stderr));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}
