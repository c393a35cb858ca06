//! The move itself. For every message: publish the copy, wait for the destination's
//! confirmation, journal it, and only then remove the original from the DLQ. Any failure
//! leaves the original where it was; a copy whose original could not be removed is the
//! only possible duplicate, and it carries the same redrive id.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use serde::Serialize;

use super::audit::{self, AuditLog, Entry, Outcome};
use super::checkpoint::{Checkpoint, Seen};
use super::select::Selection;
use super::throttle::{Rate, Throttle};
use super::{outgoing, redrive_count, redrive_id};
use crate::broker::{Broker, Destination, Failure, Handle, PublishError, Received, Sink};
use crate::error::Result;
use crate::model::DeadLetter;

/// Longest pause between two attempts at one message.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct Options {
    pub selection: Selection,
    pub limit: Option<u64>,
    pub rate: Rate,
    /// Messages taken from the DLQ, and held unsettled, at once.
    pub batch: usize,
    pub max_redrives: Option<u64>,
    /// Attempts after the first for a transient failure.
    pub retries: u32,
    /// Stop after this many messages in a row failed (a dead or missing destination), whether
    /// they exhausted their retries or failed for good.
    pub max_consecutive_failures: u32,
    /// Stop when this many moved messages have come back to the DLQ during the run.
    pub max_returns: u64,
}

/// What happened, for the final report (`-o json` prints it as is).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Chosen by the selection (and under `--limit`).
    pub selected: u64,
    pub moved: u64,
    /// Not selected by `--where`.
    pub skipped: u64,
    pub over_max_redrives: u64,
    /// Selected, but where they came from is not recorded.
    pub unroutable: u64,
    /// Publishing failed; left in the DLQ.
    pub failed: u64,
    /// Confirmed at the destination but not removed from the DLQ (possible duplicates).
    pub not_settled: u64,
    /// Moved in this run and seen in the DLQ again.
    pub returned: u64,
    pub still_in_dlq: Option<u64>,
    pub interrupted: bool,
    /// Why the run stopped early, if it did.
    pub stopped: Option<String>,
}

impl Summary {
    pub fn is_clean(&self) -> bool {
        self.failed == 0 && self.not_settled == 0 && self.unroutable == 0 && self.stopped.is_none() && !self.interrupted
    }
}

pub struct Engine<'a> {
    pub source: &'a dyn Broker,
    /// The DLQ as audit lines name it (password masked).
    pub dlq: &'a str,
    /// Where copies go; `None` when there is nowhere (no `--to` and the source cannot publish).
    pub sink: Option<&'a dyn Sink>,
    /// `--to`: one destination for all; otherwise each message's own source.
    pub fixed_destination: Option<Destination>,
    pub options: &'a Options,
    pub audit: &'a mut AuditLog,
    pub checkpoint: &'a mut Checkpoint,
    pub interrupted: &'a AtomicBool,
    pub progress: &'a dyn Fn(&Summary),
}

/// A selected message on its way out.
struct Move {
    received: Received,
    redrive_id: String,
    destination: Destination,
}

