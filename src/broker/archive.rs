//! The JSONL archive backend: a file (or stdin) of `dlqctl/dead-letter/v1` lines.
//!
//! It is the embedded default, works with no broker at all, and is what `export` writes.
//! As a redrive source, settling rewrites the file without the settled lines
//! (write a temporary file, fsync, rename), so a crash leaves either the old or the new
//! file, never a half-written one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use futures::StreamExt;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::{
    Broker, Capabilities, Description, Destination, Failure, Handle, LetterStream, OpenOptions, PublishError, Received,
    Sink,
};
use crate::error::{Error, Result};
use crate::model::{DeadLetter, Keep, SCHEMA};
use crate::target::ArchiveTarget;

const READ_BUFFER: usize = 256 * 1024;

pub struct ArchiveBroker {
    target: ArchiveTarget,
    skip_invalid: bool,
    keep: Keep,
    skipped: AtomicU64,
    first_skipped_line: AtomicU64,
    consumer: tokio::sync::Mutex<Option<Consumer>>,
    /// Lines of the original file already settled (removed from the file on disk).
    removed: Mutex<BTreeSet<u64>>,
}

/// The reader behind `receive`: it keeps the file as it was when the first receive
/// opened it, so line numbers stay stable while settles rewrite the path.
struct Consumer {
    lines: LineReader,
}

impl ArchiveBroker {
    pub async fn open(target: ArchiveTarget, options: &OpenOptions) -> Result<Self> {
        if let ArchiveTarget::File(path) = &target {
            // Fail now, with the path, rather than on first read.
            tokio::fs::metadata(path).await.map_err(|e| open_error(path, e))?;
        }
        Ok(ArchiveBroker {
            target,
            skip_invalid: options.skip_invalid,
            keep: Keep { bodies: options.bodies, headers: options.headers },
            skipped: AtomicU64::new(0),
            first_skipped_line: AtomicU64::new(0),
            consumer: tokio::sync::Mutex::new(None),
            removed: Mutex::new(BTreeSet::new()),
        })
    }

    fn name(&self) -> String {
        match &self.target {
            ArchiveTarget::File(p) => p.display().to_string(),
            ArchiveTarget::Stdin => "<stdin>".into(),
        }
    }

    fn file(&self, operation: &'static str) -> Result<&Path> {
        match &self.target {
            ArchiveTarget::File(p) => Ok(p),
            ArchiveTarget::Stdin => Err(Error::NotSupported {
                backend: self.backend(),
                operation,
                why: "an archive read from stdin can only be read once; save it to a .jsonl file first".into(),
            }),
        }
    }

    async fn reader(&self) -> Result<LineReader> {
        let input: Box<dyn AsyncBufRead + Unpin + Send> = match &self.target {
            ArchiveTarget::Stdin => Box::new(BufReader::with_capacity(READ_BUFFER, tokio::io::stdin())),
            ArchiveTarget::File(path) => {
                let file = tokio::fs::File::open(path).await.map_err(|e| open_error(path, e))?;
                Box::new(BufReader::with_capacity(READ_BUFFER, file))
            }
        };
        Ok(LineReader { input, name: self.name(), keep: self.keep, line_no: 0, buf: Vec::with_capacity(4096) })
    }

    /// The next dead letter, honouring `--skip-invalid`.
    async fn next_letter(&self, lines: &mut LineReader) -> Option<Result<(u64, DeadLetter)>> {
        loop {
            match lines.next().await? {
                Err(Error::InvalidRecord { line, .. }) if self.skip_invalid => {
                    if self.skipped.fetch_add(1, Ordering::Relaxed) == 0 {
                        self.first_skipped_line.store(line, Ordering::Relaxed);
                    }
                }
                other => return Some(other),
            }
        }
    }
}

fn open_error(path: &Path, e: std::io::Error) -> Error {
    Error::Runtime(format!(
        "cannot open archive {}: {e} (a target is a .jsonl file, a URL such as rabbitmq://, sqs://, kafka://, \
         or a name under [targets] in the config file)",
        path.display()
    ))
}

