//! A streamed Responses answer (`stream: true` on the Responses wire): its Server-Sent
//! Events read as they come, the text of `response.output_text.delta` published to the
//! watchers as the chat stream's text is (`stream.rs`), and the answer put together as
//! the non-streamed request gives it: from the last event's `response` when it lists its
//! output, else from each `response.output_item.done`'s item (llama-server's stream
//! ends a function call's arguments there, with no `response.function_call_arguments.done`,
//! and numbers no event). The arguments' deltas are not published: as on the chat wire,
//! the tool calls' events come from the loop.
//!
//! `response.failed` and an `error` event are the provider's failure
//! ([`failed`](super::responses::failed)); a stream that ends before
//! `response.completed` or `response.incomplete` fails as a broken connection does.

use std::borrow::Cow;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::error::ModelError;
use super::live::LiveAttempt;
use super::responses::{Answer, Assembly, failed};
use super::transport::Chunks;
use super::wire::ChatResponse;

/// One event: its `type`, and the fields the events read here have, borrowed from the
/// event's text. A field is read further only in the event that uses it: every event of a
/// stream is parsed as it comes, and most carry a whole item or response not read.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<&'a RawValue>,
    #[serde(borrow)]
    item: Option<&'a RawValue>,
    #[serde(borrow)]
    response: Option<&'a RawValue>,
}

/// The events read here, by type; the others (`response.created`, an item added, the
/// arguments' deltas, ...) are passed over.
const READ: [&str; 6] = [
    "response.output_text.delta",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
];

/// A string, borrowed from the event's text unless it has escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

