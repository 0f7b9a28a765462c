//! The gateway's refunds: once per operation (the refund key is the operation's), never
//! past what the order was charged; by the ledger alone or through the payment provider.

use super::{PaymentGateway, Provider};
use crate::db::StoreError;
use crate::journal::NewEntry;
use crate::payments::keys::OrderId;
use crate::payments::money::Money;
use crate::payments::store::{NewRefund, Refund, RefundOutcome, RefundStatus, Refunded, Refunds};
use crate::payments::stripe::{ProviderError, RefundAnswer, RefundCall};

/// The provider's Idempotency-Key of a refund: from the operation's key, which the handler
/// made, and its caller (the same Idempotency-Key from two callers is two operations).
pub fn refund_key(caller: &str, operation_key: &str) -> String {
    format!("refund:{caller}:{operation_key}")
}

/// A refund made, now or earlier by the same operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundMade {
    pub refund: Refund,
    /// True when this call made it; false when it found this operation's earlier one.
    pub created: bool,
    /// The journal's entries committed with it (this call made it, or recorded the
    /// provider's answer of a refund an earlier run left pending).
    pub journaled: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RefundError {
    /// The refund would pass what the order was charged: nothing was refunded.
    #[error("refunding {asked} would pass what order {order} was charged ({} of {} is left); nothing was refunded", .state.left_decimal(), .state.charged)]
    Exceeds {
        order: OrderId,
        asked: Money,
        state: Refunded,
    },
    #[error("order {0} has no receipt: it has not been charged")]
    NotCharged(OrderId),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The provider refused the refund; its amount was given back to the charge.
    #[error("the payment provider refused the refund ({code}): {message}")]
    Refused { code: String, message: String },
}

impl RefundError {
    /// A repeat could go through: the database or the provider gave no answer.
    pub fn is_transient(&self) -> bool {
        match self {
            RefundError::Store(err) => err.is_transient(),
            RefundError::Provider(err) => err.is_transient(),
            _ => false,
        }
    }
}

impl PaymentGateway {
    /// The refunds, to read.
    pub fn refunds(&self) -> &Refunds {
        &self.refunds
    }

    /// Makes `refund`, once per operation, never past what the order was charged.
    /// `journal`'s entries commit with the refund when this call makes it (with a
    /// provider: when its answer is recorded).
    pub async fn refund(
        &self,
        refund: &NewRefund<'_>,
        journal: impl FnOnce(&Refund) -> Vec<NewEntry>,
    ) -> Result<RefundMade, RefundError> {
        if let Some(provider) = &self.provider {
            return Box::pin(self.refund_provider(provider, refund, journal)).await;
        }
        let refund = NewRefund {
            status: RefundStatus::Succeeded,
            ..refund.clone()
        };
        Self::refunded(&refund, self.refunds.refund(&refund, journal).await?)
    }

    /// The provider's path: the refund reserved against the charge and committed
    /// `pending` first (so two concurrent refunds can never both reach the provider past
    /// the charge), then sent under the refund key (`refund:` + caller + operation key,
    /// from the handler's key, the same on every retry and resume), then recorded with
    /// the provider's id and the journal's entries; refused, its amount is given back.
    async fn refund_provider(
        &self,
        provider: &Provider,
        refund: &NewRefund<'_>,
        journal: impl FnOnce(&Refund) -> Vec<NewEntry>,
    ) -> Result<RefundMade, RefundError> {
        let receipt = self
            .receipts
            .receipt(refund.order_id)
            .await?
            .ok_or_else(|| RefundError::NotCharged(refund.order_id.clone()))?;
        let Some(payment_intent) = receipt.provider_payment_id.clone() else {
            return Err(RefundError::Refused {
                code: "no_provider_payment".into(),
                message: format!(
                    "order {} was charged by the ledger, not the payment provider: there is no payment to refund there",
                    refund.order_id
                ),
            });
        };
        let pending = NewRefund {
            status: RefundStatus::Pending,
            ..refund.clone()
        };
        let made = Self::refunded(refund, self.refunds.refund(&pending, |_| Vec::new()).await?)?;
        let row = made.refund;
        match row.status {
            RefundStatus::Succeeded => {
                return Ok(RefundMade {
                    refund: row,
                    created: false,
                    journaled: false,
                });
            }
            RefundStatus::Failed => {
                return Err(RefundError::Refused {
                    code: "refused".into(),
                    message: "this operation's refund was refused by the payment provider".into(),
                });
            }
            RefundStatus::Pending => {}
        }
        let key = refund_key(&row.caller, &row.operation_key);
        let call = RefundCall {
            key: &key,
            payment_intent: &payment_intent,
            amount_minor: row.amount.minor(),
            order_id: row.order_id.as_str(),
        };
        if made.created {
            tracing::info!(order = %row.order_id, refund_key = %key, "refund reserved against the charge; calling the payment provider");
        }
        // A pending refund an earlier run left (it died, or lost the answer) is looked up
        // first: listed, it is settled without a request; not listed, it is sent under its
        // key. A key the provider no longer keeps (Stripe: 24 h) cannot refund twice then.
        let listed = match made.created {
            true => None,
            false => provider.api.find_refund(&call).await?,
        };
        let answer = match listed {
            Some(answer) => answer,
            None => provider.api.refund(&call).await?,
        };
        match answer {
            RefundAnswer::Made { refund_id } => {
                let mut done = row.clone();
                done.status = RefundStatus::Succeeded;
                done.provider_refund_id = Some(refund_id.clone());
                let entries = journal(&done);
                let journaled = self
                    .refunds
                    .settle(&row, RefundStatus::Succeeded, Some(&refund_id), &entries)
                    .await?;
                tracing::info!(order = %row.order_id, refund = %refund_id, "payment provider: refunded");
                // Made by this call when it reserved the refund; a run that settled an
                // earlier run's pending refund found it.
                Ok(RefundMade {
                    refund: done,
                    created: made.created,
                    journaled,
                })
            }
            RefundAnswer::Refused { code, message } => {
                self.refunds
                    .settle(&row, RefundStatus::Failed, None, &[])
                    .await?;
                tracing::info!(order = %row.order_id, %code, "payment provider: refund refused; its amount is given back to the charge");
                Err(RefundError::Refused { code, message })
            }
        }
    }

    fn refunded(asked: &NewRefund<'_>, outcome: RefundOutcome) -> Result<RefundMade, RefundError> {
        match outcome {
            RefundOutcome::Created(refund) => Ok(RefundMade {
                refund,
                created: true,
                journaled: true,
            }),
            RefundOutcome::Existing(refund) => Ok(RefundMade {
                refund,
                created: false,
                journaled: false,
            }),
            RefundOutcome::Exceeds(state) => Err(RefundError::Exceeds {
                order: asked.order_id.clone(),
                asked: asked.amount,
                state,
            }),
            RefundOutcome::NotCharged => Err(RefundError::NotCharged(asked.order_id.clone())),
        }
    }
}
