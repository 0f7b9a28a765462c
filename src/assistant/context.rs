//! [`OperationContext`]: one operation's order, its [`Effect`] (charge or refund) and its
//! keys, made by the handler before anything is retried, and what its attempts learn
//! (charge, refund, usage, steps kept).
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::journal::{Entry, JournalKey, NewEntry};
use crate::model::Completion;
use crate::outbox::Recipient;
use crate::payments::store::{BudgetLeft, NewRefund, Refund, RefundStatus, Refunded};
use crate::payments::{
    Charge, ChargeKey, Effect, Money, OperationKey, Order, OrderId, PaymentGateway, Receipt,
};

/// Everything one operation carries through every retried unit: the order the client
/// authorized, what to do to it (its [`Effect`]) and the keys the handler made for it
/// before anything was retried.
///
/// Cloning is cheap and every clone is the same checkout: the tower retry layers clone it
/// for each attempt, so attempt three charges with the very keys attempt one had.
#[derive(Clone, Debug)]
pub struct OperationContext(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    order: Order,
    /// The customer's address, when the request named one: the confirmation's recipient.
    email: Option<Recipient>,
    charge_key: ChargeKey,
    operation_key: OperationKey,
    /// Where the loop's steps are journaled, with the lease that lets it append.
    journal: JournalKey,
    /// What the attempts learned about the charge: what an error answer reports.
    charge: Mutex<ChargeState>,
    /// Chat-completions requests sent, retries included, counted as they are sent (a
    /// request cut off by a timeout counts).
    requests: Arc<AtomicU32>,
    /// Tokens used and steps replayed.
    usage: Mutex<Usage>,
    /// The steps taken, when they are not journaled in the database (an operation
    /// without an Idempotency-Key): what the loop retry resumes from.
    kept: Mutex<Vec<Entry>>,
    /// The models that answered (replayed answers too), in order of first use.
    models: Mutex<Vec<String>>,
    /// The charge waits for a person's approval: the order's amount is above the caller's
    /// threshold, as the handler found when it took the request.
    needs_approval: bool,
    /// The caller's budget for the day in the order's currency (`None`: no budget),
    /// resolved by the handler from its API key and the settings.
    budget: Option<Money>,
    /// Charge the order, or refund it: for a refund the order's id and the amount to give
    /// back are `order`'s, authorized by the handler against the receipt, and the refund
    /// key is the operation key.
    effect: Effect,
    /// A refund's reason, for the records (the model never sees it).
    reason: Option<String>,
}

/// What a checkout cost in model requests and tokens, and what its journal saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Chat-completions requests sent, retries included.
    pub model_requests: u32,
    /// Steps (model answers and tool results) taken from the journal instead of run.
    pub replayed_steps: u32,
    /// Tokens of the answers received, as the provider reported them.
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Debug, Default)]
struct ChargeState {
    receipt: Option<Receipt>,
    /// A charge statement may have reached the database without its answer reaching us
    /// (a timeout cut it off, the connection broke).
    in_doubt: bool,
    /// A charge was refused for passing the caller's budget: what was left.
    over_budget: Option<BudgetLeft>,
    /// The refund this operation's calls made or found, and whether this run made it.
    refund: Option<(Refund, bool)>,
    /// A refund refused for passing what the order was charged (or for an order that is
    /// not charged: `None` inside).
    refund_refused: Option<Option<Refunded>>,
}

impl OperationContext {
    /// Made by the HTTP handler, from the validated order, before the loop starts. The
    /// operation is `caller`'s; `fence` is its Idempotency-Key lease, if it
    /// has one.
    pub fn new(
        order: Order,
        email: Option<Recipient>,
        operation_key: OperationKey,
        caller: &str,
        fence: Option<i64>,
    ) -> Self {
        OperationContext(Arc::new(Inner {
            email,
            charge_key: order.charge_key(),
            journal: JournalKey {
                caller: caller.to_owned(),
                operation_key: operation_key.as_str().to_owned(),
                fence,
            },
            order,
            operation_key,
            charge: Mutex::new(ChargeState::default()),
            requests: Arc::default(),
            usage: Mutex::new(Usage::default()),
            kept: Mutex::new(Vec::new()),
            models: Mutex::new(Vec::new()),
            needs_approval: false,
            budget: None,
            effect: Effect::Charge,
            reason: None,
        }))
    }

