//! The loop's memory of an operation: its journal, read at the start of every loop
//! attempt to resume where the last one stopped, and written step by step as it goes.
//!
//! A step is a model answer or a tool result, numbered 1, 2, … after the opening prompt.
//! A model answer is committed no later than the first effect of a tool it asks for: with
//! that tool's result, in the effect's own commit (a charge hands the gateway both
//! entries, which commit with the receipt), or with a result that had no effect, before
//! the next answer is asked for. Only final outcomes are written: a failed request, a timeout or a database error leaves the step open, so
//! it runs again. The first answer pins what the journal is valid for (the request, the
//! model, the prompt and the tools); under other pins the operation starts afresh, which
//! is safe because every effect is keyed.

use serde_json::json;
use sha2::{Digest, Sha256};

use super::context::OperationContext;
use super::error::JournalFailure;
use crate::journal::{Entry, EntryKind, Journal, NewEntry};
use crate::model::wire::{AssistantMessage, ChatRequest, TokenUsage, ToolCall};
use crate::outbox::Recipient;
use crate::payments::Order;

/// The journal, or nothing when it is turned off (`CHECKOUT_JOURNAL=false`: every loop
/// attempt starts over, as before).
#[derive(Clone, Debug)]
pub struct Memory {
    journal: Option<Journal>,
    /// How long entries are kept: the Idempotency-Key time to live.
    ttl_ms: i64,
}

