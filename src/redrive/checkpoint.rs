//! The checkpoint: a write-ahead journal that makes a redrive resumable after Ctrl-C,
//! kill -9 or a broker error. A message's redrive id is journalled (and fsynced) once its
//! copy is confirmed and before the DLQ is asked to remove it, so a resumed run removes it
//! without publishing it a second time.
//!
//! The journal keeps the redrive count each confirmed copy carries. That count is what tells
//! the original apart from its copy when both carry the same redrive id: the original carries
//! one less, while a copy that failed again and came back to the DLQ carries the journalled
//! count itself. Only the original may be removed without a new copy, and only as many
//! originals as copies were confirmed: two letters with the same id and body (a message
//! dead-lettered twice) are two letters, and one confirmed copy stands for one of them.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::files::private_file;

pub const CHECKPOINT_SCHEMA: &str = "dlqctl/redrive-checkpoint/v2";
/// Written by earlier versions, without copy counts: resumable, but an id it journals can no
/// longer prove which message is the original, so those are published again.
const CHECKPOINT_SCHEMA_V1: &str = "dlqctl/redrive-checkpoint/v1";

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Header {
    checkpoint: String,
    dlq: String,
    to: Option<String>,
}

/// A confirmed copy: its redrive id and the redrive count it carries.
#[derive(Debug, Serialize, Deserialize)]
struct Published {
    published: String,
    count: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Settled {
    settled: String,
}

/// What the checkpoint says of a message that carries a journalled redrive id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not journalled: nothing is known of it.
    New,
    /// The original of a confirmed copy: it may be removed without publishing again.
    Original,
    /// A confirmed copy (or a later one) that came back to the DLQ: it is not the original,
    /// and removing it would lose it.
    ReturnedCopy,
    /// Journalled without a count (a v1 checkpoint): which one it is cannot be told, so it is
    /// treated as new and published again (a duplicate with the same redrive id, never a loss).
    Unproven,
}

pub struct Checkpoint {
    path: PathBuf,
    out: BufWriter<File>,
    published: HashMap<String, Journalled>,
}

/// What the journal says of one redrive id.
#[derive(Debug, Default)]
struct Journalled {
    /// The redrive count its confirmed copies carry (`None`: a v1 line, without one).
    count: Option<u64>,
    /// Copies confirmed, and originals removed since, over every run of this checkpoint.
    confirmed: u32,
    settled: u32,
}

impl Checkpoint {
    pub fn create(path: &Path, dlq: &str, to: Option<&str>) -> Result<Checkpoint> {
        let mut checkpoint =
            Checkpoint { path: path.to_path_buf(), out: locked(path, false)?, published: HashMap::new() };
        let header = Header { checkpoint: CHECKPOINT_SCHEMA.into(), dlq: dlq.into(), to: to.map(str::to_owned) };
        checkpoint.append(&header, true)?;
        Ok(checkpoint)
    }

    /// Reopen a checkpoint; it must be for the same DLQ and destination.
    pub fn resume(path: &Path, dlq: &str, to: Option<&str>) -> Result<Checkpoint> {
        let bad = |why: String| Error::Usage(format!("cannot resume from {}: {why}", path.display()));
        let file = File::open(path).map_err(|e| bad(e.to_string()))?;
        let mut lines = BufReader::new(file).lines();
        let header: Header = lines
            .next()
            .ok_or_else(|| bad("it is empty".into()))?
            .map_err(|e| bad(e.to_string()))
            .and_then(|l| serde_json::from_str(&l).map_err(|_| bad("it is not a dlqctl checkpoint".into())))?;
        if header.checkpoint != CHECKPOINT_SCHEMA && header.checkpoint != CHECKPOINT_SCHEMA_V1 {
            return Err(bad(format!("unsupported checkpoint version {:?}", header.checkpoint)));
        }
        if header.dlq != dlq || header.to.as_deref() != to {
            return Err(bad(format!(
                "it belongs to a redrive of {} to {}, not of {dlq} to {}",
                header.dlq,
                header.to.as_deref().unwrap_or("the sources"),
                to.unwrap_or("the sources")
            )));
        }
        let mut published: HashMap<String, Journalled> = HashMap::new();
        for line in lines {
            let line = line.map_err(|e| bad(e.to_string()))?;
            // A kill can cut the last line short; what it would have said is not needed.
            if let Ok(p) = serde_json::from_str::<Published>(&line) {
                let entry = published.entry(p.published).or_default();
                entry.count = Some(p.count);
                entry.confirmed += 1;
            } else if let Ok(s) = serde_json::from_str::<Settled>(&line) {
                published.entry(s.settled).or_default().settled += 1;
            } else if let Ok(serde_json::Value::Object(v1)) = serde_json::from_str(&line)
                && let Some(serde_json::Value::String(id)) = v1.get("published")
            {
                published.entry(id.clone()).or_default().confirmed += 1;
            }
        }
        Ok(Checkpoint { path: path.to_path_buf(), out: locked(path, true)?, published })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What this run, or the run it resumes, knows of a message with this redrive id that
    /// carries `count` (its redrive count). `rereads_settled`: the DLQ can hand out again a
    /// message already removed (Kafka), so one met again is that message, not a twin.
    pub fn seen(&self, redrive_id: &str, count: u64, rereads_settled: bool) -> Seen {
        let Some(journalled) = self.published.get(redrive_id) else { return Seen::New };
        let unspent = journalled.confirmed > journalled.settled || rereads_settled;
        match journalled.count {
            None => Seen::Unproven,
            Some(copy) if count + 1 == copy && unspent => Seen::Original,
            Some(copy) if count >= copy => Seen::ReturnedCopy,
            // Another letter with the same id and body whose copy no confirmed copy stands for,
            // or an older duplicate (a copy from an earlier redrive still in the DLQ): published
            // like any other.
            Some(_) => Seen::New,
        }
    }

    /// Journal confirmed copies (redrive id, the count the copy carries), durably, before
    /// their originals are removed.
    pub fn record_published(&mut self, copies: &[(&str, u64)]) -> Result<()> {
        for &(id, count) in copies {
            self.append(&Published { published: id.to_owned(), count }, false)?;
            let entry = self.published.entry(id.to_owned()).or_default();
            entry.count = Some(count);
            entry.confirmed += 1;
        }
        self.sync()
    }

    pub fn record_settled(&mut self, ids: &[&str]) -> Result<()> {
        for id in ids {
            self.append(&Settled { settled: (*id).to_owned() }, false)?;
            self.published.entry((*id).to_owned()).or_default().settled += 1;
        }
        self.out.flush().map_err(|e| self.error(e))
    }

    fn append<T: Serialize>(&mut self, value: &T, sync: bool) -> Result<()> {
        serde_json::to_writer(&mut self.out, value).map_err(|e| self.error(e.into()))?;
        self.out.write_all(b"\n").map_err(|e| self.error(e))?;
        if sync { self.sync() } else { Ok(()) }
    }

    fn sync(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| self.error(e))?;
        self.out.get_ref().sync_data().map_err(|e| self.error(e))
    }

