//! The JSONL archive backend: a file (or stdin) of `dlqctl/dead-letter/v1` lines.
//!
//! It is the embedded default, works with no broker at all, and is what `export` writes.
//! As a redrive source it is locked for the run (`lock`), settles into a journal beside the
//! file and rewrites the file once at the end (`journal`); as a destination it appends under
//! the same lock (`sink`).

mod journal;
mod lock;
mod sink;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use futures::StreamExt;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};

use super::{Broker, Capabilities, Description, Handle, LetterStream, OpenOptions, Received};
use crate::error::{Error, Result};
use crate::model::{DeadLetter, Keep};
use crate::target::{ArchiveTarget, mask_input};
use journal::{Journal, LineId, Settled};
pub use lock::same_file;
pub use sink::ArchiveSink;

const READ_BUFFER: usize = 256 * 1024;
/// How long a run waits for an archive's lock: long enough for another run's append to end,
/// short enough that a run holding the file for good is reported at once.
const LOCK_PATIENCE: Duration = Duration::from_secs(3);

pub struct ArchiveBroker {
    target: ArchiveTarget,
    /// The file itself, symlinks resolved: what is locked, journalled and rewritten, so that a
    /// rewrite replaces the file and never the symlink the operator named it by.
    real: Option<PathBuf>,
    skip_invalid: bool,
    max_line: usize,
    keep: Keep,
    skipped: AtomicU64,
    first_skipped_line: AtomicU64,
    consumer: tokio::sync::Mutex<Option<Consumer>>,
}

/// What a run taking letters out of the file holds: the file's lock, its reader (the file as
/// it was when the run began, so line numbers stay stable) and its settle journal.
struct Consumer {
    lines: LineReader,
    journal: Journal,
    _lock: std::fs::File,
}

impl ArchiveBroker {
    pub async fn open(target: ArchiveTarget, options: &OpenOptions) -> Result<Self> {
        // Fail now, with the path, rather than on first read.
        let real = match &target {
            ArchiveTarget::File(path) => Some(tokio::fs::canonicalize(path).await.map_err(|e| open_error(path, e))?),
            ArchiveTarget::Stdin => None,
        };
        Ok(ArchiveBroker {
            target,
            real,
            skip_invalid: options.skip_invalid,
            max_line: options.max_line,
            keep: Keep { bodies: options.bodies, headers: options.headers },
            skipped: AtomicU64::new(0),
            first_skipped_line: AtomicU64::new(0),
            consumer: tokio::sync::Mutex::new(None),
        })
    }

    fn name(&self) -> String {
        match &self.target {
            // A mistyped URL (`rabbitmq:/u:pw@host`) is a file name too: shown masked.
            ArchiveTarget::File(p) => mask_input(&p.display().to_string()),
            ArchiveTarget::Stdin => "<stdin>".into(),
        }
    }

    fn file(&self, operation: &'static str) -> Result<&Path> {
        match &self.real {
            Some(p) => Ok(p),
            None => Err(Error::NotSupported {
                backend: self.backend(),
                operation,
                why: "an archive read from stdin can only be read once; save it to a .jsonl file first".into(),
            }),
        }
    }

    /// A reader of the file as it is now, skipping what a run has settled but not yet removed.
    async fn reader(&self) -> Result<LineReader> {
        let (input, settled): (Box<dyn AsyncBufRead + Unpin + Send>, _) = match &self.target {
            ArchiveTarget::Stdin => (Box::new(BufReader::with_capacity(READ_BUFFER, tokio::io::stdin())), None),
            ArchiveTarget::File(path) => {
                let file = tokio::fs::File::open(path).await.map_err(|e| open_error(path, e))?;
                let mut settled = Settled::open(self.real.as_deref().unwrap_or(path))?;
                (Box::new(BufReader::with_capacity(READ_BUFFER, file)), (!settled.is_empty()).then_some(settled))
            }
        };
        Ok(self.line_reader(input, false, settled))
    }

    fn line_reader(
        &self,
        input: Box<dyn AsyncBufRead + Unpin + Send>,
        digests: bool,
        settled: Option<Settled>,
    ) -> LineReader {
        LineReader {
            input,
            name: self.name(),
            keep: self.keep,
            line_no: 0,
            buf: Vec::with_capacity(4096),
            max_line: self.max_line,
            digests,
            settled,
        }
    }

