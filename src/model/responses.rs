//! The Responses API (`POST {base}/responses`) as a second wire, chosen per endpoint
//! (`OPENAI_WIRE_API=responses`): the same conversation, written as that API's items and
//! read back into the same answer the chat wire gives, so the loop, the journal and the
//! fallbacks know nothing of the wire (a chat endpoint and a Responses one continue each
//! other's journal).
//!
//! Function tools are sent with `strict: false`, as chat completions treats them.
//!
//! Stateless: `store: false`, the whole conversation as `input` every turn, never
//! `previous_response_id`, so a resume on another instance days later, or a turn on
//! another endpoint, continues from the journal as on chat. The reasoning items a model
//! returns (`include: ["reasoning.encrypted_content"]`) are kept with its answer, so
//! journaled with it, and sent back, as the provider gave them, before the answer in the
//! next turns' input; never to a chat endpoint.
//!
//! What is read of an answer: the `output` items (`reasoning`, `message`'s `output_text`,
//! `function_call`), `status`, `usage`. `status: "incomplete"` (`max_output_tokens`,
//! `content_filter`) is used as chat's `finish_reason: "length"` is: what came is the
//! answer, and an answer with nothing in it cannot be used. `status: "failed"` is the
//! provider's failure: its `error.code` `invalid_prompt` is a refusal (as a 400), any
//! other a transient failure (as a broken connection).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::error::{ModelError, ModelErrorKind};
use super::reasoning::ReasoningEffort;
use super::wire::{
    AssistantMessage, ChatRequest, ChatResponse, Choice, FunctionCall, Message, ReasoningItem,
    TokenUsage, ToolCall, arguments_text,
};

/// Which API an endpoint speaks (`OPENAI_WIRE_API`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WireApi {
    /// `POST {base}/chat/completions`.
    #[default]
    Chat,
    /// `POST {base}/responses`, stateless.
    Responses,
}

impl WireApi {
    /// `chat` or `responses`.
    pub fn parse(text: &str) -> Result<WireApi, String> {
        match text {
            "chat" => Ok(WireApi::Chat),
            "responses" => Ok(WireApi::Responses),
            _ => Err(format!("{text:?} is neither chat nor responses")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WireApi::Chat => "chat",
            WireApi::Responses => "responses",
        }
    }

    /// What is appended to the endpoint's base URL.
    pub fn path(self) -> &'static str {
        match self {
            WireApi::Chat => "/chat/completions",
            WireApi::Responses => "/responses",
        }
    }
}

/// What the reasoning items' encrypted content is asked for with: the items can then be
/// sent back with `store: false`.
pub const INCLUDE: [&str; 1] = ["reasoning.encrypted_content"];

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    input: Vec<Item<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<FunctionTool<'a>>,
    parallel_tool_calls: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Reasoning>,
    store: bool,
    include: [&'static str; 1],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Serialize)]
struct Reasoning {
    effort: ReasoningEffort,
}

#[derive(Serialize)]
struct FunctionTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a RawValue,
    /// `false`, as chat completions takes a tool without it: strict mode refuses a schema
    /// with optional properties, and the tools check their arguments themselves. OpenAI's
    /// document requires the field (`tests/openai/check_requests.py`).
    strict: bool,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Item<'a> {
    Message {
        role: &'static str,
        content: &'a str,
    },
    Call {
        #[serde(rename = "type")]
        kind: &'static str,
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    Output {
        #[serde(rename = "type")]
        kind: &'static str,
        call_id: &'a str,
        output: &'a str,
    },
    /// A reasoning item, as the provider gave it.
    Given(&'a RawValue),
}

/// The request's JSON on the Responses wire, written into `out`.
pub fn write_request(chat: &ChatRequest, out: &mut Vec<u8>) {
    let mut input = Vec::with_capacity(chat.messages.len() + 2);
    for message in &chat.messages {
        match message {
            Message::System { content } => input.push(Item::Message {
                role: "system",
                content,
            }),
            Message::User { content } => input.push(Item::Message {
                role: "user",
                content,
            }),
            Message::Assistant {
                content,
                tool_calls,
                reasoning,
            } => {
                input.extend(reasoning.iter().map(|item| Item::Given(item.json())));
                if let Some(content) = content.as_deref().filter(|c| !c.is_empty()) {
                    input.push(Item::Message {
                        role: "assistant",
                        content,
                    });
                }
                input.extend(tool_calls.iter().map(|call| Item::Call {
                    kind: "function_call",
                    call_id: &call.id,
                    name: &call.function.name,
                    arguments: &call.function.arguments,
                }));
            }
            Message::Tool {
                tool_call_id,
                content,
            } => input.push(Item::Output {
                kind: "function_call_output",
                call_id: tool_call_id,
                output: content,
            }),
        }
    }
    let request = Request {
        model: &chat.model,
        input,
        tools: chat
            .tools
            .iter()
            .map(|tool| FunctionTool {
                kind: "function",
                name: &tool.function.name,
                description: &tool.function.description,
                parameters: &tool.function.parameters,
                strict: false,
            })
            .collect(),
        parallel_tool_calls: true,
        max_output_tokens: chat.max_tokens,
        reasoning: chat.reasoning_effort.map(|effort| Reasoning { effort }),
        store: false,
        include: INCLUDE,
        stream: chat.stream,
    };
    serde_json::to_writer(out, &request).expect("a Responses request serializes");
}

/// A Responses answer (`object: "response"`): the fields read of it, borrowed from its
/// text. What is read only on a failure, or passed on whole, stays JSON text: nothing of
/// the answer is parsed that is not used.
#[derive(Default, Deserialize)]
pub(super) struct Answer<'a> {
    #[serde(borrow)]
    output: Option<Vec<&'a RawValue>>,
    #[serde(borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    #[serde(borrow)]
    incomplete_details: Option<&'a RawValue>,
    usage: Option<Usage>,
}

impl<'a> Answer<'a> {
    /// Its `output` items, if it lists any.
    pub(super) fn listed(&self) -> Option<&[&'a RawValue]> {
        self.output.as_deref().filter(|output| !output.is_empty())
    }

    /// Its `error`, if it has one.
    pub(super) fn error(&self) -> Option<&'a RawValue> {
        self.error
    }
}

