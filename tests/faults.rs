//! kill -9 in the middle of a real redrive, then `--resume`, on every broker; and RabbitMQ and
//! Tansu restarted under a redrive and under an export. Nothing may be lost, no run may hang,
//! and every duplicate must carry its original's `dlqctl-redrive-id`.
//!
//! `DLQCTL_FAULT_TRIALS` sets the trials per broker (default 2 in CI; the README records a run
//! of 20).

mod support;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use dlqctl::model::{DeadLetter, Headers, Value};
use dlqctl::redrive::REDRIVE_ID_HEADER;
use support::proxy::Proxy;
use support::{Namespace, TestBroker, localstack_env, records, require};

const MESSAGES: usize = 1000;

fn letters() -> Vec<DeadLetter> {
    (0..MESSAGES)
        .map(|i| DeadLetter {
            id: format!("k{i}"),
            headers: Headers::new().with("seq", i as i64),
            body: Some(format!("{{\"order\":{i}}}").into_bytes()),
            ..DeadLetter::default()
        })
        .collect()
}

fn trials() -> usize {
    std::env::var("DLQCTL_FAULT_TRIALS").ok().and_then(|n| n.parse().ok()).unwrap_or(2)
}

/// [`trials`], but `DLQCTL_FAULT_TRIALS_SQS` for SQS, whose trials wait out LocalStack's holds.
fn trials_on(broker: TestBroker) -> usize {
    let sqs = (broker == TestBroker::Sqs).then(|| std::env::var("DLQCTL_FAULT_TRIALS_SQS").ok()).flatten();
    sqs.and_then(|n| n.parse().ok()).unwrap_or_else(trials)
}

/// Every message in a queue, read through dlqctl. A Kafka DLT holds what is pending for the
/// group (after its committed offset); a source topic is read from the beginning.
fn read_all(target: &str, whole_topic: bool) -> Vec<DeadLetter> {
    let mut args = vec!["export", target, "-q"];
    if whole_topic && target.starts_with("kafka://") {
        args.push("--from-beginning");
    }
    records(&support::ok(&args))
}

fn source_of(broker: TestBroker, dlq: &str) -> String {
    match broker {
        TestBroker::Rabbitmq => format!("{}/source", dlq.trim_end_matches("/dlq")),
        TestBroker::Sqs => dlq.replacen("-dlq", "-src", 1),
        TestBroker::Kafka => dlq.trim_end_matches(".DLT").to_owned(),
    }
}

/// Seq -> copies at the source; panics if a message is in neither place or a copy carries
/// another redrive id than its twins. Returns (left in the DLQ, duplicates).
fn check(dlq: &str, source: &str) -> (usize, usize) {
    let (left, duplicates, _) = check_first(MESSAGES, dlq, source);
    (left, duplicates)
}

/// [`check`] for the first `count` messages of [`letters`]; also returns the most copies any
/// one message has (in the DLQ and at its source together).
fn check_first(count: usize, dlq: &str, source: &str) -> (usize, usize, usize) {
    let in_dlq: HashMap<String, DeadLetter> =
        read_all(dlq, false).into_iter().map(|l| (l.headers.get("seq").unwrap().to_string(), l)).collect();
    let mut copies: HashMap<String, Vec<String>> = HashMap::new();
    for copy in read_all(source, true) {
        let Some(Value::String(id)) = copy.headers.get(REDRIVE_ID_HEADER) else {
            panic!("a copy without its redrive id")
        };
        copies.entry(copy.headers.get("seq").unwrap().to_string()).or_default().push(id.clone());
    }
    let (mut duplicates, mut most) = (0, 0);
    for seq in 0..count {
        let seq = seq.to_string();
        let at_source = copies.get(&seq).map_or(&[][..], Vec::as_slice);
        assert!(in_dlq.contains_key(&seq) || !at_source.is_empty(), "message {seq} lost");
        assert!(at_source.windows(2).all(|w| w[0] == w[1]), "copies of {seq} disagree on their redrive id");
        if at_source.len() > 1 || (in_dlq.contains_key(&seq) && !at_source.is_empty()) {
            duplicates += 1;
        }
        most = most.max(at_source.len() + usize::from(in_dlq.contains_key(&seq)));
    }
    (in_dlq.len(), duplicates, most)
}

