//! The redrive engine under injected failures, at every step of a move: before publish,
//! after publish but before the confirm, and after the confirm but before the settle.
//! Whatever fails, no message may go missing, and a duplicate may exist only where a copy
//! reached the destination without its original being removed, carrying the same redrive id.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

mod support;

use async_trait::async_trait;
use dlqctl::broker::archive::{ArchiveBroker, ArchiveSink};
use dlqctl::broker::{
    Broker, Capabilities, Description, Destination, Failure, Handle, LetterStream, OpenOptions, PublishError, Received,
    Route, Sink,
};
use dlqctl::error::{Error, Result};
use dlqctl::model::{DeadLetter, Headers, Value};
use dlqctl::redrive::audit::{AuditLog, RunInfo};
use dlqctl::redrive::checkpoint::Checkpoint;
use dlqctl::redrive::engine::{Engine, Options, Summary};
use dlqctl::redrive::select::Selection;
use dlqctl::redrive::throttle::Rate;
use dlqctl::redrive::{REDRIVE_ID_HEADER, redrive_id};
use dlqctl::target::ArchiveTarget;

/// An archive DLQ whose settle fails on chosen calls.
struct FlakySource {
    inner: ArchiveBroker,
    fail_settle_calls: HashSet<usize>,
    settle_calls: AtomicUsize,
}

#[async_trait]
impl Broker for FlakySource {
    fn backend(&self) -> &'static str {
        "flaky archive"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn describe(&self) -> Result<Description> {
        self.inner.describe().await
    }
    async fn list(&self) -> Result<Vec<Description>> {
        self.inner.list().await
    }
    async fn peek(&self, limit: Option<u64>) -> Result<LetterStream<'_>> {
        self.inner.peek(limit).await
    }
    async fn begin_consume(&self) -> Result<()> {
        self.inner.begin_consume().await
    }
    async fn end_consume(&self) -> Result<()> {
        self.inner.end_consume().await
    }
    async fn receive(&self, max: usize) -> Result<Vec<Received>> {
        self.inner.receive(max).await
    }
    async fn settle(&self, handles: &[Handle]) -> Result<()> {
        let call = self.settle_calls.fetch_add(1, Ordering::SeqCst);
        if self.fail_settle_calls.contains(&call) {
            return Err(Error::Runtime(format!("injected: settle call {call} lost its connection")));
        }
        self.inner.settle(handles).await
    }
    async fn release(&self, handles: &[Handle]) -> Result<()> {
        self.inner.release(handles).await
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Refused before anything reached the destination.
    BeforePublish(Failure),
    /// Written at the destination, but the confirm never came.
    AfterPublish(Failure),
    /// Refused (transiently) this many times, then fine.
    TransientTimes(u32),
}

/// An archive destination that misbehaves for chosen message ids.
struct FlakySink {
    inner: ArchiveSink,
    faults: Mutex<HashMap<String, Fault>>,
}

#[async_trait]
impl Sink for FlakySink {
    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<std::result::Result<(), PublishError>> {
        let mut results = Vec::new();
        for item in batch {
            let fault = self.faults.lock().unwrap().get(&item.0.id).copied();
            let injected = |failure| Err(PublishError { failure, message: "injected".into() });
            let result = match fault {
                None => self.inner.publish(std::slice::from_ref(item)).await.remove(0),
                Some(Fault::BeforePublish(failure)) => injected(failure),
                Some(Fault::AfterPublish(failure)) => {
                    self.inner.publish(std::slice::from_ref(item)).await.remove(0).unwrap();
                    injected(failure)
                }
                Some(Fault::TransientTimes(0)) => self.inner.publish(std::slice::from_ref(item)).await.remove(0),
                Some(Fault::TransientTimes(n)) => {
                    self.faults.lock().unwrap().insert(item.0.id.clone(), Fault::TransientTimes(n - 1));
                    injected(Failure::Transient)
                }
            };
            results.push(result);
        }
        results
    }
}

struct Setup {
    dir: tempfile::TempDir,
    originals: Vec<DeadLetter>,
}

