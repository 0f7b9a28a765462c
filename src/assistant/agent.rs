//! The assistant loop: ask the model, run the tools it calls, send the results back,
//! round after round until it answers in text. Every step is journaled as it ends, and
//! every attempt first replays what the journal has: a retry resumes, it does not restart.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{BoxError, Service};
use tracing::Instrument;

use super::context::{LoopRequest, OperationContext, Usage};
use super::error::{CheckoutError, FailureKind, ToolFailure};
use super::memory::{self, Memory};
use super::prompts;
use super::tools::ToolBox;
use crate::journal::NewEntry;
use crate::model::wire::{ChatRequest, Message};
use crate::model::{LiveOps, ModelChain};
use crate::payments::Receipt;

/// A checkout the model confirmed.
#[derive(Clone, Debug)]
pub struct CheckoutOutcome {
    pub receipt: Receipt,
    /// True when this operation (this operation key) made the charge, in any attempt.
    pub charged: bool,
    /// The confirmation sentence.
    pub message: String,
    /// Who wrote it.
    pub message_source: MessageSource,
    /// Loop attempts it took.
    pub attempts: u32,
    /// Model requests and tokens it took, and the steps replayed from the journal.
    pub usage: Usage,
    /// The closing answer's journal entry, not yet written: it commits with the
    /// operation's saved answer, in one commit (`Records::complete`).
    pub closing: Vec<NewEntry>,
}

/// Who wrote a checkout's confirmation sentence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageSource {
    Model,
    /// The service, from the receipt: the order is charged and no model endpoint wrote
    /// the sentence (every one failed, or the answer was empty).
    Service,
}

impl MessageSource {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageSource::Model => "model",
            MessageSource::Service => "service",
        }
    }
}

/// One run of the loop is one `call`: a tower service, so the loop retry and the loop
/// timeout wrap it as layers.
#[derive(Clone)]
pub struct AgentLoop(Arc<Inner>);

struct Inner {
    model: ModelChain,
    tools: ToolBox,
    memory: Memory,
    limits: LoopLimits,
    /// The operations a stream watches on this instance: theirs are asked for streamed
    /// answers, whose text goes to the stream as the model writes it.
    live: LiveOps,
}

/// How far one run of the loop may go.
#[derive(Clone, Copy, Debug)]
pub struct LoopLimits {
    /// Model requests per run of the loop.
    pub max_rounds: u32,
    /// Times a model that ends in text without charging is asked again to charge.
    pub max_nudges: u32,
    /// The longest answer asked of the model, in tokens.
    pub max_tokens: u32,
}

impl AgentLoop {
    pub fn new(
        model: ModelChain,
        tools: ToolBox,
        memory: Memory,
        limits: LoopLimits,
        live: LiveOps,
    ) -> Self {
        AgentLoop(Arc::new(Inner {
            model,
            tools,
            memory,
            limits,
            live,
        }))
    }
}

impl Service<LoopRequest> for AgentLoop {
    type Response = CheckoutOutcome;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<CheckoutOutcome, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    /// A retry's log lines carry its `loop attempt{attempt=N}` span; the first attempt's
    /// carry none: what it would say goes without saying, and a span entered on every poll
    /// cost every checkout a few percent of its CPU.
    fn call(&mut self, request: LoopRequest) -> Self::Future {
        let inner = self.0.clone();
        let attempt = request.attempt;
        let run = async move {
            inner
                .run(&request.ctx, attempt)
                .await
                .map_err(|kind| Box::new(CheckoutError::new(kind)) as BoxError)
        };
        if attempt == 1 {
            Box::pin(run)
        } else {
            Box::pin(run.instrument(tracing::info_span!("loop attempt", attempt)))
        }
    }
}

impl CheckoutOutcome {
    /// The confirmation the service writes from the receipt.
    pub fn written_by_service(ctx: &OperationContext, receipt: Receipt, attempts: u32) -> Self {
        let message = match ctx.refund_made() {
            Some((refund, _)) => format!(
                "Order {}: {} refunded, refund {}.",
                refund.order_id, refund.amount, refund.id
            ),
            None => format!(
                "Order {} is paid: {} charged, receipt {}.",
                receipt.order_id, receipt.amount, receipt.id
            ),
        };
        CheckoutOutcome {
            charged: ctx.made(&receipt),
            message,
            receipt,
            message_source: MessageSource::Service,
            attempts,
            usage: ctx.usage(),
            closing: Vec::new(),
        }
    }
}

