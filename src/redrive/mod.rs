//! The redrive engine: select, plan, throttle, move with confirm-before-settle, audit,
//! checkpoint. Broker-agnostic: it sees a source [`Broker`](crate::broker::Broker) and a
//! [`Sink`](crate::broker::Sink), and every backend plugs into it.

pub mod audit;
pub mod checkpoint;
pub mod engine;
pub mod plan;
pub mod select;
pub mod throttle;

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::model::{DeadLetter, Value};

/// Stable per original message, so consumers can drop duplicates.
pub const REDRIVE_ID_HEADER: &str = "dlqctl-redrive-id";
/// How many times dlqctl has redriven this message, counting the copy that carries it.
pub const REDRIVE_COUNT_HEADER: &str = "dlqctl-redrive-count";

/// The message's redrive id: the one it already carries from an earlier redrive, else a
/// digest of where it sits, its id and its body (ids alone repeat in some archives).
pub fn redrive_id(letter: &DeadLetter) -> String {
    if let Some(id) = letter.headers.get(REDRIVE_ID_HEADER).and_then(Value::as_str) {
        return id.to_owned();
    }
    let mut digest = Sha256::new();
    digest.update(letter.dlq.as_deref().unwrap_or_default());
    digest.update([0]);
    digest.update(&letter.id);
    digest.update([0]);
    digest.update(letter.body_bytes());
    digest.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// How many times dlqctl redrove it before.
pub fn redrive_count(letter: &DeadLetter) -> u64 {
    match letter.headers.get(REDRIVE_COUNT_HEADER) {
        Some(Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
        Some(other) => other.to_string().parse().unwrap_or(0),
        None => 0,
    }
}

/// The copy that goes out: the original with its redrive id and an incremented count.
pub fn outgoing(letter: &DeadLetter, id: &str) -> DeadLetter {
    let mut copy = letter.clone();
    copy.headers.set(REDRIVE_ID_HEADER, id.to_owned());
    copy.headers.set(REDRIVE_COUNT_HEADER, (redrive_count(letter) + 1) as i64);
    copy
}

/// Where runs keep their audit logs and checkpoints unless told otherwise:
/// `$XDG_STATE_HOME/dlqctl/runs` (default `~/.local/state/dlqctl/runs`).
pub fn default_runs_dir() -> PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("state")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("dlqctl")
        .join("runs")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Headers;

    #[test]
    fn ids_are_stable_and_travel_with_the_copy() {
        let letter =
            DeadLetter { id: "m".into(), dlq: Some("q".into()), body: Some(b"x".to_vec()), ..DeadLetter::default() };
        let id = redrive_id(&letter);
        assert_eq!(id.len(), 32);
        assert_eq!(id, redrive_id(&letter.clone()));
        let copy = outgoing(&letter, &id);
        assert_eq!(redrive_id(&copy), id, "a copy that dies again keeps its id");
        assert_eq!(redrive_count(&copy), 1);
        assert_eq!(redrive_count(&outgoing(&copy, &id)), 2);
        let other = DeadLetter { body: Some(b"y".to_vec()), ..letter.clone() };
        assert_ne!(redrive_id(&other), id, "same id, other body: another message");
    }

    #[test]
    fn counts_from_other_clients_parse_leniently() {
        let letter = DeadLetter { headers: Headers::new().with(REDRIVE_COUNT_HEADER, "3"), ..DeadLetter::default() };
        assert_eq!(redrive_count(&letter), 3);
    }
}