impl Setup {
    fn new(count: usize) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let originals: Vec<DeadLetter> = (0..count)
            .map(|i| DeadLetter {
                id: format!("m{i}"),
                dlq: Some("orders.dlq".into()),
                headers: Headers::new().with("seq", i as i64),
                body: Some(format!("{{\"order\":{i}}}").into_bytes()),
                ..DeadLetter::default()
            })
            .collect();
        write_jsonl(&dir.path().join("dlq.jsonl"), &originals);
        Setup { dir, originals }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn run(
        &self,
        faults: &[(&str, Fault)],
        fail_settle_calls: &[usize],
        options: Options,
        resume: bool,
    ) -> Summary {
        let source = FlakySource {
            inner: ArchiveBroker::open(ArchiveTarget::File(self.path("dlq.jsonl")), &OpenOptions::default())
                .await
                .unwrap(),
            fail_settle_calls: fail_settle_calls.iter().copied().collect(),
            settle_calls: AtomicUsize::new(0),
        };
        let sink = FlakySink {
            inner: ArchiveSink::open(&self.path("dest.jsonl")).await.unwrap(),
            faults: Mutex::new(faults.iter().map(|(id, f)| ((*id).to_owned(), *f)).collect()),
        };
        let destination = Destination { label: "archive dest.jsonl".into(), route: Route::Archive };
        let checkpoint_path = self.path("run.checkpoint.jsonl");
        let mut checkpoint = if resume {
            Checkpoint::resume(&checkpoint_path, "dlq", Some(&destination.label)).unwrap()
        } else {
            Checkpoint::create(&checkpoint_path, "dlq", Some(&destination.label)).unwrap()
        };
        let run = RunInfo {
            dlq: "dlq",
            to: Some(&destination.label),
            selection: "everything",
            note: None,
            checkpoint: Some(&checkpoint_path),
        };
        let mut audit = AuditLog::create(&self.path("audit.jsonl"), &run).unwrap();
        let interrupted = AtomicBool::new(false);
        Engine {
            source: &source,
            dlq: "dlq",
            sink: Some(&sink),
            fixed_destination: Some(destination),
            options: &options,
            audit: &mut audit,
            checkpoint: &mut checkpoint,
            interrupted: &interrupted,
            progress: &|_| {},
        }
        .run()
        .await
        .unwrap()
    }

    /// No original missing; copies carry the original's redrive id; a message is both in the
    /// DLQ and at the destination, or at the destination twice, only if it may be duplicated.
    fn check_invariants(&self, may_duplicate: &[&str]) -> (usize, usize) {
        let dlq = read_jsonl(&self.path("dlq.jsonl"));
        let dest = read_jsonl(&self.path("dest.jsonl"));
        let ids_in_dlq: HashSet<String> = dlq.iter().map(redrive_id).collect();
        let mut copies: HashMap<String, usize> = HashMap::new();
        for copy in &dest {
            let Some(Value::String(id)) = copy.headers.get(REDRIVE_ID_HEADER) else {
                panic!("copy {} has no redrive id", copy.id)
            };
            assert_eq!(*id, redrive_id(copy), "the header is the id");
            *copies.entry(id.clone()).or_default() += 1;
        }
        for original in &self.originals {
            let id = redrive_id(original);
            let in_dlq = ids_in_dlq.contains(&id);
            let at_dest = copies.get(&id).copied().unwrap_or(0);
            assert!(in_dlq || at_dest > 0, "{} is missing from both", original.id);
            if (in_dlq && at_dest > 0) || at_dest > 1 {
                assert!(may_duplicate.contains(&original.id.as_str()), "{} duplicated unexpectedly", original.id);
            }
        }
        (dlq.len(), dest.len())
    }
}

fn options() -> Options {
    Options {
        selection: Selection::default(),
        limit: None,
        rate: Rate::Unlimited,
        batch: 4,
        max_redrives: None,
        retries: 2,
        max_consecutive_failures: 5,
        max_returns: 5,
    }
}

fn write_jsonl(path: &Path, letters: &[DeadLetter]) {
    std::fs::write(path, support::jsonl(letters)).unwrap();
}

fn read_jsonl(path: &Path) -> Vec<DeadLetter> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn a_clean_run_moves_everything_exactly_once() {
    let s = Setup::new(10);
    let summary = s.run(&[], &[], options(), false).await;
    assert_eq!((summary.selected, summary.moved, summary.failed), (10, 10, 0));
    assert_eq!(summary.still_in_dlq, Some(0));
    assert_eq!(s.check_invariants(&[]), (0, 10));
}

#[tokio::test]
async fn failures_before_publish_leave_the_message_in_the_dlq() {
    let s = Setup::new(10);
    let faults = [("m2", Fault::BeforePublish(Failure::Permanent)), ("m7", Fault::BeforePublish(Failure::Transient))];
    let summary = s.run(&faults, &[], options(), false).await;
    assert_eq!((summary.moved, summary.failed), (8, 2));
    assert_eq!(s.check_invariants(&[]), (2, 8));
    let left: Vec<String> = read_jsonl(&s.path("dlq.jsonl")).into_iter().map(|l| l.id).collect();
    assert_eq!(left, ["m2", "m7"]);
}

#[tokio::test]
async fn a_lost_confirm_leaves_the_original_and_a_copy_with_the_same_id() {
    let s = Setup::new(10);
    let faults = [("m3", Fault::AfterPublish(Failure::Permanent)), ("m5", Fault::AfterPublish(Failure::Transient))];
    let summary = s.run(&faults, &[], options(), false).await;
    assert_eq!((summary.moved, summary.failed), (8, 2));
    // m5 was retried twice, so three copies reached the destination, all with one id.
    assert_eq!(s.check_invariants(&["m3", "m5"]), (2, 8 + 1 + 3));
}

#[tokio::test]
async fn transient_failures_are_retried_until_they_pass() {
    let s = Setup::new(6);
    let summary = s.run(&[("m1", Fault::TransientTimes(2))], &[], options(), false).await;
    assert_eq!((summary.moved, summary.failed), (6, 0));
    assert_eq!(s.check_invariants(&[]), (0, 6));
}

