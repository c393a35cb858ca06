//! Settling from an archive in time linear in what is settled. Rewriting the file at every
//! batch made a redrive quadratic in the archive's size; instead each settled batch is one
//! fsynced line of a journal beside the archive (`.NAME.dlqctl-settled`), and the file is
//! rewritten once, when the run ends (or, after a crash, when the next run begins).
//!
//! A journal entry names a line by its index in the file and a digest of its bytes: a line is
//! dropped only when both match, so a journal left beside a file that changed since can at
//! worst leave a letter in place (a duplicate), never remove another one. A reader of the
//! journal holds its entries sorted (16 bytes a settled letter, and only until the rewrite),
//! so the file is then read once, side by side with them.
//!
//! Readers (peek, describe, export) skip the journalled lines too, so what a killed run
//! settled stays settled for them before any rewrite.

use std::fs::File;
use std::hash::Hasher;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::{private_file, remove_temporaries_beside, sync_folder_of, temporary_beside};

/// A line of the archive as the journal names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LineId {
    /// 0-based, counting every line (blank ones too).
    pub index: u64,
    pub digest: u64,
}

/// A digest of a line's bytes (as read, newline included); it only has to tell a changed
/// line from the journalled one.
pub fn digest(line: &[u8]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(line);
    hasher.finish()
}

pub fn journal_path(archive: &Path) -> PathBuf {
    let name = archive.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    archive.with_file_name(format!(".{name}.dlqctl-settled"))
}

/// The journal of the run that holds the archive's lock.
pub struct Journal {
    path: PathBuf,
    out: BufWriter<File>,
}

impl Journal {
    /// Start an empty journal (the caller has compacted any earlier one away).
    pub fn create(archive: &Path) -> Result<Journal> {
        let path = journal_path(archive);
        Ok(Journal { out: private_file(&path, false)?, path })
    }

    /// Journal these lines as settled, durably: once this returns they are gone from the DLQ.
    pub fn settle(&mut self, lines: &[LineId]) -> Result<()> {
        let pairs: Vec<(u64, u64)> = lines.iter().map(|l| (l.index, l.digest)).collect();
        let fail = |e: std::io::Error| Error::io(format!("cannot write the settle journal {}", self.path.display()), e);
        serde_json::to_writer(&mut self.out, &pairs).map_err(|e| fail(e.into()))?;
        self.out.write_all(b"\n").map_err(fail)?;
        self.out.flush().map_err(fail)?;
        self.out.get_ref().sync_data().map_err(fail)
    }
}

/// The settled lines of a journal, sorted. A line a crash cut short (no newline, or not a
/// whole JSON array) settled nothing: its batch was never confirmed.
pub struct Settled {
    lines: std::iter::Peekable<std::vec::IntoIter<LineId>>,
}

impl Settled {
    /// The journal beside `archive`, or an empty one.
    pub fn open(archive: &Path) -> Result<Settled> {
        let path = journal_path(archive);
        let mut lines = Vec::new();
        match File::open(&path) {
            Ok(file) => {
                for batch in BufReader::new(file).split(b'\n') {
                    let batch = batch
                        .map_err(|e| Error::io(format!("cannot read the settle journal {}", path.display()), e))?;
                    // The last line may lack its newline; `split` cannot tell, so every line must
                    // parse whole, which a cut one does not.
                    let pairs = serde_json::from_slice::<Vec<(u64, u64)>>(&batch).unwrap_or_default();
                    lines.extend(pairs.into_iter().map(|(index, digest)| LineId { index, digest }));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("cannot read the settle journal {}", path.display()), e)),
        }
        lines.sort_unstable();
        lines.dedup();
        Ok(Settled { lines: lines.into_iter().peekable() })
    }

    pub fn is_empty(&mut self) -> bool {
        self.lines.peek().is_none()
    }

    /// Whether the line at `index` with these bytes' `digest` was settled. Call with
    /// increasing indices.
    pub fn contains(&mut self, line: LineId) -> bool {
        while self.lines.next_if(|next| next.index < line.index).is_some() {}
        let mut found = false;
        while let Some(next) = self.lines.next_if(|next| next.index == line.index) {
            found |= next == line;
        }
        found
    }
}

