//! The response body polls the stream's follower itself: no task of its own, no channel
//! between them. The follower leaves each event in a one-event slot ([`Out`]) and waits
//! until the body has taken it; the body ([`Followed`]) polls the follower, and sends what
//! it left. The follower runs only when the client can take an event (as it did with a
//! channel full), and goes with the body when the client goes away: the operation runs
//! in a task of its own, and goes on.
//!
//! Not a task and a channel: they would cost every stream a task and a block of events
//! for its whole life (bench figure 12 under heaptrack).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::response::sse::Event;
use futures_util::Stream;

/// Where the follower leaves the next event for the body to take.
#[derive(Clone, Default)]
pub struct Out(Arc<Mutex<Option<Event>>>);

impl Out {
    /// Hands `event` to the body: returns when the body has taken it and polls again.
    pub async fn send(&self, event: Event) {
        *self.0.lock().expect("never poisoned") = Some(event);
        // Pending once, without a waker: the body takes the event and returns it, and
        // the body is polled again for the next (it is a stream: its reader asks until
        // it is pending), which polls this again.
        let mut handed = false;
        std::future::poll_fn(|_| match std::mem::replace(&mut handed, true) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
        .await
    }

    fn take(&self) -> Option<Event> {
        self.0.lock().expect("never poisoned").take()
    }
}

/// The events of a follower, as the body's stream.
pub struct Followed {
    follower: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    out: Out,
}

impl Followed {
    /// The stream of what `follower` sends to `out`.
    pub fn new(follower: impl Future<Output = ()> + Send + 'static, out: Out) -> Followed {
        Followed {
            follower: Some(Box::pin(follower)),
            out,
        }
    }
}

impl Stream for Followed {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(follower) = self.follower.as_mut() else {
            return Poll::Ready(None);
        };
        let done = follower.as_mut().poll(cx).is_ready();
        if done {
            self.follower = None;
        }
        match self.out.take() {
            Some(event) => Poll::Ready(Some(Ok(event))),
            None if done => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{FutureExt, StreamExt};

    fn same(event: Event, data: &str) -> bool {
        format!("{event:?}") == format!("{:?}", Event::default().data(data))
    }

    #[tokio::test]
    async fn every_event_is_taken_once_in_order_and_the_stream_ends_with_the_follower() {
        let out = Out::default();
        let sent = out.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let follower = async move {
            sent.send(Event::default().data("1")).await;
            sent.send(Event::default().data("2")).await;
            // Waits for something else between two events, as a follower does.
            let _ = rx.await;
            sent.send(Event::default().data("3")).await;
        };
        let mut stream = Followed::new(follower, out);
        assert!(
            same(stream.next().await.unwrap().unwrap(), "1"),
            "the first"
        );
        assert!(
            same(stream.next().await.unwrap().unwrap(), "2"),
            "the second"
        );
        // Nothing more until the follower has something.
        assert!(
            stream.next().now_or_never().is_none(),
            "pending while the follower waits"
        );
        tx.send(()).unwrap();
        assert!(
            same(stream.next().await.unwrap().unwrap(), "3"),
            "the third"
        );
        assert!(stream.next().await.is_none(), "ends with the follower");
    }
}
