//! The payment gateway: the one door a charge goes through, the thesis in a signature.
//! [`PaymentGateway::charge`] takes a [`Charge`], which needs a
//! [`ChargeKey`](super::ChargeKey), which only an [`Order`](super::Order) gives (see
//! `keys.rs`). Behind it, the ledger (the receipts table alone) or a payment provider
//! (an intent first, then the provider, then the receipt).

use std::sync::Arc;

use super::keys::{Charge, OperationKey, OrderId, PaymentMethod};
use super::money::{Currency, Money};
use super::store::{
    BudgetLeft, ChargeOutcome, Intent, IntentStatus, Intents, Receipt, Receipts, Refunds,
};
use super::stripe::{PaymentOutcome, ProviderError, Stripe};
use crate::db::StoreError;
use crate::journal::NewEntry;

mod refund;

pub use refund::{RefundError, RefundMade, refund_key};

/// Takes payments. `charge` cannot be called without a [`ChargeKey`](super::ChargeKey),
/// and only a validated [`super::Order`] makes one: the exactly-once contract is in the
/// signature.
///
/// Who moves the money: the ledger (the receipts table is the record, nothing else is
/// asked; the default) or a payment provider (an intent committed first, the provider
/// called with its key and parameters, then the receipt).
#[derive(Clone, Debug)]
pub struct PaymentGateway {
    receipts: Receipts,
    refunds: Refunds,
    provider: Option<Provider>,
}

/// A payment provider: its API, and the attempts sent to it.
#[derive(Clone, Debug)]
struct Provider {
    api: Arc<Stripe>,
    intents: Intents,
}

/// A charge that went through, now or earlier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charged {
    pub receipt: Receipt,
    /// True when this call made the receipt; false when it found the earlier one.
    pub created: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error("order {} was already charged {}, not {asked}", .existing.order_id, .existing.amount)]
    AmountConflict {
        existing: Box<Receipt>,
        asked: Money,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The charge would pass its caller's budget for the day: nothing was charged or
    /// written.
    #[error(
        "the charge would pass the caller's budget for today; {0} is left; nothing was charged"
    )]
    BudgetExceeded(BudgetLeft),
    /// The provider declined the attempt; it is over, recorded with its decline code.
    #[error("the payment provider declined the payment ({decline_code}): {message}")]
    Declined {
        decline_code: String,
        message: String,
        payment_id: Option<String>,
    },
    /// The provider waits for the customer (3-D Secure), which this service does not
    /// complete.
    #[error(
        "the payment needs the customer's action at the payment provider (3-D Secure), payment {payment_id}; completing it is out of scope"
    )]
    RequiresAction { payment_id: String },
    #[error("a payment provider charge needs a paymentMethod; none was given")]
    NoPaymentMethod,
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

impl ChargeError {
    /// This call provably charged nothing: the order is charged another amount, or the
    /// statement never reached the database.
    pub fn charged_nothing(&self) -> bool {
        match self {
            ChargeError::AmountConflict { .. }
            | ChargeError::BudgetExceeded(_)
            | ChargeError::Declined { .. }
            | ChargeError::RequiresAction { .. }
            | ChargeError::NoPaymentMethod => true,
            ChargeError::Store(err) => err.never_sent(),
            ChargeError::Provider(err) => err.charged_nothing(),
        }
    }
}

impl PaymentGateway {
    /// The ledger: the receipts table is the record of charges, nothing else is asked.
    pub fn new(receipts: Receipts) -> Self {
        PaymentGateway {
            refunds: receipts.refunds(),
            receipts,
            provider: None,
        }
    }

    /// Charges through `api`, each attempt an intent in `intents` first.
    pub fn with_provider(receipts: Receipts, intents: Intents, api: Stripe) -> Self {
        PaymentGateway {
            refunds: receipts.refunds(),
            receipts,
            provider: Some(Provider {
                api: Arc::new(api),
                intents,
            }),
        }
    }

    /// Whether a payment provider takes the payments: a checkout then names its payment
    /// method.
    pub fn needs_payment_method(&self) -> bool {
        self.provider.is_some()
    }

