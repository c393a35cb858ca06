//! Every broker call bounded in time, once for all backends. A cut connection fails fast in
//! every client library, but a stalled one (a half-open TCP connection, a hung proxy, a broker
//! that stops answering) can leave a call waiting for minutes or for ever: heartbeats,
//! socket timeouts and SDK defaults differ from one library to the next. Here each call gets
//! the same `--timeout`, and running out of it is an error that names the call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use tokio::time::Sleep;
use tokio::time::error::Elapsed;

use super::{
    Broker, Capabilities, Description, Destination, Failure, Handle, LetterStream, MoveTask, PublishError, Received,
    Sink, Visit,
};
use crate::error::{Error, Result};
use crate::model::{DeadLetter, LetterView};

/// A backend (`Bounded<dyn Broker>`) or a `--to` sink (`Bounded<dyn Sink>`) whose every call
/// to the broker must answer within `limit`.
pub struct Bounded<T: ?Sized> {
    inner: Box<T>,
    limit: Duration,
    /// The target as printed, password masked.
    shown: String,
}

impl<T: ?Sized> Bounded<T> {
    pub fn new(inner: Box<T>, limit: Duration, shown: String) -> Self {
        Bounded { inner, limit, shown }
    }

    async fn within<R>(&self, what: &str, call: impl Future<Output = Result<R>>) -> Result<R> {
        within(self.limit, &self.shown, what, call).await
    }
}

/// `call`, or an error naming `what` and `shown` when it has not answered within `limit`.
pub async fn within<T>(limit: Duration, shown: &str, what: &str, call: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| Err(stalled(limit, shown, what)))
}

/// `tokio::time::timeout`, without its clock read and timer when `call` is ready at once, as
/// most messages of a read are (already buffered by the client library).
pub async fn ready_or_timeout<F: Future>(limit: Duration, call: F) -> std::result::Result<F::Output, Elapsed> {
    let mut call = std::pin::pin!(call);
    match futures::poll!(call.as_mut()) {
        Poll::Ready(output) => Ok(output),
        Poll::Pending => tokio::time::timeout(limit, call).await,
    }
}

/// A read whose every letter must arrive within `limit`, else it ends with an error naming the
/// stall. A stream of its own rather than an `unfold` over `ready_or_timeout`: that moved each
/// letter through its future four more times (4% of a Kafka export's instructions).
struct EachWithin<'a> {
    /// `None` once the read has ended or stalled.
    letters: Option<LetterStream<'a>>,
    limit: Duration,
    shown: &'a str,
    /// Armed only while waiting, as most letters of a read are already buffered.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Stream for EachWithin<'_> {
    type Item = Result<DeadLetter>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(letters) = &mut this.letters else { return Poll::Ready(None) };
        if let Poll::Ready(next) = letters.poll_next_unpin(cx) {
            this.timer = None;
            if next.is_none() {
                this.letters = None;
            }
            return Poll::Ready(next);
        }
        let limit = this.limit;
        let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        ready!(timer.as_mut().poll(cx));
        this.letters = None;
        Poll::Ready(Some(Err(stalled(limit, this.shown, "reading the next message"))))
    }
}

fn stalled(limit: Duration, shown: &str, what: &str) -> Error {
    Error::Runtime(format!(
        "{shown}: no answer to {what} within {}s: the broker or the network stalled \
         (raise --timeout if the broker is only slow)",
        limit.as_secs_f64()
    ))
}

