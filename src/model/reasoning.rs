//! Reasoning effort, per endpoint (`OPENAI_REASONING_EFFORT`): how long a reasoning model
//! thinks before it answers. Sent as `reasoning_effort` in a chat-completions request
//! when set; nothing is sent when unset, and the provider's default applies.
//!
//! OpenAI's reasoning models (the gpt-5.4 family on) refuse function tools on chat
//! completions with any effort but `none`, and some apply an effort by default, so a
//! request that never names one is refused too:
//!
//! ```text
//! 400 {"error":{"message":"Function tools with reasoning_effort are not supported for
//!      gpt-5.6-luna in /v1/chat/completions. To use function tools, use /v1/responses or
//!      set reasoning_effort to 'none'.","type":"invalid_request_error",
//!      "param":"reasoning_effort","code":null}}
//! ```
//!
//! A 400 like any other (never repeated, never counted by the breaker, never sent to a
//! fallback: the request's shape is ours); its message gains the settings that fix it.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

impl ReasoningEffort {
    pub const ALL: [ReasoningEffort; 6] = [
        ReasoningEffort::None,
        ReasoningEffort::Minimal,
        ReasoningEffort::Low,
        ReasoningEffort::Medium,
        ReasoningEffort::High,
        ReasoningEffort::Xhigh,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::None => "none",
            ReasoningEffort::Minimal => "minimal",
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
            ReasoningEffort::Xhigh => "xhigh",
        }
    }

    /// One of `none`, `minimal`, `low`, `medium`, `high`, `xhigh`; empty is unset.
    pub fn parse(text: &str) -> Result<Option<ReasoningEffort>, String> {
        if text.is_empty() {
            return Ok(None);
        }
        Self::ALL
            .into_iter()
            .find(|effort| effort.as_str() == text)
            .map(Some)
            .ok_or_else(|| {
                format!("{text:?} is not one of none, minimal, low, medium, high, xhigh")
            })
    }
}

impl std::fmt::Display for ReasoningEffort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What fixes a 400 about the request's reasoning effort (its error's `param` is
/// `reasoning_effort`), said with the provider's message: the settings, by name.
pub fn refusal_hint(status: u16, body: &[u8]) -> Option<&'static str> {
    if status != 400 {
        return None;
    }
    let parsed: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = parsed.get("error")?;
    let about_effort = error.get("param").and_then(|p| p.as_str()) == Some("reasoning_effort")
        || error
            .get("message")
            .and_then(|m| m.as_str())
            .is_some_and(|m| m.contains("reasoning_effort"));
    about_effort.then_some(
        "the endpoint refuses this request's reasoning effort: set OPENAI_REASONING_EFFORT=none \
         (OPENAI_FALLBACK_REASONING_EFFORT, or reasoning_effort in model_fallbacks, for a fallback \
         endpoint), or OPENAI_WIRE_API=responses to use the Responses API",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_effort_parses_from_its_name_and_nothing_else_does() {
        for effort in ReasoningEffort::ALL {
            assert_eq!(ReasoningEffort::parse(effort.as_str()), Ok(Some(effort)));
            assert_eq!(
                serde_json::to_string(&effort).unwrap(),
                format!("\"{effort}\"")
            );
        }
        assert_eq!(ReasoningEffort::parse(""), Ok(None));
        assert_eq!(
            ReasoningEffort::parse("High").unwrap_err(),
            "\"High\" is not one of none, minimal, low, medium, high, xhigh"
        );
    }

    #[test]
    fn only_a_400_about_the_reasoning_effort_gets_the_hint() {
        let openai = br#"{"error":{"message":"Function tools with reasoning_effort are not supported for gpt-5.6-luna in /v1/chat/completions. To use function tools, use /v1/responses or set reasoning_effort to 'none'.","type":"invalid_request_error","param":"reasoning_effort","code":null}}"#;
        let hint = refusal_hint(400, openai).unwrap();
        assert!(hint.contains("OPENAI_REASONING_EFFORT=none"), "{hint}");
        assert!(hint.contains("OPENAI_WIRE_API=responses"), "{hint}");
        assert_eq!(refusal_hint(500, openai), None);
        let policy = br#"{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}"#;
        assert_eq!(refusal_hint(400, policy), None);
        assert_eq!(refusal_hint(400, b"bad request"), None);
    }
}