    /// Makes `charge`, once. Charging the same order and amount again returns the first
    /// receipt; another amount is refused and changes nothing. `journal`'s entries commit
    /// with the receipt when this call makes it: the assistant's record of the charge's
    /// tool result (`|_| Vec::new()` for none).
    pub async fn charge(
        &self,
        charge: &Charge<'_>,
        journal: impl FnOnce(&Receipt) -> Vec<NewEntry>,
    ) -> Result<Charged, ChargeError> {
        if let Some(provider) = &self.provider {
            let method = charge.method().ok_or(ChargeError::NoPaymentMethod)?;
            // Boxed: the provider's HTTP calls make its future large, and the ledger's
            // path (the default) would carry that size in every checkout.
            return Box::pin(self.charge_provider(provider, charge, method, journal)).await;
        }
        let outcome = self.receipts.charge(charge, None, journal).await?;
        Self::charged(outcome, charge.amount())
    }

    fn charged(outcome: ChargeOutcome, amount: Money) -> Result<Charged, ChargeError> {
        match outcome {
            ChargeOutcome::Created(receipt) => Ok(Charged {
                receipt,
                created: true,
            }),
            ChargeOutcome::Existing(receipt) if receipt.amount == amount => Ok(Charged {
                receipt,
                created: false,
            }),
            ChargeOutcome::Existing(existing) | ChargeOutcome::AmountConflict(existing) => {
                Err(ChargeError::AmountConflict {
                    existing: Box::new(existing),
                    asked: amount,
                })
            }
            ChargeOutcome::OverBudget(left) => Err(ChargeError::BudgetExceeded(left)),
        }
    }

    /// The provider's path: the order's receipt if it has one; else its open attempt,
    /// settled (re-sent with its own key and parameters within the key retention, looked
    /// up after); else a new attempt, committed before the provider is called.
    async fn charge_provider(
        &self,
        provider: &Provider,
        charge: &Charge<'_>,
        method: &PaymentMethod,
        journal: impl FnOnce(&Receipt) -> Vec<NewEntry>,
    ) -> Result<Charged, ChargeError> {
        let (order, amount, operation, caller) = (
            charge.order_id(),
            charge.amount(),
            charge.operation(),
            charge.caller(),
        );
        if let Some(existing) = self.receipts.receipt(order).await? {
            return Self::charged(ChargeOutcome::Existing(existing), amount);
        }
        // A new attempt is sent whatever its age; an open one found is re-sent within the
        // key retention and looked up after it.
        let (intent, fresh) = loop {
            let latest = provider.intents.latest(order).await?;
            match latest {
                Some(open) if open.status.is_open() => break (open, false),
                // This operation's own attempt was declined: the same answer, not a
                // new charge of the card that was just refused.
                Some(ended)
                    if ended.status == IntentStatus::Declined
                        && ended.operation_key == operation.as_str()
                        && ended.caller == caller =>
                {
                    return Err(ChargeError::Declined {
                        decline_code: ended.decline_code.unwrap_or_default(),
                        message: "this checkout's payment was declined".into(),
                        payment_id: ended.provider_payment_id,
                    });
                }
                Some(succeeded) if succeeded.status == IntentStatus::Succeeded => {
                    // Settled by a concurrent run since the receipt was looked for.
                    if let Some(existing) = self.receipts.receipt(order).await? {
                        return Self::charged(ChargeOutcome::Existing(existing), amount);
                    }
                    return Err(StoreError::Corrupt(format!(
                        "attempt {} of order {order} succeeded, and the order has no receipt",
                        succeeded.attempt
                    ))
                    .into());
                }
                ended => {
                    let attempt = ended.map_or(1, |i| i.attempt + 1);
                    let mut intent = Intent {
                        order_id: order.as_str().to_owned(),
                        attempt,
                        amount_minor: amount.minor(),
                        currency: amount.currency().code().to_owned(),
                        payment_method: method.as_str().to_owned(),
                        provider_key: Intent::provider_key(order.as_str(), attempt),
                        operation_key: operation.as_str().to_owned(),
                        caller: caller.to_owned(),
                        status: IntentStatus::Pending,
                        provider_payment_id: None,
                        decline_code: None,
                        age_ms: 0,
                        budget_day: None,
                    };
                    // A caller with a budget reserves the attempt's amount with it.
                    let created = match charge.budget() {
                        Some(limit) => provider
                            .intents
                            .create_within(&mut intent, limit)
                            .await?
                            .map_err(ChargeError::BudgetExceeded)?,
                        None => provider.intents.create(&intent).await?,
                    };
                    if created {
                        tracing::info!(order = %order, attempt, provider_key = %intent.provider_key, "payment intent committed; calling the payment provider");
                        break (intent, true);
                    }
                    // Another run committed this attempt first: settle theirs.
                }
            }
        };
        let outcome = if fresh
            || u128::try_from(intent.age_ms).unwrap_or(0) < provider.api.key_retention().as_millis()
        {
            provider.api.create(&intent).await?
        } else {
            tracing::info!(order = %order, attempt = intent.attempt, age_ms = intent.age_ms, "payment intent older than the provider's key retention: looking the payment up, never sending it again");
            match provider.api.find(&intent).await? {
                Some(outcome) => outcome,
                None => {
                    provider
                        .intents
                        .settle(&intent, IntentStatus::Absent, None, None)
                        .await?;
                    return Err(ProviderError::Absent {
                        attempt: intent.attempt,
                    }
                    .into());
                }
            }
        };
        self.settle(provider, charge, &intent, outcome, journal)
            .await
    }

