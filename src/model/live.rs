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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// What the loop says of an answer being written, as a watcher hears it.
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
    /// The answer being written, the text so far: a watcher reads what it has not heard
    /// of it, so none falls behind and loses pieces, and an operation costs one value,
    /// not a ring of pieces (tokio's broadcast keeps a ring per operation; bench figure
    /// 12).
    writing: Arc<Shared>,
    attempts: AtomicU32,
}

/// What the publishers and the watchers of an operation share: the text, a count of its
/// changes and the watchers' wake-up. A `tokio::sync::watch` channel, which this was, is
/// some 300 bytes more (nine `Notify`s) for every watched operation (bench figure 12).
#[derive(Default)]
struct Shared {
    writing: Mutex<Writing>,
    /// Bumped by every change, and when the operation is no longer published.
    version: AtomicU64,
    /// No publisher is left (the operation is no longer watched, its requests are done).
    closed: AtomicBool,
    notify: Notify,
}

impl Shared {
    /// Changes the text (`change` says whether it did), and wakes the watchers if so.
    fn modify(&self, change: impl FnOnce(&mut Writing) -> bool) {
        let changed = change(&mut self.writing.lock().expect("never poisoned"));
        if changed {
            self.version.fetch_add(1, Ordering::Release);
            self.notify.notify_waiters();
        }
    }
}

impl Drop for Op {
    /// The watchers hear that nothing more comes, once they have heard what came.
    fn drop(&mut self) {
        self.writing.closed.store(true, Ordering::Release);
        self.writing.version.fetch_add(1, Ordering::Release);
        self.writing.notify.notify_waiters();
    }
}

/// The request whose text was written last, and its text so far.
#[derive(Debug, Default)]
struct Writing {
    /// Its answer's journal step; 0: none yet.
    step: i64,
    attempt: u32,
    text: String,
    /// It ended without its answer.
    broken: bool,
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
            let op = Op {
                writing: Arc::default(),
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

    /// The live text of this operation, if it is watched here: what is being written now,
    /// then what comes.
    pub fn subscribe(&self, owner: &str, key: &str) -> Option<Watcher> {
        let ops = self.0.ops.lock().expect("never poisoned");
        let (op, _) = ops.get(&(owner.to_owned(), key.to_owned()))?;
        let shared = op.writing.clone();
        // What is being written now is the first thing heard (as a change not yet seen);
        // of a request that broke before the watcher came, nothing is.
        let (heard, len, broken, seen) = {
            let writing = shared.writing.lock().expect("never poisoned");
            let seen = shared.version.load(Ordering::Acquire).wrapping_sub(1);
            let heard = (writing.step, writing.attempt);
            match writing.broken {
                true => (heard, writing.text.len(), true, seen),
                false => (heard, 0, false, seen),
            }
        };
        Some(Watcher {
            shared,
            seen,
            heard,
            len,
            broken,
        })
    }
}

/// One watcher of an operation's live text.
pub struct Watcher {
    shared: Arc<Shared>,
    /// The version of the text last read.
    seen: u64,
    /// The (step, attempt) heard last, how many bytes of its text, and whether its
    /// break was heard.
    heard: (i64, u32),
    len: usize,
    broken: bool,
}

impl Watcher {
    /// What was written since the last call, once there is some: the text that request
    /// wrote since (all it wrote, for a request not heard of before), its break. `None`
    /// once the operation is no longer watched.
    pub async fn next(&mut self) -> Option<Vec<LiveEvent>> {
        loop {
            self.changed().await?;
            let writing = self.shared.writing.lock().expect("never poisoned");
            let (step, attempt) = (writing.step, writing.attempt);
            if (step, attempt) != self.heard {
                // A request that began after the watcher came: all of its text is heard,
                // then its break if it broke before the watcher looked.
                self.heard = (step, attempt);
                (self.len, self.broken) = (0, false);
            }
            let mut heard = Vec::new();
            if writing.text.len() > self.len {
                heard.push(LiveEvent::Text {
                    step,
                    attempt,
                    text: writing.text[self.len..].to_owned(),
                });
                self.len = writing.text.len();
            }
            if writing.broken && !self.broken {
                self.broken = true;
                heard.push(LiveEvent::Broken { step, attempt });
            }
            if !heard.is_empty() {
                return Some(heard);
            }
        }
    }