    fn error(&self, e: std::io::Error) -> Error {
        Error::io(format!("cannot write checkpoint {}", self.path.display()), e)
    }
}

/// The checkpoint file, locked for this run: two runs resuming one checkpoint at once would
/// each take the other's journalled copies for unconfirmed ones.
fn locked(path: &Path, append: bool) -> Result<BufWriter<File>> {
    let out = private_file(path, append)?;
    match out.get_ref().try_lock() {
        Ok(()) => Ok(out),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Runtime(format!(
            "checkpoint {} is in use by another dlqctl run: wait for that run to end, then resume",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::io(format!("cannot lock checkpoint {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn resume_knows_what_was_published_and_refuses_another_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.checkpoint.jsonl");
        let mut c = Checkpoint::create(&path, "q.jsonl", Some("archive out.jsonl")).unwrap();
        c.record_published(&[("a", 1), ("b", 3)]).unwrap();
        c.record_settled(&["a"]).unwrap();
        drop(c);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // A torn last line, as a kill -9 can leave.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"publ").unwrap();

        let mut c = Checkpoint::resume(&path, "q.jsonl", Some("archive out.jsonl")).unwrap();
        assert_eq!(c.seen("a", 0, false), Seen::New, "a's one copy already stands for a removed original");
        assert_eq!(c.seen("b", 2, false), Seen::Original);
        assert_eq!(c.seen("c", 0, false), Seen::New);
        // What the resumed run records is not glued to the torn line: a second resume sees it.
        c.record_published(&[("c", 1)]).unwrap();
        drop(c);
        let c = Checkpoint::resume(&path, "q.jsonl", Some("archive out.jsonl")).unwrap();
        assert_eq!([c.seen("b", 2, false), c.seen("c", 0, false)], [Seen::Original; 2]);
        let err = Checkpoint::resume(&path, "other.jsonl", Some("archive out.jsonl")).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("belongs to a redrive of q.jsonl"), "{err}");
    }

    #[test]
    fn a_copy_that_came_back_is_told_from_its_original() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.checkpoint.jsonl");
        let mut c = Checkpoint::create(&path, "q", None).unwrap();
        c.record_published(&[("a", 2)]).unwrap();
        drop(c);
        let c = Checkpoint::resume(&path, "q", None).unwrap();
        assert_eq!(c.seen("a", 1, false), Seen::Original);
        assert_eq!(c.seen("a", 2, false), Seen::ReturnedCopy, "the copy itself, dead-lettered again");
        assert_eq!(c.seen("a", 3, false), Seen::ReturnedCopy, "a later copy still is not the original");
        assert_eq!(c.seen("a", 0, false), Seen::New, "an older duplicate is published again, never dropped");
    }

    #[test]
    fn one_confirmed_copy_removes_one_original_however_many_share_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.checkpoint.jsonl");
        let mut c = Checkpoint::create(&path, "q", None).unwrap();
        c.record_published(&[("twin", 1)]).unwrap();
        drop(c);
        let mut c = Checkpoint::resume(&path, "q", None).unwrap();
        assert_eq!(c.seen("twin", 0, false), Seen::Original);
        c.record_settled(&["twin"]).unwrap();
        assert_eq!(c.seen("twin", 0, false), Seen::New, "the second twin needs a copy of its own");
        assert_eq!(c.seen("twin", 0, true), Seen::Original, "on Kafka it is the removed record read again");
        drop(c);
        let c = Checkpoint::resume(&path, "q", None).unwrap();
        assert_eq!(c.seen("twin", 0, false), Seen::New);
    }

    #[test]
    fn a_v1_checkpoint_resumes_without_removing_anything_unproven() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.checkpoint.jsonl");
        std::fs::write(
            &path,
            "{\"checkpoint\":\"dlqctl/redrive-checkpoint/v1\",\"dlq\":\"q\",\"to\":null}\n{\"published\":\"a\"}\n",
        )
        .unwrap();
        let c = Checkpoint::resume(&path, "q", None).unwrap();
        assert_eq!(c.seen("a", 0, false), Seen::Unproven);
        assert_eq!(c.seen("b", 0, false), Seen::New);
    }
}
