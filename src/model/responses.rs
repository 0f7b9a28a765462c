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

use serde::Serialize;
use serde_json::Value;

use super::error::{ModelError, ModelErrorKind};
use super::reasoning::ReasoningEffort;
use super::wire::{
    AssistantMessage, ChatRequest, ChatResponse, Choice, FunctionCall, Message, TokenUsage,
    ToolCall,
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
    parameters: &'a serde_json::value::RawValue,
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
    Given(&'a Value),
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
                input.extend(reasoning.iter().map(Item::Given));
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

/// A Responses answer (`object: "response"`) read as the chat wire's answer.
pub fn read_answer(text: &str) -> Result<ChatResponse, ModelError> {
    let mut answer: Value = serde_json::from_str(text).map_err(|err| {
        let start: String = text.chars().take(80).collect();
        ModelError::unusable(format!(
            "its body is not a Responses answer ({err}); it starts: {start:?}"
        ))
    })?;
    let Some(Value::Array(output)) = answer.get_mut("output").map(Value::take) else {
        return Err(ModelError::unusable(
            "its body is not a Responses answer: it has no output".into(),
        ));
    };
    let mut assembly = Assembly::default();
    for item in output {
        assembly.item(item);
    }
    assembly.finish(&answer)
}

/// An answer's output items, put together.
#[derive(Default)]
pub(super) struct Assembly {
    content: Option<String>,
    calls: Vec<ToolCall>,
    reasoning: Vec<Value>,
}

impl Assembly {
    /// One output item: reasoning kept whole, text joined, a function call taken.
    pub(super) fn item(&mut self, item: Value) {
        match item.get("type").and_then(Value::as_str) {
            Some("reasoning") => self.reasoning.push(item),
            Some("message") => {
                let parts = item.get("content").and_then(Value::as_array);
                for part in parts.into_iter().flatten() {
                    if part.get("type").and_then(Value::as_str) == Some("output_text")
                        && let Some(text) = part.get("text").and_then(Value::as_str)
                    {
                        self.content.get_or_insert_with(String::new).push_str(text);
                    }
                }
            }
            Some("function_call") => {
                let text = |field: &str| {
                    item.get(field)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                // A string of JSON, as OpenAI sends it; an object kept as its JSON text.
                let arguments = match item.get("arguments") {
                    Some(Value::String(arguments)) => arguments.clone(),
                    Some(Value::Null) | None => String::new(),
                    Some(other) => other.to_string(),
                };
                self.calls.push(ToolCall {
                    id: text("call_id"),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: text("name"),
                        arguments,
                    },
                });
            }
            _ => {}
        }
    }

    /// The answer, by its `status`, `error` and `usage`.
    pub(super) fn finish(self, answer: &Value) -> Result<ChatResponse, ModelError> {
        let status = answer.get("status").and_then(Value::as_str);
        match status {
            Some("failed") => return Err(failed(answer.get("error"))),
            Some("completed" | "incomplete") | None => {}
            Some(other) => {
                return Err(ModelError::unusable(format!(
                    "its status is {other:?}, not an answer (store: false asks for one now)"
                )));
            }
        }
        let said = self.content.as_deref().is_some_and(|c| !c.is_empty());
        if status == Some("incomplete") && !said && self.calls.is_empty() {
            let reason = answer
                .pointer("/incomplete_details/reason")
                .and_then(Value::as_str)
                .unwrap_or("no reason given");
            return Err(ModelError::unusable(format!(
                "it is incomplete ({reason}) with nothing in it"
            )));
        }
        let usage = answer.get("usage").map(|usage| {
            let tokens = |field: &str| usage.get(field).and_then(Value::as_u64).unwrap_or(0);
            TokenUsage {
                prompt_tokens: tokens("input_tokens"),
                completion_tokens: tokens("output_tokens"),
            }
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

/// `status: "failed"`, or a stream's `response.failed`: a refusal when the prompt is the
/// cause, else a transient failure.
pub(super) fn failed(error: Option<&Value>) -> ModelError {
    let field = |name: &str| {
        error
            .and_then(|e| e.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let code = field("code");
    let message = field("message").unwrap_or_else(|| "no message".into());
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
    use serde_json::json;

    use super::*;
    use crate::model::wire::{FunctionSpec, ToolSpec, Tools};

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
                    reasoning: vec![
                        json!({"type":"reasoning","id":"rs_1","encrypted_content":"e1","summary":[]}),
                    ],
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
                    parameters: serde_json::value::RawValue::from_string(
                        r#"{"type":"object"}"#.into(),
                    )
                    .unwrap(),
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
                    {"type":"reasoning","id":"rs_1","encrypted_content":"e1","summary":[]},
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
    }

    #[test]
    fn an_answer_s_items_become_the_chat_wire_s_answer() {
        let answer = read_answer(
            &json!({
                "object": "response", "status": "completed", "created_at": 1.5,
                "output": [
                    {"type": "reasoning", "id": "rs_2", "encrypted_content": "e2", "summary": []},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paid."}]},
                    {"type": "function_call", "id": "fc_1", "call_id": "call_2", "name": "send_confirmation", "arguments": "{}"},
                ],
                "usage": {"input_tokens": 120, "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 12}},
            })
            .to_string(),
        )
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
        assert_eq!(
            message.reasoning,
            [json!({"type": "reasoning", "id": "rs_2", "encrypted_content": "e2", "summary": []})]
        );
        assert_eq!(
            answer.usage,
            Some(TokenUsage {
                prompt_tokens: 120,
                completion_tokens: 30
            })
        );
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