/// Rewrite `archive` without the lines its journal settled, then remove the journal. Crash-safe:
/// the new file is written beside the old, fsynced, and renamed over it; a crash before the
/// rename leaves the old file and the journal, one after it a journal whose digests no longer
/// match where they point (removed by the next compaction). Call only while holding the lock.
///
/// The new file is locked before it takes the archive's name, and returned: the lock held on
/// the old file ends with it, and the run goes on holding the new one, with no moment when
/// the archive is unlocked. The new file keeps the old one's mode and, where the process may
/// set them, its owner and group.
pub fn compact(archive: &Path) -> Result<Option<File>> {
    // What a compaction killed before its rename left: only a holder of the lock compacts.
    remove_temporaries_beside(archive, "tmp");
    let mut settled = Settled::open(archive)?;
    let journal = journal_path(archive);
    if settled.is_empty() {
        return remove(&journal).map(|()| None);
    }
    let context = |what: &str| format!("cannot {what} while removing settled letters from {}", archive.display());
    let source = File::open(archive).map_err(|e| Error::io(context("read"), e))?;
    let metadata = source.metadata().map_err(|e| Error::io(context("read"), e))?;
    let (tmp, out) = temporary_beside(archive, "tmp").map_err(|e| Error::io(context("create a temporary file"), e))?;
    let written = (|| -> std::io::Result<()> {
        let mut input = BufReader::with_capacity(super::READ_BUFFER, source);
        let mut output = BufWriter::with_capacity(super::READ_BUFFER, &out);
        let mut line = Vec::new();
        let mut index = 0u64;
        loop {
            line.clear();
            if input.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            if !settled.contains(LineId { index, digest: digest(&line) }) {
                output.write_all(&line)?;
            }
            index += 1;
        }
        output.flush()?;
        drop(output);
        out.set_permissions(metadata.permissions())?;
        // Only root may give a file away; anyone else's rewrite is theirs already.
        let _ = std::os::unix::fs::fchown(&out, Some(metadata.uid()), Some(metadata.gid()));
        out.sync_all()?;
        out.try_lock().map_err(|_| std::io::Error::other("cannot lock the rewritten archive"))
    })();
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, archive)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(context("write"), e));
    }
    sync_folder_of(archive);
    remove(&journal)?;
    Ok(Some(out))
}

fn remove(journal: &Path) -> Result<()> {
    match std::fs::remove_file(journal) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("cannot remove the settle journal {}", journal.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
    }

    fn id(index: u64, line: &str) -> LineId {
        LineId { index, digest: digest(format!("{line}\n").as_bytes()) }
    }

    #[test]
    fn compaction_drops_exactly_the_journalled_lines_whose_bytes_match() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("dlq.jsonl");
        std::fs::write(&archive, "a\nb\nc\nd\ne\n").unwrap();
        let mut journal = Journal::create(&archive).unwrap();
        journal.settle(&[id(0, "a"), id(2, "c")]).unwrap();
        // Index 3 journalled with other bytes (the file changed under it): kept.
        journal.settle(&[id(3, "x"), id(4, "e")]).unwrap();
        drop(journal);
        // A batch a crash cut short settled nothing.
        std::fs::OpenOptions::new().append(true).open(journal_path(&archive)).unwrap().write_all(b"[[1,").unwrap();
        compact(&archive).unwrap();
        assert_eq!(lines(&archive), ["b", "d"]);
        assert!(!journal_path(&archive).exists());
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary file left");
        // One a killed compaction left goes with the next compaction.
        std::fs::write(dir.path().join(".dlq.jsonl.dlqctl-1-0000abcd.tmp"), "x\n").unwrap();
        compact(&archive).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn entries_in_any_order_are_all_applied() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("dlq.jsonl");
        std::fs::write(&archive, "a\nb\nc\nd\n").unwrap();
        let mut journal = Journal::create(&archive).unwrap();
        journal.settle(&[id(2, "c"), id(0, "a")]).unwrap();
        journal.settle(&[id(1, "b")]).unwrap();
        drop(journal);
        compact(&archive).unwrap();
        assert_eq!(lines(&archive), ["d"]);
    }
}
