//! Live text in a stream: the closing sentence (any answer's text) sent as the model
//! writes it, as id-less `TEXT_MESSAGE_*` events, fitted to the journal's events so that
//! the ids stay the journal's places and no text is sent twice (docs/streaming.md, "Live
//! text").
//!
//! - The answer at step S is written live only once the stream has sent every step
//!   before S: the events stay in the journal's order.
//! - Each model request is its own live message: the first of step S is `THREAD-S` (the
//!   journal's name for that answer's message), the n-th `THREAD-S-n`. A request that
//!   breaks has its message ended (`TEXT_MESSAGE_END`, no id) where it broke.
//! - When step S is journaled: if the last live message's text is the journaled text,
//!   its `TEXT_MESSAGE_START` and `TEXT_MESSAGE_CONTENT` are not sent again, and the
//!   journal's `TEXT_MESSAGE_END` (with its id, S.3) ends the live message. Otherwise (a
//!   broken request, text not yet heard) the journal's events are sent whole, their message
//!   named `THREAD-S-(n+1)` when `THREAD-S` was taken by a live message.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use serde_json::{Value, json};

use super::events::{self, AgUiEvent};
use super::out::Out;
use super::sse;
use crate::journal::Entry;
use crate::model::LiveOps;
use crate::model::live::{LiveEvent, Watcher};

/// The live text of one stream's operation, if it is watched on this instance.
pub struct Live {
    watcher: Option<Watcher>,
    /// The live message being written, if any.
    message: Option<Message>,
    /// The last journal step whose events were made.
    journaled: i64,
    /// Live messages started, by step. `BTreeMap`s, not `HashMap`s: half the size empty
    /// (a `HashMap` keeps its hasher's keys beside the table), in every waiting stream's
    /// follower; a stream has a few steps.
    started: BTreeMap<i64, u32>,
    /// What the journal's events of a step that had live messages become.
    decided: BTreeMap<i64, Decision>,
    /// The step whose text came before the stream had read the step before it: the
    /// journal was read again at once (once a step), not at the next poll.
    caught_up_for: i64,
}

struct Message {
    step: i64,
    attempt: u32,
    id: Option<String>,
    text: String,
    /// Bytes of `text` sent.
    sent: usize,
    /// Its request broke: not the answer.
    spoiled: bool,
    ended: bool,
}

enum Decision {
    /// The live message `id` was the journaled text: its end is the journal's.
    Sent(String),
    /// The journal's message, renamed.
    Renamed(String),
}

/// What waiting came to.
pub enum Waited<T> {
    Done(T),
    /// Text came for a step after one the stream has not read: read the journal now.
    Behind,
}

impl Live {
    /// Subscribes to the operation's live text; inert when it is not watched here.
    pub fn watch(live: &LiveOps, owner: &str, key: &str) -> Live {
        Live {
            watcher: live.subscribe(owner, key),
            message: None,
            journaled: 0,
            started: BTreeMap::new(),
            decided: BTreeMap::new(),
            caught_up_for: 0,
        }
    }

    /// Waits for `wait`, sending the live text that comes meanwhile.
    ///
    /// `wait` is pinned by the caller, not moved in (an `async fn`'s argument pinned
    /// inside it is held twice), and the text heard is sent after the `select!`, not in
    /// its branch (where the listening future stayed held beside each send). Every
    /// waiting stream's follower holds this future, so its size is figure 12's (bench,
    /// docs/benchmark.md).
    pub async fn relay<T>(
        &mut self,
        thread: &str,
        out: &Out,
        mut wait: Pin<&mut impl Future<Output = T>>,
    ) -> Waited<T> {
        loop {
            let heard = tokio::select! {
                done = wait.as_mut() => return Waited::Done(done),
                heard = self.hear() => heard,
            };
            for event in self.heard(thread, heard) {
                out.send(sse(&event)).await;
            }
            if let Some(m) = &self.message
                && m.step > self.journaled + 1
                && m.step > self.caught_up_for
            {
                self.caught_up_for = m.step;
                return Waited::Behind;
            }
        }
    }

    /// What was written since it was last asked. Never ends while nothing comes.
    async fn hear(&mut self) -> Vec<LiveEvent> {
        let Some(watcher) = &mut self.watcher else {
            return std::future::pending().await;
        };
        match watcher.next().await {
            Some(heard) => heard,
            None => {
                self.watcher = None;
                std::future::pending().await
            }
        }
    }

    fn heard(&mut self, thread: &str, heard: Vec<LiveEvent>) -> Vec<AgUiEvent> {
        let mut out = Vec::new();
        for event in heard {
            self.hear_one(event, &mut out);
            out.extend(self.flush(thread));
        }
        out
    }