    /// The same operation as a refund of its order's amount, not a charge. Set by the
    /// handler before anything runs.
    pub fn refunding(mut self, reason: Option<String>) -> Self {
        let inner = Arc::get_mut(&mut self.0).expect("set before the context is shared");
        inner.effect = Effect::Refund;
        inner.reason = reason;
        self
    }

    /// What the operation does to its order: the loop's prompt, tools and nudge are the
    /// effect's.
    pub fn effect(&self) -> Effect {
        self.0.effect
    }

    /// The one refund this operation may make: its order, its amount, under its key, for
    /// its caller. The model's arguments have no part in it.
    pub fn refund(&self) -> NewRefund<'_> {
        NewRefund {
            order_id: self.0.order.id(),
            amount: self.0.order.amount(),
            operation_key: self.0.operation_key.as_str(),
            caller: &self.0.journal.caller,
            reason: self.0.reason.as_deref(),
            status: RefundStatus::Succeeded,
        }
    }

    /// Notes the refund a call made (`created`) or found. A run that made it keeps
    /// saying so when a later attempt finds it.
    pub(crate) fn record_refund(&self, refund: &Refund, created: bool) {
        let mut state = self.charge_state();
        let created = created || state.refund.as_ref().is_some_and(|(_, made)| *made);
        state.refund = Some((refund.clone(), created));
        state.in_doubt = false;
    }

    /// The refund made or found, and whether this run made it.
    pub fn refund_made(&self) -> Option<(Refund, bool)> {
        self.charge_state().refund.clone()
    }

    /// Notes a refund refused for passing the charge (`None`: the order is not charged).
    pub(crate) fn refund_refused(&self, state: Option<Refunded>) {
        self.charge_state().refund_refused = Some(state);
    }

    /// Why a refund of this operation was refused, if one was.
    pub fn refused_refund(&self) -> Option<Option<Refunded>> {
        self.charge_state().refund_refused
    }

    /// The same checkout, its charge waiting for a person's approval. Set by the handler
    /// before anything runs, never by the loop.
    pub fn needing_approval(mut self) -> Self {
        Arc::get_mut(&mut self.0)
            .expect("set before the context is shared")
            .needs_approval = true;
        self
    }

    /// Whether the charge waits for a person's approval.
    pub fn needs_approval(&self) -> bool {
        self.0.needs_approval
    }

    /// Within the caller's budget for the day, in the order's currency (`None`: none).
    /// Called by the handler on the context it just made, before any clone.
    pub fn with_budget(mut self, budget: Option<Money>) -> Self {
        Arc::get_mut(&mut self.0)
            .expect("the budget is set before the context is shared")
            .budget = budget;
        self
    }

    /// Notes that a charge was refused for passing the caller's budget.
    pub(crate) fn refused_over_budget(&self, left: BudgetLeft) {
        self.charge_state().over_budget = Some(left);
    }

    /// What was left of the caller's budget when a charge of this checkout was refused
    /// for passing it; `None` when none was.
    pub fn over_budget(&self) -> Option<BudgetLeft> {
        self.charge_state().over_budget
    }

    /// Whether this operation made `receipt`: its key, and its caller's (the same
    /// Idempotency-Key from two callers is two operations).
    pub fn made(&self, receipt: &Receipt) -> bool {
        receipt.operation_key == self.operation_key().as_str()
            && receipt.caller == self.0.journal.caller
    }

    pub fn journal_key(&self) -> &JournalKey {
        &self.0.journal
    }

    pub fn usage(&self) -> Usage {
        Usage {
            model_requests: self.0.requests.load(Ordering::Relaxed),
            ..*self.0.usage.lock().expect("never poisoned")
        }
    }

    /// The counter the model client adds each request it sends to.
    pub(crate) fn request_counter(&self) -> Arc<AtomicU32> {
        self.0.requests.clone()
    }

    /// Counts an answer's tokens.
    pub(crate) fn used(&self, completion: &Completion) {
        if let Some(tokens) = completion.usage {
            let mut usage = self.0.usage.lock().expect("never poisoned");
            usage.input_tokens += tokens.prompt_tokens;
            usage.output_tokens += tokens.completion_tokens;
        }
    }

    /// Notes the model that gave an answer (none for a journal entry that does not say).
    pub(crate) fn answered_by(&self, model: &str) {
        let mut models = self.0.models.lock().expect("never poisoned");
        if !model.is_empty() && !models.iter().any(|m| m == model) {
            models.push(model.to_owned());
        }
    }

    /// The models that answered, in order of first use.
    pub fn models(&self) -> Vec<String> {
        self.0.models.lock().expect("never poisoned").clone()
    }

    /// Keeps steps in the context (see [`Self::kept`]).
    pub(crate) fn keep(&self, entries: Vec<NewEntry>) {
        let mut kept = self.0.kept.lock().expect("never poisoned");
        kept.extend(entries.into_iter().map(NewEntry::into_entry));
    }

    /// The steps kept in the context, in order.
    pub(crate) fn kept(&self) -> Vec<Entry> {
        self.0.kept.lock().expect("never poisoned").clone()
    }

    /// Counts a step taken from the journal.
    pub(crate) fn replayed(&self) {
        self.0.usage.lock().expect("never poisoned").replayed_steps += 1;
    }

    pub fn order(&self) -> &Order {
        &self.0.order
    }

    /// The customer's address: with one, the assistant may send the confirmation.
    pub fn email(&self) -> Option<&Recipient> {
        self.0.email.as_ref()
    }

    pub fn charge_key(&self) -> &ChargeKey {
        &self.0.charge_key
    }

    /// The one charge this checkout may make: its order's key and amount, paid with its
    /// payment method, for this operation of this caller. The model's arguments have no
    /// part in it.
    pub fn charge(&self) -> Charge<'_> {
        let order = &self.0.order;
        Charge::new(
            &self.0.charge_key,
            order.amount(),
            &self.0.operation_key,
            &self.0.journal.caller,
        )
        .paid_with(order.payment_method())
        .within(self.0.budget)
    }

    pub fn operation_key(&self) -> &OperationKey {
        &self.0.operation_key
    }

    fn charge_state(&self) -> std::sync::MutexGuard<'_, ChargeState> {
        self.0.charge.lock().expect("never poisoned")
    }

    /// Called before the effect's statement (a charge, a refund) is sent: until it
    /// answers, its outcome is unknown. Returns the doubt there was before, for
    /// [`Self::effect_not_sent`].
    pub(crate) fn effect_sending(&self) -> bool {
        std::mem::replace(&mut self.charge_state().in_doubt, true)
    }

    /// The statement provably never reached the database (no connection was had).
    pub(crate) fn effect_not_sent(&self, doubt_before: bool) {
        self.charge_state().in_doubt = doubt_before;
    }

    pub(crate) fn record_charge(&self, receipt: &Receipt) {
        let mut state = self.charge_state();
        state.receipt = Some(receipt.clone());
        state.in_doubt = false;
    }

    /// What this checkout's charge calls saw, without asking the database: the order
    /// charged (the receipt they got back, whichever operation made it), not charged by
    /// them, or unknown (a statement may have taken effect unseen).
    pub fn charge_status(&self) -> ChargeStatus {
        let state = self.charge_state();
        match (&state.receipt, state.in_doubt) {
            (Some(receipt), _) => ChargeStatus::Charged(receipt.clone()),
            (None, false) => ChargeStatus::NotCharged,
            (None, true) => ChargeStatus::Unknown,
        }
    }

    /// Whether the order is charged, and by this checkout, once its retries are over: from
    /// the database, read outside every retried unit (an attempt cut off by a timeout may
    /// have committed its charge unseen); from what the attempts saw when the database
    /// cannot be asked.
    pub async fn charge_report(&self, gateway: &PaymentGateway) -> ChargeReport {
        let order = self.order().id().clone();
        let by_us = |receipt: &Receipt| {
            if self.made(receipt) {
                ChargeStatus::Charged(receipt.clone())
            } else {
                ChargeStatus::NotCharged
            }
        };
        match gateway.receipt(&order).await {
            Ok(Some(receipt)) => ChargeReport {
                this_checkout: by_us(&receipt),
                order: ChargeStatus::Charged(receipt),
                order_id: order,
            },
            Ok(None) => ChargeReport {
                order: ChargeStatus::NotCharged,
                this_checkout: ChargeStatus::NotCharged,
                order_id: order,
            },
            Err(err) => {
                tracing::warn!(error = %err, "cannot ask the database whether the order is charged");
                match self.charge_status() {
                    ChargeStatus::Charged(receipt) => ChargeReport {
                        this_checkout: by_us(&receipt),
                        order: ChargeStatus::Charged(receipt),
                        order_id: order,
                    },
                    // Another operation may have charged it meanwhile.
                    ChargeStatus::NotCharged => ChargeReport {
                        order: ChargeStatus::Unknown,
                        this_checkout: ChargeStatus::NotCharged,
                        order_id: order,
                    },
                    ChargeStatus::Unknown => ChargeReport {
                        order: ChargeStatus::Unknown,
                        this_checkout: ChargeStatus::Unknown,
                        order_id: order,
                    },
                }
            }
        }
    }
}