fn wait_until_nothing_in_flight(target: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let report = support::json(&support::ok(&["list", target, "-o", "json"]));
        if report["dlqs"][0]["notes"][0].as_str().unwrap_or_default().contains(" 0 in flight") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "messages stayed in flight: {report}");
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// A test a broker for a family of trials (`family(broker)`), SQS's with LocalStack's
/// environment set.
macro_rules! on_every_broker {
    ($family:ident: $rabbitmq:ident, $sqs:ident, $kafka:ident $(,)?) => {
        #[test]
        fn $rabbitmq() {
            $family(TestBroker::Rabbitmq);
        }

        #[test]
        fn $sqs() {
            localstack_env();
            $family(TestBroker::Sqs);
        }

        #[test]
        fn $kafka() {
            $family(TestBroker::Kafka);
        }
    };
}

/// Restarts take a broker away from every test: they hold this for writing, the others for reading.
static BROKER_IN_USE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn kill_and_resume(broker: TestBroker) {
    if require(broker).is_none() {
        return;
    }
    let _shared = BROKER_IN_USE.read().unwrap_or_else(|e| e.into_inner());
    let (mut lost, mut duplicates, mut interrupted) = (0, 0, 0);
    for trial in 0..trials_on(broker) {
        let ns = Namespace::create(broker, &letters());
        let source = source_of(broker, &ns.target);
        let state = tempfile::tempdir().unwrap();
        let mut child = support::dlqctl(state.path())
            // The client-side path: an SQS move task would go on on the server after the kill.
            .args(["redrive", &ns.target, "--mode", "client", "--yes", "--rate", "2000", "-q"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(fastrand::u64(200..2500)));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        interrupted += usize::from(status.code().is_none());
        if broker == TestBroker::Sqs {
            // What the killed run held stays invisible until its hold runs out; it is not lost,
            // but no read can see it before then.
            wait_until_nothing_in_flight(&ns.target);
        }
        check(&ns.target, &source);

        // The run wrote its checkpoint before it was killed.
        resume(state.path(), &ns.target, &format!("trial {trial}"));
        let (left, dups) = check(&ns.target, &source);
        lost += left;
        duplicates += dups;
        assert!(dups <= 10, "trial {trial}: duplicates are bounded by --batch, got {dups}");
    }
    assert_eq!(lost, 0, "every message ends at its source");
    eprintln!(
        "{}: {} kill -9 trials ({interrupted} killed mid-run) of a {MESSAGES}-message redrive, then --resume: \
         0 lost, {duplicates} duplicate(s), each with its original's redrive id",
        broker.name(),
        trials_on(broker)
    );
}

on_every_broker!(kill_and_resume:
    rabbitmq_kill_9_mid_redrive_loses_nothing,
    sqs_kill_9_mid_redrive_loses_nothing,
    kafka_kill_9_mid_redrive_loses_nothing
);

/// `--resume` the one run under `state` to the end.
fn resume(state: &std::path::Path, target: &str, what: &str) {
    let checkpoint = support::run_file(state, ".checkpoint.jsonl");
    let args = ["redrive", target, "--mode", "client", "--yes", "--rate", "unlimited", "-q", "--resume"];
    let o = support::output(support::dlqctl(state).args(args).arg(&checkpoint));
    assert_eq!(o.status.code(), Some(0), "{what}: {}", support::text(&o.stderr));
}

/// Wait for a child, but never longer than `limit`: a run that hangs fails the test.
fn wait_bounded(child: &mut std::process::Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn restart(broker: TestBroker) {
    let name = match broker {
        TestBroker::Rabbitmq => "rabbitmq",
        TestBroker::Kafka => "kafka",
        TestBroker::Sqs => unreachable!("LocalStack is not restarted: it keeps no state across a restart"),
    };
    let status = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/brokers"))
        .args(["restart", name, "2"])
        .status()
        .unwrap();
    assert!(status.success(), "restarting {}", broker.name());
}

/// What goes wrong two seconds into a run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// The broker goes away for two seconds (`scripts/brokers restart`).
    Restart,
    /// A proxy between dlqctl and the broker shuts every connection.
    Cut,
    /// A proxy between dlqctl and the broker stops passing bytes and keeps the sockets open.
    Stall,
}

/// Seconds dlqctl waits for one answer in the proxy trials (`--timeout`).
const TIMEOUT: &str = "3";

/// `dlqctl` and the target it reaches the DLQ by: through `proxy` when there is one (the
/// broker's port in the target: RabbitMQ's AMQP port, the SQS endpoint's).
fn through(
    proxy: Option<&Proxy>,
    broker: TestBroker,
    target: &str,
    state: &std::path::Path,
) -> (std::process::Command, String) {
    let mut cmd = support::dlqctl(state);
    cmd.args(["--timeout", TIMEOUT]);
    let target = match (proxy, broker) {
        (None, _) => target.to_owned(),
        (Some(p), TestBroker::Rabbitmq) => {
            let direct = format!(":{}/", broker.addr().port());
            assert!(target.contains(&direct), "{target}");
            target.replacen(&direct, &format!(":{}/", p.port), 1)
        }
        (Some(p), TestBroker::Sqs) => {
            let direct = format!("endpoint=http://127.0.0.1:{}", broker.addr().port());
            assert!(target.contains(&direct), "{target}");
            target.replacen(&direct, &format!("endpoint=http://127.0.0.1:{}", p.port), 1)
        }
        (Some(p), TestBroker::Kafka) => {
            // Bootstrap through the proxy too (the broker's metadata already points there).
            let (_, rest) = target.split_once("127.0.0.1:").expect("a loopback Kafka target");
            let (_, path) = rest.split_once('/').expect("a topic");
            format!("kafka://127.0.0.1:{}/{path}", p.port)
        }
    };
    (cmd, target)
}

/// Two seconds into a 1,000-message redrive paced at 200/s, `fault` strikes. The run either
/// rides it out (where the client reconnects safely) or stops with one clear line within
/// bounded time (a stall: after `--timeout`); `--resume` then finishes, and nothing is lost.
fn fault_mid_redrive(broker: TestBroker, fault: Fault) {
    if require(broker).is_none() {
        return;
    }
    let _alone = BROKER_IN_USE.write().unwrap_or_else(|e| e.into_inner());
    // Kafka clients go where the broker's metadata sends them: the proxy takes the port the
    // proxy tests' Tansu advertises, and is up before the fixture is written through it.
    let (proxy, ns) = match (fault, broker) {
        (Fault::Restart, _) => (None, Namespace::create(broker, &letters())),
        (_, TestBroker::Kafka) => {
            let Some((inner, advertised)) = support::require_kafka_proxied() else { return };
            let proxy = Proxy::start_on(advertised, inner);
            (Some(proxy), Namespace::create_on_kafka(inner, &letters()))
        }
        _ => (Some(Proxy::start(broker.addr())), Namespace::create(broker, &letters())),
    };
    let source = source_of(broker, &ns.target);
    let state = tempfile::tempdir().unwrap();
    let (mut cmd, target) = through(proxy.as_ref(), broker, &ns.target, state.path());
    let mut child = cmd
        .args(["redrive"])
        .arg(&target)
        .args(["--mode", "client", "--yes", "--rate", "200", "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    match (fault, &proxy) {
        (Fault::Restart, _) => restart(broker),
        (Fault::Cut, Some(p)) => p.cut(),
        (Fault::Stall, Some(p)) => p.stall(),
        _ => unreachable!(),
    }
    let status = wait_bounded(&mut child, Duration::from_secs(120), "a redrive across a fault");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    if fault == Fault::Stall {
        assert!(!status.success(), "a stalled broker cannot have confirmed every copy: {stderr}");
        assert!(stderr.contains("no answer to"), "the error names the stalled call: {stderr}");
    }
    if !status.success() {
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(stderr.lines().any(|l| l.starts_with("dlqctl: ")), "no clear error: {stderr}");
    }
    eprintln!("{}: redrive across {fault:?} ended with {status}: {}", broker.name(), stderr.trim());
    if let Some(p) = &proxy {
        // The stalled connections still hold what the run took: closing them gives it back.
        // The link then works again, for the resume (which must name the same target).
        p.pass();
        p.cut();
    }
    if broker == TestBroker::Sqs {
        wait_until_nothing_in_flight(&ns.target);
    }
    check(&ns.target, &source);
    resume(state.path(), &target, &format!("resume after {fault:?}"));
    let (left, dups) = check(&ns.target, &source);
    assert_eq!(left, 0, "every message ends at its source");
    assert!(dups <= 10, "duplicates are bounded by --batch, got {dups}");
}

/// The broker goes away while an export is stalled on a full pipe: the export finishes or
/// stops with one clear line within bounded time, and the DLQ still holds every message.
fn restart_mid_export(broker: TestBroker) {
    if require(broker).is_none() {
        return;
    }
    let _alone = BROKER_IN_USE.write().unwrap_or_else(|e| e.into_inner());
    let ns = Namespace::create(broker, &letters());
    let state = tempfile::tempdir().unwrap();
    let mut child = support::dlqctl(state.path())
        .args(["export", &ns.target, "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Nobody reads stdout yet: the export blocks on the pipe, holding what it has read.
    std::thread::sleep(Duration::from_secs(2));
    restart(broker);
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
        out
    });
    let status = wait_bounded(&mut child, Duration::from_secs(120), "an export across a restart");
    let lines = reader.join().unwrap().lines().count();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    if status.success() {
        assert_eq!(lines, MESSAGES, "a finished export has every message");
    } else {
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(stderr.lines().any(|l| l.starts_with("dlqctl: ")), "no clear error: {stderr}");
    }
    eprintln!("{}: export across a restart: {lines} lines, {status}: {}", broker.name(), stderr.trim());
    let after = read_all(&ns.target, true);
    assert_eq!(after.len(), MESSAGES, "an export leaves every message in the DLQ");
}

#[test]
fn rabbitmq_restart_mid_redrive_loses_nothing() {
    fault_mid_redrive(TestBroker::Rabbitmq, Fault::Restart);
}

#[test]
fn kafka_restart_mid_redrive_loses_nothing() {
    fault_mid_redrive(TestBroker::Kafka, Fault::Restart);
}

#[test]
fn rabbitmq_connection_cut_mid_redrive_loses_nothing() {
    fault_mid_redrive(TestBroker::Rabbitmq, Fault::Cut);
}

#[test]
fn rabbitmq_connection_stall_mid_redrive_stops_in_time() {
    fault_mid_redrive(TestBroker::Rabbitmq, Fault::Stall);
}

#[test]
fn sqs_connection_cut_mid_redrive_loses_nothing() {
    fault_mid_redrive(TestBroker::Sqs, Fault::Cut);
}

#[test]
fn sqs_connection_stall_mid_redrive_stops_in_time() {
    fault_mid_redrive(TestBroker::Sqs, Fault::Stall);
}

#[test]
fn kafka_connection_cut_mid_redrive_loses_nothing() {
    fault_mid_redrive(TestBroker::Kafka, Fault::Cut);
}

#[test]
fn kafka_connection_stall_mid_redrive_stops_in_time() {
    fault_mid_redrive(TestBroker::Kafka, Fault::Stall);
}

#[test]
fn rabbitmq_restart_mid_export_loses_nothing() {
    restart_mid_export(TestBroker::Rabbitmq);
}

#[test]
fn kafka_restart_mid_export_loses_nothing() {
    restart_mid_export(TestBroker::Kafka);
}

// The loss paths of issue #29, on each broker.

/// `--to` naming the DLQ itself, as written or by another name for its host, is refused
/// before anything moves.
fn to_naming_the_dlq_is_refused(broker: TestBroker) {
    if require(broker).is_none() {
        return;
    }
    let _shared = BROKER_IN_USE.read().unwrap_or_else(|e| e.into_inner());
    let ns = Namespace::create(broker, &letters()[..20]);
    let state = tempfile::tempdir().unwrap();
    for to in [ns.target.clone(), ns.target.replacen("127.0.0.1", "localhost", 1)] {
        let o = support::output(
            support::dlqctl(state.path()).args(["redrive", &ns.target, "--to", &to, "--mode", "client", "--yes"]),
        );
        assert_eq!(o.status.code(), Some(2), "{}", support::text(&o.stderr));
        assert!(support::text(&o.stderr).contains("names the DLQ being redriven"), "{}", support::text(&o.stderr));
    }
    assert_eq!(read_all(&ns.target, false).len(), 20, "nothing moved");
}

on_every_broker!(to_naming_the_dlq_is_refused: rabbitmq_to_naming_the_dlq_is_refused, sqs_to_naming_the_dlq_is_refused, kafka_to_naming_the_dlq_is_refused);

/// Two redrives of one DLQ at once, the second started a moment after the first. RabbitMQ and
/// SQS hand each message to one of them; on Kafka both read the topic from the group's
/// committed offset, and the one that sees the other's commits stops. Nothing is lost, and
/// every copy carries its original's redrive id.
fn two_runs_at_once(broker: TestBroker) {
    if require(broker).is_none() {
        return;
    }
    let _shared = BROKER_IN_USE.read().unwrap_or_else(|e| e.into_inner());
    let (mut duplicates, mut most) = (0, 0);
    for trial in 0..trials_on(broker) {
        let ns = Namespace::create(broker, &letters());
        let source = source_of(broker, &ns.target);
        let states = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let start = |state: &std::path::Path| {
            support::dlqctl(state)
                .args(["redrive", &ns.target, "--mode", "client", "--yes", "--rate", "2000", "-q"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let mut first = start(states[0].path());
        std::thread::sleep(Duration::from_millis(fastrand::u64(0..300)));
        let mut second = start(states[1].path());
        for child in [&mut first, &mut second] {
            let status = wait_bounded(child, Duration::from_secs(180), "one of two runs at once");
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            assert!(matches!(status.code(), Some(0 | 1)), "trial {trial}: {status}: {stderr}");
        }
        if broker == TestBroker::Sqs {
            wait_until_nothing_in_flight(&ns.target);
        }
        let (_, dups, at_most) = check_first(MESSAGES, &ns.target, &source);
        // A copy per run, and the original while it is not yet settled.
        let bound = if broker == TestBroker::Kafka { 3 } else { 2 };
        assert!(at_most <= bound, "trial {trial}: a message has {at_most} copies");
        // Kafka: the later run copies one batch, sees the group's offsets move at its first
        // commit, and stops.
        assert!(dups <= 20, "trial {trial}: duplicates are bounded by the two runs' batches, got {dups}");
        duplicates += dups;
        most = most.max(at_most);
    }
    eprintln!(
        "{}: {} trials of two {MESSAGES}-message redrives at once: 0 lost, {duplicates} duplicate(s), at most \
         {most} copies of one message, each with its original's redrive id",
        broker.name(),
        trials_on(broker)
    );
}

on_every_broker!(two_runs_at_once: rabbitmq_two_runs_at_once_lose_nothing, sqs_two_runs_at_once_lose_nothing, kafka_two_runs_at_once_lose_nothing);

/// A run moves some messages; their copies fail again and die back into the DLQ (moved there
/// with their headers, as the broker's or the framework's own dead-lettering does); the first
/// run is then resumed. Its checkpoint knows their redrive ids, but they are copies, not the
/// originals it confirmed: they stay in the DLQ.
fn resume_leaves_copies_that_came_back(broker: TestBroker) {
    if require(broker).is_none() {
        return;
    }
    let _shared = BROKER_IN_USE.read().unwrap_or_else(|e| e.into_inner());
    const COUNT: usize = 100;
    for trial in 0..trials_on(broker) {
        let ns = Namespace::create(broker, &letters()[..COUNT]);
        let source = source_of(broker, &ns.target);
        let state = tempfile::tempdir().unwrap();
        let moved = fastrand::usize(1..COUNT).to_string();
        let base = ["--mode", "client", "--yes", "--rate", "unlimited", "-q"];
        support::ok_in(state.path(), &[&["redrive", &ns.target, "--limit", &moved][..], &base].concat());
        if broker == TestBroker::Sqs {
            wait_until_nothing_in_flight(&ns.target);
        }
        let other = tempfile::tempdir().unwrap();
        let mut back = vec!["redrive", source.as_str(), "--to", &ns.target];
        if broker == TestBroker::Kafka {
            back.push("--from-beginning");
        }
        support::ok_in(other.path(), &[&back[..], &base].concat());
        let checkpoint = support::run_file(state.path(), ".checkpoint.jsonl");
        let o = support::output(
            support::dlqctl(state.path()).args(["redrive", &ns.target, "--resume"]).arg(&checkpoint).args(base),
        );
        assert!(matches!(o.status.code(), Some(0 | 1)), "trial {trial}: {}", support::text(&o.stderr));
        if broker == TestBroker::Sqs {
            wait_until_nothing_in_flight(&ns.target);
        }
        check_first(COUNT, &ns.target, &source);
    }
    eprintln!("{}: {} trials of --resume after copies died back: 0 lost", broker.name(), trials_on(broker));
}

on_every_broker!(resume_leaves_copies_that_came_back: rabbitmq_resume_leaves_copies_that_came_back, sqs_resume_leaves_copies_that_came_back, kafka_resume_leaves_copies_that_came_back);
