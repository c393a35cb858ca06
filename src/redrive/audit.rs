//! The audit log: a JSONL paper trail of a redrive. A header line says who ran what, when
//! and why; then one line per message says where it went and how that ended.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use chrono::Utc;
use serde::Serialize;
use serde_json::json;

use crate::error::{Error, Result};
use crate::files::private_file;
use crate::model::format_time;
use crate::target::mask_input;

pub const AUDIT_SCHEMA: &str = "dlqctl/redrive-audit/v1";

/// How one message's redrive ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Confirmed at the destination, then removed from the DLQ.
    Moved,
    /// Published by an earlier, interrupted run (per the checkpoint): only removed now.
    SettledFromCheckpoint,
    /// Left in the DLQ: publishing failed.
    Failed,
    /// Left in the DLQ: the destination confirmed it but the DLQ did not remove it.
    NotSettled,
    /// Left in the DLQ: not selected.
    Skipped,
    /// Left in the DLQ: redriven `--max-redrives` times already.
    OverMaxRedrives,
    /// Left in the DLQ: where it came from is not recorded.
    Unroutable,
    /// A message this run moved, seen again in the DLQ.
    Returned,
}

#[derive(Debug, Serialize)]
pub struct Entry<'a> {
    pub time: String,
    pub dlq: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<&'a str>,
    pub message_id: &'a str,
    pub redrive_id: &'a str,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
}

/// What the header line records about the run.
pub struct RunInfo<'a> {
    pub dlq: &'a str,
    pub to: Option<&'a str>,
    pub selection: &'a str,
    pub note: Option<&'a str>,
    /// None for a server-side move, which the broker itself keeps track of.
    pub checkpoint: Option<&'a Path>,
}

pub struct AuditLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl AuditLog {
    pub fn create(path: &Path, run: &RunInfo) -> Result<AuditLog> {
        // A log shared between runs (--audit-log) is appended to.
        let mut log = AuditLog { path: path.to_path_buf(), out: private_file(path, true)? };
        // Arguments may carry a URL with a password; mask it like every other output.
        let command: Vec<String> = std::env::args().map(|a| mask_input(&a)).collect();
        let header = json!({
            "audit": AUDIT_SCHEMA,
            "command": command,
            "dlq": run.dlq,
            "to": run.to,
            "selection": run.selection,
            "operator": operator(),
            "started_at": format_time(&Utc::now()),
            "note": run.note,
            "checkpoint": run.checkpoint.map(|c| c.display().to_string()),
        });
        log.write(&header)?;
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn record(&mut self, entry: &Entry) -> Result<()> {
        self.write(entry)
    }

    /// A line about the run rather than one message (a server-side move starting or ending).
    pub fn event(&mut self, event: &serde_json::Value) -> Result<()> {
        self.write(event)
    }

    fn write<T: Serialize>(&mut self, value: &T) -> Result<()> {
        let fail = |e: std::io::Error| Error::io(format!("cannot write audit log {}", self.path.display()), e);
        serde_json::to_writer(&mut self.out, value).map_err(|e| fail(e.into()))?;
        self.out.write_all(b"\n").map_err(fail)
    }

    /// Flush what is buffered; called after every batch so the trail keeps up with the DLQ.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::io(format!("cannot write audit log {}", self.path.display()), e))
    }
}

pub fn now() -> String {
    format_time(&Utc::now())
}

/// `user@host`, for the paper trail.
fn operator() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(user_from_passwd)
        .unwrap_or_else(|| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    format!("{user}@{host}")
}

/// The name of the user running us, from /etc/passwd, for sessions without $USER (cron, CI).
fn user_from_passwd() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.get(2) == Some(&uid.as_str())).then(|| fields[0].to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_appending_to_a_log_with_an_unfinished_line_starts_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::fs::write(&path, "{\"audit\":\"dlqctl/redrive-audit/v1\"}\n{\"time\":\"2026-").unwrap();
        let run = RunInfo { dlq: "orders.dlq", to: None, selection: "all", note: None, checkpoint: None };
        let mut log = AuditLog::create(&path, &run).unwrap();
        log.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[1], "{\"time\":\"2026-", "the unfinished line is kept as it was");
        assert!(serde_json::from_str::<serde_json::Value>(lines[2]).unwrap()["audit"] == AUDIT_SCHEMA);

        // A new or whole log gets no blank line.
        let fresh = dir.path().join("fresh.jsonl");
        AuditLog::create(&fresh, &run).unwrap().flush().unwrap();
        AuditLog::create(&fresh, &run).unwrap().flush().unwrap();
        assert_eq!(std::fs::read_to_string(&fresh).unwrap().lines().filter(|l| l.is_empty()).count(), 0);
    }
}