#[async_trait]
impl Broker for Bounded<dyn Broker> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn describe(&self) -> Result<Description> {
        self.within("describing the DLQ", self.inner.describe()).await
    }

    async fn list(&self) -> Result<Vec<Description>> {
        self.within("listing DLQs", self.inner.list()).await
    }

    /// Each message of the read must arrive within the limit, not the whole read.
    async fn peek(&self, limit: Option<u64>) -> Result<LetterStream<'_>> {
        let letters = self.within("starting a read", self.inner.peek(limit)).await?;
        Ok(EachWithin { letters: Some(letters), limit: self.limit, shown: &self.shown, timer: None }.boxed())
    }

    /// As `peek`: each message must arrive within the limit. The read is pushed, not pulled,
    /// so a watchdog beside it counts the messages handed on, looking every eighth of the
    /// limit: a stall is named between the limit and an eighth more after the last message.
    /// The two share a task, so the watchdog runs only while the read waits on the broker:
    /// the time a message took to be written out is never counted as the broker's.
    async fn peek_each(&self, limit: Option<u64>, visit: &mut Visit<'_>) -> Result<()> {
        // A count rather than a clock read per message, which cost 100 instructions each.
        let handed = AtomicU64::new(0);
        let mut counting = |letter: &LetterView<'_>| {
            let visited = visit(letter);
            handed.store(handed.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            visited
        };
        let read = self.inner.peek_each(limit, &mut counting);
        let watchdog = async {
            let (mut seen, mut since) = (0, Instant::now());
            loop {
                tokio::time::sleep(self.limit / 8).await;
                let now = handed.load(Ordering::Relaxed);
                if now != seen {
                    (seen, since) = (now, Instant::now());
                } else if since.elapsed() >= self.limit {
                    let what = if seen == 0 { "starting a read" } else { "reading the next message" };
                    return stalled(self.limit, &self.shown, what);
                }
            }
        };
        tokio::select! {
            done = read => done,
            stall = watchdog => Err(stall),
        }
    }

    async fn begin_consume(&self) -> Result<()> {
        self.within("getting ready to take messages", self.inner.begin_consume()).await
    }

    async fn end_consume(&self) -> Result<()> {
        self.within("finishing the removal of moved messages", self.inner.end_consume()).await
    }

    async fn receive(&self, max: usize) -> Result<Vec<Received>> {
        self.within("taking messages", self.inner.receive(max)).await
    }

    async fn settle(&self, handles: &[Handle]) -> Result<()> {
        self.within("removing moved messages", self.inner.settle(handles)).await
    }

    async fn release(&self, handles: &[Handle]) -> Result<()> {
        self.within("putting messages back", self.inner.release(handles)).await
    }

    fn source_destination(&self, letter: &DeadLetter) -> Option<Destination> {
        self.inner.source_destination(letter)
    }

    fn source_sink(&self) -> Option<&dyn Sink> {
        self.inner.source_sink().map(|_| self as &dyn Sink)
    }

    async fn start_move_task(&self, rate: Option<u32>) -> Result<String> {
        self.within("starting a move task", self.inner.start_move_task(rate)).await
    }

    async fn move_task(&self) -> Result<Option<MoveTask>> {
        self.within("asking for the move task", self.inner.move_task()).await
    }

    async fn cancel_move_task(&self) -> Result<MoveTask> {
        self.within("cancelling the move task", self.inner.cancel_move_task()).await
    }

    async fn end_read(&self) -> Result<()> {
        self.within("ending the read", self.inner.end_read()).await
    }

    async fn lint_inventory(&self) -> Result<crate::lint::Inventory> {
        self.within("describing the configuration", self.inner.lint_inventory()).await
    }

    fn read_notes(&self) -> Vec<String> {
        self.inner.read_notes()
    }
}

#[async_trait]
impl Sink for Bounded<dyn Broker> {
    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<std::result::Result<(), PublishError>> {
        let sink = self.inner.source_sink().expect("offered only when the backend has one");
        publish_within(sink, batch, self.limit, &self.shown).await
    }
}

#[async_trait]
impl Sink for Bounded<dyn Sink> {
    async fn publish(&self, batch: &[(DeadLetter, Destination)]) -> Vec<std::result::Result<(), PublishError>> {
        publish_within(self.inner.as_ref(), batch, self.limit, &self.shown).await
    }

    fn open_notes(&self) -> Vec<String> {
        self.inner.open_notes()
    }
}

