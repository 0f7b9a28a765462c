//! The checkout streamed as AG-UI events (docs/streaming.md): the same operation, its
//! journal's steps as events with their places as ids, its answer as the last event; a
//! stream cut and resumed with `Last-Event-ID`, on another instance, replays what the
//! journal holds and never runs the loop or the charge again.

use std::time::Duration;

use checkout::config::Settings;
use checkout::payments::PerCurrency;
use serde_json::Value;

use crate::common::Instance;
use crate::common::{Backend, Harness, TestDb, client, scripted, test_settings};

/// One event as received: its `id` (if any) and its JSON.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: Option<String>,
    pub data: Value,
}

impl Received {
    pub fn kind(&self) -> &str {
        self.data["type"].as_str().unwrap_or_default()
    }
}

/// The complete events in `text` (SSE: blocks ended by a blank line; comments skipped),
/// and what is left of an unfinished one.
pub fn parse(text: &str) -> (Vec<Received>, String) {
    let text = text.replace("\r\n", "\n");
    let mut events = Vec::new();
    let mut rest = text.as_str();
    while let Some(end) = rest.find("\n\n") {
        let block = &rest[..end];
        rest = &rest[end + 2..];
        let (mut id, mut data) = (None, String::new());
        for line in block.lines() {
            if let Some(value) = line.strip_prefix("id:") {
                id = Some(value.trim_start().to_owned());
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push_str(value.trim_start());
            }
        }
        if !data.is_empty() {
            events.push(Received {
                id,
                data: serde_json::from_str(&data).expect("each event's data is JSON"),
            });
        }
    }
    (events, rest.to_owned())
}

/// Reads a stream to its end.
pub async fn read_all(response: reqwest::Response) -> Vec<Received> {
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let text = response.text().await.expect("the stream reads");
    let (events, rest) = parse(&text);
    assert_eq!(rest.trim(), "", "the stream ends with a whole event");
    events
}

/// The events with each run of a message's `TEXT_MESSAGE_CONTENT`s as one (its deltas
/// joined, the last one's id): a sentence sent live, piece by piece as the model writes
/// it (docs/streaming.md, "Live text"), reads as the journal's one content event.
pub fn fold(events: Vec<Received>) -> Vec<Received> {
    let mut folded: Vec<Received> = Vec::new();
    for event in events {
        if let Some(last) = folded.last_mut()
            && last.kind() == "TEXT_MESSAGE_CONTENT"
            && event.kind() == "TEXT_MESSAGE_CONTENT"
            && last.data["messageId"] == event.data["messageId"]
        {
            let delta = format!(
                "{}{}",
                last.data["delta"].as_str().unwrap(),
                event.data["delta"].as_str().unwrap()
            );
            last.data["delta"] = Value::String(delta);
            last.id = event.id;
            continue;
        }
        folded.push(event);
    }
    folded
}

/// Reads a stream until `stop` holds for an event, then drops it: the client goes away.
async fn read_until(
    mut response: reqwest::Response,
    stop: impl Fn(&Received) -> bool,
) -> Vec<Received> {
    let (mut text, mut received) = (String::new(), Vec::new());
    while let Some(chunk) = response.chunk().await.expect("the stream reads") {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        let (events, rest) = parse(&text);
        text = rest;
        for event in events {
            let done = stop(&event);
            received.push(event);
            if done {
                return received;
            }
        }
    }
    panic!("the stream ended before the event awaited: {received:?}");
}

fn kinds(events: &[Received]) -> Vec<String> {
    events.iter().map(|e| e.kind().to_owned()).collect()
}

fn ids(events: &[Received]) -> Vec<Option<String>> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// The service, the model following `faults`; on Postgres with a second instance on the
/// same database (SQLite allows one instance per file: there, the same one).
async fn service(
    backend: Backend,
    faults: &str,
    tune: impl Fn(&mut Settings),
) -> (Harness, String) {
    let db = TestDb::new(backend).await;
    let model = scripted(faults).await;
    let mut settings = test_settings(&db, &model);
    tune(&mut settings);
    let second = match backend {
        Backend::Postgres => Some(Instance::start(settings.clone()).await),
        Backend::Sqlite => None,
    };
    let h = Harness::serve(db, model, settings).await;
    let other = match second {
        Some(second) => {
            let base = second.base.clone();
            std::mem::forget(second);
            base
        }
        None => h.base.clone(),
    };
    (h, other)
}

