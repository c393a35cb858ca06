//! What tests that need a real broker share: finding it, and failing loudly when it is
//! missing. Under CI (`CI=true`) a missing broker is always a failure; elsewhere a test
//! may skip only when `DLQCTL_SKIP_BROKERS=1` is set, and says so.

#![allow(dead_code)] // each test crate uses the part it needs

pub mod proxy;

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBroker {
    Rabbitmq,
    Sqs,
    Kafka,
}

impl TestBroker {
    pub const ALL: [TestBroker; 3] = [TestBroker::Rabbitmq, TestBroker::Sqs, TestBroker::Kafka];

    pub fn name(self) -> &'static str {
        match self {
            TestBroker::Rabbitmq => "RabbitMQ",
            TestBroker::Sqs => "LocalStack (SQS)",
            TestBroker::Kafka => "Tansu (Kafka)",
        }
    }

    /// The loopback address `scripts/brokers up` starts it on (same environment overrides).
    pub fn addr(self) -> SocketAddr {
        let (var, default) = match self {
            TestBroker::Rabbitmq => ("DLQCTL_RABBITMQ_PORT", 5672),
            TestBroker::Sqs => ("DLQCTL_LOCALSTACK_PORT", 4566),
            TestBroker::Kafka => ("DLQCTL_KAFKA_PORT", 9092),
        };
        loopback(var, default)
    }
}

/// Point the AWS SDK at LocalStack with its fake credentials, unless the environment already
/// says otherwise. Test processes only; the real binary never invents credentials.
pub fn localstack_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (name, value) in [
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
        ] {
            if std::env::var_os(name).is_none() {
                // SAFETY: called once, before any SQS client of this test process reads them.
                unsafe { std::env::set_var(name, value) };
            }
        }
    });
}

/// The broker's address if it answers; `None` (skip) only outside CI with DLQCTL_SKIP_BROKERS=1;
/// otherwise the calling test fails with a message that says how to start it.
pub fn require(broker: TestBroker) -> Option<SocketAddr> {
    require_at(broker.name(), broker.addr())
}

/// The second Tansu of `scripts/brokers up`: TLS with a client certificate, then SASL/SCRAM.
pub fn require_kafka_secure() -> Option<SocketAddr> {
    require_at("Tansu behind TLS with SASL/SCRAM (Kafka)", loopback("DLQCTL_KAFKA_SECURE_PORT", 9094))
}

/// The third Tansu of `scripts/brokers up`, for proxy tests: where it listens, and the port it
/// advertises (where the test's proxy must listen, since Kafka clients connect there).
pub fn require_kafka_proxied() -> Option<(SocketAddr, u16)> {
    let advertised = loopback("DLQCTL_KAFKA_PROXIED_PORT", 9096).port();
    require_at("Tansu for proxy tests (Kafka)", loopback("DLQCTL_KAFKA_PROXIED_INNER_PORT", 9095))
        .map(|addr| (addr, advertised))
}

fn require_at(name: &str, addr: SocketAddr) -> Option<SocketAddr> {
    let env_is = |name: &str, value: &str| std::env::var(name).is_ok_and(|v| v == value);
    decide(name, addr, reachable(addr), env_is("CI", "true"), env_is("DLQCTL_SKIP_BROKERS", "1"))
}

fn loopback(port_var: &str, default: u16) -> SocketAddr {
    let port = std::env::var(port_var).ok().and_then(|p| p.parse().ok()).unwrap_or(default);
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn reachable(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
}

pub fn decide(name: &str, addr: SocketAddr, reachable: bool, ci: bool, skip_allowed: bool) -> Option<SocketAddr> {
    if reachable {
        return Some(addr);
    }
    if ci {
        panic!("{name} is not reachable at {addr} and CI=true: scripts/brokers up must run first");
    }
    if skip_allowed {
        eprintln!("SKIPPED: {name} is not reachable at {addr} (DLQCTL_SKIP_BROKERS=1)");
        return None;
    }
    panic!(
        "{name} is not reachable at {addr}: run scripts/brokers up (or set DLQCTL_SKIP_BROKERS=1 to skip broker tests)"
    );
}

/// Where `scripts/brokers` keeps its state: seed counts, the test CA and certificates (`tls/`).
/// Dead letters as archive lines, as dlqctl writes them.
pub fn jsonl(letters: &[dlqctl::model::DeadLetter]) -> Vec<u8> {
    let mut text = Vec::new();
    for letter in letters {
        letter.write_json(&mut text);
        text.push(b'\n');
    }
    text
}

pub fn brokers_dir() -> std::path::PathBuf {
    std::env::var_os("DLQCTL_BROKERS_DIR")
        .map_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/brokers"), Into::into)
}

/// The counts `scripts/brokers seed` wrote for the seeded story.
pub fn seed_counts() -> serde_json::Value {
    let path = brokers_dir().join("seed.json").display().to_string();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}: run scripts/brokers seed"));
    serde_json::from_str(&text).unwrap()
}

impl TestBroker {
    /// The name `scripts/brokers fixture` takes.
    pub fn key(self) -> &'static str {
        match self {
            TestBroker::Rabbitmq => "rabbitmq",
            TestBroker::Sqs => "sqs",
            TestBroker::Kafka => "kafka",
        }
    }
}

