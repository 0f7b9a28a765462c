//! `POST /agui`: a checkout for AG-UI clients (`@ag-ui/client`'s `HttpAgent`). The run
//! input's `threadId` is the operation (its Idempotency-Key), the order is its `state`
//! (`orderId`, `amount`, `currency`), never the conversation's text; a run whose
//! `resume` answers the approval's interrupt is that decision (docs/streaming.md).

use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::schema::{
    ArrayBuilder, KnownFormat, ObjectBuilder, OneOfBuilder, Schema, SchemaFormat, Type,
};
use uuid::Uuid;

use super::approvals;
use super::auth::require;
use super::checkout::{self, CheckoutErrors, CheckoutQuery};
use super::error::{Code, Problem};
use super::extract::Format;
use super::schema;
use super::state::AppState;
use super::stream::{self, Finish, Position, Tail};
use crate::caller::{Caller, Scope};
use crate::payments::OperationKey;

/// The fields of AG-UI's `RunAgentInput` the service reads; the others (`messages`,
/// `tools`, `context`, `forwardedProps`) are accepted and not read.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    /// The operation: its Idempotency-Key.
    #[schema(schema_with = thread_id)]
    pub thread_id: String,
    #[schema(example = "run-1")]
    pub run_id: String,
    /// The order: `{"orderId": "A-100", "amount": "42.50", "currency": "USD"}` (strings,
    /// as the query parameters of `POST /checkout`).
    #[schema(schema_with = order_state)]
    pub state: OrderState,
    /// Answers to the interrupt that ended the thread's last run: one, the approval's.
    #[serde(default)]
    #[schema(schema_with = resume_entries)]
    pub resume: Option<Vec<ResumeEntry>>,
}

/// The order in a run's `state` (its schema is `order_state`); other fields are not
/// read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderState {
    #[serde(default, deserialize_with = "text")]
    pub order_id: Option<String>,
    #[serde(default, deserialize_with = "text")]
    pub amount: Option<String>,
    #[serde(default, deserialize_with = "text")]
    pub currency: Option<String>,
}

/// A field that is a string when present: `null` is refused, as the schema says.
fn text<'de, D: serde::Deserializer<'de>>(field: D) -> Result<Option<String>, D::Error> {
    String::deserialize(field).map(Some)
}

/// The error answers of `POST /agui`: the checkout's, and a resume's interrupt unknown.
pub struct AguiErrors;

impl utoipa::IntoResponses for AguiErrors {
    fn responses()
    -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
        let mut responses = CheckoutErrors::responses();
        responses.extend(super::error::documented([(
            "`not_found`: the resume answers no interrupt of this thread",
            vec![Problem::new(
                Code::NotFound,
                "thread \"order-A-100\" has no interrupt 0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f",
            )],
        )]));
        responses
    }
}

/// AG-UI's `ResumeEntry` (its schema is `resume_entries`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    /// The interrupt answered: the approval's id.
    pub interrupt_id: String,
    /// `resolved` or `cancelled` (a denial).
    pub status: String,
    /// `{"approve": true}`, or `{"approve": false, "reason": "…"}`.
    #[serde(default)]
    pub payload: Value,
}

/// A thread id, as [`OperationKey::from_client`] takes it: 1 to its most characters of
/// printable ASCII.
fn thread_id() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(OperationKey::MAX_LEN))
        .pattern(Some("^[ -~]*$"))
        .description(Some("The operation: its Idempotency-Key"))
        .examples([serde_json::json!("order-A-100")])
        .into()
}

/// The order in a run's `state`, with the schemas of `POST /checkout`'s parameters.
fn order_state() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("orderId", schema::order_id())
        .property("amount", schema::amount())
        .property("currency", schema::currency())
        .required("orderId")
        .required("amount")
        .description(Some("The order; other fields are not read"))
        .into()
}

/// At most one entry, answering the approval's interrupt: resolved with a decision, or
/// cancelled (a denial).
fn resume_entries() -> Schema {
    let interrupt = || {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
            .description(Some("The approval's id (the interrupt's id)"))
    };
    let status = |value: &str| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some([value]))
    };
    let resolved = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("interruptId", interrupt())
        .property("status", status("resolved"))
        .property(
            "payload",
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property("approve", ObjectBuilder::new().schema_type(Type::Boolean))
                .property(
                    "reason",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .max_length(Some(500)),
                )
                .required("approve"),
        )
        .required("interruptId")
        .required("status")
        .required("payload");
    let cancelled = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("interruptId", interrupt())
        .property("status", status("cancelled"))
        .required("interruptId")
        .required("status");
    ArrayBuilder::new()
        .items(OneOfBuilder::new().item(resolved).item(cancelled))
        .max_items(Some(1))
        .into()
}