fn streamed(h: &Harness, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
    let request = h
        .http
        .post(h.url(path))
        .header("accept", "text/event-stream");
    match key {
        Some(key) => request.header("idempotency-key", key),
        None => request,
    }
}

const ONE_CHECKOUT: [&str; 10] = [
    "RUN_STARTED",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "RUN_FINISHED",
    "",
];

// Seen failing: without the `stream::wanted` branch in the checkout handler the answer is
// the JSON form (content type application/json, no events).
both_backends!(
    a_streamed_checkout_sends_its_steps_and_ends_with_the_json_answer,
    |backend| async move {
        let (h, _) = service(backend, "", |_| {}).await;
        let events = fold(
            read_all(
                streamed(&h, "/checkout?orderId=S-1&amount=12.50", Some("stream-1"))
                    .send()
                    .await
                    .unwrap(),
            )
            .await,
        );
        assert_eq!(kinds(&events), ONE_CHECKOUT[..9].to_vec());
        // The closing sentence is sent live as the model writes it: its start and its
        // pieces have no id (tests/spec/provider_stream.rs); its end is the journal's 3.3.
        let expected_ids: Vec<Option<String>> = [
            Some("0"),
            Some("1.1"),
            Some("1.2"),
            Some("1.3"),
            Some("2"),
            None,
            None,
            Some("3.3"),
            None,
        ]
        .iter()
        .map(|id| id.map(str::to_owned))
        .collect();
        assert_eq!(
            ids(&events),
            expected_ids,
            "each journaled event's id is its place in the journal; the answer has none"
        );
        assert_eq!(events[0].data["threadId"], "stream-1");
        assert_eq!(events[1].data["toolCallName"], "charge");
        let call = events[1].data["toolCallId"].clone();
        assert_eq!(events[4].data["toolCallId"], call);
        let finished = &events[8].data;
        assert_eq!(finished["outcome"]["type"], "success");
        let result = &finished["result"];
        assert_eq!(result["orderId"], "S-1");
        assert_eq!(result["charged"], true);
        assert_eq!(result["operationKey"], "stream-1");
        assert_eq!(
            events[6].data["delta"], result["message"],
            "the closing sentence is the answer's message"
        );
        assert_eq!(h.db.receipts("S-1").await, 1);
        assert_eq!(h.model.requests(), 2);
        // The same key asked again (JSON) answers the saved answer: the one the stream ended with.
        let again = h
            .post(
                "/checkout?orderId=S-1&amount=12.50",
                &[("idempotency-key", "stream-1")],
                None,
            )
            .await;
        assert_eq!(again.status, 200);
        assert_eq!(&again.json(), result);
        assert_eq!(h.model.requests(), 2);
    }
);

// Seen failing: with the keyless streamed checkout left unkeyed (the `streamed` term
// dropped from the key's `or_else`), it takes the unkeyed path, whose steps are not
// durable, and answers JSON, not events.
both_backends!(
    a_keyless_streamed_checkout_is_keyed_and_its_operation_found,
    |backend| async move {
        let (h, _) = service(backend, "", |_| {}).await;
        let events = fold(
            read_all(
                streamed(&h, "/checkout?orderId=S-2&amount=3.00", None)
                    .send()
                    .await
                    .unwrap(),
            )
            .await,
        );
        assert_eq!(kinds(&events), ONE_CHECKOUT[..9].to_vec());
        let key = events[0].data["threadId"].as_str().unwrap().to_owned();
        assert_eq!(events[8].data["result"]["operationKey"], key.as_str());
        let operation = h.get(&format!("/operations/{key}")).await;
        assert_eq!(operation.status, 200);
        assert_eq!(&operation.json(), &events[8].data["result"]);
        assert_eq!(h.db.receipts("S-2").await, 1);
    }
);