impl Engine<'_> {
    pub async fn run(mut self) -> Result<Summary> {
        let throttle = Throttle::new(self.options.rate);
        let mut summary = Summary::default();
        // Redrive ids handled in this run: a released message that comes round again is not
        // handled twice.
        let mut seen = HashSet::new();
        let rereads_settled = self.source.capabilities().rereads_settled;
        let mut consecutive_failures = 0u32;
        let mut last_failure = String::new();
        let now = Utc::now();
        // Messages left in the DLQ are released only when the run ends: released earlier,
        // a queue would hand the same ones out again and hide the rest behind them.
        let mut held: Vec<Handle> = Vec::new();

        'run: loop {
            if self.stop_requested(&mut summary) || self.limit_reached(&summary) {
                break;
            }
            let received = match self.source.receive(self.options.batch).await {
                Ok(r) => r,
                Err(e) => {
                    summary.stopped = Some(format!("reading the DLQ failed: {e}"));
                    break;
                }
            };
            if received.is_empty() {
                break;
            }
            let mut release: Vec<Handle> = Vec::new();
            let mut moves: Vec<Move> = Vec::new();
            let mut from_checkpoint: Vec<(Received, String)> = Vec::new();
            for r in received {
                let id = redrive_id(&r.letter);
                // The checkpoint knows every copy this run (or the run it resumes) had confirmed,
                // with the count it carries: a copy that failed again and came back is left in
                // the DLQ, and only a provable original is removed without a new copy.
                let journalled = self.checkpoint.seen(&id, redrive_count(&r.letter), rereads_settled);
                if journalled == Seen::ReturnedCopy {
                    summary.returned += 1;
                    self.log(&r.letter, &id, None, Outcome::Returned, None)?;
                    release.push(r.handle);
                    continue;
                }
                if !seen.insert(id.clone()) {
                    // Left for a later run, and said: a twin (the same message dead-lettered
                    // twice) or the same delivery handed out again.
                    summary.skipped += 1;
                    let why = "a message with the same redrive id was handled earlier in this run; left in the DLQ \
                               for a later run";
                    self.log(&r.letter, &id, None, Outcome::Skipped, Some(why))?;
                    release.push(r.handle);
                    continue;
                }
                if self.stop_requested(&mut summary) || self.limit_reached(&summary) {
                    // Left for a later run: not looked at, not counted.
                    seen.remove(&id);
                    release.push(r.handle);
                    continue;
                }
                if !self.options.selection.matches(&r.letter, now) {
                    summary.skipped += 1;
                    self.log(&r.letter, &id, None, Outcome::Skipped, None)?;
                    release.push(r.handle);
                    continue;
                }
                if self.options.max_redrives.is_some_and(|max| redrive_count(&r.letter) >= max) {
                    summary.over_max_redrives += 1;
                    self.log(&r.letter, &id, None, Outcome::OverMaxRedrives, None)?;
                    release.push(r.handle);
                    continue;
                }
                summary.selected += 1;
                if journalled == Seen::Original {
                    from_checkpoint.push((r, id));
                    continue;
                }
                let destination = self.fixed_destination.clone().or_else(|| self.source.source_destination(&r.letter));
                match (destination, self.sink) {
                    (Some(destination), Some(_)) => {
                        throttle.acquire().await;
                        moves.push(Move { received: r, redrive_id: id, destination });
                    }
                    _ => {
                        summary.unroutable += 1;
                        let why = "its source is not recorded in the message; name a destination with --to";
                        self.log(&r.letter, &id, None, Outcome::Unroutable, Some(why))?;
                        release.push(r.handle);
                    }
                }
            }

            let results = match self.sink {
                Some(sink) if !moves.is_empty() => publish_with_retries(sink, &moves, self.options.retries).await,
                _ => Vec::new(),
            };
            let mut confirmed: Vec<(Received, String, Option<Destination>)> = Vec::new();
            for (m, result) in moves.into_iter().zip(results) {
                match result {
                    Ok(()) => {
                        consecutive_failures = 0;
                        confirmed.push((m.received, m.redrive_id, Some(m.destination)));
                    }
                    Err(e) => {
                        consecutive_failures += 1;
                        last_failure.clone_from(&e.message);
                        summary.failed += 1;
                        let label = m.destination.label.clone();
                        self.log(&m.received.letter, &m.redrive_id, Some(&label), Outcome::Failed, Some(&e.message))?;
                        release.push(m.received.handle);
                    }
                }
            }
            let newly_published: Vec<(&str, u64)> =
                confirmed.iter().map(|(r, id, _)| (id.as_str(), redrive_count(&r.letter) + 1)).collect();
            self.checkpoint.record_published(&newly_published)?;
            confirmed.extend(from_checkpoint.into_iter().map(|(r, id)| (r, id, None)));

            let handles: Vec<Handle> = confirmed.iter().map(|(r, _, _)| r.handle).collect();
            match self.source.settle(&handles).await {
                Ok(()) => {
                    for (r, id, destination) in &confirmed {
                        let (outcome, label) = match destination {
                            Some(d) => (Outcome::Moved, Some(d.label.as_str())),
                            None => (Outcome::SettledFromCheckpoint, None),
                        };
                        self.log(&r.letter, id, label, outcome, None)?;
                    }
                    summary.moved += confirmed.len() as u64;
                    let ids: Vec<&str> = confirmed.iter().map(|(_, id, _)| id.as_str()).collect();
                    self.checkpoint.record_settled(&ids)?;
                }
                Err(e) => {
                    let why = format!("confirmed at the destination, but the DLQ did not remove it: {e}");
                    for (r, id, destination) in &confirmed {
                        let label = destination.as_ref().map(|d| d.label.as_str());
                        self.log(&r.letter, id, label, Outcome::NotSettled, Some(&why))?;
                    }
                    summary.not_settled += confirmed.len() as u64;
                    // Back in the DLQ, not held until the connection drops or a hold runs out.
                    release.extend(handles);
                    summary.stopped = Some(format!(
                        "the DLQ refused to remove {} message(s) whose copies were confirmed ({e}); they are \
                         journalled in the checkpoint, so --resume removes them without publishing again",
                        confirmed.len()
                    ));
                }
            }
            held.extend(release);
            self.audit.flush()?;
            (self.progress)(&summary);

            if summary.stopped.is_some() {
                break 'run;
            }
            if consecutive_failures >= self.options.max_consecutive_failures {
                summary.stopped = Some(format!(
                    "{consecutive_failures} messages in a row could not be delivered: the destination looks down or \
                     gone (last: {last_failure})"
                ));
                break;
            }
            if summary.returned >= self.options.max_returns {
                summary.stopped = Some(format!(
                    "{} copies this run (or the run it resumes) moved came back to the DLQ: the consumer is still \
                     failing",
                    summary.returned
                ));
                break;
            }
        }
        if let Err(e) = self.source.release(&held).await {
            summary.stopped.get_or_insert(format!("returning unmoved messages to the DLQ failed: {e}"));
        }
        if let Err(e) = self.source.end_consume().await {
            summary.stopped.get_or_insert(format!("finishing the removal of moved messages failed: {e}"));
        }
        self.audit.flush()?;
        summary.still_in_dlq = self.source.describe().await.ok().and_then(|d| d.depth);
        Ok(summary)
    }

    fn stop_requested(&self, summary: &mut Summary) -> bool {
        let stop = self.interrupted.load(Ordering::Relaxed);
        summary.interrupted |= stop;
        stop
    }

    fn limit_reached(&self, summary: &Summary) -> bool {
        self.options.limit.is_some_and(|limit| summary.selected >= limit)
    }

    fn log(
        &mut self,
        letter: &DeadLetter,
        redrive_id: &str,
        destination: Option<&str>,
        outcome: Outcome,
        error: Option<&str>,
    ) -> Result<()> {
        self.audit.record(&Entry {
            time: audit::now(),
            dlq: self.dlq,
            destination,
            message_id: &letter.id,
            redrive_id,
            outcome,
            error,
        })
    }
}

