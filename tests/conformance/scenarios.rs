//! Scenarios every backend must pass. Each takes a fixture that can create a fresh,
//! isolated DLQ holding exactly the letters it is given.

use async_trait::async_trait;
use dlqctl::broker::{Broker, Handle};
use dlqctl::error::Error;
use dlqctl::model::{DeadLetter, Headers, LetterView, Reason, ReasonKind, Source, Value};
use futures::TryStreamExt;

#[async_trait]
pub trait Fixture: Sync {
    /// A new DLQ, in its own namespace, holding `letters` in order.
    async fn dlq_with(&self, letters: &[DeadLetter]) -> Box<dyn Broker>;

    /// The reason the backend will report for a seeded letter. A real broker decides
    /// that itself (RabbitMQ says `rejected` for what the fixture rejected); the archive
    /// keeps whatever was written.
    fn reason_for(&self, seeded: &DeadLetter) -> ReasonKind {
        seeded.reason.kind
    }
}

/// Letters with the shapes that break naive code: binary and empty bodies, typed and
/// repeated headers, and a spread of reasons.
pub fn seed_letters(n: usize) -> Vec<DeadLetter> {
    let reasons = [ReasonKind::Rejected, ReasonKind::Expired, ReasonKind::Exception];
    (0..n)
        .map(|i| DeadLetter {
            id: format!("conf-{i}"),
            dlq: Some("conformance.dlq".into()),
            source: Source { name: Some("conformance".into()), ..Source::default() },
            reason: Reason::new(reasons[i % reasons.len()]),
            failure_count: Some(1),
            headers: Headers::new()
                .with("seq", i as i64)
                .with("trace", format!("t-{i}"))
                .with("bin", vec![0u8, 0xff, i as u8]),
            body: Some(match i % 4 {
                0 => vec![0xff, 0xfe, i as u8],
                1 => Vec::new(),
                _ => format!(r#"{{"order":{i}}}"#).into_bytes(),
            }),
            ..DeadLetter::default()
        })
        .collect()
}

async fn all(broker: &dyn Broker) -> Vec<DeadLetter> {
    broker.peek(None).await.unwrap().try_collect().await.unwrap()
}

async fn depth(broker: &dyn Broker) -> u64 {
    broker.describe().await.unwrap().depth.expect("depth is known")
}

/// Brokers assign their own message ids, so letters are known by their `seq` header.
fn seq(letter: &DeadLetter) -> String {
    letter.headers.get("seq").map(|v| v.to_string()).expect("every seeded letter has a seq header")
}

fn seqs(letters: &[DeadLetter]) -> Vec<String> {
    let mut seqs: Vec<String> = letters.iter().map(seq).collect();
    seqs.sort();
    seqs
}

pub async fn describe_reports_depth(f: &impl Fixture) {
    let broker = f.dlq_with(&seed_letters(7)).await;
    assert_eq!(depth(broker.as_ref()).await, 7);
}

pub async fn peek_returns_n_and_leaves_depth(f: &impl Fixture) {
    let broker = f.dlq_with(&seed_letters(10)).await;
    let peeked: Vec<DeadLetter> = broker.peek(Some(4)).await.unwrap().try_collect().await.unwrap();
    assert_eq!(peeked.len(), 4);
    assert_eq!(depth(broker.as_ref()).await, 10);
}

/// `peek_each` shows the letters `peek` reads (export writes what it shows), stops at the
/// limit, and ends at the visitor's error.
pub async fn peek_each_shows_what_peek_reads(f: &impl Fixture) {
    let broker = f.dlq_with(&seed_letters(8)).await;
    let mut lines = Vec::new();
    let mut write = |letter: &LetterView<'_>| {
        letter.write_line(&mut lines);
        Ok(())
    };
    broker.peek_each(None, &mut write).await.unwrap();
    broker.end_read().await.unwrap();
    let shown: Vec<DeadLetter> =
        lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
    // Counts a broker keeps per read (SQS's receive count) may move between reads.
    let parts = |letters: &[DeadLetter]| {
        let mut parts: Vec<_> = letters.iter().map(|l| (seq(l), l.body.clone(), l.headers.clone())).collect();
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        parts
    };
    assert_eq!(parts(&shown), parts(&all(broker.as_ref()).await));

    let mut visited = 0;
    let mut count = |_: &LetterView<'_>| {
        visited += 1;
        Ok(())
    };
    broker.peek_each(Some(3), &mut count).await.unwrap();
    broker.end_read().await.unwrap();
    assert_eq!(visited, 3);
    let stop = broker.peek_each(None, &mut |_| Err(Error::Runtime("stop here".into()))).await;
    broker.end_read().await.unwrap();
    assert!(matches!(&stop, Err(Error::Runtime(m)) if m == "stop here"), "{stop:?}");
}

