//! The scripted model's `POST /v1/responses`: the request's items read back into the
//! conversation the script answers (`script.rs`), and the script's answer written as a
//! Responses answer, or streamed as that API's events, with a reasoning item of its own
//! first ([`reasoning_item`]), as OpenAI's reasoning models answer.
//!
//! It is as strict as the servers it stands for: a `previous_response_id` is refused
//! (llama-server refuses any), a `reasoning` item without its `encrypted_content` is
//! refused (OpenAI cannot find an unstored item by its id), and a `function_call_output`
//! with no `function_call` of its `call_id` before it is refused (OpenAI's "No tool call
//! found for function call output").

use serde_json::{Value, json};

use crate::model::reasoning::ReasoningEffort;
use crate::model::wire::{
    ChatRequest, FunctionCall, FunctionSpec, Message, ToolCall, ToolSpec, Tools,
};

/// The reasoning item the scripted model returns first in its answer to request `number`
/// (1-based, as [`ScriptedModel::requests`](super::ScriptedModel::requests) counts).
pub fn reasoning_item(number: u64) -> Value {
    json!({
        "type": "reasoning",
        "id": format!("rs_scripted_{number}"),
        "summary": [],
        "encrypted_content": format!("scripted-reasoning-{number}"),
    })
}

/// The conversation a Responses request carries, or why it is refused (a 400).
pub(super) fn chat_of(body: &[u8]) -> Result<ChatRequest, String> {
    let request: Value = serde_json::from_slice(body)
        .map_err(|err| format!("the request is not a Responses request: {err}"))?;
    if request.get("previous_response_id").is_some() {
        return Err("previous_response_id is not supported".into());
    }
    let Some(input) = request.get("input").and_then(Value::as_array) else {
        return Err("the request has no input list".into());
    };
    let mut messages = Vec::new();
    // Items of one model turn (reasoning, its text, its calls) make one assistant message.
    let mut turn: Option<(Option<String>, Vec<ToolCall>)> = None;
    let mut called = Vec::new();
    let end_turn = |turn: &mut Option<(Option<String>, Vec<ToolCall>)>,
                    messages: &mut Vec<Message>| {
        if let Some((content, tool_calls)) = turn.take() {
            messages.push(Message::Assistant {
                content,
                tool_calls,
                reasoning: Vec::new(),
            });
        }
    };
    for item in input {
        let text = |field: &str| item.get(field).and_then(Value::as_str).map(str::to_owned);
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match (kind, item.get("role").and_then(Value::as_str)) {
            ("reasoning", _) => {
                if text("encrypted_content").is_none_or(|e| e.is_empty()) {
                    return Err(format!(
                        "Item with id '{}' not found. Items are not persisted when `store` is set to false.",
                        text("id").unwrap_or_default()
                    ));
                }
                turn.get_or_insert_with(Default::default);
            }
            ("function_call", _) => {
                let call_id = text("call_id").ok_or("a function_call without call_id")?;
                called.push(call_id.clone());
                turn.get_or_insert_with(Default::default).1.push(ToolCall {
                    id: call_id,
                    kind: "function".into(),
                    function: FunctionCall {
                        name: text("name").unwrap_or_default(),
                        arguments: text("arguments").unwrap_or_default(),
                    },
                });
            }
            ("function_call_output", _) => {
                let call_id = text("call_id").unwrap_or_default();
                if !called.contains(&call_id) {
                    return Err(format!(
                        "No tool call found for function call output with call_id {call_id}."
                    ));
                }
                end_turn(&mut turn, &mut messages);
                messages.push(Message::Tool {
                    tool_call_id: call_id,
                    content: text("output").unwrap_or_default(),
                });
            }
            ("message", Some("assistant")) => {
                let content = message_text(item);
                turn.get_or_insert_with(Default::default).0 = Some(content);
            }
            ("message", Some(role @ ("system" | "developer" | "user"))) => {
                end_turn(&mut turn, &mut messages);
                let content = message_text(item);
                messages.push(if role == "user" {
                    Message::User { content }
                } else {
                    Message::System { content }
                });
            }
            (kind, role) => return Err(format!("an input item of type {kind} ({role:?})")),
        }
    }
    end_turn(&mut turn, &mut messages);
    let tools = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|tool| {
            let parameters = tool.get("parameters").cloned().unwrap_or(json!({}));
            Ok(ToolSpec {
                kind: "function".into(),
                function: FunctionSpec {
                    name: tool["name"].as_str().unwrap_or_default().to_owned(),
                    description: tool["description"].as_str().unwrap_or_default().to_owned(),
                    parameters: serde_json::value::to_raw_value(&parameters)
                        .map_err(|e| e.to_string())?,
                },
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let effort = request.pointer("/reasoning/effort").and_then(Value::as_str);
    Ok(ChatRequest {
        model: request["model"].as_str().unwrap_or_default().to_owned(),
        messages,
        tools: Tools::Received(tools),
        max_tokens: request["max_output_tokens"].as_u64().map(|n| n as u32),
        reasoning_effort: effort.and_then(|e| ReasoningEffort::parse(e).ok().flatten()),
        stream: request["stream"].as_bool().unwrap_or(false),
        stream_options: None,
    })
}

/// A message item's text: a string, or its `input_text`/`output_text` parts joined.
fn message_text(item: &Value) -> String {
    match item.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// The script's chat completion `answer` to request `number`, as a Responses answer.
pub(super) fn answer_of(answer: &Value, number: u64) -> Value {
    let message = &answer["choices"][0]["message"];
    let mut output = vec![reasoning_item(number)];
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        output.push(json!({
            "type": "message",
            "id": format!("msg_scripted_{number}"),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }));
    }
    for (i, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let arguments = match &call["function"]["arguments"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        output.push(json!({
            "type": "function_call",
            "id": format!("fc_scripted_{number}_{i}"),
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": arguments,
            "status": "completed",
        }));
    }
    let usage = &answer["usage"];
    json!({
        "id": format!("resp_scripted_{number}"),
        "object": "response",
        "created_at": answer["created"],
        "status": "completed",
        "model": answer["model"],
        "output": output,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    })
}

/// The events of a Responses `answer` as a stream sends them: its items added, the text
/// word by word, each call's arguments in two pieces, each item done, then
/// `response.completed` with the whole answer.
pub(super) fn events(answer: &Value) -> Vec<String> {
    let mut events = Vec::new();
    let mut send = |event: Value| {
        events.push(format!(
            "event: {}\ndata: {event}\n\n",
            event["type"].as_str().unwrap_or_default()
        ))
    };
    let mut started = answer.clone();
    started["status"] = json!("in_progress");
    started["output"] = json!([]);
    send(json!({"type": "response.created", "response": started}));
    for (index, item) in answer["output"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        send(json!({"type": "response.output_item.added", "output_index": index, "item": item}));
        match item["type"].as_str() {
            Some("message") => {
                let text = item["content"][0]["text"].as_str().unwrap_or_default();
                for word in text.split_inclusive(' ') {
                    send(
                        json!({"type": "response.output_text.delta", "output_index": index, "item_id": item["id"], "content_index": 0, "delta": word}),
                    );
                }
            }
            Some("function_call") => {
                let arguments = item["arguments"].as_str().unwrap_or_default();
                let mut half = arguments.len() / 2;
                while !arguments.is_char_boundary(half) {
                    half += 1;
                }
                for piece in [&arguments[..half], &arguments[half..]] {
                    send(
                        json!({"type": "response.function_call_arguments.delta", "output_index": index, "item_id": item["id"], "delta": piece}),
                    );
                }
            }
            _ => {}
        }
        send(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }
    send(json!({"type": "response.completed", "response": answer}));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_s_items_read_back_into_the_conversation() {
        let chat = chat_of(
            json!({
                "model": "m", "store": false,
                "input": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": [{"type": "input_text", "text": "u"}]},
                    reasoning_item(1),
                    {"type": "function_call", "call_id": "c1", "name": "charge", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
                ],
                "tools": [{"type": "function", "name": "charge", "description": "d", "parameters": {"type": "object"}}],
                "max_output_tokens": 512,
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(chat.messages.len(), 4);
        assert!(
            matches!(&chat.messages[2], Message::Assistant { tool_calls, .. } if tool_calls[0].id == "c1")
        );
        assert_eq!(chat.tools.len(), 1);
        assert_eq!(chat.max_tokens, Some(512));
    }

    #[test]
    fn what_the_real_servers_refuse_is_refused() {
        let refused = |input: Value, extra: Value| {
            let mut request = json!({"model": "m", "input": input});
            request
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            chat_of(request.to_string().as_bytes()).unwrap_err()
        };
        assert!(
            refused(json!([]), json!({"previous_response_id": "resp_1"}))
                .contains("previous_response_id")
        );
        assert!(
            refused(
                json!([{"type": "reasoning", "id": "rs_1", "summary": []}]),
                json!({})
            )
            .contains("not persisted")
        );
        assert!(
            refused(
                json!([{"type": "function_call_output", "call_id": "c9", "output": "x"}]),
                json!({})
            )
            .contains("No tool call found")
        );
    }
}
