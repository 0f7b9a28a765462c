//! The configured model endpoints, in order: the primary, then its fallbacks. One turn
//! of the conversation is asked of the first endpoint; a transient failure there (its
//! request retry gave up, or its breaker is open) or a conversation too long for it asks
//! the next one the same turn. The conversation is the loop's, built from the journal:
//! a switch continues it, it never restarts it.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use super::breaker::Breaker;
use super::client::{Completion, ModelClient};
use super::error::{ModelError, ModelErrorKind};
use super::live::LiveText;
use super::wire::{ChatRequest, StreamOptions};
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct ModelChain {
    /// Never empty: the primary first.
    endpoints: Arc<[ModelClient]>,
}

impl ModelChain {
    pub fn new(endpoints: Vec<ModelClient>) -> ModelChain {
        assert!(!endpoints.is_empty(), "a chain has its primary");
        ModelChain {
            endpoints: endpoints.into(),
        }
    }

    pub fn primary(&self) -> &ModelClient {
        &self.endpoints[0]
    }

    pub fn endpoints(&self) -> &[ModelClient] {
        &self.endpoints
    }

    /// Each endpoint's breaker, in order: the handles `/health/ready` reads.
    pub fn breakers(&self) -> Vec<Breaker> {
        self.endpoints.iter().map(|e| e.breaker().clone()).collect()
    }

    /// The configured chain's models, in order, as the journal's pins name it: a journal
    /// stays valid whichever of them answered.
    pub fn models(&self) -> String {
        let models: Vec<&str> = self.endpoints.iter().map(ModelClient::model).collect();
        models.join(",")
    }

    pub fn metrics(&self) -> &Metrics {
        self.primary().metrics()
    }

    /// Asks the turn of each endpoint in order until one answers; returns the answer and
    /// the endpoint that gave it, or the failure of the last endpoint asked. `chat.model`
    /// and `chat.reasoning_effort` are set to each endpoint's as it is asked. With `live`, each is asked for a
    /// streamed answer whose text goes there as it comes: a stream that breaks is a
    /// transient failure like any other, and the next endpoint streams its own answer.
    pub async fn complete(
        &self,
        chat: &mut Arc<ChatRequest>,
        round: u32,
        sent: Arc<AtomicU32>,
        live: Option<LiveText>,
    ) -> Result<(Completion, &ModelClient), ModelError> {
        let last = self.endpoints.len() - 1;
        // The last turn's sends are over: nothing else holds the conversation, and it is
        // changed in place.
        let asking = Arc::make_mut(chat);
        asking.stream = live.is_some();
        asking.stream_options = asking.stream.then_some(StreamOptions {
            include_usage: true,
        });
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            let asking = Arc::make_mut(chat);
            endpoint.model().clone_into(&mut asking.model);
            asking.reasoning_effort = endpoint.reasoning_effort();
            let failover = i < last;
            let asked = endpoint.complete(chat, round, sent.clone(), failover, live.clone());
            match asked.await {
                Ok(completion) => {
                    if i > 0 {
                        self.metrics().fallback_turn(endpoint.metric_label());
                    }
                    return Ok((completion, endpoint));
                }
                Err(err) if failover && err.fails_over() => {
                    let next = self.endpoints[i + 1].name();
                    let from = endpoint.name();
                    let said = "fallback: this turn goes to the next model endpoint, continuing the same conversation";
                    // An open breaker said so once, when it opened; not on every turn.
                    if matches!(err.kind, ModelErrorKind::CircuitOpen) {
                        tracing::debug!(round, endpoint = from, next, error = %err, "{said}");
                    } else {
                        tracing::warn!(round, endpoint = from, next, error = %err, "{said}");
                    }
                }
                Err(err) => return Err(err),
            }
        }
        unreachable!("the last endpoint's failure is returned")
    }
}
