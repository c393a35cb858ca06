//! `dlqctl redrive` from the command line: plans, refusals, audit trail, loop guard,
//! interrupts and kill -9 followed by `--resume`, with archive sources and destinations.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dlqctl::model::{DeadLetter, Value};
use dlqctl::redrive::{REDRIVE_COUNT_HEADER, REDRIVE_ID_HEADER, redrive_id};

const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/orders-dlq.jsonl");

struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn with_sample() -> Workspace {
        let w = Workspace { dir: tempfile::tempdir().unwrap() };
        std::fs::copy(SAMPLE, w.path("dlq.jsonl")).unwrap();
        w
    }

    /// An archive of `count` distinct dead letters, from the sample generator.
    fn generated(count: u64) -> Workspace {
        let w = Workspace { dir: tempfile::tempdir().unwrap() };
        let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        let generator = deps.parent().unwrap().join("examples").join("gen_sample");
        let out = Command::new(generator).args(["--count", &count.to_string()]).output().unwrap();
        std::fs::write(w.path("dlq.jsonl"), out.stdout).unwrap();
        w
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn dlqctl(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlqctl"));
        cmd.current_dir(self.dir.path())
            .env("XDG_STATE_HOME", self.path("state"))
            .env("XDG_CONFIG_HOME", "/nonexistent")
            .env_remove("DLQCTL_CONFIG")
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.dlqctl().args(args).output().unwrap()
    }

    /// `--resume` a redrive of dlq.jsonl into out.jsonl from `checkpoint`, as fast as it goes.
    fn resume_into_out(&self, checkpoint: &Path, extra: &[&str]) -> Output {
        let args = ["redrive", "dlq.jsonl", "--to", "out.jsonl", "--yes", "--rate", "unlimited", "--resume"];
        self.dlqctl().args(args).arg(checkpoint).args(extra).output().unwrap()
    }

    /// The one checkpoint a run wrote under the state directory.
    fn checkpoint(&self) -> PathBuf {
        let runs = self.path("state/dlqctl/runs");
        let found: Vec<PathBuf> = std::fs::read_dir(&runs)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".checkpoint.jsonl"))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        found.into_iter().next().unwrap()
    }
}

