//! Files that hold message data or redrive history (audit logs, checkpoints, plans, exports,
//! settle journals and rewrites): readable by their owner only, never reached through a
//! symlink someone planted at their path, and temporary ones under names nobody could guess.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Create (or, with `append`, reopen) a file only its owner can read. A symlink at the path is
/// refused, not followed: a planted one would send message data into another file. An
/// existing file that others could read is tightened to 0600, and the operator told.
/// Reopened, a file whose last line a killed run left unfinished gets a newline first: that
/// line stays as it was, as evidence, and the next line written is one of its own instead of
/// being glued to it.
pub fn private_file(path: &Path, append: bool) -> Result<BufWriter<File>> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
    if append {
        // Read too: the last byte tells whether a killed run left the last line unfinished.
        options.read(true).append(true);
    } else {
        options.truncate(true);
    }
    let file = options.open(path).map_err(|e| open_error(path, e))?;
    tighten(&file, path)?;
    let unfinished = append && ends_unfinished(&file);
    let mut out = BufWriter::new(file);
    if unfinished {
        out.write_all(b"\n").map_err(|e| Error::io(format!("cannot write {}", path.display()), e))?;
    }
    Ok(out)
}

/// A new file beside `path`, named `.NAME.dlqctl-PID-RANDOM.SUFFIX`, created exclusively (so
/// never through a symlink) with mode 0600.
pub fn temporary_beside(path: &Path, suffix: &str) -> std::io::Result<(PathBuf, File)> {
    let prefix = temporary_prefix(path);
    loop {
        let random = fastrand::u32(..);
        let tmp = path.with_file_name(format!("{prefix}{}-{random:08x}.{suffix}", std::process::id()));
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Remove what [`temporary_beside`] made for `path` with this suffix and a killed process left;
/// call only when no live process can be writing one (while holding the file's lock).
pub fn remove_temporaries_beside(path: &Path, suffix: &str) {
    let prefix = temporary_prefix(path);
    let Ok(entries) = std::fs::read_dir(folder_of(path)) else { return };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.starts_with(&prefix) && file.ends_with(&format!(".{suffix}")) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Make a rename in `path`'s folder durable (best effort: not every file system can sync a
/// folder).
pub fn sync_folder_of(path: &Path) {
    if let Ok(dir) = File::open(folder_of(path)) {
        let _ = dir.sync_all();
    }
}

fn temporary_prefix(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!(".{name}.dlqctl-")
}

fn folder_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

fn open_error(path: &Path, e: std::io::Error) -> Error {
    // O_NOFOLLOW on a symlink fails with ELOOP.
    if e.raw_os_error() == Some(libc::ELOOP) {
        return Error::Usage(format!(
            "{} is a symbolic link: dlqctl writes run files only to a path of their own; name the real file",
            path.display()
        ));
    }
    Error::io(format!("cannot create {}", path.display()), e)
}

/// An existing file others could read or write becomes the owner's alone.
fn tighten(file: &File, path: &Path) -> Result<()> {
    let mode =
        file.metadata().map_err(|e| Error::io(format!("cannot inspect {}", path.display()), e))?.permissions().mode();
    if mode & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("cannot make {} private", path.display()), e))?;
        crate::output::say(&format!(
            "note: {} was readable by others (mode {:o}); it holds message ids and history, so it is now 0600",
            path.display(),
            mode & 0o777
        ));
    }
    Ok(())
}

/// Whether the file's last byte is not a newline (an empty file ends nothing unfinished).
fn ends_unfinished(file: &File) -> bool {
    use std::os::unix::fs::FileExt;
    let mut last = [0u8];
    match file.metadata() {
        Ok(m) if m.len() > 0 => file.read_exact_at(&mut last, m.len() - 1).is_ok_and(|()| last[0] != b'\n'),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep\n").unwrap();
        let planted = dir.path().join("audit.jsonl");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        for append in [true, false] {
            let err = private_file(&planted, append).unwrap_err();
            assert!(err.to_string().contains("symbolic link"), "{err}");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    }

    #[test]
    fn a_file_others_can_read_is_made_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::fs::write(&path, "x\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(private_file(&path, true).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let (tmp, _) = temporary_beside(&path, "tmp").unwrap();
        assert_eq!(std::fs::metadata(&tmp).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(tmp.file_name().unwrap().to_string_lossy().starts_with(".audit.jsonl.dlqctl-"));
    }
}