    /// Take the file for a run that removes letters from it: its lock (refused while another
    /// run holds it), what a killed run settled removed for good, and a journal of its own.
    /// Creating the journal also proves the file's folder can be written, before any copy
    /// is published.
    fn consume(&self, path: &Path) -> Result<Consumer> {
        // A run that could not change the file is refused as a usage error (exit 2): the fix
        // is the operator's. A run that holds the file is a moment's matter (exit 1).
        let mut lock = lock::lock_file_waiting(path, LOCK_PATIENCE).map_err(|e| match e {
            lock::LockError::Busy => Error::Runtime(format!(
                "archive {} is in use by another dlqctl run (one moving letters out of it or into it): wait for \
                 that run to end, then run this again",
                self.name()
            )),
            lock::LockError::Io(e) => Error::Usage(format!(
                "cannot open archive {} for writing, which moving letters out of it needs: {e}",
                self.name()
            )),
        })?;
        if let Some(rewritten) = journal::compact(path)? {
            lock = rewritten;
        }
        let journal = Journal::create(path).map_err(|e| {
            Error::Usage(format!(
                "cannot write beside archive {} ({e}), which moving letters out of it needs: its folder must be \
                 writable",
                self.name()
            ))
        })?;
        let file = std::fs::File::open(path).map_err(|e| open_error(path, e))?;
        let input = Box::new(BufReader::with_capacity(READ_BUFFER, tokio::fs::File::from_std(file)));
        Ok(Consumer { lines: self.line_reader(input, true, None), journal, _lock: lock })
    }

    /// The next dead letter, honouring `--skip-invalid`.
    async fn next_letter(&self, lines: &mut LineReader) -> Option<Result<(LineId, DeadLetter)>> {
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
        mask_input(&path.display().to_string())
    ))
}

struct LineReader {
    input: Box<dyn AsyncBufRead + Unpin + Send>,
    name: String,
    keep: Keep,
    line_no: u64,
    buf: Vec<u8>,
    /// The longest line read: past it the read stops, in bounded memory.
    max_line: usize,
    /// Whether each line's digest is needed (to journal it when settled).
    digests: bool,
    /// Lines a run settled and has not yet removed from the file: passed over.
    settled: Option<Settled>,
}

impl LineReader {
    /// The next non-blank, unsettled line as a dead letter.
    async fn next(&mut self) -> Option<Result<(LineId, DeadLetter)>> {
        loop {
            self.buf.clear();
            match read_line(&mut self.input, &mut self.buf, self.max_line).await {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                    return Some(Err(Error::Runtime(format!(
                        "{}:{}: a line longer than {} MiB, the most one letter may take: this is not a dlqctl \
                         archive, or its letters are larger (raise --max-line-mib)",
                        self.name,
                        self.line_no + 1,
                        self.max_line >> 20
                    ))));
                }
                Err(e) => {
                    return Some(Err(Error::io(format!("cannot read archive {}", self.name), e)));
                }
            }
            let index = self.line_no;
            self.line_no += 1;
            let line_id = match (self.digests, &mut self.settled) {
                (false, None) => LineId { index, digest: 0 },
                (_, settled) => {
                    let id = LineId { index, digest: journal::digest(&self.buf) };
                    if settled.as_mut().is_some_and(|s| s.contains(id)) {
                        continue;
                    }
                    id
                }
            };
            let line = self.buf.trim_ascii();
            if line.is_empty() {
                continue;
            }
            return Some(DeadLetter::from_archive_line(line, self.keep).map(|letter| (line_id, letter)).map_err(|e| {
                Error::InvalidRecord {
                    source_name: self.name.clone(),
                    line: index + 1,
                    message: format!("not a dead letter: {}", without_position(&e)),
                }
            }));
        }
    }
}

