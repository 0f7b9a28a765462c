//! Each chat-completions request as it is sent, retries included: its `chat {model}` span,
//! and how long it took, the tokens it used and the request timeouts, into the metrics.
//! Sits between the request retry and the request timeout, so it sees every try and the
//! timeout's verdict on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tower::timeout::error::Elapsed;
use tower::{BoxError, Layer, Service};
use tracing::Instrument;

use super::call::ModelCall;
use super::error::ModelError;
use super::wire::ChatResponse;
use crate::metrics::{GenAiTarget, Metrics, TimedOut};
use crate::telemetry::genai;

#[derive(Clone)]
pub struct ObserveLayer {
    metrics: Metrics,
    target: Arc<GenAiTarget>,
}

impl ObserveLayer {
    pub fn new(metrics: Metrics, target: GenAiTarget) -> Self {
        ObserveLayer {
            metrics,
            target: Arc::new(target),
        }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    layer: ObserveLayer,
}

impl<S> Service<ModelCall> for Observe<S>
where
    S: Service<ModelCall, Response = ChatResponse, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = ChatResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<ChatResponse, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let ObserveLayer { metrics, target } = self.layer.clone();
        let span = genai::chat(&target.model, call.attempt);
        let started = Instant::now();
        let sent = span.in_scope(|| self.inner.call(call));
        Box::pin(async move {
            let result = sent.instrument(span.clone()).await;
            let took = started.elapsed();
            let outcome = match &result {
                Ok(response) => Ok(response
                    .usage
                    .map(|u| (u.prompt_tokens, u.completion_tokens))),
                Err(err) if err.is::<Elapsed>() => {
                    metrics.timeout(TimedOut::Request);
                    Err("timeout")
                }
                Err(err) => Err(err
                    .downcast_ref::<ModelError>()
                    .map_or("_OTHER", |e| e.kind.reason())),
            };
            metrics.chat(&target, took, outcome);
            genai::chat_finished(&span, outcome);
            result
        })
    }
}
