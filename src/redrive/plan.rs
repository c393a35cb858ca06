//! The plan: what a redrive would move, read without moving anything. `--dry-run` prints
//! it; the confirmation prompt is built from it; `--plan-out` saves it with exact ids.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use chrono::Utc;
use futures::TryStreamExt;
use serde::Serialize;
use serde_json::json;

use super::select::Selection;
use super::{redrive_count, redrive_id};
use crate::broker::{Broker, Destination};
use crate::error::{Error, Result};
use crate::files::private_file;
use crate::model::format_time;

pub const PLAN_SCHEMA: &str = "dlqctl/redrive-plan/v1";
const SAMPLES: usize = 3;
/// The destination column for messages that would stay because their source is unknown.
pub const UNROUTABLE: &str = "(stays: source unknown)";

#[derive(Debug, Default, Serialize)]
pub struct Plan {
    pub scanned: u64,
    pub selected: u64,
    pub skipped: u64,
    pub over_max_redrives: u64,
    pub unroutable: u64,
    pub groups: Vec<Group>,
    /// What reading the DLQ to make this plan cost, when it was not free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_cost: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct Group {
    pub destination: String,
    pub reason: String,
    pub count: u64,
    pub sample_ids: Vec<String>,
}

impl Plan {
    /// The distinct destinations, for the confirmation prompt.
    pub fn destinations(&self) -> Vec<&str> {
        let mut d: Vec<&str> =
            self.groups.iter().map(|g| g.destination.as_str()).filter(|d| *d != UNROUTABLE).collect();
        d.dedup();
        d
    }
}

pub struct Request<'a> {
    pub source: &'a dyn Broker,
    pub dlq: &'a str,
    pub selection: &'a Selection,
    pub limit: Option<u64>,
    pub max_redrives: Option<u64>,
    pub fixed_destination: Option<&'a Destination>,
    pub plan_out: Option<&'a Path>,
}

pub async fn build(req: Request<'_>) -> Result<Plan> {
    let mut plan = Plan { read_cost: req.source.capabilities().peek_cost, ..Plan::default() };
    let mut out = req.plan_out.map(|p| PlanFile::create(p, &req)).transpose()?;
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    let now = Utc::now();
    let mut letters = req.source.peek(None).await?;
    while let Some(letter) = letters.try_next().await? {
        plan.scanned += 1;
        if req.limit.is_some_and(|limit| plan.selected >= limit) {
            continue;
        }
        if !req.selection.matches(&letter, now) {
            plan.skipped += 1;
            continue;
        }
        if req.max_redrives.is_some_and(|max| redrive_count(&letter) >= max) {
            plan.over_max_redrives += 1;
            continue;
        }
        plan.selected += 1;
        let destination = req.fixed_destination.cloned().or_else(|| req.source.source_destination(&letter));
        let label = match &destination {
            Some(d) => d.label.clone(),
            None => {
                plan.unroutable += 1;
                UNROUTABLE.to_owned()
            }
        };
        let reason = letter.reason.kind.to_string();
        if let Some(out) = &mut out {
            out.line(&json!({
                "id": letter.id,
                "redrive_id": redrive_id(&letter),
                "reason": reason,
                "destination": destination.as_ref().map(|d| d.label.as_str()),
            }))?;
        }
        let group = groups.entry((label.clone(), reason.clone())).or_insert_with(|| Group {
            destination: label,
            reason,
            count: 0,
            sample_ids: Vec::new(),
        });
        group.count += 1;
        if group.sample_ids.len() < SAMPLES {
            group.sample_ids.push(letter.id);
        }
    }
    drop(letters);
    req.source.end_read().await?;
    if let Some(out) = out {
        out.finish()?;
    }
    plan.groups = groups.into_values().collect();
    Ok(plan)
}

/// `--plan-out`: a header line, then one line per selected message.
struct PlanFile {
    path: std::path::PathBuf,
    out: BufWriter<File>,
}

impl PlanFile {
    fn create(path: &Path, req: &Request) -> Result<PlanFile> {
        let mut file = PlanFile { path: path.to_path_buf(), out: private_file(path, false)? };
        file.line(&json!({
            "plan": PLAN_SCHEMA,
            "dlq": req.dlq,
            "selection": req.selection.to_string(),
            "limit": req.limit,
            "to": req.fixed_destination.map(|d| d.label.as_str()),
            "created_at": format_time(&Utc::now()),
        }))?;
        Ok(file)
    }

    fn line(&mut self, value: &serde_json::Value) -> Result<()> {
        let fail = |e: std::io::Error| Error::io(format!("cannot write plan {}", self.path.display()), e);
        serde_json::to_writer(&mut self.out, value).map_err(|e| fail(e.into()))?;
        self.out.write_all(b"\n").map_err(fail)
    }

    fn finish(mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::io(format!("cannot write plan {}", self.path.display()), e))
    }
}
