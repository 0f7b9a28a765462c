//! The mapping of an operation onto AG-UI events (docs/streaming.md): each journal step
//! becomes the events that say it, each with its place in the journal as its SSE id; the
//! operation's answer becomes the run's last event.

use std::fmt;

use serde_json::{Value, json};

use crate::assistant::tools;
use crate::journal::Entry;
use crate::model::wire::AssistantMessage;

/// A place in an operation's journal: step `step`, and within an answer's step its
/// `sub`-th event (from 1). A tool result is its step alone (`sub` 0); `RUN_STARTED` is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub step: i64,
    pub sub: i64,
}

impl Position {
    /// Reads a `Last-Event-ID`: `STEP` or `STEP.SUB`, both whole numbers.
    pub fn parse(text: &str) -> Option<Position> {
        let (step, sub) = match text.trim().split_once('.') {
            Some((step, sub)) => (step, sub),
            None => (text.trim(), "0"),
        };
        let whole = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<i64>().ok())
                .flatten()
        };
        Some(Position {
            step: whole(step)?,
            sub: whole(sub)?,
        })
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.sub == 0 {
            write!(f, "{}", self.step)
        } else {
            write!(f, "{}.{}", self.step, self.sub)
        }
    }
}

/// One event of the stream: its place (none for the run's last event, which is no
/// journal step) and its JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct AgUiEvent {
    pub id: Option<Position>,
    pub body: Value,
}

/// `RUN_STARTED`, at place 0.
pub fn run_started(thread_id: &str, run_id: &str) -> AgUiEvent {
    AgUiEvent {
        id: Some(Position::default()),
        body: json!({"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}),
    }
}

/// The events of one journal step, in order. `thread` names the messages (a message id
/// is `THREAD-STEP`, unique in the operation).
pub fn of_step(thread: &str, entry: &Entry) -> Vec<AgUiEvent> {
    let step = entry.step;
    let mut events = Vec::new();
    let mut push = |body: Value| {
        let sub = i64::try_from(events.len()).unwrap_or(i64::MAX) + 1;
        events.push(AgUiEvent {
            id: Some(Position { step, sub }),
            body,
        });
    };
    if entry.kind == "tool" {
        return vec![AgUiEvent {
            id: Some(Position { step, sub: 0 }),
            body: json!({
                "type": "TOOL_CALL_RESULT",
                "messageId": format!("{thread}-{step}"),
                "toolCallId": entry.call_id.clone().unwrap_or_default(),
                "content": entry.body,
                "role": "tool",
            }),
        }];
    }
    let Ok(answer) = serde_json::from_str::<AssistantMessage>(&entry.body) else {
        return events;
    };
    let message_id = format!("{thread}-{step}");
    let text = answer.content.as_deref().filter(|t| !t.trim().is_empty());
    if let Some(text) = text {
        push(json!({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"}));
        push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": text}));
        push(json!({"type": "TEXT_MESSAGE_END", "messageId": message_id}));
    }
    for call in answer.tool_calls.unwrap_or_default() {
        // The answer's message is named only when it was sent (it has text).
        let mut start = json!({
            "type": "TOOL_CALL_START",
            "toolCallId": call.id,
            "toolCallName": call.function.name,
        });
        if text.is_some() {
            start["parentMessageId"] = Value::String(message_id.clone());
        }
        push(start);
        if !call.function.arguments.is_empty() {
            push(
                json!({"type": "TOOL_CALL_ARGS", "toolCallId": call.id, "delta": call.function.arguments}),
            );
        }
        push(json!({"type": "TOOL_CALL_END", "toolCallId": call.id}));
    }
    events
}

/// The call of the operation's effect (`charge`, `refund`) the journal's last answer
/// asked for: the call a paused operation waits on.
pub fn waiting_call(entries: &[Entry]) -> Option<String> {
    let answer = entries.iter().rev().find(|e| e.kind == "answer")?;
    let answer: AssistantMessage = serde_json::from_str(&answer.body).ok()?;
    answer
        .tool_calls?
        .into_iter()
        .find(|c| tools::effect_of(&c.function.name).is_some())
        .map(|c| c.id)
}

/// The run's last event, from the operation's answer (`status`, `body`) as the JSON form
/// would give it: 200 `RUN_FINISHED` with the answer as its `result`; a pause
/// `RUN_FINISHED` with the interrupt outcome (the approval, `toolCallId` the waiting
/// charge); anything else `RUN_ERROR` with the problem's detail and code.
pub fn last(
    thread_id: &str,
    run_id: &str,
    status: u16,
    body: &[u8],
    call: Option<String>,
) -> AgUiEvent {
    let answer: Value = serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
    let body = if status == 200 {
        json!({
            "type": "RUN_FINISHED",
            "threadId": thread_id,
            "runId": run_id,
            "result": answer,
            "outcome": {"type": "success"},
        })
    } else if status == 202 && answer["status"] == "requires_approval" {
        let approval = &answer["approval"];
        let mut interrupt = json!({
            "id": approval["id"],
            "reason": "approval_required",
            "message": answer["message"],
            "expiresAt": approval["expiresAt"],
            "metadata": {"orderId": approval["orderId"], "amount": approval["amount"], "currency": approval["currency"]},
        });
        if let Some(call) = call {
            interrupt["toolCallId"] = Value::String(call);
        }
        json!({
            "type": "RUN_FINISHED",
            "threadId": thread_id,
            "runId": run_id,
            "outcome": {"type": "interrupt", "interrupts": [interrupt]},
        })
    } else {
        let message = answer["detail"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("the operation ended with status {status}"));
        let mut event = json!({"type": "RUN_ERROR", "message": message});
        if let Some(code) = answer["code"].as_str() {
            event["code"] = Value::String(code.to_owned());
        }
        event
    };
    AgUiEvent { id: None, body }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_event_ids_read_as_places() {
        assert_eq!(Position::parse("3"), Some(Position { step: 3, sub: 0 }));
        assert_eq!(Position::parse("2.4"), Some(Position { step: 2, sub: 4 }));
        assert_eq!(Position::parse("2.x"), None);
        assert_eq!(Position::parse("-1"), None);
        assert_eq!(Position { step: 2, sub: 4 }.to_string(), "2.4");
        assert!(Position { step: 2, sub: 9 } < Position { step: 3, sub: 0 });
    }
}