    /// Records what the provider did with `intent`: the receipt (with the provider's
    /// payment id, and `journal`'s entries when the intent is this operation's and for
    /// this amount), or the ended attempt.
    async fn settle(
        &self,
        provider: &Provider,
        charge: &Charge<'_>,
        intent: &Intent,
        outcome: PaymentOutcome,
        journal: impl FnOnce(&Receipt) -> Vec<NewEntry>,
    ) -> Result<Charged, ChargeError> {
        let (order, amount) = (charge.order_id(), charge.amount());
        match outcome {
            PaymentOutcome::Succeeded { payment_id } => {
                let corrupt = |what: String| {
                    StoreError::Corrupt(format!("intent {}: {what}", intent.provider_key))
                };
                let currency =
                    Currency::parse(&intent.currency).map_err(|e| corrupt(e.to_string()))?;
                let charged = Money::from_minor(intent.amount_minor, currency)
                    .map_err(|e| corrupt(e.to_string()))?;
                let by = OperationKey::from_client(&intent.operation_key)
                    .map_err(|e| corrupt(e.to_string()))?;
                // The receipt is the intent's: its amount, made by its operation.
                let made = Charge::new(charge.key(), charged, &by, &intent.caller);
                let ours = charged == amount
                    && by == *charge.operation()
                    && intent.caller == charge.caller();
                let outcome = self
                    .receipts
                    .charge(&made, Some(&payment_id), |r| {
                        if ours { journal(r) } else { Vec::new() }
                    })
                    .await?;
                provider
                    .intents
                    .settle(intent, IntentStatus::Succeeded, Some(&payment_id), None)
                    .await?;
                tracing::info!(order = %order, attempt = intent.attempt, payment = %payment_id, "payment provider: succeeded");
                let charged = Self::charged(outcome, charged)?;
                if charged.receipt.amount != amount {
                    return Err(ChargeError::AmountConflict {
                        existing: Box::new(charged.receipt),
                        asked: amount,
                    });
                }
                Ok(charged)
            }
            PaymentOutcome::Declined {
                payment_id,
                decline_code,
                message,
            } => {
                provider
                    .intents
                    .settle(
                        intent,
                        IntentStatus::Declined,
                        payment_id.as_deref(),
                        Some(&decline_code),
                    )
                    .await?;
                tracing::info!(order = %order, attempt = intent.attempt, %decline_code, "payment provider: declined; the attempt is over");
                Err(ChargeError::Declined {
                    decline_code,
                    message,
                    payment_id,
                })
            }
            PaymentOutcome::RequiresAction { payment_id } => {
                provider
                    .intents
                    .settle(
                        intent,
                        IntentStatus::RequiresAction,
                        Some(&payment_id),
                        None,
                    )
                    .await?;
                tracing::info!(order = %order, attempt = intent.attempt, payment = %payment_id, "payment provider: requires the customer's action (3-D Secure)");
                Err(ChargeError::RequiresAction { payment_id })
            }
        }
    }

    pub async fn receipt(&self, order: &OrderId) -> Result<Option<Receipt>, StoreError> {
        self.receipts.receipt(order).await
    }
}