// Seen failing: with `Last-Event-ID` ignored (`after: None`), the resumed stream starts
// again from RUN_STARTED and the events before the cut come twice.
both_backends!(
    a_stream_cut_after_the_charge_resumes_on_the_other_instance_without_running_again,
    |backend| async move {
        // The closing sentence is slow to come: the stream is cut while the loop waits for it.
        let (h, other) = service(backend, "slow=600@2", |s| {
            s.model_request.timeout = Duration::from_millis(2_000);
        })
        .await;
        let response = streamed(&h, "/checkout?orderId=S-3&amount=20.00", Some("stream-3"))
            .send()
            .await
            .unwrap();
        let before = read_until(response, |e| e.kind() == "TOOL_CALL_RESULT").await;
        let last_id = before.last().unwrap().id.clone().unwrap();
        assert_eq!(last_id, "2");
        let after = read_all(
            client()
                .get(format!("{other}/operations/stream-3/events"))
                .header("last-event-id", &last_id)
                .send()
                .await
                .unwrap(),
        )
        .await;
        // Resumed on the same instance (SQLite) the sentence comes live, on the other
        // (Postgres) from the journal: folded, the same events.
        let all: Vec<Received> = fold(before.into_iter().chain(after).collect());
        assert_eq!(
            kinds(&all),
            ONE_CHECKOUT[..9].to_vec(),
            "every event once, in order"
        );
        assert_eq!(all[8].data["result"]["charged"], true);
        assert_eq!(h.db.receipts("S-3").await, 1);
        assert_eq!(
            h.model.requests(),
            2,
            "the model asked once per step, never again for a journaled one"
        );
        // Resumed again after the end: the same answer, still nothing run.
        let replay = read_all(
            client()
                .get(format!("{other}/operations/stream-3/events"))
                .header("last-event-id", "3.3")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(kinds(&replay), vec!["RUN_FINISHED"]);
        assert_eq!(replay[0].data["result"], all[8].data["result"]);
        assert_eq!(h.db.receipts("S-3").await, 1);
        assert_eq!(h.model.requests(), 2);
    }
);

// Seen failing: with `events::last` mapping every non-200 to RUN_ERROR, the pause ends
// the run with RUN_ERROR and no interrupt.
both_backends!(
    a_checkout_paused_for_approval_ends_its_run_with_the_interrupt,
    |backend| async move {
        let (h, _) = service(backend, "", |s| {
            s.payments.approval_above = PerCurrency::parse("USD:100.00").unwrap();
        })
        .await;
        let events = read_all(
            streamed(&h, "/checkout?orderId=S-4&amount=500.00", Some("stream-4"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            kinds(&events),
            vec![
                "RUN_STARTED",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "RUN_FINISHED"
            ]
        );
        let outcome = &events[4].data["outcome"];
        assert_eq!(outcome["type"], "interrupt");
        let interrupts = outcome["interrupts"].as_array().unwrap();
        assert_eq!(interrupts.len(), 1);
        let paused = h.get("/operations/stream-4").await;
        assert_eq!(paused.status, 202);
        let approval = &paused.json()["approval"];
        assert_eq!(interrupts[0]["id"], approval["id"]);
        assert_eq!(interrupts[0]["expiresAt"], approval["expiresAt"]);
        assert_eq!(interrupts[0]["reason"], "approval_required");
        assert_eq!(interrupts[0]["toolCallId"], events[1].data["toolCallId"]);
        assert_eq!(h.db.receipts("S-4").await, 0);
    }
);

// Seen failing: with a problem mapped as a RUN_FINISHED (`last`'s error arm made to say
// RUN_FINISHED), the failed checkout's stream ended in RUN_FINISHED.
both_backends!(
    a_failed_checkout_ends_its_run_with_run_error_and_the_problem,
    |backend| async move {
        // A model that never charges: the checkout fails, nothing charged.
        let (h, _) = service(backend, "no-charge", |_| {}).await;
        let events = read_all(
            streamed(&h, "/checkout?orderId=S-5&amount=1.00", Some("stream-5"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let last = events.last().unwrap();
        assert_eq!(last.kind(), "RUN_ERROR");
        assert!(last.id.is_none());
        let saved = h
            .post(
                "/checkout?orderId=S-5&amount=1.00",
                &[("idempotency-key", "stream-5")],
                None,
            )
            .await;
        assert_eq!(last.data["code"], saved.json()["code"]);
        assert!(!last.data["message"].as_str().unwrap().is_empty());
        assert_eq!(h.db.receipts("S-5").await, 0);
    }
);
