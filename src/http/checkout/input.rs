//! What a checkout request says: the order, given once, in the query string, checked
//! field by field; and the answer format the client asked for.

use serde::Deserialize;
use utoipa::IntoParams;
use utoipa::openapi::Required;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::Schema;

use crate::http::error::Problem;
use crate::http::schema;
use crate::outbox::Recipient;
use crate::payments::{Currency, Money, Order, OrderId, PaymentMethod};

/// The order to charge, as query parameters (as in the article:
/// `POST /checkout?orderId=A-100&amount=42.50`): the one place a checkout names it, so
/// each field is given once. Every field is optional to serde: a missing one is the
/// handler's 400 naming the field, not the query parser's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckoutQuery {
    #[serde(rename = "orderId")]
    pub(crate) order_id: Option<String>,
    pub(crate) amount: Option<String>,
    pub(crate) currency: Option<String>,
    pub(crate) email: Option<String>,
    #[serde(rename = "paymentMethod")]
    pub(crate) payment_method: Option<String>,
}

impl CheckoutQuery {
    /// The order as an AG-UI run's `state` names it (`POST /agui`).
    pub(crate) fn of_order(
        order_id: Option<String>,
        amount: Option<String>,
        currency: Option<String>,
    ) -> CheckoutQuery {
        CheckoutQuery {
            order_id,
            amount,
            currency,
            email: None,
            payment_method: None,
        }
    }
}

/// Written out rather than derived: the derive drops `required` and the description of
/// a field whose schema is built by a function, and each schema here is built from its
/// parser's constants ([`schema`]).
impl IntoParams for CheckoutQuery {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let query =
            |name: &str, required: bool, description: &str, schema: Schema, example: &str| {
                let required = if required {
                    Required::True
                } else {
                    Required::False
                };
                ParameterBuilder::new()
                    .name(name)
                    .parameter_in(ParameterIn::Query)
                    .required(required)
                    .description(Some(description))
                    .schema(Some(schema))
                    .example(Some(example.into()))
                    .build()
            };
        vec![
            query(
                "orderId",
                true,
                schema::ORDER_ID,
                schema::order_id(),
                "A-100",
            ),
            query(
                "amount",
                true,
                &schema::amount_description(schema::default_max_amount()),
                schema::amount(),
                "42.50",
            ),
            query(
                "currency",
                false,
                "The currency, an ISO 4217 code; `USD` when not given.",
                schema::currency(),
                "USD",
            ),
            query(
                "email",
                false,
                &schema::email_description(),
                schema::email(),
                "ann@example.com",
            ),
            query(
                "paymentMethod",
                false,
                "The payment provider's payment method (`pm_…`, e.g. `pm_card_visa`): required with a payment provider (`CHECKOUT_PAYMENT_PROVIDER=stripe`), optional with the ledger.",
                schema::payment_method(),
                "pm_card_visa",
            ),
        ]
    }
}

/// The order the query names, field by field. `needs_method`: a payment provider takes
/// the payment.
pub(crate) fn order(
    query: CheckoutQuery,
    max_amount: u64,
    needs_method: bool,
) -> Result<Order, Problem> {
    let order_id = query
        .order_id
        .ok_or_else(|| Problem::invalid("orderId", "orderId is required"))?;
    let order_id = OrderId::parse(&order_id)
        .map_err(|err| Problem::invalid("orderId", format!("orderId {err}")))?;
    let currency = match query.currency {
        Some(code) => Currency::parse(&code)
            .map_err(|err| Problem::invalid("currency", format!("currency: {err}")))?,
        None => Currency::USD,
    };
    let amount = query
        .amount
        .ok_or_else(|| Problem::invalid("amount", "amount is required"))?;
    let amount = Money::parse(&amount, currency)
        .and_then(|m| m.at_most(max_amount))
        .map_err(|err| Problem::invalid("amount", format!("amount {err}")))?;
    let method = query
        .payment_method
        .map(|m| PaymentMethod::parse(&m))
        .transpose()
        .map_err(|err| Problem::invalid("paymentMethod", format!("paymentMethod {err}")))?;
    if needs_method && method.is_none() {
        return Err(Problem::invalid(
            "paymentMethod",
            "paymentMethod is required with the payment provider (a pm_… id, e.g. pm_card_visa)",
        ));
    }
    // The one place an Order is made (clippy.toml): from the client's request, checked.
    #[allow(clippy::disallowed_methods, reason = "the handler's validation")]
    let order = Order::new(order_id, amount);
    Ok(order.with_payment_method(method))
}

/// The customer's address, if the query names one.
pub(crate) fn recipient(query: Option<String>) -> Result<Option<Recipient>, Problem> {
    query
        .map(|text| {
            Recipient::parse(&text).map_err(|err| Problem::invalid("email", format!("email {err}")))
        })
        .transpose()
}