#[tokio::test]
async fn a_failed_settle_stops_the_run_and_resume_settles_without_publishing_again() {
    let s = Setup::new(12);
    // The second batch (m4..m7) reaches the destination but the DLQ refuses to remove it.
    let summary = s.run(&[], &[1], options(), false).await;
    assert_eq!((summary.moved, summary.not_settled), (4, 4));
    assert!(summary.stopped.as_deref().unwrap().contains("--resume"), "{summary:?}");
    assert_eq!(s.check_invariants(&["m4", "m5", "m6", "m7"]), (8, 8));

    let resumed = s.run(&[], &[], options(), true).await;
    assert_eq!(resumed.moved, 8, "four settled from the checkpoint, four published");
    assert_eq!(s.check_invariants(&[]), (0, 12), "no duplicate left once resumed");
}

#[tokio::test]
async fn the_circuit_breaker_stops_a_run_against_a_dead_destination() {
    let s = Setup::new(20);
    let faults: Vec<(String, Fault)> =
        (0..20).map(|i| (format!("m{i}"), Fault::BeforePublish(Failure::Transient))).collect();
    let faults: Vec<(&str, Fault)> = faults.iter().map(|(id, f)| (id.as_str(), *f)).collect();
    let summary = s.run(&faults, &[], Options { retries: 0, max_consecutive_failures: 3, ..options() }, false).await;
    assert!(summary.stopped.as_deref().unwrap().contains("in a row"), "{summary:?}");
    assert_eq!(summary.failed, 4, "stops at the end of the batch where the third failure came");
    assert_eq!(s.check_invariants(&[]), (20, 0));
}

#[tokio::test]
async fn isolated_permanent_failures_do_not_trip_the_breaker() {
    let s = Setup::new(8);
    // Never two in a row: each is one bad message, not a dead destination.
    let faults: Vec<(String, Fault)> =
        (0..8).step_by(2).map(|i| (format!("m{i}"), Fault::BeforePublish(Failure::Permanent))).collect();
    let faults: Vec<(&str, Fault)> = faults.iter().map(|(id, f)| (id.as_str(), *f)).collect();
    let summary = s.run(&faults, &[], Options { max_consecutive_failures: 2, ..options() }, false).await;
    assert_eq!(summary.stopped, None);
    assert_eq!((summary.moved, summary.failed), (4, 4));
    s.check_invariants(&[]);
}

#[tokio::test]
async fn a_run_of_permanent_failures_stops_the_run() {
    let s = Setup::new(12);
    let faults: Vec<(String, Fault)> =
        (4..12).map(|i| (format!("m{i}"), Fault::BeforePublish(Failure::Permanent))).collect();
    let faults: Vec<(&str, Fault)> = faults.iter().map(|(id, f)| (id.as_str(), *f)).collect();
    let summary = s.run(&faults, &[], Options { max_consecutive_failures: 3, ..options() }, false).await;
    assert!(summary.stopped.as_deref().unwrap().contains("in a row"), "{summary:?}");
    assert_eq!((summary.moved, summary.failed), (4, 4));
    assert_eq!(s.check_invariants(&[]), (8, 4));
}

#[tokio::test]
async fn every_failure_mode_at_once_loses_nothing() {
    let s = Setup::new(40);
    let faults = [
        ("m1", Fault::BeforePublish(Failure::Permanent)),
        ("m9", Fault::AfterPublish(Failure::Transient)),
        ("m13", Fault::TransientTimes(1)),
        ("m22", Fault::AfterPublish(Failure::Permanent)),
        ("m30", Fault::BeforePublish(Failure::Transient)),
    ];
    s.run(&faults, &[3], options(), false).await;
    // Batch 4 (m12..m15) was confirmed but not settled.
    s.check_invariants(&["m9", "m12", "m13", "m14", "m15", "m22"]);
    s.run(&[], &[], options(), true).await;
    s.check_invariants(&["m9", "m22"]);
    assert!(read_jsonl(&s.path("dlq.jsonl")).is_empty());
}

/// Duplicates a crash left in the DLQ (same redrive id, same count) are not "returns", and a
/// batch made only of them does not end the run early.
#[tokio::test]
async fn duplicates_already_in_the_dlq_neither_stop_the_run_nor_count_as_returns() {
    let s = Setup::new(10);
    let mut dlq = s.originals.clone();
    dlq.splice(3..3, std::iter::repeat_n(s.originals[2].clone(), 8));
    write_jsonl(&s.path("dlq.jsonl"), &dlq);
    let summary = s.run(&[], &[], options(), false).await;
    assert_eq!((summary.moved, summary.returned, summary.stopped.as_deref()), (10, 0, None));
    let left: Vec<String> = read_jsonl(&s.path("dlq.jsonl")).into_iter().map(|l| l.id).collect();
    assert_eq!(left, vec!["m2"; 8], "the duplicates stay where they were");
    assert_eq!(s.check_invariants(&["m2"]), (8, 10));
}