fn read(path: &Path) -> Vec<DeadLetter> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The letters a reader sees in an archive: what a killed run settled, but did not yet remove
/// from the file (its settle journal says which), is not there any more.
fn still_in(dlq: &Path) -> Vec<DeadLetter> {
    let o = Command::new(env!("CARGO_BIN_EXE_dlqctl")).args(["export", "-q"]).arg(dlq).output().unwrap();
    assert_exit(&o, 0);
    text(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The letters in whole lines of an archive a killed run was appending to: its last line may
/// be the start of a copy it never finished (and so never confirmed). Returns the letters and
/// whether such a line was there.
fn read_whole_lines(path: &Path) -> (Vec<DeadLetter>, bool) {
    let content = std::fs::read(path).unwrap_or_default();
    let whole = content.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let letters = String::from_utf8(content[..whole].to_vec())
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (letters, whole < content.len())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn assert_exit(o: &Output, code: i32) {
    assert_eq!(o.status.code(), Some(code), "stdout:\n{}\nstderr:\n{}", text(&o.stdout), text(&o.stderr));
}

/// Every original is in the DLQ or at the destination; what is in both, or at the destination
/// twice, carries the original's redrive id. Returns (in DLQ, at destination, duplicated).
fn check_nothing_lost(originals: &[DeadLetter], dlq: &Path, at_dest: &[DeadLetter]) -> (usize, usize, usize) {
    let in_dlq: HashSet<String> = still_in(dlq).iter().map(redrive_id).collect();
    let mut copies: HashMap<String, usize> = HashMap::new();
    for copy in at_dest {
        let Some(Value::String(id)) = copy.headers.get(REDRIVE_ID_HEADER) else { panic!("copy without id") };
        *copies.entry(id.clone()).or_default() += 1;
    }
    let mut duplicated = 0;
    for o in originals {
        let id = redrive_id(o);
        let at_dest = copies.get(&id).copied().unwrap_or(0);
        assert!(in_dlq.contains(&id) || at_dest > 0, "{} lost", o.id);
        if in_dlq.contains(&id) && at_dest > 0 || at_dest > 1 {
            duplicated += 1;
        }
    }
    (in_dlq.len(), copies.values().sum(), duplicated)
}

#[test]
fn without_a_terminal_it_refuses_unless_told_yes() {
    let w = Workspace::with_sample();
    let before = std::fs::read(w.path("dlq.jsonl")).unwrap();
    let o = w.run(&["redrive", "dlq.jsonl", "--to", "out.jsonl"]);
    assert_exit(&o, 2);
    let err = text(&o.stderr);
    assert!(err.contains("no terminal") && err.contains("--yes"), "{err}");
    assert_eq!(std::fs::read(w.path("dlq.jsonl")).unwrap(), before);
    assert!(!w.path("out.jsonl").exists());
}

#[test]
fn dry_run_plans_per_destination_and_reason_and_changes_nothing() {
    let w = Workspace::with_sample();
    let before = std::fs::read(w.path("dlq.jsonl")).unwrap();
    let o = w.run(&[
        "redrive",
        "dlq.jsonl",
        "--to",
        "out.jsonl",
        "--where",
        "source=orders",
        "--dry-run",
        "--plan-out",
        "plan.jsonl",
        "-o",
        "json",
    ]);
    assert_exit(&o, 0);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let plan = &report["plan"];
    assert_eq!(plan["scanned"], 300);
    let selected = plan["selected"].as_u64().unwrap();
    let groups = plan["groups"].as_array().unwrap();
    assert_eq!(groups.iter().map(|g| g["count"].as_u64().unwrap()).sum::<u64>(), selected);
    assert!(groups.iter().all(|g| g["destination"] == "archive out.jsonl"));
    assert!(groups.iter().any(|g| g["reason"] == "rejected") && groups.iter().any(|g| g["reason"] == "exception"));

    assert_eq!(std::fs::read(w.path("dlq.jsonl")).unwrap(), before, "the DLQ is untouched");
    assert!(!w.path("out.jsonl").exists(), "a dry run does not even create the destination");
    let plan_lines: Vec<serde_json::Value> = std::fs::read_to_string(w.path("plan.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(plan_lines[0]["plan"], "dlqctl/redrive-plan/v1");
    assert_eq!(plan_lines.len() as u64 - 1, selected, "one line per selected message, with its exact id");
    assert!(plan_lines[1]["id"].is_string() && plan_lines[1]["redrive_id"].is_string());
    assert_eq!(std::fs::metadata(w.path("plan.jsonl")).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn a_selected_redrive_moves_exactly_the_selection_and_keeps_a_paper_trail() {
    let w = Workspace::with_sample();
    let originals = read(&w.path("dlq.jsonl"));
    let o = w.run(&[
        "redrive",
        "dlq.jsonl",
        "--to",
        "out.jsonl",
        "--where",
        "reason=expired",
        "--yes",
        "--rate",
        "unlimited",
        "--note",
        "INC-1234 consumer fixed",
        "--audit-log",
        "audit.jsonl",
        "-o",
        "json",
    ]);
    assert_exit(&o, 0);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let expired = originals.iter().filter(|l| l.reason.kind.as_str() == "expired").count() as u64;
    assert_eq!(report["summary"]["moved"], expired);
    assert_eq!(report["summary"]["still_in_dlq"], 300 - expired);

    let moved = read(&w.path("out.jsonl"));
    assert!(moved.iter().all(|l| l.reason.kind.as_str() == "expired"));
    assert!(moved.iter().all(|l| l.headers.get(REDRIVE_COUNT_HEADER) == Some(&Value::Int(1))));
    assert!(read(&w.path("dlq.jsonl")).iter().all(|l| l.reason.kind.as_str() != "expired"));
    assert_eq!(check_nothing_lost(&originals, &w.path("dlq.jsonl"), &read(&w.path("out.jsonl"))).2, 0);

    let audit: Vec<serde_json::Value> = std::fs::read_to_string(w.path("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let header = &audit[0];
    assert_eq!(header["audit"], "dlqctl/redrive-audit/v1");
    assert_eq!(header["note"], "INC-1234 consumer fixed");
    assert_eq!(header["selection"], "reason=expired");
    assert!(header["operator"].as_str().unwrap().contains('@'));
    let moved_lines = audit.iter().filter(|l| l["outcome"] == "moved").count() as u64;
    assert_eq!(moved_lines, expired);
    assert!(audit[1..].iter().all(|l| l["redrive_id"].is_string() && l["message_id"].is_string()));
    assert_eq!(std::fs::metadata(w.path("audit.jsonl")).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(w.checkpoint()).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn limit_caps_the_number_moved() {
    let w = Workspace::with_sample();
    let o = w.run(&["redrive", "dlq.jsonl", "--to", "out.jsonl", "--limit", "7", "--yes", "--rate", "unlimited"]);
    assert_exit(&o, 0);
    assert_eq!(read(&w.path("out.jsonl")).len(), 7);
    assert_eq!(read(&w.path("dlq.jsonl")).len(), 293);
}

#[test]
fn max_redrives_skips_messages_already_redriven_that_often() {
    let w = Workspace::with_sample();
    let o = w.run(&["redrive", "dlq.jsonl", "--to", "once.jsonl", "--limit", "5", "--yes", "--rate", "unlimited"]);
    assert_exit(&o, 0);
    // The copies carry dlqctl-redrive-count 1; with --max-redrives 1 they stay where they are.
    let o = w.run(&["redrive", "once.jsonl", "--to", "twice.jsonl", "--max-redrives", "1", "--yes", "-o", "json"]);
    assert_exit(&o, 0);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["summary"]["over_max_redrives"], 5);
    assert_eq!(report["summary"]["moved"], 0);
    assert_eq!(read(&w.path("once.jsonl")).len(), 5);
    // With a higher guard they move, keep their redrive id and count up.
    let o = w.run(&["redrive", "once.jsonl", "--to", "twice.jsonl", "--max-redrives", "2", "--yes"]);
    assert_exit(&o, 0);
    let twice = read(&w.path("twice.jsonl"));
    assert_eq!(twice.len(), 5);
    assert!(twice.iter().all(|l| l.headers.get(REDRIVE_COUNT_HEADER) == Some(&Value::Int(2))));
}

#[test]
fn an_archive_without_to_is_refused_before_anything_is_written() {
    let w = Workspace::with_sample();
    let before = std::fs::read(w.path("dlq.jsonl")).unwrap();
    for extra in [&[][..], &["--dry-run"][..]] {
        let o = w.run(&[&["redrive", "dlq.jsonl", "--yes", "--limit", "4"][..], extra].concat());
        assert_exit(&o, 2);
        let err = text(&o.stderr);
        assert!(err.contains("not how to reach that broker") && err.contains("--to"), "{err}");
    }
    assert_eq!(std::fs::read(w.path("dlq.jsonl")).unwrap(), before);
    assert!(!w.path("state").exists(), "no audit log or checkpoint for a run that cannot start");
}

#[test]
fn resume_refuses_a_checkpoint_of_another_redrive() {
    let w = Workspace::with_sample();
    assert_exit(&w.run(&["redrive", "dlq.jsonl", "--to", "a.jsonl", "--limit", "1", "--yes"]), 0);
    let checkpoint = w.checkpoint();
    let o = w.run(&["redrive", "dlq.jsonl", "--to", "b.jsonl", "--yes", "--resume", checkpoint.to_str().unwrap()]);
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("belongs to a redrive of dlq.jsonl to archive a.jsonl"), "{}", text(&o.stderr));
    assert!(!w.path("b.jsonl").exists(), "refused before touching the destination");
}

#[test]
fn ctrl_c_finishes_in_flight_messages_and_resume_completes() {
    let w = Workspace::with_sample();
    let originals = read(&w.path("dlq.jsonl"));
    let child = w
        .dlqctl()
        .args(["redrive", "dlq.jsonl", "--to", "out.jsonl", "--yes", "--rate", "200"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let o = child.wait_with_output().unwrap();
    assert_exit(&o, 130);
    let err = text(&o.stderr);
    assert!(err.contains("interrupted") && err.contains("--resume"), "{err}");
    let (left, moved, dup) = check_nothing_lost(&originals, &w.path("dlq.jsonl"), &read(&w.path("out.jsonl")));
    assert_eq!(dup, 0, "a clean stop leaves no duplicate");
    assert!(left > 0 && moved > 0, "stopped part way: {left} left, {moved} moved");

    let checkpoint = w.checkpoint();
    let o = w.resume_into_out(&checkpoint, &[]);
    assert_exit(&o, 0);
    assert_eq!(check_nothing_lost(&originals, &w.path("dlq.jsonl"), &read(&w.path("out.jsonl"))), (0, 300, 0));
}

#[test]
fn kill_9_at_random_points_then_resume_loses_nothing() {
    let (mut duplicates, mut unfinished_copies) = (0, 0);
    let trials = trials().max(5);
    for trial in 0..trials {
        let w = Workspace::generated(1000);
        let originals = read(&w.path("dlq.jsonl"));
        let mut child = w
            .dlqctl()
            .args(["redrive", "dlq.jsonl", "--to", "out.jsonl", "--yes", "--rate", "2000", "-q"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(fastrand::u64(30..450)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let (copies, unfinished) = read_whole_lines(&w.path("out.jsonl"));
        check_nothing_lost(&originals, &w.path("dlq.jsonl"), &copies);
        unfinished_copies += usize::from(unfinished);

        let checkpoint = w.checkpoint();
        let o = w.resume_into_out(&checkpoint, &["-q"]);
        assert_exit(&o, 0);
        let (left, _, dup) = check_nothing_lost(&originals, &w.path("dlq.jsonl"), &read(&w.path("out.jsonl")));
        assert_eq!(left, 0, "trial {trial}: the resumed run empties the DLQ");
        assert!(dup <= 10, "trial {trial}: duplicates are bounded by --batch, got {dup}");
        duplicates += dup;
    }
    eprintln!(
        "kill -9 trials: {trials}, messages lost: 0, duplicates (all with their original's redrive id): {duplicates}, \
         copies left unfinished by the kill (cut by the resume): {unfinished_copies}"
    );
}

/// What a kill -9 in the middle of an append leaves, made on purpose: whole copies, then the
/// first bytes of one more. The next run cuts those bytes, says so, and appends whole lines.
#[test]
fn a_copy_left_unfinished_at_the_destination_is_cut_before_appending() {
    let w = Workspace::with_sample();
    let sample = std::fs::read_to_string(w.path("dlq.jsonl")).unwrap();
    let mut lines = sample.lines();
    let (whole, cut) = (lines.next().unwrap(), lines.next().unwrap());
    let unfinished = &cut[..cut.len() / 3];
    std::fs::write(w.path("out.jsonl"), format!("{whole}\n{unfinished}")).unwrap();
    let o = w.run(&["redrive", "dlq.jsonl", "--to", "out.jsonl", "--yes", "--rate", "unlimited", "--limit", "5"]);
    assert_exit(&o, 0);
    let err = text(&o.stderr);
    assert!(err.contains(&format!("cut {} bytes of an unfinished copy", unfinished.len())), "{err}");
    let copies = read(&w.path("out.jsonl"));
    assert_eq!(copies.len(), 6, "the whole line kept, five copies appended");
    assert!(std::fs::read(w.path("out.jsonl")).unwrap().ends_with(b"\n"));

    // A last line that is a whole letter without its newline only gets the newline.
    std::fs::write(w.path("out2.jsonl"), whole).unwrap();
    let o = w.run(&["redrive", "dlq.jsonl", "--to", "out2.jsonl", "--yes", "--rate", "unlimited", "--limit", "1"]);
    assert_exit(&o, 0);
    assert!(!text(&o.stderr).contains("unfinished"), "{}", text(&o.stderr));
    assert_eq!(read(&w.path("out2.jsonl")).len(), 2);
}

#[test]
fn a_destination_that_is_not_an_archive_is_refused_and_left_as_it_was() {
    let w = Workspace::with_sample();
    let before = std::fs::read(w.path("dlq.jsonl")).unwrap();
    std::fs::write(w.path("notes.txt"), "remember to rotate the keys").unwrap();
    let o = w.run(&["redrive", "dlq.jsonl", "--to", "notes.txt", "--yes", "--rate", "unlimited"]);
    assert_exit(&o, 2);
    let err = text(&o.stderr);
    assert!(err.contains("notes.txt") && err.contains("not a dlqctl archive") && err.contains("--to"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(std::fs::read_to_string(w.path("notes.txt")).unwrap(), "remember to rotate the keys");
    assert_eq!(std::fs::read(w.path("dlq.jsonl")).unwrap(), before);
}

// The loss paths of issue #29, on the archive. `DLQCTL_FAULT_TRIALS` sets the trials (default 2).

fn trials() -> usize {
    std::env::var("DLQCTL_FAULT_TRIALS").ok().and_then(|n| n.parse().ok()).unwrap_or(2)
}

#[test]
fn to_naming_the_source_by_any_path_is_refused_before_anything_is_read() {
    let w = Workspace::with_sample();
    std::os::unix::fs::symlink(w.path("dlq.jsonl"), w.path("link.jsonl")).unwrap();
    std::fs::hard_link(w.path("dlq.jsonl"), w.path("hard.jsonl")).unwrap();
    let before = std::fs::read(w.path("dlq.jsonl")).unwrap();
    let absolute = w.path("dlq.jsonl").display().to_string();
    for to in ["dlq.jsonl", "./dlq.jsonl", "link.jsonl", "hard.jsonl", absolute.as_str()] {
        let o = w.run(&["redrive", "dlq.jsonl", "--to", to, "--yes"]);
        assert_exit(&o, 2);
        assert!(text(&o.stderr).contains("names the DLQ being redriven"), "{to}: {}", text(&o.stderr));
        let o = w.run(&["redrive", "link.jsonl", "--to", to, "--yes"]);
        assert_exit(&o, 2);
    }
    assert_eq!(std::fs::read(w.path("dlq.jsonl")).unwrap(), before);
    assert!(!w.path("state").exists(), "refused before any audit log or checkpoint");
}

/// Two runs over one archive at once: the second waits briefly for the lock, then is refused
/// with one line; whichever ran, every letter is in the DLQ or at a destination, and every
/// line of every file is a whole letter.
#[test]
fn two_runs_over_one_archive_never_lose_a_letter() {
    let (mut refused, mut duplicates) = (0, 0);
    for trial in 0..trials() {
        let w = Workspace::generated(20_000);
        let originals = read(&w.path("dlq.jsonl"));
        let start = |to: &str| {
            w.dlqctl()
                .args(["redrive", "dlq.jsonl", "--to", to, "--yes", "--rate", "unlimited", "-q"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let first = start("a.jsonl");
        std::thread::sleep(Duration::from_millis(fastrand::u64(0..200)));
        let second = start("b.jsonl");
        let outputs = [first.wait_with_output().unwrap(), second.wait_with_output().unwrap()];
        for o in &outputs {
            if o.status.code() != Some(0) {
                assert_exit(o, 1);
                assert!(text(&o.stderr).contains("in use by another dlqctl run"), "{}", text(&o.stderr));
                refused += 1;
            }
        }
        assert!(outputs.iter().any(|o| o.status.success()), "trial {trial}: one of the two runs ran");
        let copies: Vec<DeadLetter> = [read(&w.path("a.jsonl")), read(&w.path("b.jsonl"))].concat();
        let (_, _, dup) = check_nothing_lost(&originals, &w.path("dlq.jsonl"), &copies);
        assert_eq!(dup, 0, "trial {trial}: one run at a time copies each letter once");
        duplicates += dup;
    }
    eprintln!(
        "two runs at once over one archive: {} trials, {refused} refused run(s), 0 lost, {duplicates} duplicates",
        trials()
    );
}

/// A copy that failed again and came back to the DLQ carries its original's redrive id, and
/// its checkpoint knows that id; `--resume` must leave it in the DLQ, not remove it as if it
/// were the original whose copy was confirmed.
#[test]
fn resume_leaves_copies_that_came_back() {
    let mut returned = 0;
    for _ in 0..trials() {
        let w = Workspace::with_sample();
        let originals = read(&w.path("dlq.jsonl"));
        let limit = fastrand::u64(1..100).to_string();
        let o =
            w.run(&["redrive", "dlq.jsonl", "--to", "out.jsonl", "--limit", &limit, "--yes", "--rate", "unlimited"]);
        assert_exit(&o, 0);
        let checkpoint = w.checkpoint();
        // The consumer fails on the copies again: they die back into the DLQ (moved there by
        // another run, with its own state, as a broker's own dead-lettering would).
        let back = w
            .dlqctl()
            .env("XDG_STATE_HOME", w.path("other-state"))
            .args(["redrive", "out.jsonl", "--to", "dlq.jsonl", "--yes", "--rate", "unlimited", "-q"])
            .output()
            .unwrap();
        assert_exit(&back, 0);
        let o = w.resume_into_out(&checkpoint, &["-o", "json"]);
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(report["summary"]["returned"].as_u64().unwrap() >= 1, "{report}");
        returned += report["summary"]["returned"].as_u64().unwrap();
        check_nothing_lost(&originals, &w.path("dlq.jsonl"), &read(&w.path("out.jsonl")));
    }
    eprintln!("--resume after copies died back: {} trials, 0 lost, {returned} copies left in the DLQ", trials());
}

/// Copies of 512 KiB in batches of 10 MiB, with `--timeout` at 50 ms: appends outlast the
/// timeout. The wait is given up, never the write: no line of the destination is ever part of
/// a copy, and nothing is lost.
#[test]
fn a_timeout_mid_write_never_leaves_part_of_a_copy() {
    let w = Workspace { dir: tempfile::tempdir().unwrap() };
    let originals: Vec<DeadLetter> = (0..60)
        .map(|i| DeadLetter {
            id: format!("big-{i}"),
            body: Some(vec![b'a' + (i % 26) as u8; 512 * 1024]),
            ..DeadLetter::default()
        })
        .collect();
    let lines: Vec<u8> = originals.iter().flat_map(|l| l.json_line(&mut Vec::new()).to_vec()).collect();
    std::fs::write(w.path("dlq.jsonl"), lines).unwrap();
    let o = w.run(&[
        "--timeout",
        "0.05",
        "redrive",
        "dlq.jsonl",
        "--to",
        "out.jsonl",
        "--batch",
        "20",
        "--retries",
        "1",
        "--max-consecutive-failures",
        "1000",
        "--yes",
        "--rate",
        "unlimited",
        "-q",
    ]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o.stderr));
    let (copies, unfinished) = read_whole_lines(&w.path("out.jsonl"));
    assert!(!unfinished, "the destination ends in a whole line");
    let (left, at_dest, _) = check_nothing_lost(&originals, &w.path("dlq.jsonl"), &copies);
    eprintln!("timeout mid-write: exit {:?}, {left} left in the DLQ, {at_dest} copies", o.status.code());
}

/// A source the run cannot change (here: a folder it cannot write, as user nobody) is refused
/// before any copy is published: no duplicate is left behind.
#[test]
fn a_source_that_cannot_be_changed_is_refused_before_publishing() {
    let w = Workspace::with_sample();
    let open = w.path("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(w.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", env!("CARGO_BIN_EXE_dlqctl")])
        .args(["redrive", "dlq.jsonl", "--to", "open/out.jsonl", "--yes", "--rate", "unlimited"])
        .current_dir(w.dir.path())
        .env("XDG_STATE_HOME", open.join("state"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("cannot open archive dlq.jsonl for writing"), "{}", text(&o.stderr));
    assert!(read(&open.join("out.jsonl")).is_empty(), "nothing was published");
}

/// A message dead-lettered twice: two letters with one id and body (so one redrive id), which
/// differ in their failure count. A resumed run removes without a copy only as many of them as
/// copies were confirmed: the twin gets a copy of its own.
#[test]
fn resume_copies_a_twin_instead_of_removing_it() {
    let w = Workspace::with_sample();
    let lines: Vec<String> = std::fs::read_to_string(w.path("dlq.jsonl")).unwrap().lines().map(str::to_owned).collect();
    let mut twin: DeadLetter = serde_json::from_str(&lines[0]).unwrap();
    twin.failure_count = Some(twin.failure_count.unwrap_or(1) + 1);
    let twin_line = String::from_utf8(twin.json_line(&mut Vec::new()).to_vec()).unwrap();
    std::fs::write(w.path("dlq.jsonl"), format!("{}\n{}\n{twin_line}", lines[0], lines[1])).unwrap();
    assert_exit(&w.run(&["redrive", "dlq.jsonl", "--to", "out.jsonl", "--limit", "1", "--yes", "-q"]), 0);
    let o = w.resume_into_out(&w.checkpoint(), &["-q"]);
    assert_exit(&o, 0);
    let out = read(&w.path("out.jsonl"));
    assert_eq!(out.len(), 3, "each of the three letters has its copy");
    assert!(out.iter().any(|l| l.failure_count == twin.failure_count), "the twin itself was copied");
    assert!(still_in(&w.path("dlq.jsonl")).is_empty());
}

#[test]
fn to_a_device_pipe_or_folder_is_refused_up_front() {
    let w = Workspace::with_sample();
    for to in ["/dev/null", "/dev/full", "."] {
        let o = w.run(&["redrive", "dlq.jsonl", "--to", to, "--yes"]);
        assert_exit(&o, 2);
        assert!(text(&o.stderr).contains("not a regular file"), "{to}: {}", text(&o.stderr));
    }
    assert_eq!(read(&w.path("dlq.jsonl")).len(), 300);
}