struct LineReader {
    input: Box<dyn AsyncBufRead + Unpin + Send>,
    name: String,
    keep: Keep,
    line_no: u64,
    buf: Vec<u8>,
}

impl LineReader {
    /// The next non-blank line as a dead letter, with its 0-based line index.
    async fn next(&mut self) -> Option<Result<(u64, DeadLetter)>> {
        loop {
            self.buf.clear();
            match self.input.read_until(b'\n', &mut self.buf).await {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => {
                    return Some(Err(Error::io(format!("cannot read archive {}", self.name), e)));
                }
            }
            let index = self.line_no;
            self.line_no += 1;
            let line = self.buf.trim_ascii();
            if line.is_empty() {
                continue;
            }
            return Some(DeadLetter::from_archive_line(line, self.keep).map(|letter| (index, letter)).map_err(|e| {
                Error::InvalidRecord {
                    source_name: self.name.clone(),
                    line: index + 1,
                    message: format!("not a dead letter: {}", without_position(&e)),
                }
            }));
        }
    }
}

/// serde_json appends "at line 1 column N"; within one JSONL line only the column helps.
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => format!("{} (column {})", &text[..i], e.column()),
        None => text,
    }
}

#[async_trait]
impl Broker for ArchiveBroker {
    fn backend(&self) -> &'static str {
        "archive"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            peek: true,
            peek_cost: None,
            consume: matches!(self.target, ArchiveTarget::File(_)),
            server_move: false,
        }
    }

    async fn describe(&self) -> Result<Description> {
        let mut lines = self.reader().await?;
        let mut depth = 0u64;
        let mut oldest = None;
        let mut sources = BTreeSet::new();
        while let Some(next) = self.next_letter(&mut lines).await {
            let (_, letter) = next?;
            depth += 1;
            if let Some(t) = letter.failed_at() {
                oldest = Some(oldest.map_or(t, |o: chrono::DateTime<Utc>| o.min(t)));
            }
            if let Some(name) = letter.source.name {
                sources.insert(name);
            }
        }
        Ok(Description {
            target: self.name(),
            name: self.name(),
            kind: "archive",
            depth: Some(depth),
            oldest_age: oldest.map(|t| (Utc::now() - t).to_std().unwrap_or(Duration::ZERO)),
            retention: None,
            sources: sources.into_iter().collect(),
            capabilities: self.capabilities(),
            notes: self.read_notes(),
        })
    }

    async fn list(&self) -> Result<Vec<Description>> {
        Ok(vec![self.describe().await?])
    }

    async fn peek(&self, limit: Option<u64>) -> Result<LetterStream<'_>> {
        let lines = self.reader().await?;
        let remaining = limit.unwrap_or(u64::MAX);
        Ok(futures::stream::unfold((lines, remaining), move |(mut lines, remaining)| async move {
            if remaining == 0 {
                return None;
            }
            let next = self.next_letter(&mut lines).await?;
            Some((next.map(|(_, letter)| letter), (lines, remaining - 1)))
        })
        .boxed())
    }

    async fn receive(&self, max: usize) -> Result<Vec<Received>> {
        self.file("receive messages")?;
        let mut consumer = self.consumer.lock().await;
        if consumer.is_none() {
            *consumer = Some(Consumer { lines: self.reader().await? });
        }
        let lines = &mut consumer.as_mut().expect("set above").lines;
        let mut batch = Vec::with_capacity(max);
        while batch.len() < max {
            let Some(next) = self.next_letter(lines).await else {
                break;
            };
            let (index, letter) = next?;
            batch.push(Received { handle: Handle::ArchiveRecord(index), letter });
        }
        Ok(batch)
    }

    async fn settle(&self, handles: &[Handle]) -> Result<()> {
        let path = self.file("settle messages")?.to_path_buf();
        let settled: BTreeSet<u64> = handles
            .iter()
            .filter_map(|h| match h {
                Handle::ArchiveRecord(i) => Some(*i),
                _ => None,
            })
            .collect();
        if settled.is_empty() {
            return Ok(());
        }
        // Hold the consumer lock so no receive interleaves with the rewrite.
        let _consumer = self.consumer.lock().await;
        let removed_before = self.removed.lock().expect("not poisoned").clone();
        rewrite_without(&path, &removed_before, &settled).await?;
        self.removed.lock().expect("not poisoned").extend(settled);
        Ok(())
    }

    async fn release(&self, _handles: &[Handle]) -> Result<()> {
        // Released records were never removed from the file: nothing to undo.
        self.file("release messages")?;
        Ok(())
    }

    fn read_notes(&self) -> Vec<String> {
        match self.skipped.load(Ordering::Relaxed) {
            0 => Vec::new(),
            n => vec![format!(
                "skipped {n} invalid line(s) in {} (first at line {})",
                self.name(),
                self.first_skipped_line.load(Ordering::Relaxed)
            )],
        }
    }
}