/// A publish without its confirmations in time is a transient failure of every copy: the
/// originals stay in the DLQ, and a copy that did arrive is a bounded, labelled duplicate.
async fn publish_within(
    sink: &dyn Sink,
    batch: &[(DeadLetter, Destination)],
    limit: Duration,
    shown: &str,
) -> Vec<std::result::Result<(), PublishError>> {
    match tokio::time::timeout(limit, sink.publish(batch)).await {
        Ok(results) => results,
        Err(_) => {
            let message = stalled(limit, shown, "publishing copies").to_string();
            batch.iter().map(|_| Err(PublishError { failure: Failure::Transient, message: message.clone() })).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_that_never_answers_fails_naming_it() {
        let never = std::future::pending::<Result<()>>();
        let e = within(Duration::from_millis(20), "rabbitmq://h/v/dlq", "taking messages", never).await.unwrap_err();
        let text = e.to_string();
        assert!(text.contains("rabbitmq://h/v/dlq: no answer to taking messages within 0.02s"), "{text}");
        assert!(text.contains("--timeout"), "{text}");
    }

    #[tokio::test]
    async fn a_read_that_stops_answering_ends_with_the_stall_named() {
        let letter = DeadLetter { id: "m-1".into(), ..DeadLetter::default() };
        let stalls = futures::stream::iter([Ok(letter)]).chain(futures::stream::pending()).boxed();
        let limit = Duration::from_millis(50);
        let mut read = EachWithin { letters: Some(stalls), limit, shown: "t", timer: None };
        assert_eq!(read.next().await.unwrap().unwrap().id, "m-1");
        let e = read.next().await.unwrap().unwrap_err().to_string();
        assert!(e.contains("t: no answer to reading the next message within 0.05s"), "{e}");
        assert!(read.next().await.is_none());
    }

    /// The limit is per letter: three letters 0.4 s apart take longer than the 1 s limit.
    #[tokio::test]
    async fn a_slow_read_that_keeps_answering_is_not_a_stall() {
        let slow = futures::stream::iter(0..3)
            .then(|i| async move {
                tokio::time::sleep(Duration::from_millis(400)).await;
                Ok(DeadLetter { id: i.to_string(), ..DeadLetter::default() })
            })
            .boxed();
        let read = EachWithin { letters: Some(slow), limit: Duration::from_secs(1), shown: "t", timer: None };
        let ids: Vec<String> = read.map(|l| l.unwrap().id).collect().await;
        assert_eq!(ids, ["0", "1", "2"]);
    }

    /// A backend whose `peek_each` hands on letters at the given pauses, then stalls for good.
    struct Paced(Vec<Duration>);

    #[async_trait]
    impl Broker for Paced {
        fn backend(&self) -> &'static str {
            "paced"
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities { peek: true, peek_cost: None, consume: false, server_move: false, rereads_settled: false }
        }
        async fn describe(&self) -> Result<Description> {
            Err(self.not_supported("describe"))
        }
        async fn list(&self) -> Result<Vec<Description>> {
            Err(self.not_supported("list"))
        }
        async fn peek(&self, _limit: Option<u64>) -> Result<LetterStream<'_>> {
            Err(self.not_supported("peek"))
        }
        async fn peek_each(&self, _limit: Option<u64>, visit: &mut Visit<'_>) -> Result<()> {
            for (i, pause) in self.0.iter().enumerate() {
                tokio::time::sleep(*pause).await;
                visit(&DeadLetter { id: i.to_string(), ..DeadLetter::default() }.view())?;
            }
            std::future::pending().await
        }
    }

    async fn ids_seen(pauses: &[u64], limit: Duration, visit_takes: Duration) -> (Vec<String>, Result<()>) {
        let paced = Paced(pauses.iter().map(|ms| Duration::from_millis(*ms)).collect());
        let bounded = Bounded::<dyn Broker>::new(Box::new(paced), limit, "t".into());
        let mut ids = Vec::new();
        let outcome = bounded
            .peek_each(None, &mut |letter| {
                ids.push(letter.id.as_str().to_owned());
                std::thread::sleep(visit_takes);
                Ok(())
            })
            .await;
        (ids, outcome)
    }

    #[tokio::test]
    async fn a_pushed_read_that_stops_answering_ends_with_the_stall_named() {
        let (ids, outcome) = ids_seen(&[0, 0], Duration::from_millis(50), Duration::ZERO).await;
        assert_eq!(ids, ["0", "1"]);
        let e = outcome.unwrap_err().to_string();
        assert!(e.contains("t: no answer to reading the next message within 0.05s"), "{e}");
        let (ids, outcome) = ids_seen(&[100], Duration::from_millis(50), Duration::ZERO).await;
        assert!(ids.is_empty());
        assert!(outcome.unwrap_err().to_string().contains("no answer to starting a read"));
    }

    /// The limit is per letter, and the time spent writing a letter out is not the broker's:
    /// three letters 0.4 s apart, each taking 0.7 s to write, under a 1 s limit.
    #[tokio::test]
    async fn a_slow_pushed_read_that_keeps_answering_is_not_a_stall() {
        let (ids, outcome) = ids_seen(&[400, 400, 400], Duration::from_secs(1), Duration::from_millis(700)).await;
        assert_eq!(ids, ["0", "1", "2"]);
        assert!(outcome.unwrap_err().to_string().contains("no answer to reading the next message within 1s"));
    }

    #[tokio::test]
    async fn a_call_that_answers_in_time_passes_through() {
        let quick = async { Ok(7) };
        assert_eq!(within(Duration::from_secs(5), "t", "x", quick).await.unwrap(), 7);
    }
}