impl Memory {
    pub fn new(journal: Option<Journal>, ttl: std::time::Duration) -> Memory {
        Memory {
            journal,
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// Whether this operation's steps go to the database: those of an operation with an
    /// Idempotency-Key do, so that the client's retry, another instance or the recovery
    /// sweep can resume it. An operation without one (its key minted here, known to
    /// nobody else, with no lease for another instance to take over) can only be resumed
    /// by its own loop retry, in this process: its steps are kept in its context.
    pub fn durable(&self, ctx: &OperationContext) -> bool {
        self.journal.is_some() && ctx.journal_key().fence.is_some()
    }

    /// The steps this operation has journaled under these pins. Under other pins its
    /// journal is discarded and the loop starts afresh.
    ///
    /// The first loop attempt of a new operation has nothing to read, and does not ask:
    /// an Idempotency-Key whose record this request made (fence 1: a takeover raises it,
    /// and a record is forgotten with its journal) has no journal yet.
    pub async fn recall(
        &self,
        ctx: &OperationContext,
        pins: &str,
        attempt: u32,
    ) -> Result<Replay, JournalFailure> {
        let Some(journal) = &self.journal else {
            return Ok(Replay::default());
        };
        let key = ctx.journal_key();
        if !self.durable(ctx) {
            let entries = ctx.kept();
            if !entries.is_empty() {
                tracing::info!(
                    steps = entries.len(),
                    "resuming the loop from the steps this operation took: they are replayed, not run again"
                );
            }
            return Ok(Replay {
                entries: entries.into_iter().rev().collect(),
            });
        }
        if attempt == 1 && key.fence == Some(1) {
            return Ok(Replay::default());
        }
        // Boxed: inline, the database's future would make every call's future as large as
        // itself, also for the operations that never reach it (figure 2).
        let entries = Box::pin(journal.load(&key.caller, &key.operation_key)).await?;
        let Some(first) = entries.first() else {
            return Ok(Replay::default());
        };
        if first.step == 1 && first.pins.as_deref() == Some(pins) {
            tracing::info!(
                steps = entries.len(),
                "resuming the loop from the journal: its steps are replayed, not run again"
            );
            return Ok(Replay {
                entries: entries.into_iter().rev().collect(),
            });
        }
        tracing::warn!(
            steps = entries.len(),
            journaled = first.pins.as_deref().unwrap_or("none"),
            now = pins,
            "the journal was made under other pins (request, model, prompt or tools); starting afresh, every effect keyed as before"
        );
        if !Box::pin(journal.discard(key)).await? {
            return Err(JournalFailure::LeaseLost);
        }
        Ok(Replay::default())
    }

    /// Writes `entries` (one operation's next steps; none when the journal is off) and
    /// waits for their commit; keeps them in the context when they are not durable.
    pub async fn remember(
        &self,
        ctx: &OperationContext,
        entries: Vec<NewEntry>,
    ) -> Result<(), JournalFailure> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        if !self.durable(ctx) {
            ctx.keep(entries);
            return Ok(());
        }
        if journal.append(entries).await? {
            Ok(())
        } else {
            Err(JournalFailure::LeaseLost)
        }
    }

    /// The entry of a model answer at `step`, named by the endpoint that gave it
    /// (`model@base_url`); the first carries the pins.
    pub fn answer(
        &self,
        ctx: &OperationContext,
        step: i64,
        message: &AssistantMessage,
        usage: Option<TokenUsage>,
        pins: &str,
        endpoint: &str,
    ) -> Option<NewEntry> {
        let tokens = |n: u64| i64::try_from(n).ok();
        Some(NewEntry {
            kind: EntryKind::Answer,
            name: endpoint.to_owned(),
            call_id: None,
            body: serde_json::to_string(message).expect("answers serialize"),
            pins: (step == 1).then(|| pins.to_owned()),
            input_tokens: usage.and_then(|u| tokens(u.prompt_tokens)),
            output_tokens: usage.and_then(|u| tokens(u.completion_tokens)),
            ..self.entry(ctx, step)?
        })
    }

    /// The entry of a tool call's result at `step`.
    pub fn tool(
        &self,
        ctx: &OperationContext,
        step: i64,
        call: &ToolCall,
        content: String,
    ) -> Option<NewEntry> {
        Some(NewEntry {
            kind: EntryKind::Tool,
            name: call.function.name.clone(),
            call_id: Some(call.id.clone()),
            body: content,
            ..self.entry(ctx, step)?
        })
    }

    fn entry(&self, ctx: &OperationContext, step: i64) -> Option<NewEntry> {
        self.journal.as_ref()?;
        Some(NewEntry {
            key: ctx.journal_key().clone(),
            step,
            kind: EntryKind::Answer,
            name: String::new(),
            call_id: None,
            body: String::new(),
            pins: None,
            input_tokens: None,
            output_tokens: None,
            ttl_ms: self.ttl_ms,
        })
    }
}

/// What a journal is valid for: the order and address the operation acts on, the
/// configured chain of models (not the one that answered: a fallback continues the
/// journal), and the exact opening prompt and tool schemas (hashed), as the loop is about
/// to send them. The effect is in the prompt; the operation key names the journal.
pub fn pins(ctx: &OperationContext, opening: &ChatRequest, models: &str) -> String {
    let mut prompt = Sha256::new();
    prompt.update(serde_json::to_vec(&opening.messages).expect("messages serialize"));
    prompt.update(serde_json::to_vec(&opening.tools).expect("tools serialize"));
    // The first 8 bytes, as 16 hex digits.
    let digest = hex::encode(&prompt.finalize()[..8]);
    json!({
        "request": order_pin(ctx.order(), ctx.email()),
        "model": models,
        "prompt": digest,
    })
    .to_string()
}

/// The order, its payment method and the address, as a journal's pins name them (the
/// text journals kept since before the effect was a type, so that theirs still match).
fn order_pin(order: &Order, email: Option<&Recipient>) -> String {
    let amount = order.amount();
    let mut pin = format!(
        "POST /checkout orderId={} amount={} currency={}",
        order.id(),
        amount.minor(),
        amount.currency()
    );
    if let Some(method) = order.payment_method() {
        pin.push_str(&format!(" paymentMethod={method}"));
    }
    if let Some(email) = email {
        pin.push_str(&format!(" email={email}"));
    }
    pin
}

/// Tokens an answer cost when it was asked for: (input, output).
pub type Tokens = (u64, u64);

/// The journaled steps not yet replayed, next first.
#[derive(Debug, Default)]
pub struct Replay {
    /// In reverse order: the next step is the last.
    entries: Vec<Entry>,
}

impl Replay {
    /// The journaled model answer at `step`, if the journal reaches it, with the tokens
    /// (input, output) it cost when first asked for and the model that gave it (empty
    /// for an entry older than the fallbacks).
    pub fn answer(
        &mut self,
        step: i64,
    ) -> Result<Option<(AssistantMessage, Tokens, String)>, JournalFailure> {
        let Some(entry) = self.next(step)? else {
            return Ok(None);
        };
        if entry.kind != EntryKind::Answer.as_str() {
            return Err(mismatch(
                step,
                format!(
                    "the journal has a result of tool {:?} where the model's answer belongs",
                    entry.name
                ),
            ));
        }
        let tokens = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
        let cost = (tokens(entry.input_tokens), tokens(entry.output_tokens));
        let model = entry.name.split('@').next().unwrap_or_default().to_owned();
        serde_json::from_str(&entry.body)
            .map(|answer| Some((answer, cost, model)))
            .map_err(|err| mismatch(step, format!("the journaled answer does not read: {err}")))
    }

    /// The journaled result of `call` at `step`, if the journal reaches it.
    pub fn tool(&mut self, step: i64, call: &ToolCall) -> Result<Option<String>, JournalFailure> {
        let Some(entry) = self.next(step)? else {
            return Ok(None);
        };
        if entry.kind != EntryKind::Tool.as_str() {
            return Err(mismatch(
                step,
                format!(
                    "the journal has a model answer where the result of tool {:?} belongs",
                    call.function.name
                ),
            ));
        }
        if entry.name != call.function.name || entry.call_id.as_deref() != Some(&call.id) {
            return Err(mismatch(
                step,
                format!(
                    "the journal has the result of tool {:?} (call {}), the replayed answer calls {:?} (call {})",
                    entry.name,
                    entry.call_id.as_deref().unwrap_or("none"),
                    call.function.name,
                    call.id
                ),
            ));
        }
        Ok(Some(entry.body))
    }

    fn next(&mut self, step: i64) -> Result<Option<Entry>, JournalFailure> {
        match self.entries.last() {
            None => Ok(None),
            Some(entry) if entry.step == step => Ok(self.entries.pop()),
            Some(entry) => Err(mismatch(
                step,
                format!("the journal's next step is {}", entry.step),
            )),
        }
    }
}

fn mismatch(step: i64, detail: String) -> JournalFailure {
    JournalFailure::Mismatch { step, detail }
}
