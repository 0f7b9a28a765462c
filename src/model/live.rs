//! Live text: the pieces of a model answer as the provider writes them, for the event
//! streams that watch the operation on this instance (docs/streaming.md, "Live text").
//!
//! A stream that watches an operation run by this instance opens it here
//! ([`LiveOps::open`]); while it is open, the loop asks the model for a streamed answer
//! (`stream: true`) and each request publishes its text as it comes ([`LiveAttempt`]).
//! Nothing here is durable: the journal still stores each step whole, and it alone gives
//! the events their ids. An operation nobody watches on this instance is asked without
//! `stream: true`, and looking that up costs one atomic load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

/// Pieces a watcher may fall behind by before it loses the live text (the journal's
/// whole text is sent instead). A watcher relays each piece as it comes, so it is
/// behind only while its client reads slower than the model writes. The ring is
/// allocated whole for each watched operation (about 72 B a piece): at 1,024 it was
/// some 72 KB each, four times a waiting stream's whole budget (bench figure 12).
const BACKLOG: usize = 16;

/// What the loop says of an answer being written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveEvent {
    /// More text of the answer at journal step `step`, from request `attempt` (numbered
    /// per operation on this instance: a retry or a fallback is another attempt).
    Text {
        step: i64,
        attempt: u32,
        text: String,
    },
    /// Request `attempt` ended without its answer (its stream broke, it timed out, it
    /// was over the bound): its text so far is not the answer.
    Broken { step: i64, attempt: u32 },
}

/// The operations watched on this instance, by (owner, key).
#[derive(Clone, Default)]
pub struct LiveOps(Arc<Registry>);

#[derive(Default)]
struct Registry {
    /// Entries in `ops`: while none, no lock is taken.
    count: AtomicUsize,
    ops: Mutex<HashMap<OpId, (Arc<Op>, usize)>>,
}

/// (owner, operation key).
type OpId = (String, String);

struct Op {
    tx: broadcast::Sender<LiveEvent>,
    /// The answer being written: what a watcher that subscribes mid-answer starts from.
    writing: Mutex<Option<(i64, u32, String)>>,
    attempts: AtomicU32,
}

impl std::fmt::Debug for LiveOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LiveOps({})", self.0.count.load(Ordering::Relaxed))
    }
}

impl LiveOps {
    /// The operation is watched until the guard is dropped (several may hold it).
    pub fn open(&self, owner: &str, key: &str) -> Watched {
        let id = (owner.to_owned(), key.to_owned());
        let mut ops = self.0.ops.lock().expect("never poisoned");
        let entry = ops.entry(id.clone()).or_insert_with(|| {
            self.0.count.fetch_add(1, Ordering::Relaxed);
            let (tx, _) = broadcast::channel(BACKLOG);
            let op = Op {
                tx,
                writing: Mutex::new(None),
                attempts: AtomicU32::new(0),
            };
            (Arc::new(op), 0)
        });
        entry.1 += 1;
        Watched {
            ops: self.clone(),
            id,
        }
    }

    /// Where the answer at `step` of this operation is to be published, if anyone
    /// watches it here: the loop then asks for a streamed answer.
    pub fn publisher(&self, owner: &str, key: &str, step: i64) -> Option<LiveText> {
        if self.0.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let ops = self.0.ops.lock().expect("never poisoned");
        let (op, _) = ops.get(&(owner.to_owned(), key.to_owned()))?;
        Some(LiveText {
            op: op.clone(),
            step,
        })
    }

    /// The live text of this operation, if it is watched here: what is being written now
    /// (as one `Text`), then what comes.
    pub fn subscribe(
        &self,
        owner: &str,
        key: &str,
    ) -> Option<(Option<LiveEvent>, broadcast::Receiver<LiveEvent>)> {
        let ops = self.0.ops.lock().expect("never poisoned");
        let (op, _) = ops.get(&(owner.to_owned(), key.to_owned()))?;
        // Under the lock the publishers take: nothing is missed or heard twice.
        let writing = op.writing.lock().expect("never poisoned");
        let now = writing
            .clone()
            .map(|(step, attempt, text)| LiveEvent::Text {
                step,
                attempt,
                text,
            });
        Some((now, op.tx.subscribe()))
    }
}

