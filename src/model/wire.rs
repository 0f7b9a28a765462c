//! The OpenAI chat-completions wire format: the part of it a tool-calling loop uses.
//! Unknown fields in answers are ignored, so any compatible server (vLLM, Ollama,
//! llama.cpp) can answer.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::reasoning::ReasoningEffort;

/// The most tool calls taken from one answer (a checkout needs two at most): an answer
/// with more cannot be used, and the next endpoint is asked.
pub const MAX_TOOL_CALLS: usize = 16;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    /// A static list when sending: every conversation offers the same tools.
    #[serde(default, skip_serializing_if = "no_tools")]
    pub tools: Tools,
    /// A bound on the answer's length: a small model asked for a tool call can ramble
    /// for thousands of tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The endpoint's `OPENAI_REASONING_EFFORT`; left out when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Asks for the answer as Server-Sent Events of [`ChatChunk`]s: only when someone
    /// watches the operation (docs/streaming.md); left out otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// With `stream`: `{"include_usage": true}`, the tokens in a last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// One Server-Sent Event of a streamed answer (`object: "chat.completion.chunk"`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChatChunk {
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    /// In the last chunk (its `choices` empty) when `include_usage` was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenUsage>,
    /// A provider's failure after the stream began (OpenAI, vLLM send it as a chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChunkChoice {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub delta: ChunkDelta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChunkDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A piece of one tool call: the call is the one at `index`; its `id`, `type` and name
/// come in its first piece, its arguments' JSON text in pieces to be joined.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionDelta>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FunctionDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

fn no_tools(tools: &[ToolSpec]) -> bool {
    tools.is_empty()
}

/// The tools a request offers: a list of the service's, whose JSON text is written once
/// (every request sends it, and it never changes), or a list read from a request.
#[derive(Clone, Debug)]
pub enum Tools {
    Offered(&'static ToolList),
    Received(Vec<ToolSpec>),
}

/// A static list of tools and its JSON text.
#[derive(Debug)]
pub struct ToolList {
    specs: Vec<ToolSpec>,
    json: Box<RawValue>,
}

impl ToolList {
    pub fn new(specs: Vec<ToolSpec>) -> ToolList {
        let json = serde_json::value::to_raw_value(&specs).expect("tool specs serialize");
        ToolList { specs, json }
    }
}

impl Default for Tools {
    fn default() -> Self {
        Tools::Received(Vec::new())
    }
}

impl std::ops::Deref for Tools {
    type Target = [ToolSpec];