/// `read_until(b'\n')` that stops at `max` bytes with `FileTooLarge` instead of growing `buf`
/// for as long as the input goes on without a newline.
async fn read_line(
    input: &mut (dyn AsyncBufRead + Unpin + Send),
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            return Ok(buf.len());
        }
        let (taken, ended) = match memchr::memchr(b'\n', available) {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        if buf.len() + taken > max {
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        buf.extend_from_slice(&available[..taken]);
        input.consume(taken);
        if ended {
            return Ok(buf.len());
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
            rereads_settled: false,
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

    async fn begin_consume(&self) -> Result<()> {
        let path = self.file("receive messages")?;
        let mut consumer = self.consumer.lock().await;
        if consumer.is_none() {
            let path = path.to_path_buf();
            let this = self.consume(&path)?;
            *consumer = Some(this);
        }
        Ok(())
    }

    async fn receive(&self, max: usize) -> Result<Vec<Received>> {
        self.begin_consume().await?;
        let mut consumer = self.consumer.lock().await;
        let lines = &mut consumer.as_mut().expect("begun above").lines;
        let mut batch = Vec::with_capacity(max);
        while batch.len() < max {
            let Some(next) = self.next_letter(lines).await else {
                break;
            };
            let (line, letter) = next?;
            batch.push(Received { handle: Handle::ArchiveLine { index: line.index, digest: line.digest }, letter });
        }
        Ok(batch)
    }

    async fn settle(&self, handles: &[Handle]) -> Result<()> {
        self.file("settle messages")?;
        let lines: Vec<LineId> = handles
            .iter()
            .filter_map(|h| match h {
                Handle::ArchiveLine { index, digest } => Some(LineId { index: *index, digest: *digest }),
                _ => None,
            })
            .collect();
        if lines.is_empty() {
            return Ok(());
        }
        let mut consumer = self.consumer.lock().await;
        let consumer = consumer.as_mut().ok_or_else(|| Error::Runtime("settle before any receive".into()))?;
        consumer.journal.settle(&lines)
    }

    async fn release(&self, _handles: &[Handle]) -> Result<()> {
        // Released records were never removed from the file: nothing to undo.
        self.file("release messages")?;
        Ok(())
    }

    /// Remove what the run settled from the file, in one rewrite, then let the lock go.
    async fn end_consume(&self) -> Result<()> {
        let Some(consumer) = self.consumer.lock().await.take() else { return Ok(()) };
        let path = self.file("settle messages")?;
        let compacted = journal::compact(path);
        drop(consumer);
        compacted.map(drop)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that finds a killed run's journal rewrites the file first; the new file must be
    /// locked from the moment it takes the archive's name, for the whole run.
    #[tokio::test]
    async fn a_run_holds_the_lock_on_the_file_it_rewrote_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dlq.jsonl");
        let letters: Vec<u8> = (0..3)
            .flat_map(|i| {
                DeadLetter { id: format!("m{i}"), ..DeadLetter::default() }.json_line(&mut Vec::new()).to_vec()
            })
            .collect();
        std::fs::write(&path, &letters).unwrap();
        let killed = ArchiveBroker::open(ArchiveTarget::File(path.clone()), &OpenOptions::default()).await.unwrap();
        let first = killed.receive(1).await.unwrap();
        killed.settle(&[first[0].handle]).await.unwrap();
        drop(killed.consumer.lock().await.take()); // killed: the journal stays, the lock goes

        let next = ArchiveBroker::open(ArchiveTarget::File(path.clone()), &OpenOptions::default()).await.unwrap();
        next.begin_consume().await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2, "the journal was applied");
        assert!(matches!(lock::lock_file(&path, false), Err(lock::LockError::Busy)), "still locked");
    }

    #[tokio::test]
    async fn a_symlinked_archive_stays_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.jsonl");
        let line = DeadLetter { id: "m".into(), ..DeadLetter::default() }.json_line(&mut Vec::new()).to_vec();
        std::fs::write(&real, [line.clone(), line].concat()).unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let dlq = ArchiveBroker::open(ArchiveTarget::File(link.clone()), &OpenOptions::default()).await.unwrap();
        let got = dlq.receive(1).await.unwrap();
        dlq.settle(&[got[0].handle]).await.unwrap();
        dlq.end_consume().await.unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap().lines().count(), 1);
    }
}
