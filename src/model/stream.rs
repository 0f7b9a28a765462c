//! A streamed answer (`stream: true`): the provider's Server-Sent Events of
//! `chat.completion.chunk`s, parsed by `eventsource-stream` as they come, its text
//! published to the watchers ([`LiveAttempt`]) and the pieces put together into the very
//! answer the non-streamed request gives: text joined, each tool call assembled by its
//! `index` (id, type and name from its first piece, the arguments' JSON text joined),
//! the tokens from the last chunk (`stream_options.include_usage`).
//!
//! A stream that ends before its end (no `finish_reason` and no `[DONE]`: the connection
//! dropped, the server died) fails as a broken connection does: a transient failure, so
//! the turn is repeated or goes to the next endpoint. A piece that is not a chunk cannot
//! be used, as a non-streamed body that is not a completion.

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;

use super::error::ModelError;
use super::live::LiveAttempt;
use super::transport::Chunks;
use super::wire::{
    AssistantMessage, ChatChunk, ChatResponse, Choice, FunctionCall, MAX_TOOL_CALLS, TokenUsage,
    ToolCall,
};

/// What a failure to read a streamed answer as Server-Sent Events is: the transport's
/// own error, or an unusable answer (not UTF-8, not SSE). Both wires' readers use it.
pub(super) fn sse_error(err: EventStreamError<ModelError>) -> ModelError {
    match err {
        EventStreamError::Transport(err) => err,
        EventStreamError::Utf8(err) => {
            ModelError::unusable(format!("its stream is not UTF-8 text ({err})"))
        }
        EventStreamError::Parser(err) => {
            ModelError::unusable(format!("its stream is not Server-Sent Events ({err})"))
        }
    }
}

/// Reads the stream to its end, publishing its text to `live` as it comes.
pub async fn read(chunks: Chunks, live: LiveAttempt) -> Result<ChatResponse, ModelError> {
    let mut events = chunks.eventsource();
    let mut answer = Assembly::default();
    while let Some(event) = events.next().await {
        let event = event.map_err(sse_error)?;
        let data = event.data.trim();
        if data == "[DONE]" {
            answer.done = true;
            break;
        }
        if data.is_empty() {
            continue;
        }
        let chunk: ChatChunk = serde_json::from_str(data).map_err(|err| {
            let start: String = data.chars().take(80).collect();
            ModelError::unusable(format!(
                "a piece of its stream is not a chat completion chunk ({err}); it starts: {start:?}"
            ))
        })?;
        answer.add(chunk, &live)?;
    }
    if !answer.done && answer.finish_reason.is_none() {
        return Err(ModelError::transport(
            "the answer's stream ended before its end (no finish_reason, no [DONE])",
        ));
    }
    live.finished();
    Ok(answer.into_response())
}

/// The answer so far.
#[derive(Default)]
struct Assembly {
    content: Option<String>,
    calls: Vec<ToolCall>,
    finish_reason: Option<String>,
    usage: Option<TokenUsage>,
    done: bool,
}

impl Assembly {
    fn add(&mut self, chunk: ChatChunk, live: &LiveAttempt) -> Result<(), ModelError> {
        if let Some(error) = chunk.error {
            // The provider failed after the stream began: what a dropped connection is.
            return Err(ModelError::transport(format!(
                "the provider's stream ended with an error: {error}"
            )));
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        // One answer is asked for (no `n`): the first choice is the answer.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(text) = choice.delta.content {
                live.text(&text);
                self.content.get_or_insert_with(String::new).push_str(&text);
            }
            for piece in choice.delta.tool_calls.unwrap_or_default() {
                if piece.index > MAX_TOOL_CALLS {
                    return Err(ModelError::unusable(format!(
                        "its stream has a tool call at index {}; at most {} are taken from one answer",
                        piece.index, MAX_TOOL_CALLS
                    )));
                }
                while self.calls.len() <= piece.index {
                    // One at a time (an answer has one or two): grown from empty, a
                    // `Vec` takes room for four, kept while the calls run.
                    self.calls.reserve_exact(1);
                    self.calls.push(ToolCall {
                        id: String::new(),
                        kind: "function".into(),
                        function: FunctionCall {
                            name: String::new(),
                            arguments: String::new(),
                        },
                    });
                }
                let call = &mut self.calls[piece.index];
                if let Some(id) = piece.id.filter(|id| !id.is_empty()) {
                    call.id = id;
                }
                if let Some(kind) = piece.kind.filter(|k| !k.is_empty()) {
                    call.kind = kind;
                }
                if let Some(function) = piece.function {
                    if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                        call.function.name = name;
                    }
                    if let Some(arguments) = function.arguments {
                        call.function.arguments.push_str(&arguments);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                self.finish_reason = choice.finish_reason;
            }
        }
        Ok(())
    }

    fn into_response(self) -> ChatResponse {
        ChatResponse {
            choices: vec![Choice {
                message: AssistantMessage {
                    content: self.content,
                    tool_calls: (!self.calls.is_empty()).then_some(self.calls),
                    reasoning: Vec::new(),
                },
                finish_reason: self.finish_reason,
            }],
            usage: self.usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::model::live::LiveOps;

    fn chunks(pieces: &[&'static str]) -> Chunks {
        let pieces: Vec<Result<Bytes, ModelError>> = pieces
            .iter()
            .map(|p| Ok(Bytes::from_static(p.as_bytes())))
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
    async fn pieces_split_anywhere_make_the_answer_a_whole_body_gives() {
        // Events cut mid-line and mid-UTF-8, two calls whose pieces interleave.
        let response = read(
            chunks(&[
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Pa\"}}]}\n\nda",
                "ta: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"id \\u00e9\"}}]}\n\n",
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"charge\",\"arguments\":\"{\\\"a\"}}]}}]}\r\n\r\n",
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":\"send_confirmation\",\"arguments\":\"{}\"}}]}}]}\n\n",
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\":1}\"}}]}}]}\n\n: a comment\n\n",
                "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
            ]),
            attempt(),
        )
        .await
        .unwrap();
        let whole: ChatResponse = serde_json::from_str(
            r#"{"choices":[{"message":{"content":"Paid é","tool_calls":[
                {"id":"c1","type":"function","function":{"name":"charge","arguments":"{\"a\":1}"}},
                {"id":"c2","type":"function","function":{"name":"send_confirmation","arguments":"{}"}}]},
                "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            serde_json::to_value(&whole).unwrap()
        );
    }

    // Seen failing: "left: 4 right: 1" with the call pushed onto an empty list.
    #[tokio::test]
    async fn an_answer_s_one_call_is_kept_without_room_for_more() {
        let response = read(
            chunks(&[
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"charge\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
                "data: [DONE]\n\n",
            ]),
            attempt(),
        )
        .await
        .unwrap();
        let calls = response.choices[0].message.tool_calls.as_ref().unwrap();
        assert_eq!(calls.capacity(), 1);
    }

    #[tokio::test]
    async fn a_stream_that_stops_before_its_end_is_a_broken_connection() {
        let err = read(
            chunks(&["data: {\"choices\":[{\"delta\":{\"content\":\"Your pay\"}}]}\n\n"]),
            attempt(),
        )
        .await
        .unwrap_err();
        assert!(err.kind.is_retryable(), "{err}");
        assert!(err.to_string().contains("before its end"), "{err}");
        let err = read(chunks(&["data: {\"choices\": [\n\n"]), attempt())
            .await
            .unwrap_err();
        assert!(!err.kind.is_retryable(), "{err}");
    }
}