impl Inner {
    async fn run(
        &self,
        ctx: &OperationContext,
        attempt: u32,
    ) -> Result<CheckoutOutcome, FailureKind> {
        let limits = self.limits;
        // Shared with the model request it is sent as, for as long as that waits (the
        // request retry repeats it from here); a turn's answer is added once it is over.
        let mut chat = Arc::new(ChatRequest {
            model: self.model.primary().model().to_owned(),
            messages: prompts::opening(ctx.effect(), ctx.order(), ctx.email().is_some()),
            tools: ToolBox::offered_for(ctx.effect(), ctx.email().is_some()),
            max_tokens: Some(limits.max_tokens),
            reasoning_effort: None,
            stream: false,
            stream_options: None,
        });
        // Pins guard a journal that another run may read; steps kept in process are read
        // back by this operation's own loop retry only, under the same pins.
        let pins = if self.memory.durable(ctx) {
            memory::pins(ctx, &chat, &self.model.models())
        } else {
            String::new()
        };
        // The futures awaited here are small: the journal, the model client and the tools
        // box what is large inside them (a database statement, a provider's HTTP call),
        // so a checkout allocates only for what it runs (docs/benchmark.md, figure 7).
        // The tool call is boxed here: inline, a loop waiting on the model would keep room
        // for it.
        let mut replay = self.memory.recall(ctx, &pins, attempt).await?;
        let mut receipt: Option<Receipt> = None;
        let mut nudges = 0;
        let mut step = 0;
        // Steps made but not yet journaled: an answer waits for its first tool's result.
        let mut pending = Vec::new();
        let mut rounds = self.model.metrics().loop_rounds();
        for round in 1..=limits.max_rounds {
            rounds.reached(round);
            step += 1;
            let reply = match replay.answer(step)? {
                Some((reply, cost, answered_by)) => {
                    ctx.replayed();
                    ctx.answered_by(&answered_by);
                    self.model.metrics().journal_replayed_answer(cost);
                    reply
                }
                None => {
                    let key = ctx.journal_key();
                    let live = self.live.publisher(&key.caller, &key.operation_key, step);
                    let asked = self
                        .model
                        .complete(&mut chat, round, ctx.request_counter(), live)
                        .await;
                    let (completion, endpoint) = asked.map_err(FailureKind::Model)?;
                    let name = endpoint.name();
                    ctx.answered_by(endpoint.model());
                    ctx.used(&completion);
                    // Journaled with the first tool result it leads to (in the tool's
                    // own commit, when it has an effect), or alone if it asks for none.
                    // Room for it alone: grown from empty, a Vec of these takes four,
                    // and thousands of checkouts hold theirs while their charges queue
                    // (figure 12).
                    if let Some(entry) = self.memory.answer(
                        ctx,
                        step,
                        &completion.message,
                        completion.usage,
                        &pins,
                        name,
                    ) {
                        pending.reserve_exact(1);
                        pending.push(entry);
                    }
                    completion.message
                }
            };
            let calls = reply.tool_calls.unwrap_or_default();
            if calls.is_empty() {
                let Some(receipt) = receipt else {
                    self.memory
                        .remember(ctx, std::mem::take(&mut pending))
                        .await?;
                    // Over the budget (or past the charge, for a refund), not charging
                    // (refunding) is right: no nudge.
                    if nudges == limits.max_nudges
                        || ctx.over_budget().is_some()
                        || ctx.refused_refund().is_some()
                    {
                        return Err(FailureKind::did_not(ctx.effect()));
                    }
                    nudges += 1;
                    tracing::info!(
                        round,
                        nudge = nudges,
                        of = limits.max_nudges,
                        answer = reply.content.as_deref().unwrap_or_default(),
                        "the model ended without charging; asking it again to charge"
                    );
                    Arc::make_mut(&mut chat).messages.push(Message::Assistant {
                        content: reply.content,
                        tool_calls: Vec::new(),
                        reasoning: reply.reasoning,
                    });
                    Arc::make_mut(&mut chat)
                        .messages
                        .push(prompts::nudge(ctx.effect(), ctx.order()));
                    continue;
                };
                // The closing answer ends the operation: a journaled one commits with the
                // operation's saved answer, one commit where there were two. Lost with an
                // answer that is not saved, it costs a retry one model request, no effect.
                let closing = if self.memory.durable(ctx) {
                    pending
                } else {
                    self.memory.remember(ctx, pending).await?;
                    Vec::new()
                };
                return Ok(match reply.content.as_deref().map(str::trim) {
                    Some(text) if !text.is_empty() => CheckoutOutcome {
                        charged: ctx.made(&receipt),
                        receipt,
                        message: text.to_owned(),
                        message_source: MessageSource::Model,
                        attempts: attempt,
                        usage: ctx.usage(),
                        closing,
                    },
                    _ => CheckoutOutcome {
                        closing,
                        ..CheckoutOutcome::written_by_service(ctx, receipt, attempt)
                    },
                });
            }
            Arc::make_mut(&mut chat).messages.push(Message::Assistant {
                content: reply.content,
                tool_calls: calls.clone(),
                reasoning: reply.reasoning,
            });
            for call in calls {
                step += 1;
                let output = match replay.tool(step, &call)? {
                    Some(content) => {
                        ctx.replayed();
                        self.model.metrics().journal_replayed_tool();
                        Box::pin(self.tools.replayed(ctx, step, &call, content)).await?
                    }
                    None => {
                        // The answer (if not yet journaled) and this result: committed
                        // with the tool's effect, or appended once the tool is done.
                        let entries = self.memory.durable(ctx).then_some(|content| {
                            // Exactly its rows: they wait in the tool's commit queue.
                            let mut entries = Vec::with_capacity(pending.len() + 1);
                            entries.extend_from_slice(&pending);
                            entries.extend(self.memory.tool(ctx, step, &call, content));
                            entries
                        });
                        let output = match Box::pin(self.tools.dispatch(ctx, &call, entries)).await
                        {
                            Ok(output) => output,
                            // The loop stops for a person: the answer that asked for the
                            // charge is journaled, so that the approved run replays it and
                            // runs the charge, not the model again.
                            Err(stop @ ToolFailure::Approval(_)) => {
                                self.memory.remember(ctx, pending).await?;
                                return Err(stop.into());
                            }
                            Err(err) => return Err(err.into()),
                        };
                        if !output.journaled {
                            pending.extend(self.memory.tool(
                                ctx,
                                step,
                                &call,
                                output.content.clone(),
                            ));
                            self.memory
                                .remember(ctx, std::mem::take(&mut pending))
                                .await?;
                        }
                        // Emptied, not cleared: its room would be kept while the next
                        // round waits on the model (figure 12).
                        pending = Vec::new();
                        output
                    }
                };
                if output.receipt.is_some() {
                    receipt = output.receipt;
                }
                Arc::make_mut(&mut chat).messages.push(Message::Tool {
                    tool_call_id: call.id,
                    content: output.content,
                });
            }
        }
        Err(FailureKind::TooManyRounds(limits.max_rounds))
    }
}