/// Rewrite `path` without the lines in `settled`. Line indices refer to the file as it was
/// first opened; `removed_before` are the lines earlier rewrites already dropped.
async fn rewrite_without(path: &Path, removed_before: &BTreeSet<u64>, settled: &BTreeSet<u64>) -> Result<()> {
    let context = |what: &str| format!("cannot {what} while settling messages in archive {}", path.display());
    let tmp = temp_path(path);
    let source = tokio::fs::File::open(path).await.map_err(|e| Error::io(context("read"), e))?;
    let permissions = source.metadata().await.map_err(|e| Error::io(context("read"), e))?.permissions();
    let mut input = BufReader::with_capacity(READ_BUFFER, source);
    let out = tokio::fs::File::create(&tmp).await.map_err(|e| Error::io(context("create a temporary file"), e))?;
    let mut output = tokio::io::BufWriter::with_capacity(READ_BUFFER, out);
    let mut original_index = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line).await.map_err(|e| Error::io(context("read"), e))? == 0 {
            break;
        }
        while removed_before.contains(&original_index) {
            original_index += 1;
        }
        if !settled.contains(&original_index) {
            output.write_all(&line).await.map_err(|e| Error::io(context("write"), e))?;
        }
        original_index += 1;
    }
    output.flush().await.map_err(|e| Error::io(context("write"), e))?;
    let out = output.into_inner();
    out.set_permissions(permissions).await.map_err(|e| Error::io(context("write"), e))?;
    out.sync_all().await.map_err(|e| Error::io(context("sync"), e))?;
    tokio::fs::rename(&tmp, path).await.map_err(|e| Error::io(context("replace"), e))?;
    Ok(())
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.dlqctl-settle"))
}

/// An archive file as a redrive destination ("replay into a file"): copies are appended,
/// and a batch counts as confirmed once it is flushed and fsynced.
pub struct ArchiveSink {
    path: PathBuf,
    out: tokio::sync::Mutex<tokio::io::BufWriter<tokio::fs::File>>,
    /// What opening did to the file's last line, for the operator.
    open_notes: Vec<String>,
}

impl ArchiveSink {
    pub async fn open(path: &Path) -> Result<Self> {
        let owned = path.to_path_buf();
        let open_notes = tokio::task::spawn_blocking(move || finish_last_line(&owned))
            .await
            .map_err(|e| Error::Runtime(format!("cannot check the end of archive {}: {e}", path.display())))??
            .into_iter()
            .collect();
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await
            .map_err(|e| Error::Runtime(format!("cannot open archive {} for writing: {e}", path.display())))?;
        Ok(ArchiveSink {
            path: path.to_path_buf(),
            out: tokio::sync::Mutex::new(tokio::io::BufWriter::with_capacity(READ_BUFFER, file)),
            open_notes,
        })
    }

    async fn append(&self, batch: &[(DeadLetter, Destination)]) -> std::io::Result<()> {
        let mut out = self.out.lock().await;
        let mut line = Vec::with_capacity(4096);
        for (letter, _) in batch {
            out.write_all(letter.json_line(&mut line)).await?;
        }
        out.flush().await?;
        out.get_ref().sync_data().await
    }
}