/// Publish every move, retrying transient failures with exponential backoff and full
/// jitter up to `retries` more attempts; results in the order of `moves`.
async fn publish_with_retries(sink: &dyn Sink, moves: &[Move], retries: u32) -> Vec<Result<(), PublishError>> {
    let copies: Vec<(DeadLetter, Destination)> =
        moves.iter().map(|m| (outgoing(&m.received.letter, &m.redrive_id), m.destination.clone())).collect();
    let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; copies.len()];
    let mut pending: Vec<usize> = (0..copies.len()).collect();
    for attempt in 0..=retries {
        let outcome = if attempt == 0 {
            sink.publish(&copies).await
        } else {
            let batch: Vec<(DeadLetter, Destination)> = pending.iter().map(|&i| copies[i].clone()).collect();
            sink.publish(&batch).await
        };
        let mut again = Vec::new();
        for (&i, result) in pending.iter().zip(outcome) {
            match result {
                Err(e) if e.failure == Failure::Transient && attempt < retries => again.push(i),
                Err(e) if e.failure == Failure::Transient => {
                    results[i] = Some(Err(PublishError {
                        message: format!("gave up after {} attempts: {}", attempt + 1, e.message),
                        ..e
                    }))
                }
                other => results[i] = Some(other),
            }
        }
        if again.is_empty() {
            break;
        }
        tokio::time::sleep(backoff(attempt)).await;
        pending = again;
    }
    results.into_iter().map(|r| r.expect("every message has a result once retries end")).collect()
}

/// Full jitter: a random pause up to an exponentially growing, capped ceiling.
fn backoff(attempt: u32) -> Duration {
    let ceiling = FIRST_BACKOFF.saturating_mul(1u32 << attempt.min(16)).min(MAX_BACKOFF);
    ceiling.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_a_cap_and_is_jittered() {
        for attempt in 0..40 {
            let ceiling = FIRST_BACKOFF.saturating_mul(1u32 << attempt.min(16)).min(MAX_BACKOFF);
            assert!(backoff(attempt) <= ceiling);
        }
        let samples: HashSet<Duration> = (0..20).map(|_| backoff(3)).collect();
        assert!(samples.len() > 1, "jittered");
    }
}