    fn deref(&self) -> &[ToolSpec] {
        match self {
            Tools::Offered(list) => &list.specs,
            Tools::Received(specs) => specs,
        }
    }
}

impl Serialize for Tools {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Tools::Offered(list) => list.json.serialize(serializer),
            Tools::Received(specs) => specs.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Tools {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::deserialize(deserializer).map(Tools::Received)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        #[serde(default)]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// The Responses API's reasoning items that came with this answer: sent back
        /// before it on that wire (`responses.rs`), never in a chat-completions request
        /// (nor read from one).
        #[serde(skip)]
        reasoning: Vec<ReasoningItem>,
    },
    Tool {
        tool_call_id: String,
        content: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text, as the model wrote it: it may not parse.
    #[serde(default)]
    pub arguments: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ToolSpec {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionSpec,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FunctionSpec {
    pub name: String,
    pub description: String,
    /// JSON text, written once: the specs are static, and sent with every request.
    pub parameters: Box<RawValue>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChatResponse {
    #[serde(default)]
    pub choices: Vec<Choice>,
    /// Tokens as the provider counted them; some servers leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenUsage>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Choice {
    pub message: AssistantMessage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AssistantMessage {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "received_calls"
    )]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The reasoning items a Responses endpoint returned with the answer, as it gave them
    /// (`responses.rs`): journaled with the answer, so a replayed or resumed loop sends
    /// them back too. Named apart from any field a chat server sends.
    #[serde(
        rename = "reasoning_items",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reasoning: Vec<ReasoningItem>,
}

/// A reasoning item of the Responses API, as the provider gave it: its JSON text, kept and
/// sent back byte for byte (a provider may refuse an item changed in any way), and not
/// read: nothing of it is used here.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReasoningItem(Box<RawValue>);

impl ReasoningItem {
    /// The item whose JSON text is `item`.
    pub fn new(item: &RawValue) -> ReasoningItem {
        ReasoningItem(item.to_owned())
    }

    /// Its JSON text, as given.
    pub fn json(&self) -> &RawValue {
        &self.0
    }
}

impl PartialEq for ReasoningItem {
    fn eq(&self, other: &ReasoningItem) -> bool {
        self.0.get() == other.0.get()
    }
}

/// A tool call as a server sends it. Some (Ollama's native API, some proxies) send the
/// arguments as a JSON object rather than a string of JSON; either is kept as its JSON
/// text, exactly as written, and sent back as a string, as OpenAI requires of a request.
#[derive(Deserialize)]
struct ReceivedCall {
    id: String,
    #[serde(rename = "type", default = "function_type")]
    kind: String,
    function: ReceivedFunction,
}

#[derive(Deserialize)]
struct ReceivedFunction {
    name: String,
    #[serde(default)]
    arguments: Option<Box<RawValue>>,
}

fn received_calls<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<ToolCall>>, D::Error> {
    let Some(calls) = Option::<Vec<ReceivedCall>>::deserialize(deserializer)? else {
        return Ok(None);
    };
    calls
        .into_iter()
        .map(|call| {
            let arguments = arguments_text(call.function.arguments.as_deref())
                .map_err(serde::de::Error::custom)?;
            Ok(ToolCall {
                id: call.id,
                kind: call.kind,
                function: FunctionCall {
                    name: call.function.name,
                    arguments,
                },
            })
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A call's arguments as their JSON text: a string of JSON read as its text, anything else
/// (an object) kept exactly as written, none (or `null`) as nothing. Both wires' answers
/// read them so.
pub(super) fn arguments_text(arguments: Option<&RawValue>) -> Result<String, serde_json::Error> {
    match arguments {
        None => Ok(String::new()),
        Some(raw) if raw.get().starts_with('"') => serde_json::from_str(raw.get()),
        Some(raw) => Ok(raw.get().to_owned()),
    }
}

/// An error body as OpenAI sends it: `{"error": {"message", "type", "code"}}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ErrorDetail {
    #[serde(default)]
    pub message: String,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

fn function_type() -> String {
    "function".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(call: &str) -> String {
        let answer: AssistantMessage =
            serde_json::from_str(&format!(r#"{{"content":"","tool_calls":[{call}]}}"#)).unwrap();
        answer.tool_calls.unwrap().remove(0).function.arguments
    }

    #[test]
    fn an_offered_tool_list_sends_what_its_specs_serialize_to() {
        let specs = vec![ToolSpec {
            kind: "function".into(),
            function: FunctionSpec {
                name: "charge".into(),
                description: "Charges \"the\" order.".into(),
                parameters: RawValue::from_string(r#"{"type":"object"}"#.into()).unwrap(),
            },
        }];
        let list: &'static ToolList = Box::leak(Box::new(ToolList::new(specs.clone())));
        let request = |tools| ChatRequest {
            model: "m".into(),
            messages: vec![Message::User {
                content: "hi".into(),
            }],
            tools,
            max_tokens: Some(5),
            reasoning_effort: None,
            stream: false,
            stream_options: None,
        };
        let offered = serde_json::to_string(&request(Tools::Offered(list))).unwrap();
        assert_eq!(
            offered,
            serde_json::to_string(&request(Tools::Received(specs))).unwrap()
        );
        assert!(offered.contains(r#""tools":[{"type":"function","function":{"name":"charge","#));
        let back: ChatRequest = serde_json::from_str(&offered).unwrap();
        assert_eq!(back.tools.len(), 1);
    }

    #[test]
    fn arguments_are_read_from_a_string_or_an_object_as_their_json_text() {
        assert_eq!(
            arguments(
                r#"{"id":"c","function":{"name":"charge","arguments":"{\"amount\": 42.50}"}}"#
            ),
            r#"{"amount": 42.50}"#
        );
        // An object keeps its text as written: the amount's digits never pass through a float.
        assert_eq!(
            arguments(r#"{"id":"c","function":{"name":"charge","arguments":{"amount": 42.50}}}"#),
            r#"{"amount": 42.50}"#
        );
        assert_eq!(
            arguments(r#"{"id":"c","function":{"name":"charge","arguments":null}}"#),
            ""
        );
        assert_eq!(arguments(r#"{"id":"c","function":{"name":"charge"}}"#), "");
    }

    #[test]
    fn object_arguments_are_sent_back_as_a_string() {
        let call =
            arguments(r#"{"id":"c","function":{"name":"charge","arguments":{"orderId":"A-1"}}}"#);
        let echoed = Message::Assistant {
            reasoning: Vec::new(),
            content: None,
            tool_calls: vec![ToolCall {
                id: "c".into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "charge".into(),
                    arguments: call,
                },
            }],
        };
        assert_eq!(
            serde_json::to_value(&echoed).unwrap()["tool_calls"][0]["function"]["arguments"],
            r#"{"orderId":"A-1"}"#
        );
    }
}
