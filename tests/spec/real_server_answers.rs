//! What real OpenAI-compatible servers send, replayed by the scripted model: answers
//! recorded from llama.cpp's `llama-server` (`tests/fixtures/llama-server/`, whose README
//! has the command that recorded each), and the forms other servers use, as quirks of the
//! fault plan. Each test states the answer, the receipts and the model requests it expects.

use crate::common::{Backend, Harness, Reply};

const RECORDED: &str = "tests/fixtures/llama-server";

async fn checkout(plan: &str) -> (Harness, Reply) {
    let h = Harness::with(Backend::Sqlite, plan, |_| {}).await;
    let reply = h.checkout("A-100", "42.50").await;
    (h, reply)
}

/// The scripted model's confirmation, as the service passes it on.
fn confirmed(reply: &Reply) -> String {
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["charged"], true, "{body}");
    let message = body["message"].as_str().unwrap().to_owned();
    assert_eq!(
        message,
        format!(
            "Your payment of 42.50 USD for order A-100 went through; your receipt is {}.",
            body["receipt"]["id"].as_str().unwrap()
        )
    );
    message
}

#[tokio::test]
async fn a_recorded_llama_server_checkout_charges_once() {
    let (h, reply) = checkout(&format!(
        "replay={RECORDED}/tool-call.http@1,replay={RECORDED}/final-answer.http@2"
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["charged"], true);
    // The recorded sentence, passed on as the model wrote it (its receipt id is the one
    // in the recorded conversation, not this checkout's).
    assert_eq!(
        body["message"],
        "The order A-100 was charged for a total of $42.50, with a receipt ID of 01a2388c-6f56-70a8-8b09-bdea56c0abad."
    );
    assert_eq!(h.db.receipts("A-100").await, 1);
    assert_eq!(h.db.all_receipts().await, 1);
    assert_eq!(h.model.requests(), 2);
}

#[tokio::test]
async fn a_recorded_401_with_a_numeric_code_reads_once() {
    let (h, reply) = checkout(&format!("replay={RECORDED}/unauthorized.http")).await;
    let problem = reply.problem(502);
    assert_eq!(problem["code"], "model_error");
    assert_eq!(problem["upstreamStatus"], 401);
    assert_eq!(problem["requestAttempts"], 1, "a 401 is not retried");
    assert_eq!(problem["attempts"], 1, "nor is the loop");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("the model provider answered 401: Invalid API Key;"),
        "{detail}"
    );
    assert_eq!(h.model.requests(), 1);
    assert_eq!(h.db.all_receipts().await, 0);
}

#[tokio::test]
async fn empty_content_beside_tool_calls_charges_once() {
    let (h, reply) = checkout("empty-content").await;
    confirmed(&reply);
    assert_eq!(h.db.receipts("A-100").await, 1);
    assert_eq!(h.model.requests(), 2);
}

#[tokio::test]
async fn text_before_a_tool_call_charges_once_and_is_not_the_confirmation() {
    let (h, reply) = checkout("text-before-call").await;
    confirmed(&reply);
    assert_eq!(h.db.receipts("A-100").await, 1);
    assert_eq!(h.model.requests(), 2);
}

#[tokio::test]
async fn finish_reason_stop_beside_tool_calls_still_runs_them() {
    let (h, reply) = checkout("finish-stop").await;
    confirmed(&reply);
    assert_eq!(h.db.receipts("A-100").await, 1);
    assert_eq!(h.model.requests(), 2);
}

#[tokio::test]
async fn finish_reason_tool_calls_without_calls_is_the_final_answer() {
    let (h, reply) = checkout("finish-tool-calls").await;
    confirmed(&reply);
    assert_eq!(h.db.receipts("A-100").await, 1);
    assert_eq!(h.model.requests(), 2);
}

#[tokio::test]
async fn finish_reason_tool_calls_without_calls_before_a_charge_is_nudged_as_text() {
    let (h, reply) = checkout("finish-tool-calls,no-charge@1").await;
    confirmed(&reply);
    // Round 1 ended without a call (whatever its finish_reason said) and was nudged;
    // round 2 charged; round 3 confirmed.
    assert_eq!(h.model.requests(), 3);
    assert_eq!(h.db.receipts("A-100").await, 1);
}

#[tokio::test]
async fn arguments_as_a_json_object_charge_once() {
    let (h, reply) = checkout("object-arguments").await;
    confirmed(&reply);
    assert_eq!(h.db.receipts("A-100").await, 1);
    assert_eq!(h.model.requests(), 2);
}

#[tokio::test]
async fn one_tool_call_id_for_two_calls_in_an_answer_charges_once() {
    let (h, reply) = checkout("same-id,double-charge@1").await;
    confirmed(&reply);
    assert_eq!(h.db.receipts("A-100").await, 1);
    assert_eq!(h.model.requests(), 2);
}

#[tokio::test]
async fn one_tool_call_id_in_every_answer_charges_once() {
    let (h, reply) = checkout("same-id,recharge@2").await;
    confirmed(&reply);
    assert_eq!(
        h.db.receipts("A-100").await,
        1,
        "two charge calls, one charge"
    );
    assert_eq!(h.model.requests(), 3);
}
