//! Answers to `stream: true`, as real servers send them (OpenAI, vLLM, llama-server):
//! Server-Sent Events of `chat.completion.chunk`s, the role first, the text word by word,
//! each tool call's id and name in its first piece and its arguments in three more, an
//! empty delta with the `finish_reason`, the tokens in a chunk of their own when
//! `stream_options.include_usage` asks, then `data: [DONE]`. The pieces come
//! [`PIECE_GAP`] apart, as a model writes them.
//!
//! And the faults only a stream has: `break-stream` sends the first half of the answer's
//! pieces, then drops the connection; `endless-stream` never ends its text.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use hyper::body::Frame;
use serde_json::{Value, json};

use crate::model::wire::ChatRequest;

/// Returned by the service (or a streamed body) to make hyper drop the connection.
#[derive(Debug)]
pub(super) struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted fault: connection closed")
    }
}

impl std::error::Error for CloseConnection {}

/// Between two pieces of a streamed answer.
pub(super) const PIECE_GAP: Duration = Duration::from_millis(8);

/// The events of `answer` (a `chat.completion`) as a stream sends them.
pub(super) fn pieces(chat: &ChatRequest, answer: &Value) -> Vec<String> {
    let head = |choices: Value| {
        json!({
            "id": answer["id"],
            "object": "chat.completion.chunk",
            "created": answer["created"],
            "model": answer["model"],
            "choices": choices,
        })
    };
    let delta = |delta: Value| head(json!([{"index": 0, "delta": delta, "finish_reason": null}]));
    let message = &answer["choices"][0]["message"];
    let mut chunks = vec![delta(json!({"role": "assistant", "content": ""}))];
    if let Some(text) = message["content"].as_str() {
        chunks.extend(
            text.split_inclusive(' ')
                .map(|word| delta(json!({"content": word}))),
        );
    }
    for (index, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        chunks.push(delta(json!({"tool_calls": [{
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }]})));
        let arguments = match &call["function"]["arguments"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        chunks.extend(thirds(&arguments).into_iter().map(|piece| {
            delta(json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        }));
    }
    chunks.push(head(json!([{
        "index": 0,
        "delta": {},
        "finish_reason": answer["choices"][0]["finish_reason"],
    }])));
    if chat.stream_options.is_some_and(|o| o.include_usage) {
        let mut usage = head(json!([]));
        usage["usage"] = answer["usage"].clone();
        chunks.push(usage);
    }
    let mut events: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    events.push("data: [DONE]\n\n".into());
    events
}

/// `text` in three pieces, cut on character boundaries.
fn thirds(text: &str) -> Vec<&str> {
    let cuts: Vec<usize> = (1..3)
        .map(|i| {
            let mut at = text.len() * i / 3;
            while !text.is_char_boundary(at) {
                at += 1;
            }
            at
        })
        .collect();
    vec![&text[..cuts[0]], &text[cuts[0]..cuts[1]], &text[cuts[1]..]]
}

/// The stream of `events`, [`PIECE_GAP`] apart; with `broken`, the first half of them
/// (the text half written), then the connection dropped.
pub(super) fn body(events: Vec<String>, broken: bool) -> BoxBody<Bytes, CloseConnection> {
    let keep = if broken {
        events.len() / 2
    } else {
        events.len()
    };
    let mut events = events.into_iter().take(keep);
    let frames = futures_util::stream::unfold(Some(()), move |going| {
        let next = going.map(|()| events.next());
        async move {
            tokio::time::sleep(PIECE_GAP).await;
            match next? {
                Some(event) => Some((Ok(Frame::data(Bytes::from(event))), Some(()))),
                // Broken: hyper drops the connection on the body's error.
                None if broken => Some((Err(CloseConnection), None)),
                None => None,
            }
        }
    });
    BoxBody::new(StreamBody::new(frames))
}

/// A stream whose text never ends (each piece a few words more): a client must cut it.
pub(super) fn endless(chat: &ChatRequest) -> BoxBody<Bytes, CloseConnection> {
    let piece = json!({
        "object": "chat.completion.chunk",
        "model": chat.model,
        "choices": [{"index": 0, "delta": {"content": "and on and on "}, "finish_reason": null}],
    });
    let event = Bytes::from(format!("data: {piece}\n\n"));
    let frames = futures_util::stream::repeat_with(move || Ok(Frame::data(event.clone())));
    BoxBody::new(StreamBody::new(frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_cut_in_three_on_character_boundaries() {
        assert_eq!(thirds("{\"a\":\"é\"}"), vec!["{\"a", "\":\"", "é\"}"]);
        // Byte 1 is inside the first "é": the cut moves to its end.
        assert_eq!(thirds("éé"), vec!["é", "", "é"]);
        assert_eq!(thirds(""), vec!["", "", ""]);
    }
}
