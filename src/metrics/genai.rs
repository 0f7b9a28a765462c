//! The model's metrics, after the OpenTelemetry GenAI semantic conventions (see
//! `metrics.rs`): their definitions, in the catalogue, and the methods that record them.

use std::time::Duration;

use metrics::Recorder;

use super::{Def, Metrics, key, metadata};

pub(super) const DURATION: Def = Def {
    name: "gen_ai_client_operation_duration_seconds",
    help: "GenAI operation duration: one chat-completions HTTP request, each retry its own (OpenTelemetry semconv v1.37.0 gen_ai.client.operation.duration).",
    buckets: Some(&[
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ]),
};
pub(super) const TOKENS: Def = Def {
    name: "gen_ai_client_token_usage",
    help: "Tokens used per chat-completions request, as the provider reported them, by gen_ai_token_type input or output (OpenTelemetry semconv v1.37.0 gen_ai.client.token.usage).",
    buckets: Some(&[
        1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
        4194304.0, 16777216.0, 67108864.0,
    ]),
};

/// The model a client talks to, as the GenAI attributes name it, with the series its
/// answered requests record into (registered once: a lookup by labels on every request
/// cost more than the rest of the record).
#[derive(Clone, Debug)]
pub struct GenAiTarget {
    /// `gen_ai.provider.name`.
    pub provider: &'static str,
    /// `gen_ai.request.model`: the configured model name.
    pub model: String,
    answered: [metrics::Histogram; 3],
}

impl Metrics {
    /// One chat-completions request took `took`: answered with `usage` (input, output
    /// tokens), or failed with `error` (`error.type`).
    pub fn chat(
        &self,
        target: &GenAiTarget,
        took: Duration,
        outcome: Result<Option<(u64, u64)>, &'static str>,
    ) {
        match outcome {
            Ok(usage) => {
                let [duration, input, output] = &target.answered;
                duration.record(took.as_secs_f64());
                if let Some((input_tokens, output_tokens)) = usage {
                    input.record(input_tokens as f64);
                    output.record(output_tokens as f64);
                }
            }
            Err(error) => {
                let labels = [
                    ("gen_ai_operation_name", "chat"),
                    ("gen_ai_provider_name", target.provider),
                    ("gen_ai_request_model", target.model.as_str()),
                    ("error_type", error),
                ];
                self.histogram(&DURATION, &labels, took.as_secs_f64());
            }
        }
    }

    /// The model `model` of `provider`, as a client's metrics and spans name it.
    pub fn genai_target(&self, provider: &'static str, model: &str) -> GenAiTarget {
        let base = [
            ("gen_ai_operation_name", "chat"),
            ("gen_ai_provider_name", provider),
            ("gen_ai_request_model", model),
        ];
        let tokens = |kind| {
            let labels = [base[0], base[1], base[2], ("gen_ai_token_type", kind)];
            self.0
                .recorder
                .register_histogram(&key(&TOKENS, &labels), &metadata())
        };
        GenAiTarget {
            provider,
            model: model.to_owned(),
            answered: [
                self.0
                    .recorder
                    .register_histogram(&key(&DURATION, &base), &metadata()),
                tokens("input"),
                tokens("output"),
            ],
        }
    }
}