/// An isolated namespace (vhost, queue-name prefix, topic prefix) on a test broker, holding
/// the given letters as real dead letters; removed again when dropped.
pub struct Namespace {
    broker: TestBroker,
    name: String,
    /// The dlqctl target of its DLQ.
    pub target: String,
}

impl Namespace {
    pub fn create(broker: TestBroker, letters: &[dlqctl::model::DeadLetter]) -> Namespace {
        Namespace::create_kind(broker, broker.key(), letters)
    }

    /// A namespace made by one of `scripts/brokers fixture`'s kinds for `broker`
    /// (`rabbitmq-story`, `rabbitmq-exchange`, ...).
    pub fn create_kind(broker: TestBroker, kind: &str, letters: &[dlqctl::model::DeadLetter]) -> Namespace {
        Namespace::create_kind_on(broker, kind, letters, None)
    }

    /// The same on a Kafka broker other than the default one (the proxy tests' Tansu).
    pub fn create_on_kafka(addr: SocketAddr, letters: &[dlqctl::model::DeadLetter]) -> Namespace {
        Namespace::create_kind_on(TestBroker::Kafka, "kafka", letters, Some(addr))
    }

    fn create_kind_on(
        broker: TestBroker,
        kind: &str,
        letters: &[dlqctl::model::DeadLetter],
        kafka: Option<SocketAddr>,
    ) -> Namespace {
        use std::io::Write;
        use std::process::{Command, Stdio};
        use std::sync::atomic::{AtomicU32, Ordering};

        static NEXT: AtomicU32 = AtomicU32::new(0);
        // Unique across parallel tests and runs, and valid as a vhost, SQS name and topic.
        let name = format!("dlqctl-t{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let mut command = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/brokers"));
        if let Some(addr) = kafka {
            command.env("DLQCTL_KAFKA_PORT", addr.port().to_string());
        }
        let mut child = command
            .args(["fixture", kind, &name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run scripts/brokers fixture");
        child.stdin.take().unwrap().write_all(&jsonl(letters)).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "scripts/brokers fixture {kind} {name} failed");
        let target = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        Namespace { broker, name, target }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/brokers"))
            .args(["drop", self.broker.key(), &self.name])
            .status();
    }
}

/// The real binary with a clean environment: no user config, run state under `state`, and the
/// AWS SDK pointed at LocalStack (callers may override any of it).
pub fn dlqctl(state: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dlqctl"));
    cmd.env("XDG_STATE_HOME", state)
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .env_remove("DLQCTL_CONFIG")
        .env_remove("AWS_PROFILE")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:4566");
    cmd
}

/// Run with a fresh state directory.
pub fn run(args: &[&str]) -> std::process::Output {
    let state = tempfile::tempdir().unwrap();
    output(dlqctl(state.path()).args(args))
}

/// Run a command to the end and keep what it printed for the suite-wide check in `scripts/test`,
/// which fails if any kept output holds a secret the tests hand to dlqctl (each contains
/// `never-print`).
pub fn output(cmd: &mut std::process::Command) -> std::process::Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    keep(&o);
    o
}

/// Append an output to this test binary's file under `target/tmp/outputs`.
pub fn keep(o: &std::process::Output) {
    use std::io::Write;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("outputs");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let name = format!("{}-{}.log", exe.file_stem().unwrap().to_string_lossy(), std::process::id());
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(name)).unwrap();
    file.write_all(&[o.stdout.as_slice(), o.stderr.as_slice()].concat()).unwrap();
}

/// Run, and fail the test unless it exits 0.
#[track_caller]
pub fn ok(args: &[&str]) -> std::process::Output {
    let o = run(args);
    assert_eq!(o.status.code(), Some(0), "{args:?}\nstdout:\n{}\nstderr:\n{}", text(&o.stdout), text(&o.stderr));
    o
}

/// [`ok`] with run state kept under `state` (for a later `--resume`).
#[track_caller]
pub fn ok_in(state: &std::path::Path, args: &[&str]) -> std::process::Output {
    let o = output(dlqctl(state).args(args));
    assert_eq!(o.status.code(), Some(0), "{args:?}\nstdout:\n{}\nstderr:\n{}", text(&o.stdout), text(&o.stderr));
    o
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stdout)))
}

/// The JSONL records a command printed.
pub fn records(o: &std::process::Output) -> Vec<dlqctl::model::DeadLetter> {
    text(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `summarize -o json` groups as field value -> count.
pub fn counts(report: &serde_json::Value, field: &str) -> std::collections::BTreeMap<String, u64> {
    report["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g[field].as_str().unwrap().to_owned(), g["count"].as_u64().unwrap()))
        .collect()
}

/// The file a run wrote under `state` whose name ends with `suffix` (`.checkpoint.jsonl`,
/// `.audit.jsonl`).
pub fn run_file(state: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    std::fs::read_dir(state.join("dlqctl/runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(suffix))
        .unwrap_or_else(|| panic!("no *{suffix} under {}", state.display()))
}