#[derive(Deserialize)]
struct Usage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

/// An output item: its `type`, and what is read of a `message` or a `function_call`. A
/// `reasoning` item is kept as its text ([`ReasoningItem`]), a message's `content` read
/// only for a message.
#[derive(Deserialize)]
struct OutputItem<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    call_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// A part of a message's `content`: an `output_text` part's text is the answer's.
#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
}

/// The `code` and `message` of a failure: each read only if it is a string.
#[derive(Default, Deserialize)]
struct Failure<'a> {
    #[serde(borrow)]
    code: Option<&'a RawValue>,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
}

/// The answer unusable: `what` is wrong with it.
fn unusable(what: impl std::fmt::Display) -> ModelError {
    ModelError::unusable(format!("its body is not a Responses answer: {what}"))
}

/// A Responses answer (`object: "response"`) read as the chat wire's answer.
pub fn read_answer(text: &str) -> Result<ChatResponse, ModelError> {
    let answer: Answer = serde_json::from_str(text).map_err(|err| {
        let start: String = text.chars().take(80).collect();
        ModelError::unusable(format!(
            "its body is not a Responses answer ({err}); it starts: {start:?}"
        ))
    })?;
    let Some(output) = &answer.output else {
        return Err(unusable("it has no output"));
    };
    let mut assembly = Assembly::default();
    for item in output {
        assembly.item(item)?;
    }
    assembly.finish(&answer)
}

/// An answer's output items, put together. Its lists grow one item at a time (an answer
/// has one or two): grown from empty, a `Vec` takes room for four, and the loop keeps
/// these while its tools run and its next turn waits.
#[derive(Default)]
pub(super) struct Assembly {
    content: Option<String>,
    calls: Vec<ToolCall>,
    reasoning: Vec<ReasoningItem>,
}