#[utoipa::path(
    post,
    path = "/agui",
    operation_id = "runAgent",
    tag = "checkout",
    summary = "Run a checkout as an AG-UI agent",
    description = "AG-UI's `RunAgentInput` (docs/streaming.md): `threadId` is the operation's Idempotency-Key, `state` the order (`orderId`, `amount`, `currency`; the conversation's text is never read for it). Answers the operation's steps as AG-UI events (`text/event-stream`), as `POST /checkout` with `Accept: text/event-stream` does (scope `checkout`). A run whose `resume` answers the approval's interrupt (`resolved` with `{\"approve\": true}` or `{\"approve\": false, \"reason\"}`; `cancelled` denies) is that decision (scope `approve`), and streams the rest of the operation.",
    request_body(content = RunAgentInput, content_type = "application/json"),
    security(("api_key" = ["checkout"]), ("api_key" = ["approve"])),
    responses(
        (status = 200, description = "The run's events", content_type = "text/event-stream", body = stream::StreamEvent),
        AguiErrors,
    )
)]
pub async fn run(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Response {
    let input: RunAgentInput = match serde_json::from_slice(&body) {
        Ok(input) => input,
        Err(err) => {
            return Problem::invalid("body", format!("the body is not a RunAgentInput: {err}"))
                .into_response();
        }
    };
    let key = match OperationKey::from_client(&input.thread_id) {
        Ok(key) => key,
        Err(err) => return Problem::invalid("threadId", err.to_string()).into_response(),
    };
    match input.resume {
        Some(entries) if !entries.is_empty() => {
            Box::pin(decide(app, caller, key, input.run_id, entries)).await
        }
        _ => {
            if let Some(refusal) = require(&caller, Scope::Checkout) {
                return refusal;
            }
            let OrderState {
                order_id,
                amount,
                currency,
            } = input.state;
            let query = CheckoutQuery::of_order(order_id, amount, currency);
            checkout::start(
                app,
                caller,
                Format::Json,
                Some(key),
                query,
                Some(input.run_id),
            )
            .await
        }
    }
}

/// The decision a resume entry is, and the rest of the operation as a new run.
async fn decide(
    app: AppState,
    caller: Caller,
    key: OperationKey,
    run_id: String,
    entries: Vec<ResumeEntry>,
) -> Response {
    if let Some(refusal) = require(&caller, Scope::Approve) {
        return refusal;
    }
    let Ok([entry]) = <[ResumeEntry; 1]>::try_from(entries) else {
        return Problem::invalid("resume", "one resume entry: the approval's interrupt")
            .into_response();
    };
    let approve = match (
        entry.status.as_str(),
        entry.payload.get("approve").and_then(Value::as_bool),
    ) {
        ("resolved", Some(approve)) => approve,
        ("cancelled", _) => false,
        _ => {
            return Problem::invalid(
                "resume",
                "a resume entry is resolved with {\"approve\": true|false} or cancelled",
            )
            .into_response();
        }
    };
    let Ok(id) = Uuid::parse_str(&entry.interrupt_id) else {
        return Problem::invalid("resume", "the interrupt's id is the approval's id (a UUID)")
            .into_response();
    };
    let approval = match app.approvals().get(id).await {
        Ok(Some(approval)) if approval.operation_key == key.as_str() => approval,
        Ok(_) => {
            return Problem::new(
                Code::NotFound,
                format!("thread {:?} has no interrupt {id}", key.as_str()),
            )
            .into_response();
        }
        Err(err) => {
            return Problem::unavailable(format!("cannot read the approval: {err}"))
                .into_response();
        }
    };
    // The new run goes on from the interrupt: it restates the answer that asked for the
    // waiting call (its TOOL_CALL_START, ARGS and END, the same toolCallId), so that the
    // run is whole on its own, then what comes after.
    let after = match crate::journal::read(app.db(), &approval.caller, key.as_str()).await {
        Ok(entries) => match entries.last() {
            Some(entry) if entry.kind == "answer" => Position {
                step: entry.step,
                sub: 0,
            },
            Some(entry) => Position {
                step: entry.step,
                sub: i64::MAX,
            },
            None => Position::default(),
        },
        Err(err) => {
            return Problem::unavailable(format!("cannot read the operation: {err}"))
                .into_response();
        }
    };
    let tail = Tail {
        after: Some(after),
        announce: true,
        ..Tail::new(&app, &approval.caller, key.as_str(), run_id)
    };

    if approve {
        // Watched while the approved run goes on: its closing sentence is streamed live.
        let watched = app.live().open(&approval.caller, key.as_str());
        let run = tokio::spawn(async move {
            let _watched = watched;
            approvals::decide::approve(&app, &caller, id).await
        });
        return stream::respond(tail, Finish::Task(run));
    }
    let reason = (entry.payload.get("reason").and_then(Value::as_str)).map(str::to_owned);
    let denied = approvals::decide::deny(&app, &caller, id, reason).await;
    if !denied.status().is_success() {
        return denied;
    }
    stream::respond(tail, Finish::Record)
}
