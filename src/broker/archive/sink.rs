//! An archive file as a redrive destination ("replay into a file"): copies are appended, and a
//! batch counts as confirmed once it is written whole and fsynced.
//!
//! Each batch is appended under the archive's lock, by a blocking task that a timeout cannot
//! cut short: `--timeout` stops the wait, never the write, so no copy is left half-written.
//! A batch whose wait was given up on is cut back out before the lock is let go, when the
//! write is still in hand; otherwise it stays as a duplicate carrying its redrive id.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::lock::{LockError, lock_file};
use crate::broker::{Destination, Failure, PublishError, Sink};
use crate::error::{Error, Result};
use crate::model::{DeadLetter, Keep, SCHEMA};

pub struct ArchiveSink {
    path: PathBuf,
    /// What opening did to the file's last line, for the operator.
    open_notes: Vec<String>,
    /// Where this sink last left the file's end. While the file is still so, it ends in a whole
    /// letter this sink wrote or checked, and is not read back before the next append.
    checked_end: Arc<Mutex<Option<End>>>,
}

/// A file's identity and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct End {
    dev: u64,
    ino: u64,
    len: u64,
}

impl End {
    fn of(file: &File) -> std::io::Result<End> {
        let m = file.metadata()?;
        Ok(End { dev: m.dev(), ino: m.ino(), len: m.len() })
    }
}

impl ArchiveSink {
    pub async fn open(path: &Path) -> Result<Self> {
        let owned = path.to_path_buf();
        let (open_notes, end) = tokio::task::spawn_blocking(move || prepare(&owned))
            .await
            .map_err(|e| Error::Runtime(format!("cannot check the end of archive {}: {e}", path.display())))??;
        Ok(ArchiveSink { path: path.to_path_buf(), open_notes, checked_end: Arc::new(Mutex::new(end)) })
    }
}

/// Check the destination can be written, and finish what a killed run left unfinished at its
/// end, saying where that end now is. A lock held by another run is no error here: the
/// appends wait their turn.
fn prepare(path: &Path) -> Result<(Vec<String>, Option<End>)> {
    if let Ok(metadata) = std::fs::metadata(path)
        && !metadata.is_file()
    {
        return Err(Error::Usage(format!(
            "--to {} is not a regular file (a device, pipe or folder cannot be fsynced and cut back): \
             name a .jsonl file",
            path.display()
        )));
    }
    match lock_file(path, true) {
        Ok(mut file) => {
            let notes = finish_last_line(&mut file, path)?.into_iter().collect();
            Ok((notes, End::of(&file).ok()))
        }
        Err(LockError::Busy) => Ok((Vec::new(), None)),
        Err(LockError::Io(e)) => Err(Error::Usage(format!("cannot open archive {} for writing: {e}", path.display()))),
    }
}

/// Sets its flag when dropped before being disarmed: the publish that owned it stopped waiting.
struct GaveUp(Arc<AtomicBool>, bool);

impl Drop for GaveUp {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// Append `lines` to `path` under its lock, durably. When `gave_up` is set by the time the
/// write is done, the caller no longer waits for it: the bytes are cut back out, so a copy
/// never counts as confirmed without its caller knowing. The file's end is checked first
/// unless it is still where `checked_end` says this sink left it.
fn append(
    path: &Path,
    lines: &[u8],
    gave_up: &AtomicBool,
    checked_end: &Mutex<Option<End>>,
) -> std::result::Result<(), PublishError> {
    let fail = |failure, what: String| PublishError {
        failure,
        message: format!("cannot append to {}: {what}", path.display()),
    };
    let mut file = match lock_file(path, true) {
        Ok(file) => file,
        Err(LockError::Busy) => {
            return Err(fail(Failure::Transient, "another dlqctl run holds its lock; waiting for it".into()));
        }
        Err(LockError::Io(e)) => return Err(fail(io_failure(&e), e.to_string())),
    };
    let mut checked = checked_end.lock().expect("not poisoned");
    let end = End::of(&file).map_err(|e| fail(io_failure(&e), e.to_string()))?;
    if *checked != Some(end) {
        // Another writer was here (or this is the first append): its end is not known whole.
        *checked = None;
        finish_last_line(&mut file, path).map_err(|e| fail(Failure::Permanent, e.to_string()))?;
    }
    let start = End::of(&file).map_err(|e| fail(io_failure(&e), e.to_string()))?;
    let written = file.write_all(lines).and_then(|()| file.sync_data());
    let abandoned = gave_up.load(Ordering::SeqCst);
    if written.is_err() || abandoned {
        // Nothing else can have written since: we hold the lock.
        file.set_len(start.len).and_then(|()| file.sync_data()).map_err(|e| fail(Failure::Permanent, e.to_string()))?;
        *checked = Some(start);
    } else {
        *checked = Some(End { len: start.len + lines.len() as u64, ..start });
    }
    match written {
        Err(e) => Err(fail(io_failure(&e), e.to_string())),
        Ok(()) if abandoned => Err(fail(Failure::Transient, "the write outlasted --timeout; cut back out".into())),
        Ok(()) => Ok(()),
    }
}

fn io_failure(e: &std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::Interrupted | std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            Failure::Transient
        }
        _ => Failure::Permanent,
    }
}

