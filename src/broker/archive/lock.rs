//! One redrive at a time per archive file. Two runs rewriting one file would each drop what the
//! other settled, and a copy appended while a run rewrites the file would be lost with the old
//! file, so every run that changes an archive takes an advisory lock (`flock`) on it first.
//!
//! The lock is on the file itself, so every path to it (symlinks, hard links, `./x` and `x`)
//! shares it; a compaction replaces the file, so a lock taken on a file that has since been
//! replaced is dropped and taken again on the new one.

use std::fs::{File, Metadata, OpenOptions, TryLockError};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a lock could not be had.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it.
    Busy,
    Io(std::io::Error),
}

impl From<std::io::Error> for LockError {
    fn from(e: std::io::Error) -> Self {
        LockError::Io(e)
    }
}

/// Open `path` (read and write; `create` makes it when missing, in append mode) and lock it
/// exclusively without waiting. The lock lasts as long as the returned file is open.
pub fn lock_file(path: &Path, create: bool) -> Result<File, LockError> {
    loop {
        let mut options = OpenOptions::new();
        options.read(true);
        if create {
            // A new archive holds message bodies: its owner's alone.
            options.append(true).create(true).mode(0o600);
        } else {
            options.write(true);
        }
        let file = options.open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(LockError::Busy),
            Err(TryLockError::Error(e)) => return Err(e.into()),
        }
        let locked = file.metadata()?;
        match std::fs::metadata(path) {
            Ok(now) if same_inode(&now, &locked) => return Ok(file),
            // Replaced (or removed) between our open and our lock: lock what is there now.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// [`lock_file`] on an existing file, trying again for up to `patience` while it is busy.
pub fn lock_file_waiting(path: &Path, patience: std::time::Duration) -> Result<File, LockError> {
    let deadline = std::time::Instant::now() + patience;
    loop {
        match lock_file(path, false) {
            Err(LockError::Busy) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Whether two paths name one file (device and inode, through symlinks and hard links).
/// A path that does not exist names no file yet.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => same_inode(&a, &b),
        _ => false,
    }
}

fn same_inode(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_file_by_another_path_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dlq.jsonl");
        std::fs::write(&path, "").unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let hard = dir.path().join("hard.jsonl");
        std::fs::hard_link(&path, &hard).unwrap();
        let held = lock_file(&path, false).unwrap();
        assert!(matches!(lock_file(&link, false), Err(LockError::Busy)));
        assert!(matches!(lock_file(&hard, true), Err(LockError::Busy)));
        assert!(same_file(&path, &link) && same_file(&path, &hard));
        assert!(!same_file(&path, &dir.path().join("absent.jsonl")));
        drop(held);
        lock_file(&link, false).unwrap();
    }
}
