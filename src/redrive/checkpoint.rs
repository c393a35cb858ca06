//! The checkpoint: a write-ahead journal that makes a redrive resumable after Ctrl-C,
//! kill -9 or a broker error. A message's redrive id is journalled (and fsynced) once its
//! copy is confirmed and before the DLQ is asked to remove it, so a resumed run removes it
//! without publishing it a second time.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::private_file;
use crate::error::{Error, Result};

pub const CHECKPOINT_SCHEMA: &str = "dlqctl/redrive-checkpoint/v1";

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Header {
    checkpoint: String,
    dlq: String,
    to: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Published(String),
    Settled(String),
}

pub struct Checkpoint {
    path: PathBuf,
    out: BufWriter<File>,
    published: HashSet<String>,
}

impl Checkpoint {
    pub fn create(path: &Path, dlq: &str, to: Option<&str>) -> Result<Checkpoint> {
        let mut checkpoint =
            Checkpoint { path: path.to_path_buf(), out: private_file(path, false)?, published: HashSet::new() };
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
        if header.checkpoint != CHECKPOINT_SCHEMA {
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
        let mut published = HashSet::new();
        for line in lines {
            let line = line.map_err(|e| bad(e.to_string()))?;
            // A kill can cut the last line short; what it would have said is not needed.
            if let Ok(Line::Published(id)) = serde_json::from_str(&line) {
                published.insert(id);
            }
        }
        Ok(Checkpoint { path: path.to_path_buf(), out: private_file(path, true)?, published })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether an earlier run already had this message's copy confirmed.
    pub fn was_published(&self, redrive_id: &str) -> bool {
        self.published.contains(redrive_id)
    }

    /// Journal confirmed copies, durably, before their originals are removed.
    pub fn record_published(&mut self, ids: &[&str]) -> Result<()> {
        for id in ids {
            self.append(&Line::Published((*id).to_owned()), false)?;
            self.published.insert((*id).to_owned());
        }
        self.sync()
    }

    pub fn record_settled(&mut self, ids: &[&str]) -> Result<()> {
        for id in ids {
            self.append(&Line::Settled((*id).to_owned()), false)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn resume_knows_what_was_published_and_refuses_another_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.checkpoint.jsonl");
        let mut c = Checkpoint::create(&path, "q.jsonl", Some("archive out.jsonl")).unwrap();
        c.record_published(&["a", "b"]).unwrap();
        c.record_settled(&["a"]).unwrap();
        drop(c);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // A torn last line, as a kill -9 can leave.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"publ").unwrap();

        let mut c = Checkpoint::resume(&path, "q.jsonl", Some("archive out.jsonl")).unwrap();
        assert!(c.was_published("a") && c.was_published("b") && !c.was_published("c"));
        // What the resumed run records is not glued to the torn line: a second resume sees it.
        c.record_published(&["c"]).unwrap();
        drop(c);
        let c = Checkpoint::resume(&path, "q.jsonl", Some("archive out.jsonl")).unwrap();
        assert!(c.was_published("a") && c.was_published("b") && c.was_published("c"));
        let err = Checkpoint::resume(&path, "other.jsonl", Some("archive out.jsonl")).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("belongs to a redrive of q.jsonl"), "{err}");
    }
}