#[async_trait]
impl Sink for ArchiveSink {
    fn open_notes(&self) -> Vec<String> {
        self.open_notes.clone()
    }

    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<Result<(), PublishError>> {
        let mut lines = Vec::new();
        let mut line = Vec::with_capacity(4096);
        for (letter, _) in batch {
            lines.extend_from_slice(letter.json_line(&mut line));
        }
        let flag = Arc::new(AtomicBool::new(false));
        let mut waiting = GaveUp(flag.clone(), false);
        let path = self.path.clone();
        let checked_end = self.checked_end.clone();
        let task = tokio::task::spawn_blocking(move || append(&path, &lines, &flag, &checked_end));
        let result = task.await.unwrap_or_else(|e| {
            Err(PublishError { failure: Failure::Permanent, message: format!("the append task failed: {e}") })
        });
        waiting.1 = true;
        vec![result; batch.len()]
    }
}

/// Makes the file end in a whole line before copies are appended to it. A run killed while
/// appending (kill -9, power loss) can leave the first bytes of a copy and no newline; that
/// copy was never confirmed, so its original is still in the DLQ and the cut is safe. A last
/// line that is a whole dead letter only gets its newline; any other unfinished line means the
/// file is not a dlqctl archive, and nothing is touched. Returns a note when bytes were cut.
/// Call only while holding the lock: another run's append in progress is not unfinished.
fn finish_last_line(file: &mut File, path: &Path) -> Result<Option<String>> {
    let fail = |what: &str, e: std::io::Error| Error::Runtime(format!("cannot {what} archive {}: {e}", path.display()));
    let not_an_archive = || {
        Error::Usage(format!(
            "{} ends in a line that is neither a dead letter nor part of one: it is not a dlqctl \
             archive; name another file with --to",
            path.display()
        ))
    };
    let len = file.metadata().map_err(|e| fail("inspect", e))?.len();
    let line_start = last_line_start(file, len).map_err(|e| fail("read", e))?;
    let unfinished_len = len - line_start;
    if unfinished_len == 0 {
        // Whole lines: the last must be a dead letter, or this is some other file that a
        // mistyped --to would append message bodies to.
        if len > 0 {
            let start = last_line_start(file, len - 1).map_err(|e| fail("read", e))?;
            let mut last = Vec::new();
            file.seek(SeekFrom::Start(start))
                .and_then(|_| (&mut *file).take(len - 1 - start).read_to_end(&mut last))
                .map_err(|e| fail("read", e))?;
            let last = last.trim_ascii();
            if !last.is_empty() && DeadLetter::from_archive_line(last, Keep { bodies: false, headers: false }).is_err()
            {
                return Err(not_an_archive());
            }
        }
        return Ok(None);
    }
    // Only a line that opens as JSON is read whole: a letter can be large, and a file that is
    // not an archive larger still. Its first 64 bytes tell.
    let mut line = Vec::new();
    file.seek(SeekFrom::Start(line_start))
        .and_then(|_| (&mut *file).take(64).read_to_end(&mut line))
        .map_err(|e| fail("read", e))?;
    match line.trim_ascii_start().first() {
        None if unfinished_len <= 64 => return Ok(None),
        Some(b'{') => {}
        _ => return Err(not_an_archive()),
    }
    (&mut *file).take(unfinished_len - line.len() as u64).read_to_end(&mut line).map_err(|e| fail("read", e))?;
    let unfinished = line.trim_ascii();
    if DeadLetter::from_archive_line(unfinished, Keep { bodies: false, headers: false }).is_ok() {
        file.write_all(b"\n").and_then(|()| file.sync_data()).map_err(|e| fail("write to", e))?;
        return Ok(None);
    }
    // Cut only what is the start of a dlqctl letter that ended early: it opens as one, and
    // it fails to parse only because it ends (a whole line with an error inside is another
    // letter, damaged, and is not ours to cut).
    let line_opening = format!(r#"{{"schema":"{SCHEMA}""#);
    let opens_as_a_letter =
        unfinished.starts_with(line_opening.as_bytes()) || line_opening.as_bytes().starts_with(unfinished);
    let ends_early = serde_json::from_slice::<serde::de::IgnoredAny>(unfinished).is_err_and(|e| e.is_eof());
    if !(opens_as_a_letter && ends_early) {
        return Err(not_an_archive());
    }
    file.set_len(line_start).and_then(|_| file.sync_data()).map_err(|e| fail("truncate", e))?;
    Ok(Some(format!(
        "cut {unfinished_len} bytes of an unfinished copy from the end of {} (left by a run that \
         stopped while writing; its original is still in the DLQ)",
        path.display()
    )))
}

/// Where the file's last line starts: just after its last newline, or at 0. Reads backwards,
/// a chunk at a time, holding one chunk.
fn last_line_start(file: &mut File, len: u64) -> std::io::Result<u64> {
    let mut chunk = vec![0; 64 * 1024];
    let mut end = len;
    while end > 0 {
        let size = (chunk.len() as u64).min(end) as usize;
        let at = end - size as u64;
        file.seek(SeekFrom::Start(at))?;
        file.read_exact(&mut chunk[..size])?;
        if let Some(i) = chunk[..size].iter().rposition(|&b| b == b'\n') {
            return Ok(at + i as u64 + 1);
        }
        end = at;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_line(body_len: usize) -> String {
        let letter = DeadLetter { id: "m-1".into(), body: Some(vec![b'x'; body_len]), ..DeadLetter::default() };
        String::from_utf8(letter.json_line(&mut Vec::new()).to_vec()).unwrap()
    }

    fn finish(path: &Path) -> Result<Option<String>> {
        match lock_file(path, false) {
            Ok(mut file) => finish_last_line(&mut file, path),
            Err(LockError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn an_unfinished_copy_longer_than_a_chunk_is_cut_at_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let whole = sample_line(10);
        let long = sample_line(300 * 1024);
        let unfinished = &long[..long.len() - 100];
        std::fs::write(&path, format!("{whole}{unfinished}")).unwrap();
        let note = finish(&path).unwrap().unwrap();
        assert!(note.contains(&format!("cut {} bytes", unfinished.len())), "{note}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), whole);
    }

    #[test]
    fn whole_lines_blank_ends_and_missing_files_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let whole = sample_line(10);
        for content in [String::new(), whole.clone(), format!("{whole}  ")] {
            let path = dir.path().join("out.jsonl");
            std::fs::write(&path, &content).unwrap();
            assert_eq!(finish(&path).unwrap(), None);
            assert_eq!(std::fs::read_to_string(&path).unwrap(), content);
        }
        assert_eq!(finish(&dir.path().join("absent.jsonl")).unwrap(), None);
    }

    #[test]
    fn a_file_that_is_not_an_archive_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image.bin");
        // No newline anywhere and more than a chunk: refused without reading it whole.
        let content = vec![0xffu8; 200 * 1024];
        std::fs::write(&path, &content).unwrap();
        let err = finish(&path).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("not a dlqctl archive"), "{err}");
        let json = dir.path().join("other.json");
        std::fs::write(&json, "{\"not\": \"a letter\"").unwrap();
        assert!(finish(&json).is_err());
        // A whole line that opens as a letter but is damaged inside is not an unfinished copy.
        let damaged = dir.path().join("damaged.jsonl");
        let whole = sample_line(10);
        let broken = whole.trim_end().replacen("\"id\"", "\"id\" \"", 1);
        std::fs::write(&damaged, &broken).unwrap();
        assert!(finish(&damaged).is_err());
        assert_eq!(std::fs::read_to_string(&damaged).unwrap(), broken);
        // Whole lines of something else: not appended to.
        let notes = dir.path().join("notes.txt");
        std::fs::write(&notes, "victim\n").unwrap();
        assert!(finish(&notes).is_err());
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "victim\n");
        assert_eq!(std::fs::read(&path).unwrap(), content);
        assert_eq!(std::fs::read_to_string(&json).unwrap(), "{\"not\": \"a letter\"");
    }

    #[test]
    fn a_write_whose_caller_gave_up_is_cut_back_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let whole = sample_line(10);
        std::fs::write(&path, &whole).unwrap();
        let big = sample_line(3 * 1024 * 1024);
        let gave_up = AtomicBool::new(true);
        let err = append(&path, big.as_bytes(), &gave_up, &Mutex::new(None)).unwrap_err();
        assert_eq!(err.failure, Failure::Transient, "{}", err.message);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), whole, "no part of the copy stays");
        append(&path, big.as_bytes(), &AtomicBool::new(false), &Mutex::new(None)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{whole}{big}"));
    }

    #[test]
    fn an_end_another_writer_left_unfinished_is_checked_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let (first, second) = (sample_line(10), sample_line(20));
        let checked_end = Mutex::new(None);
        append(&path, first.as_bytes(), &AtomicBool::new(false), &checked_end).unwrap();
        assert!(checked_end.lock().unwrap().is_some(), "this sink knows the end it left");
        // Another run, killed mid-append, leaves the start of a copy.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&second.as_bytes()[..15]).unwrap();
        append(&path, second.as_bytes(), &AtomicBool::new(false), &checked_end).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{first}{second}"));
    }

    #[test]
    fn a_locked_destination_is_a_transient_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let _held = lock_file(&path, true).unwrap();
        let err = append(&path, sample_line(1).as_bytes(), &AtomicBool::new(false), &Mutex::new(None)).unwrap_err();
        assert_eq!(err.failure, Failure::Transient);
        assert!(err.message.contains("another dlqctl run"), "{}", err.message);
    }
}