impl Assembly {
    /// One output item: reasoning kept whole, text joined, a function call taken.
    pub(super) fn item(&mut self, item: &RawValue) -> Result<(), ModelError> {
        let read = OutputItem::deserialize(item)
            .map_err(|err| unusable(format!("an output item does not read ({err})")))?;
        match read.kind.as_deref() {
            Some("reasoning") => {
                self.reasoning.reserve_exact(1);
                self.reasoning.push(ReasoningItem::new(item));
            }
            Some("message") => {
                let Some(content) = read.content else {
                    return Ok(());
                };
                let parts = Vec::<Part>::deserialize(content).map_err(|err| {
                    unusable(format!(
                        "a message's content is not a list of parts ({err})"
                    ))
                })?;
                for part in parts {
                    if part.kind.as_deref() == Some("output_text")
                        && let Some(text) = part.text
                    {
                        self.content.get_or_insert_with(String::new).push_str(&text);
                    }
                }
            }
            Some("function_call") => {
                let arguments = arguments_text(read.arguments)
                    .map_err(|err| unusable(format!("a call's arguments do not read ({err})")))?;
                self.calls.reserve_exact(1);
                self.calls.push(ToolCall {
                    id: read.call_id.unwrap_or_default().into_owned(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: read.name.unwrap_or_default().into_owned(),
                        arguments,
                    },
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// The answer, by its `status`, `error` and `usage`.
    pub(super) fn finish(self, answer: &Answer) -> Result<ChatResponse, ModelError> {
        let status = answer.status.as_deref();
        match status {
            Some("failed") => return Err(failed(answer.error)),
            Some("completed" | "incomplete") | None => {}
            Some(other) => {
                return Err(ModelError::unusable(format!(
                    "its status is {other:?}, not an answer (store: false asks for one now)"
                )));
            }
        }
        let said = self.content.as_deref().is_some_and(|c| !c.is_empty());
        if status == Some("incomplete") && !said && self.calls.is_empty() {
            #[derive(Deserialize)]
            struct Details {
                reason: Option<String>,
            }
            let reason = answer
                .incomplete_details
                .and_then(|details| Details::deserialize(details).ok())
                .and_then(|details| details.reason);
            return Err(ModelError::unusable(format!(
                "it is incomplete ({}) with nothing in it",
                reason.as_deref().unwrap_or("no reason given")
            )));
        }
        let usage = answer.usage.as_ref().map(|usage| TokenUsage {
            prompt_tokens: usage.input_tokens.unwrap_or(0),
            completion_tokens: usage.output_tokens.unwrap_or(0),
        });
        Ok(ChatResponse {
            choices: vec![Choice {
                message: AssistantMessage {
                    content: self.content,
                    tool_calls: (!self.calls.is_empty()).then_some(self.calls),
                    reasoning: self.reasoning,
                },
                finish_reason: status.map(str::to_owned),
            }],
            usage,
        })
    }
}

/// `status: "failed"`'s `error`, or a stream's `response.failed` or `error` event: a
/// refusal when the prompt is the cause, else a transient failure.
pub(super) fn failed(error: Option<&RawValue>) -> ModelError {
    let failure = error
        .and_then(|error| Failure::deserialize(error).ok())
        .unwrap_or_default();
    let string = |field: Option<&RawValue>| serde_json::from_str::<String>(field?.get()).ok();
    let code = string(failure.code);
    let message = string(failure.message).unwrap_or_else(|| "no message".into());
    if code.as_deref() == Some("invalid_prompt") {
        return ModelError::new(ModelErrorKind::Status {
            status: 400,
            code,
            message,
            retry_after: None,
        });
    }
    ModelError::transport(format!(
        "the response failed{}: {message}",
        code.map(|c| format!(" ({c})")).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::model::wire::{FunctionSpec, ToolSpec, Tools};

    /// A reasoning item as a provider may write it: spaces, an escape, its own key order.
    const GIVEN: &str =
        r#"{"type": "reasoning", "summary": [], "id": "rs_1", "encrypted_content": "e\u00e91"}"#;

    fn conversation() -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages: vec![
                Message::System {
                    content: "Be brief.".into(),
                },
                Message::User {
                    content: "Charge A-1.".into(),
                },
                Message::Assistant {
                    content: None,
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        kind: "function".into(),
                        function: FunctionCall {
                            name: "charge".into(),
                            arguments: r#"{"orderId":"A-1"}"#.into(),
                        },
                    }],
                    reasoning: vec![ReasoningItem::new(
                        &RawValue::from_string(GIVEN.into()).unwrap(),
                    )],
                },
                Message::Tool {
                    tool_call_id: "call_1".into(),
                    content: "charged".into(),
                },
            ],
            tools: Tools::Received(vec![ToolSpec {
                kind: "function".into(),
                function: FunctionSpec {
                    name: "charge".into(),
                    description: "Charges.".into(),
                    parameters: RawValue::from_string(r#"{"type":"object"}"#.into()).unwrap(),
                },
            }]),
            max_tokens: Some(512),
            reasoning_effort: Some(ReasoningEffort::Low),
            stream: false,
            stream_options: None,
        }
    }

    #[test]
    fn a_conversation_is_written_as_the_responses_items_whole_and_stateless() {
        let mut body = Vec::new();
        write_request(&conversation(), &mut body);
        let sent: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "m",
                "input": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Charge A-1."},
                    {"type": "reasoning", "id": "rs_1", "encrypted_content": "e\u{e9}1", "summary": []},
                    {"type": "function_call", "call_id": "call_1", "name": "charge", "arguments": "{\"orderId\":\"A-1\"}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "charged"},
                ],
                "tools": [{"type": "function", "name": "charge", "description": "Charges.", "parameters": {"type": "object"}, "strict": false}],
                "parallel_tool_calls": true,
                "max_output_tokens": 512,
                "reasoning": {"effort": "low"},
                "store": false,
                "include": ["reasoning.encrypted_content"],
            })
        );
        // Seen failing: with the item kept as a `serde_json::Value`, the body had
        // `{"type":"reasoning","summary":[],"id":"rs_1","encrypted_content":"eé1"}`.
        let body = String::from_utf8(body).unwrap();
        assert_eq!(body.matches(GIVEN).count(), 1, "{body}");
    }

    #[test]
    fn an_answer_s_items_become_the_chat_wire_s_answer() {
        let answer = read_answer(&format!(
            r#"{{
                "object": "response", "status": "completed", "created_at": 1.5,
                "output": [
                    {GIVEN},
                    {{"type": "message", "role": "assistant", "content": [{{"type": "output_text", "text": "Paid."}}]}},
                    {{"type": "function_call", "id": "fc_1", "call_id": "call_2", "name": "send_confirmation", "arguments": "{{}}"}}
                ],
                "usage": {{"input_tokens": 120, "output_tokens": 30, "output_tokens_details": {{"reasoning_tokens": 12}}}}
            }}"#
        ))
        .unwrap();
        let message = &answer.choices[0].message;
        assert_eq!(message.content.as_deref(), Some("Paid."));
        let calls = message.tool_calls.as_ref().unwrap();
        assert_eq!(
            (
                calls.len(),
                calls[0].id.as_str(),
                calls[0].function.name.as_str()
            ),
            (1, "call_2", "send_confirmation")
        );
        // Seen failing: kept as a `serde_json::Value`, the item's text was
        // `{"type":"reasoning","summary":[],"id":"rs_1","encrypted_content":"eé1"}`.
        let reasoning: Vec<&str> = message.reasoning.iter().map(|r| r.json().get()).collect();
        assert_eq!(reasoning, [GIVEN]);
        assert_eq!(
            answer.usage,
            Some(TokenUsage {
                prompt_tokens: 120,
                completion_tokens: 30
            })
        );
    }

    // Seen failing: "left: (4, 4) right: (1, 1)" with the items pushed onto empty lists.
    #[test]
    fn an_answer_s_one_call_and_one_reasoning_item_are_kept_without_room_for_more() {
        let answer = read_answer(&format!(
            r#"{{"status": "completed", "output": [{GIVEN}, {{"type": "function_call", "call_id": "c", "name": "charge", "arguments": "{{}}"}}]}}"#
        ))
        .unwrap();
        let message = &answer.choices[0].message;
        let calls = message.tool_calls.as_ref().unwrap();
        assert_eq!((calls.capacity(), message.reasoning.capacity()), (1, 1));
    }

    #[test]
    fn a_failed_or_empty_incomplete_answer_is_a_failure() {
        let failed = read_answer(
            r#"{"status":"failed","output":[],"error":{"code":"server_error","message":"boom"}}"#,
        )
        .unwrap_err();
        assert!(failed.kind.is_retryable(), "{failed}");
        let prompt = read_answer(
            r#"{"status":"failed","output":[],"error":{"code":"invalid_prompt","message":"no"}}"#,
        )
        .unwrap_err();
        assert!(prompt.kind.is_refusal(), "{prompt}");
        let empty = read_answer(r#"{"status":"incomplete","output":[],"incomplete_details":{"reason":"content_filter"}}"#).unwrap_err();
        assert!(
            empty.to_string().contains("incomplete (content_filter)"),
            "{empty}"
        );
        let cut = read_answer(r#"{"status":"incomplete","output":[{"type":"message","content":[{"type":"output_text","text":"Paid"}]}],"incomplete_details":{"reason":"max_output_tokens"}}"#).unwrap();
        assert_eq!(cut.choices[0].message.content.as_deref(), Some("Paid"));
        assert!(read_answer(r#"{"choices":[]}"#).is_err());
    }
}