/// Whether a charge happened, as far as can be told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChargeStatus {
    Charged(Receipt),
    NotCharged,
    /// A charge statement may have taken effect, and the database cannot be asked.
    Unknown,
}

impl ChargeStatus {
    /// `Some(true)`, `Some(false)`, or `None` when unknown.
    pub fn known(&self) -> Option<bool> {
        match self {
            ChargeStatus::Charged(_) => Some(true),
            ChargeStatus::NotCharged => Some(false),
            ChargeStatus::Unknown => None,
        }
    }
}

/// An order's charge after a checkout that did not confirm one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargeReport {
    order_id: OrderId,
    /// The order, charged by any operation.
    pub order: ChargeStatus,
    /// This checkout's part: charged means this operation made the charge.
    pub this_checkout: ChargeStatus,
}

impl ChargeReport {
    /// The order was charged before, by another operation: `receipt`.
    pub fn charged_before(receipt: Receipt) -> ChargeReport {
        ChargeReport {
            order_id: receipt.order_id.clone(),
            order: ChargeStatus::Charged(receipt),
            this_checkout: ChargeStatus::NotCharged,
        }
    }

    /// Nothing was charged: the payment provider ended the attempt.
    pub fn not_charged(order_id: OrderId) -> ChargeReport {
        ChargeReport {
            order_id,
            order: ChargeStatus::NotCharged,
            this_checkout: ChargeStatus::NotCharged,
        }
    }
}

impl fmt::Display for ChargeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let order = &self.order_id;
        match (&self.order, &self.this_checkout) {
            (ChargeStatus::Charged(receipt), _) => {
                write!(f, "order {order} is charged (receipt {})", receipt.id)
            }
            (ChargeStatus::NotCharged, _) => write!(f, "the order was not charged"),
            (ChargeStatus::Unknown, ChargeStatus::NotCharged) => write!(
                f,
                "this checkout charged nothing: none of its charge statements reached the database"
            ),
            (ChargeStatus::Unknown, _) => write!(
                f,
                "whether order {order} was charged is unknown until the database answers (GET /receipts/{order})"
            ),
        }
    }
}

/// The value the loop retry clones: the checkout, and which attempt this is.
#[derive(Clone, Debug)]
pub struct LoopRequest {
    pub ctx: OperationContext,
    /// 1 for the first run of the loop, 2 for the first loop retry, …
    pub attempt: u32,
}
