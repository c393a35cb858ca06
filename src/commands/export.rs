//! `dlqctl export`: every dead letter as one JSONL line, streamed in bounded memory.
//! With `--file`, the output appears under its name only once complete, so a failed
//! export never leaves a truncated archive that looks whole.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use futures::TryStreamExt;

use super::Context;
use crate::cli::ExportArgs;
use crate::error::{Error, Result};
use crate::files::temporary_beside;
use crate::model::LetterView;
use crate::output::Buffered;

pub async fn run(ctx: &mut Context, args: &ExportArgs) -> Result<()> {
    let (target, broker) = ctx.open(&args.read).await?;
    let redactor = ctx.redactor(&args.redact);
    // Letters are read whole only when there is something to select or change; else each is
    // written as the backend shows it (Kafka: straight from librdkafka's buffers).
    let as_shown = redactor.is_empty() && args.read.filters.is_empty() && args.read.reason_from.is_none();
    let mut letters = if as_shown { None } else { Some(ctx.letters(broker.as_ref(), &args.read, None).await?) };
    let mut file = args.file.as_deref().map(PartialFile::create).transpose()?;
    let mut count = 0u64;
    // What reading costs, said once the read has begun (as `Context::letters` does), so a
    // mistyped DLQ gets only its error.
    let peek_cost = if as_shown { broker.capabilities().peek_cost } else { None };
    let out = &mut ctx.out;
    let mut write = |letter: &LetterView<'_>| {
        if count == 0
            && let Some(cost) = peek_cost
        {
            out.note(cost);
        }
        count += 1;
        match &mut file {
            Some(f) => f.write_letter(letter),
            None => out.letter_line(letter),
        }
    };
    match &mut letters {
        Some(letters) => {
            while let Some(mut letter) = letters.try_next().await? {
                redactor.apply(&mut letter);
                write(&letter.view())?;
            }
        }
        None => broker.peek_each(None, &mut write).await?,
    }
    drop(letters);
    if count == 0
        && let Some(cost) = peek_cost
    {
        ctx.out.note(cost);
    }
    broker.end_read().await?;
    if let Some(file) = file {
        let path = file.commit()?;
        ctx.out.note(&format!("exported {count} dead letters from {target} to {}", path.display()));
    }
    ctx.report_read_notes(broker.as_ref());
    Ok(())
}

/// A file written under a temporary name and renamed into place when complete.
struct PartialFile {
    path: PathBuf,
    tmp: PathBuf,
    out: Buffered<File>,
}

impl PartialFile {
    /// A name of its own beside `path`, created exclusively with mode 0600: an export holds
    /// message bodies, and a symlink planted at a predictable name is never followed.
    fn create(path: &Path) -> Result<Self> {
        let (tmp, file) = temporary_beside(path, "partial")
            .map_err(|e| Error::io(format!("cannot create a file beside {}", path.display()), e))?;
        Ok(PartialFile { path: path.to_path_buf(), tmp, out: Buffered::new(file) })
    }

    fn write_letter(&mut self, letter: &LetterView<'_>) -> Result<()> {
        let fail = |e: std::io::Error| Error::io(format!("cannot write {}", self.tmp.display()), e);
        self.out.letter_line(letter).map_err(fail)
    }

    fn commit(mut self) -> Result<PathBuf> {
        let fail = |e: std::io::Error| Error::io(format!("cannot finish {}", self.path.display()), e);
        self.out.flush().map_err(fail)?;
        self.out.get_ref().sync_all().map_err(fail)?;
        std::fs::rename(&self.tmp, &self.path).map_err(fail)?;
        Ok(self.path.clone())
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        // Reached with the temporary file still present only when the export failed.
        let _ = std::fs::remove_file(&self.tmp);
    }
}