    fn hear_one(&mut self, heard: LiveEvent, out: &mut Vec<AgUiEvent>) {
        match heard {
            LiveEvent::Broken { step, attempt } => {
                if let Some(message) = self
                    .message
                    .as_mut()
                    .filter(|m| (m.step, m.attempt) == (step, attempt))
                {
                    message.spoiled = true;
                    out.extend(end(message));
                }
            }
            LiveEvent::Text {
                step,
                attempt,
                text,
            } => {
                if step <= self.journaled {
                    return;
                }
                match &mut self.message {
                    Some(m) if (m.step, m.attempt) == (step, attempt) => m.text.push_str(&text),
                    _ => {
                        // Another request's text: the one before is not the answer.
                        if let Some(mut before) = self.message.take() {
                            out.extend(end(&mut before));
                        }
                        self.message = Some(Message {
                            step,
                            attempt,
                            id: None,
                            text,
                            sent: 0,
                            spoiled: false,
                            ended: false,
                        });
                    }
                }
            }
        }
    }

    /// The live text that may be sent now: its message's start, then what is unsent.
    pub fn flush(&mut self, thread: &str) -> Vec<AgUiEvent> {
        let Some(m) = &mut self.message else {
            return Vec::new();
        };
        if m.step != self.journaled + 1 || m.spoiled || m.ended || m.text.trim().is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let id = match &m.id {
            Some(id) => id.clone(),
            None => {
                let n = self.started.entry(m.step).or_default();
                *n += 1;
                let id = match *n {
                    1 => format!("{thread}-{}", m.step),
                    n => format!("{thread}-{}-{n}", m.step),
                };
                out.push(
                    json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}),
                );
                m.id = Some(id.clone());
                id
            }
        };
        if m.sent < m.text.len() {
            let delta = &m.text[m.sent..];
            out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": delta}));
            m.sent = m.text.len();
        }
        out.into_iter()
            .map(|body| AgUiEvent { id: None, body })
            .collect()
    }

    /// The journal's events of `entry`, fitted to the live text sent of its step; with,
    /// first, the end (no id) of a live message that was not the answer.
    pub fn of_step(&mut self, thread: &str, entry: &Entry) -> Vec<AgUiEvent> {
        let mut events = events::of_step(thread, entry);
        let mut out = Vec::new();
        if entry.step > self.journaled {
            self.journaled = entry.step;
            self.decide(thread, entry, &events, &mut out);
        }
        match self.decided.get(&entry.step) {
            None => {}
            Some(Decision::Sent(id)) => {
                events.retain(|e| {
                    !matches!(
                        e.body["type"].as_str(),
                        Some("TEXT_MESSAGE_START" | "TEXT_MESSAGE_CONTENT")
                    )
                });
                rename(&mut events, id);
            }
            Some(Decision::Renamed(id)) => rename(&mut events, id),
        }
        out.extend(events);
        out
    }

    fn decide(
        &mut self,
        thread: &str,
        entry: &Entry,
        events: &[AgUiEvent],
        out: &mut Vec<AgUiEvent>,
    ) {
        let journaled_text = events
            .iter()
            .find(|e| e.body["type"] == "TEXT_MESSAGE_CONTENT")
            .and_then(|e| e.body["delta"].as_str());
        let message = self.message.take_if(|m| m.step <= entry.step);
        if let Some(mut m) = message {
            let whole = m.step == entry.step && !m.spoiled && m.sent == m.text.len();
            match &m.id {
                Some(id) if whole && journaled_text == Some(m.text.as_str()) => {
                    self.decided.insert(entry.step, Decision::Sent(id.clone()));
                    return;
                }
                _ => out.extend(end(&mut m)),
            }
        }
        if let Some(n) = self.started.get(&entry.step) {
            let id = format!("{thread}-{}-{}", entry.step, n + 1);
            self.decided.insert(entry.step, Decision::Renamed(id));
        }
    }

    /// The end of a live message left open when the run ends.
    pub fn close(&mut self) -> Vec<AgUiEvent> {
        match self.message.take() {
            Some(mut m) => end(&mut m),
            None => Vec::new(),
        }
    }
}

/// `TEXT_MESSAGE_END` (no id) of a live message started and not yet ended.
fn end(m: &mut Message) -> Vec<AgUiEvent> {
    match &m.id {
        Some(id) if !m.ended => {
            m.ended = true;
            vec![AgUiEvent {
                id: None,
                body: json!({"type": "TEXT_MESSAGE_END", "messageId": id}),
            }]
        }
        _ => Vec::new(),
    }
}

/// The answer's message named `id` in its events (its text's and its calls' parent).
fn rename(events: &mut [AgUiEvent], id: &str) {
    for event in events {
        for field in ["messageId", "parentMessageId"] {
            if event.body.get(field).is_some() {
                event.body[field] = Value::String(id.to_owned());
            }
        }
    }
}