pub async fn reasons_match_what_was_seeded(f: &impl Fixture) {
    let seeded = seed_letters(9);
    let broker = f.dlq_with(&seeded).await;
    let mut expected: Vec<(String, ReasonKind)> = seeded.iter().map(|l| (seq(l), f.reason_for(l))).collect();
    let mut read: Vec<(String, ReasonKind)> =
        all(broker.as_ref()).await.iter().map(|l| (seq(l), l.reason.kind)).collect();
    expected.sort();
    read.sort();
    assert_eq!(read, expected);
}

/// Read everything, write it as an archive, read that back: nothing changes.
pub async fn export_round_trip_is_lossless(f: &impl Fixture) {
    let broker = f.dlq_with(&seed_letters(8)).await;
    let read = all(broker.as_ref()).await;
    let archive = crate::support::jsonl(&read);
    let back: Vec<DeadLetter> =
        archive.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
    assert_eq!(back, read);
    let bin = read[0].headers.get("bin").expect("binary header kept");
    assert!(matches!(bin, Value::Bytes(_) | Value::String(_)), "{bin:?}");
}

pub async fn settle_removes_exactly_the_settled(f: &impl Fixture) {
    let seeded = seed_letters(6);
    let broker = f.dlq_with(&seeded).await;
    let batch = broker.receive(4).await.unwrap();
    assert_eq!(batch.len(), 4);
    let (settle, keep): (Vec<_>, Vec<_>) = batch.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let settle_handles: Vec<Handle> = settle.iter().map(|(_, r)| r.handle).collect();
    broker.settle(&settle_handles).await.unwrap();
    let keep_handles: Vec<Handle> = keep.iter().map(|(_, r)| r.handle).collect();
    broker.release(&keep_handles).await.unwrap();

    let remaining = seqs(&all(broker.as_ref()).await);
    let settled: Vec<String> = settle.iter().map(|(_, r)| seq(&r.letter)).collect();
    let mut expected: Vec<String> = seeded.iter().map(seq).filter(|s| !settled.contains(s)).collect();
    expected.sort();
    assert_eq!(remaining, expected);

    // A second settle after more receives still removes exactly its own messages.
    let more = broker.receive(10).await.unwrap();
    let (last, rest) = more.split_last().expect("more to receive");
    broker.settle(&[last.handle]).await.unwrap();
    let rest: Vec<Handle> = rest.iter().map(|r| r.handle).collect();
    broker.release(&rest).await.unwrap();
    assert_eq!(depth(broker.as_ref()).await, (seeded.len() - settled.len() - 1) as u64);
}

/// A whole consuming run as the redrive engine makes it: begin, take, settle some, release the
/// rest, end. What was settled stays gone for a new reader of the same DLQ; the rest is there.
pub async fn a_consuming_run_ends_with_exactly_the_unsettled(f: &impl Fixture) {
    let seeded = seed_letters(6);
    let broker = f.dlq_with(&seeded).await;
    broker.begin_consume().await.unwrap();
    let batch = broker.receive(6).await.unwrap();
    let (settle, keep): (Vec<_>, Vec<_>) = batch.into_iter().partition(|r| seq(&r.letter).parse::<u64>().unwrap() < 2);
    broker.settle(&settle.iter().map(|r| r.handle).collect::<Vec<_>>()).await.unwrap();
    broker.release(&keep.iter().map(|r| r.handle).collect::<Vec<_>>()).await.unwrap();
    broker.end_consume().await.unwrap();
    let mut expected: Vec<String> = keep.iter().map(|r| seq(&r.letter)).collect();
    expected.sort();
    assert_eq!(seqs(&all(broker.as_ref()).await), expected);
    assert_eq!(depth(broker.as_ref()).await, expected.len() as u64);
}

pub async fn release_leaves_them(f: &impl Fixture) {
    let broker = f.dlq_with(&seed_letters(5)).await;
    let batch = broker.receive(5).await.unwrap();
    let handles: Vec<Handle> = batch.iter().map(|r| r.handle).collect();
    broker.release(&handles).await.unwrap();
    assert_eq!(seqs(&all(broker.as_ref()).await), seqs(&seed_letters(5)));
}

/// What a backend says it cannot do must fail as `NotSupported`, never succeed silently.
pub async fn unsupported_is_not_supported(f: &impl Fixture) {
    assert_not_supported_where_not_capable(f.dlq_with(&seed_letters(1)).await.as_ref()).await;
}

pub async fn assert_not_supported_where_not_capable(broker: &dyn Broker) {
    let caps = broker.capabilities();
    if !caps.consume {
        for result in [
            broker.begin_consume().await,
            broker.receive(1).await.map(|_| ()),
            broker.settle(&[]).await,
            broker.release(&[]).await,
        ] {
            assert!(matches!(result, Err(Error::NotSupported { .. })), "{result:?}");
        }
    }
}