    /// Returns when the text changed since it was last read (at once if it has), marking
    /// it read; `None` once it can no longer change and every change was read.
    async fn changed(&mut self) -> Option<()> {
        let shared = &*self.shared;
        loop {
            // Listening before the version is read: a change between the two wakes it.
            let notified = shared.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            // Closed is read first: a change that came before it was set is seen below.
            let closed = shared.closed.load(Ordering::Acquire);
            let version = shared.version.load(Ordering::Acquire);
            if version != self.seen {
                self.seen = version;
                return Some(());
            }
            if closed {
                return None;
            }
            notified.await;
        }
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
        self.op.writing.modify(|writing| {
            if (writing.step, writing.attempt) == (self.step, self.attempt) {
                writing.text.push_str(piece);
            } else {
                *writing = Writing {
                    step: self.step,
                    attempt: self.attempt,
                    text: piece.to_owned(),
                    broken: false,
                };
            }
            true
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
        // Only a request that wrote text has anything to take back.
        self.op.writing.modify(|writing| {
            let this = (writing.step, writing.attempt) == (self.step, self.attempt);
            if this {
                writing.broken = true;
            }
            this
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(step: i64, attempt: u32, text: &str) -> LiveEvent {
        LiveEvent::Text {
            step,
            attempt,
            text: text.into(),
        }
    }

    #[tokio::test]
    async fn a_watcher_hears_the_answer_being_written_then_what_comes() {
        let ops = LiveOps::default();
        assert!(ops.publisher("ann", "k", 3).is_none(), "nobody watches");
        let watched = ops.open("ann", "k");
        let live = ops.publisher("ann", "k", 3).expect("watched");
        let first = live.attempt();
        first.text("Your ");
        let mut watcher = ops.subscribe("ann", "k").unwrap();
        assert_eq!(watcher.next().await, Some(vec![text(3, 1, "Your ")]));
        first.text("pay");
        first.text("ment ");
        assert_eq!(
            watcher.next().await,
            Some(vec![text(3, 1, "payment ")]),
            "what was written since, none of it lost"
        );
        first.text("of");
        drop(first);
        assert_eq!(
            watcher.next().await,
            Some(vec![
                text(3, 1, "of"),
                LiveEvent::Broken {
                    step: 3,
                    attempt: 1
                }
            ])
        );
        // A watcher that comes after a request broke hears nothing of it.
        let mut late = ops.subscribe("ann", "k").unwrap();
        let second = live.attempt();
        second.text("Paid.");
        assert_eq!(watcher.next().await, Some(vec![text(3, 2, "Paid.")]));
        assert_eq!(late.next().await, Some(vec![text(3, 2, "Paid.")]));
        second.finished();
        drop((watched, live));
        assert!(ops.publisher("ann", "k", 3).is_none(), "unwatched");
        assert_eq!(watcher.next().await, None, "nothing more once unwatched");
    }

    #[tokio::test]
    async fn a_request_that_broke_before_its_watcher_looked_is_heard_whole_then_its_break() {
        let ops = LiveOps::default();
        let _watched = ops.open("ann", "k");
        let live = ops.publisher("ann", "k", 1).unwrap();
        let mut watcher = ops.subscribe("ann", "k").unwrap();
        // The whole answer written and cut before the watcher looks (an endless stream
        // over the bound, in a few milliseconds).
        let first = live.attempt();
        first.text("and on ");
        first.text("and on ");
        drop(first);
        let heard = tokio::time::timeout(std::time::Duration::from_secs(1), watcher.next()).await;
        assert_eq!(
            heard.expect("the broken request is heard, not skipped"),
            Some(vec![
                text(1, 1, "and on and on "),
                LiveEvent::Broken {
                    step: 1,
                    attempt: 1
                }
            ])
        );
    }

    #[tokio::test]
    async fn a_watcher_that_missed_a_break_hears_the_next_request_whole() {
        let ops = LiveOps::default();
        let _watched = ops.open("ann", "k");
        let live = ops.publisher("ann", "k", 3).unwrap();
        let mut watcher = ops.subscribe("ann", "k").unwrap();
        let first = live.attempt();
        first.text("Your pay");
        assert_eq!(watcher.next().await, Some(vec![text(3, 1, "Your pay")]));
        first.text("ment");
        drop(first);
        let second = live.attempt();
        second.text("Your ");
        second.text("payment");
        assert_eq!(
            watcher.next().await,
            Some(vec![text(3, 2, "Your payment")]),
            "the second request's text from its start"
        );
    }
}