pub async fn read(chunks: Chunks, live: LiveAttempt) -> Result<ChatResponse, ModelError> {
    let mut events = chunks.eventsource();
    let mut items = Assembly::default();
    while let Some(event) = events.next().await {
        let event = event.map_err(super::stream::sse_error)?;
        // A stream that names its events (`event:`, as OpenAI's does) names each for its
        // type: one not read here is passed over unparsed (`response.created` alone
        // carries the whole response). An unnamed one says its type only in its data.
        if event.event != "message" && !READ.contains(&event.event.as_str()) {
            continue;
        }
        let data = event.data.trim();
        if data.is_empty() || data == "[DONE]" {
            continue;
        }
        let unusable = |err: serde_json::Error| {
            let start: String = data.chars().take(80).collect();
            ModelError::unusable(format!(
                "a piece of its stream is not a Responses event ({err}); it starts: {start:?}"
            ))
        };
        let read: Event = serde_json::from_str(data).map_err(unusable)?;
        let response = || match read.response {
            Some(response) => Answer::deserialize(response).map_err(unusable),
            None => Ok(Answer::default()),
        };
        match read.kind.as_deref() {
            Some("response.output_text.delta") => {
                if let Some(Ok(Text(delta))) = read.delta.map(Text::deserialize) {
                    live.text(&delta);
                }
            }
            Some("response.output_item.done") => {
                if let Some(item) = read.item {
                    items.item(item)?;
                }
            }
            Some("response.completed" | "response.incomplete") => {
                let response = response()?;
                let answer = match response.listed() {
                    Some(output) => {
                        let mut whole = Assembly::default();
                        for item in output {
                            whole.item(item)?;
                        }
                        whole.finish(&response)
                    }
                    None => std::mem::take(&mut items).finish(&response),
                }?;
                live.finished();
                return Ok(answer);
            }
            Some("response.failed") => {
                return Err(failed(response().ok().and_then(|r| r.error())));
            }
            Some("error") => return Err(failed(serde_json::from_str(data).ok())),
            _ => {}
        }
    }
    Err(ModelError::transport(
        "the answer's stream ended before its end (no response.completed)",
    ))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::Value;

    use super::*;
    use crate::model::live::LiveOps;

    fn chunks(events: &[Value]) -> Chunks {
        let text: String = events
            .iter()
            .map(|event| {
                format!(
                    "event: {}\ndata: {event}\n\n",
                    event["type"].as_str().unwrap()
                )
            })
            .collect();
        pieces(text)
    }

    /// `text` in pieces of 7 bytes, as a transport may hand it over.
    fn pieces(text: String) -> Chunks {
        let pieces: Vec<Result<Bytes, ModelError>> = text
            .into_bytes()
            .chunks(7)
            .map(|piece| Ok(Bytes::copy_from_slice(piece)))
            .collect();
        Box::pin(futures_util::stream::iter(pieces))
    }

    fn attempt() -> LiveAttempt {
        let ops = LiveOps::default();
        let watched = ops.open("o", "k");
        let live = ops.publisher("o", "k", 1).unwrap();
        std::mem::forget(watched);
        live.attempt()
    }

    #[tokio::test]
    async fn text_deltas_are_published_and_the_items_done_make_the_answer() {
        // As llama-server streams: no sequence numbers, the arguments ended by the item's
        // done, a completed response that lists no output.
        let answer = read(
            chunks(&[
                serde_json::json!({"type": "response.created", "response": {"status": "in_progress", "output": []}}),
                serde_json::json!({"type": "response.output_text.delta", "delta": "Pa"}),
                serde_json::json!({"type": "response.output_text.delta", "delta": "id."}),
                serde_json::json!({"type": "response.output_item.done", "item": {"type": "message", "content": [{"type": "output_text", "text": "Paid."}]}}),
                serde_json::json!({"type": "response.function_call_arguments.delta", "delta": "{}"}),
                serde_json::json!({"type": "response.output_item.done", "item": {"type": "function_call", "call_id": "c1", "name": "charge", "arguments": "{}"}}),
                serde_json::json!({"type": "response.completed", "response": {"status": "completed", "output": [], "usage": {"input_tokens": 5, "output_tokens": 2}}}),
            ]),
            attempt(),
        )
        .await
        .unwrap();
        let message = &answer.choices[0].message;
        assert_eq!(message.content.as_deref(), Some("Paid."));
        assert_eq!(message.tool_calls.as_ref().unwrap()[0].id, "c1");
        assert_eq!(answer.usage.unwrap().prompt_tokens, 5);
    }

    // Seen failing: with every event parsed, "a piece of its stream is not a Responses
    // event (key must be a string at line 1 column 2); it starts: \"{not json\"".
    #[tokio::test]
    async fn an_event_named_for_a_type_not_read_is_passed_over_and_an_unnamed_one_read() {
        let answer = read(
            pieces(
                [
                    "event: response.created\ndata: {not json\n\n",
                    "data: {\"type\": \"response.output_text.delta\", \"delta\": \"Pa\"}\n\n",
                    "event: response.output_item.done\ndata: {\"type\": \"response.output_item.done\", \"item\": {\"type\": \"message\", \"content\": [{\"type\": \"output_text\", \"text\": \"Paid.\"}]}}\n\n",
                    "data: {\"type\": \"response.completed\", \"response\": {\"status\": \"completed\", \"output\": []}}\n\n",
                ]
                .concat(),
            ),
            attempt(),
        )
        .await
        .unwrap();
        assert_eq!(answer.choices[0].message.content.as_deref(), Some("Paid."));
    }

    #[tokio::test]
    async fn a_failed_or_unfinished_stream_is_a_failure() {
        let err = read(
            chunks(&[serde_json::json!({"type": "response.failed", "response": {"status": "failed", "error": {"code": "server_error", "message": "boom"}}})]),
            attempt(),
        )
        .await
        .unwrap_err();
        assert!(err.kind.is_retryable(), "{err}");
        let err = read(
            chunks(&[serde_json::json!({"type": "response.output_text.delta", "delta": "Pa"})]),
            attempt(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("ended before its end"), "{err}");
    }
}