/// Makes the file end in a whole line before copies are appended to it. A run killed while
/// appending (kill -9, power loss) can leave the first bytes of a copy and no newline; that
/// copy was never confirmed, so its original is still in the DLQ and the cut is safe. A last
/// line that is a whole dead letter only gets its newline; any other unfinished line means the
/// file is not a dlqctl archive, and nothing is touched. Returns a note when bytes were cut.
fn finish_last_line(path: &Path) -> Result<Option<String>> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let fail = |what: &str, e: std::io::Error| Error::Runtime(format!("cannot {what} archive {}: {e}", path.display()));
    let not_an_archive = || {
        Error::Usage(format!(
            "archive {} ends in a line that is neither a dead letter nor part of one: \
             it is not a dlqctl archive; name another file with --to",
            path.display()
        ))
    };
    let mut file = match std::fs::OpenOptions::new().read(true).write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail("open for writing", e)),
    };
    let len = file.metadata().map_err(|e| fail("inspect", e))?.len();
    let line_start = last_line_start(&mut file, len).map_err(|e| fail("read", e))?;
    let unfinished_len = len - line_start;
    if unfinished_len == 0 {
        return Ok(None);
    }
    // Only a line that opens as JSON is read whole: a letter can be large, and a file that is
    // not an archive larger still. Its first 64 bytes tell.
    let mut line = Vec::new();
    file.seek(SeekFrom::Start(line_start))
        .and_then(|_| (&mut file).take(64).read_to_end(&mut line))
        .map_err(|e| fail("read", e))?;
    match line.trim_ascii_start().first() {
        None if unfinished_len <= 64 => return Ok(None),
        Some(b'{') => {}
        _ => return Err(not_an_archive()),
    }
    (&mut file).take(unfinished_len - line.len() as u64).read_to_end(&mut line).map_err(|e| fail("read", e))?;
    let unfinished = line.trim_ascii();
    if DeadLetter::from_archive_line(unfinished, Keep { bodies: false, headers: false }).is_ok() {
        file.seek(SeekFrom::End(0)).and_then(|_| file.write_all(b"\n")).map_err(|e| fail("write to", e))?;
        return Ok(None);
    }
    let line_opening = format!(r#"{{"schema":"{SCHEMA}""#);
    if !(unfinished.starts_with(line_opening.as_bytes()) || line_opening.as_bytes().starts_with(unfinished)) {
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
fn last_line_start(file: &mut std::fs::File, len: u64) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
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

#[async_trait]
impl Sink for ArchiveSink {
    fn open_notes(&self) -> Vec<String> {
        self.open_notes.clone()
    }

    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<Result<(), PublishError>> {
        let result = self.append(batch).await.map_err(|e| PublishError {
            failure: match e.kind() {
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                    Failure::Transient
                }
                _ => Failure::Permanent,
            },
            message: format!("cannot append to {}: {e}", self.path.display()),
        });
        vec![result; batch.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_line(body_len: usize) -> String {
        let letter = DeadLetter { id: "m-1".into(), body: Some(vec![b'x'; body_len]), ..DeadLetter::default() };
        String::from_utf8(letter.json_line(&mut Vec::new()).to_vec()).unwrap()
    }

    #[test]
    fn an_unfinished_copy_longer_than_a_chunk_is_cut_at_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let whole = sample_line(10);
        let long = sample_line(300 * 1024);
        let unfinished = &long[..long.len() - 100];
        std::fs::write(&path, format!("{whole}{unfinished}")).unwrap();
        let note = finish_last_line(&path).unwrap().unwrap();
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
            assert_eq!(finish_last_line(&path).unwrap(), None);
            assert_eq!(std::fs::read_to_string(&path).unwrap(), content);
        }
        assert_eq!(finish_last_line(&dir.path().join("absent.jsonl")).unwrap(), None);
    }

    #[test]
    fn a_file_that_is_not_an_archive_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image.bin");
        // No newline anywhere and more than a chunk: refused without reading it whole.
        let content = vec![0xffu8; 200 * 1024];
        std::fs::write(&path, &content).unwrap();
        let err = finish_last_line(&path).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("not a dlqctl archive"), "{err}");
        let json = dir.path().join("other.json");
        std::fs::write(&json, "{\"not\": \"a letter\"").unwrap();
        assert!(finish_last_line(&json).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), content);
        assert_eq!(std::fs::read_to_string(&json).unwrap(), "{\"not\": \"a letter\"");
    }
}