/// An operation watched; unwatched when the last guard goes.
pub struct Watched {
    ops: LiveOps,
    id: OpId,
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut ops = self.ops.0.ops.lock().expect("never poisoned");
        if let Some(entry) = ops.get_mut(&self.id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                ops.remove(&self.id);
                self.ops.0.count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// Where one answer's text goes: the answer at journal step `step` of a watched operation.
#[derive(Clone)]
pub struct LiveText {
    op: Arc<Op>,
    step: i64,
}

impl std::fmt::Debug for LiveText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LiveText(step {})", self.step)
    }
}

impl LiveText {
    /// One request's answer, from its first piece: the text of each request is heard as
    /// its own, so a retry's or a fallback's is never joined to a broken one's.
    pub fn attempt(&self) -> LiveAttempt {
        let attempt = self.op.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        LiveAttempt {
            op: self.op.clone(),
            step: self.step,
            attempt,
            finished: false,
        }
    }
}

/// One request's text as it comes. Dropped before [`finished`](Self::finished) (the
/// request failed, or its future was dropped by a timeout), it says so: `Broken`.
pub struct LiveAttempt {
    op: Arc<Op>,
    step: i64,
    attempt: u32,
    finished: bool,
}

impl LiveAttempt {
    pub fn text(&self, piece: &str) {
        if piece.is_empty() {
            return;
        }
        let mut writing = self.op.writing.lock().expect("never poisoned");
        match writing.as_mut() {
            Some((step, attempt, text)) if (*step, *attempt) == (self.step, self.attempt) => {
                text.push_str(piece)
            }
            _ => *writing = Some((self.step, self.attempt, piece.to_owned())),
        }
        let _ = self.op.tx.send(LiveEvent::Text {
            step: self.step,
            attempt: self.attempt,
            text: piece.to_owned(),
        });
    }

    /// The request's answer came whole.
    pub fn finished(mut self) {
        self.finished = true;
    }
}

impl Drop for LiveAttempt {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut writing = self.op.writing.lock().expect("never poisoned");
        if writing
            .as_ref()
            .is_some_and(|(s, a, _)| (*s, *a) == (self.step, self.attempt))
        {
            *writing = None;
        }
        let _ = self.op.tx.send(LiveEvent::Broken {
            step: self.step,
            attempt: self.attempt,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_hears_the_answer_being_written_then_what_comes() {
        let ops = LiveOps::default();
        assert!(ops.publisher("ann", "k", 3).is_none(), "nobody watches");
        let watched = ops.open("ann", "k");
        let live = ops.publisher("ann", "k", 3).expect("watched");
        let first = live.attempt();
        first.text("Your ");
        let (now, mut rx) = ops.subscribe("ann", "k").unwrap();
        assert_eq!(
            now,
            Some(LiveEvent::Text {
                step: 3,
                attempt: 1,
                text: "Your ".into()
            })
        );
        first.text("pay");
        drop(first);
        let second = live.attempt();
        second.text("Paid.");
        second.finished();
        let heard: Vec<LiveEvent> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(
            heard,
            vec![
                LiveEvent::Text {
                    step: 3,
                    attempt: 1,
                    text: "pay".into()
                },
                LiveEvent::Broken {
                    step: 3,
                    attempt: 1
                },
                LiveEvent::Text {
                    step: 3,
                    attempt: 2,
                    text: "Paid.".into()
                },
            ]
        );
        drop(watched);
        assert!(ops.publisher("ann", "k", 3).is_none(), "unwatched");
    }
}
