//! The provider's own stream (docs/streaming.md, "Live text"): a checkout streamed to a
//! client asks the model with `stream: true` and sends the closing sentence piece by piece
//! as it is written (id-less `TEXT_MESSAGE_CONTENT`s), while the journal stores the step
//! whole and gives the ids; a stream broken mid-sentence fails the turn over to the next
//! endpoint; an endless stream is cut at the answer bound. The model is the scripted
//! model (our real one: its streams are as real servers send them, its faults
//! `break-stream` and `endless-stream` cut or never end one).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Backend, Harness, TestDb, client, scripted, test_settings};
use crate::streaming::{Received, parse, read_all};

fn kinds(events: &[Received]) -> Vec<&str> {
    events.iter().map(Received::kind).collect()
}

fn ids(events: &[Received]) -> Vec<Option<&str>> {
    events.iter().map(|e| e.id.as_deref()).collect()
}

/// The `delta`s of the `TEXT_MESSAGE_CONTENT`s of message `id`.
fn deltas<'a>(events: &'a [Received], id: &str) -> Vec<&'a str> {
    events
        .iter()
        .filter(|e| e.kind() == "TEXT_MESSAGE_CONTENT" && e.data["messageId"] == id)
        .map(|e| e.data["delta"].as_str().unwrap())
        .collect()
}

async fn streamed(h: &Harness, order: &str, key: &str) -> Vec<Received> {
    read_all(
        h.http
            .post(h.url(&format!("/checkout?orderId={order}&amount=42.50")))
            .header("accept", "text/event-stream")
            .header("idempotency-key", key)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// As [`streamed`], each event with when it came.
async fn streamed_timed(h: &Harness, order: &str, key: &str) -> Vec<(Instant, Received)> {
    let mut response = h
        .http
        .post(h.url(&format!("/checkout?orderId={order}&amount=42.50")))
        .header("accept", "text/event-stream")
        .header("idempotency-key", key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (mut text, mut received) = (String::new(), Vec::new());
    while let Some(chunk) = response.chunk().await.expect("the stream reads") {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        let (events, rest) = parse(&text);
        text = rest;
        received.extend(events.into_iter().map(|e| (Instant::now(), e)));
    }
    assert_eq!(text.trim(), "", "the stream ends with a whole event");
    received
}

/// The journal's events of the operation after `after`, read back (no live text).
async fn replayed(h: &Harness, key: &str, after: &str) -> Vec<Received> {
    read_all(
        client()
            .get(h.url(&format!("/operations/{key}/events")))
            .header("last-event-id", after)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// The journaled text of the answer at `step`.
async fn journaled_text(h: &Harness, key: &str, step: i64) -> String {
    let events = replayed(h, key, &format!("{}", step - 1)).await;
    let content = events
        .iter()
        .find(|e| e.kind() == "TEXT_MESSAGE_CONTENT")
        .expect("the step has text");
    assert_eq!(content.id.as_deref(), Some(&*format!("{step}.2")));
    content.data["delta"].as_str().unwrap().to_owned()
}

// Seen failing: with the loop's publisher dropped (`.filter(|_| false)` on
// `self.live.publisher(…)` in agent.rs) the model is not asked to stream and the sentence
// comes from the journal as one TEXT_MESSAGE_CONTENT: "the sentence in pieces" failed.
both_backends!(
    the_closing_sentence_is_sent_piece_by_piece_as_the_provider_streams_it,
    |backend| async move { piece_by_piece(backend, false).await }
);

// Seen failing: with `H2c::open` reading the whole body before handing it over (`read`,
// then one piece), the pieces reached the client within a millisecond: the spread failed.
both_backends!(
    the_closing_sentence_streams_over_h2c_too,
    |backend| async move { piece_by_piece(backend, true).await }
);

async fn piece_by_piece(backend: Backend, h2c: bool) {
    {
        let db = TestDb::new(backend).await;
        let model = scripted("").await;
        let mut settings = test_settings(&db, &model);
        settings.model.h2c = h2c;
        let h = Harness::serve(db, model, settings).await;
        let timed = streamed_timed(&h, "PS-1", "pstream-1").await;
        // Sent as written, not once written: the model writes a word every 8 ms, so the
        // pieces reach the client over some 100 ms, not all at once.
        let pieces: Vec<Instant> = timed
            .iter()
            .filter(|(_, e)| e.kind() == "TEXT_MESSAGE_CONTENT")
            .map(|(at, _)| *at)
            .collect();
        let spread = *pieces.last().unwrap() - pieces[0];
        assert!(spread >= Duration::from_millis(40), "{spread:?}");
        let events: Vec<Received> = timed.into_iter().map(|(_, e)| e).collect();
        let text = deltas(&events, "pstream-1-3");
        assert!(text.len() >= 2, "the sentence in pieces: {text:?}");
        let k = text.len();
        let mut expected_kinds = vec![
            "RUN_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "TEXT_MESSAGE_START",
        ];
        expected_kinds.extend(std::iter::repeat_n("TEXT_MESSAGE_CONTENT", k));
        expected_kinds.extend(["TEXT_MESSAGE_END", "RUN_FINISHED"]);
        assert_eq!(kinds(&events), expected_kinds);
        // The live text has no id; the journal's end of its message has its place.
        let mut expected_ids = vec![Some("0"), Some("1.1"), Some("1.2"), Some("1.3"), Some("2")];
        expected_ids.extend(std::iter::repeat_n(None, k + 1));
        expected_ids.extend([Some("3.3"), None]);
        assert_eq!(ids(&events), expected_ids);
        assert_eq!(events[5].data["messageId"], "pstream-1-3");
        assert_eq!(events[6 + k].data["messageId"], "pstream-1-3");
        let sentence = text.concat();
        assert_eq!(sentence, journaled_text(&h, "pstream-1", 3).await);
        let result = &events[7 + k].data["result"];
        assert_eq!(result["message"], Value::String(sentence));
        assert_eq!(result["charged"], true);
        assert_eq!(h.db.receipts("PS-1").await, 1);
        assert_eq!(h.model.requests(), 2);
        assert_eq!(
            h.model.streamed_requests(),
            2,
            "both asked with stream: true"
        );
        // A plain JSON checkout keeps the request unstreamed.
        let plain = h
            .post("/checkout?orderId=PS-2&amount=1.00", &[], None)
            .await;
        assert_eq!(plain.status, 200);
        assert_eq!(h.model.requests(), 4);
        assert_eq!(
            h.model.streamed_requests(),
            2,
            "nobody watches: not streamed"
        );
        assert_eq!(h.model.requests_over_http2(), if h2c { 4 } else { 0 });
    }
}

// Seen failing: with the chain never failing over (`let failover = i < last && false;` in
// chain.rs) the primary's request retry repeated the broken stream until it gave up, the
// fallback was never asked and the service wrote the sentence: no step 3 was journaled
// ("the step has text" failed).
both_backends!(
    a_provider_stream_broken_mid_sentence_finishes_on_the_fallback_with_one_receipt,
    |backend| async move {
        let fallback = scripted("").await;
        let db = TestDb::new(backend).await;
        let primary = scripted("break-stream@2").await;
        let mut settings = test_settings(&db, &primary);
        settings.model.name = "primary-model".into();
        settings.model.fallback_base_url = Some(fallback.base_url());
        settings.model.fallback_model = Some("fallback-model".into());
        let h = Harness::serve(db, primary, settings).await;
        let events = streamed(&h, "PS-3", "pstream-3").await;
        let broken = deltas(&events, "pstream-3-3").concat();
        let whole = deltas(&events, "pstream-3-3-2").concat();
        let journaled = journaled_text(&h, "pstream-3", 3).await;
        assert_eq!(whole, journaled, "the fallback's sentence, as journaled");
        assert!(
            !broken.is_empty() && broken.len() < whole.len() && whole.starts_with(&broken),
            "the primary's first half, sent as written: {broken:?} of {whole:?}"
        );
        let text_events: Vec<(&str, Option<&str>, &str)> = events
            .iter()
            .filter(|e| e.kind() != "TEXT_MESSAGE_CONTENT")
            .map(|e| {
                (
                    e.kind(),
                    e.id.as_deref(),
                    e.data["messageId"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            text_events,
            vec![
                ("RUN_STARTED", Some("0"), ""),
                ("TOOL_CALL_START", Some("1.1"), ""),
                ("TOOL_CALL_ARGS", Some("1.2"), ""),
                ("TOOL_CALL_END", Some("1.3"), ""),
                ("TOOL_CALL_RESULT", Some("2"), "pstream-3-2"),
                ("TEXT_MESSAGE_START", None, "pstream-3-3"),
                ("TEXT_MESSAGE_END", None, "pstream-3-3"),
                ("TEXT_MESSAGE_START", None, "pstream-3-3-2"),
                ("TEXT_MESSAGE_END", Some("3.3"), "pstream-3-3-2"),
                ("RUN_FINISHED", None, ""),
            ],
            "the broken message ended where it broke, the fallback's its own message"
        );
        let result = &events.last().unwrap().data["result"];
        assert_eq!(result["message"], Value::String(journaled));
        assert_eq!(
            result["usage"]["models"],
            serde_json::json!(["primary-model", "fallback-model"])
        );
        assert_eq!(h.db.receipts("PS-3").await, 1);
        assert_eq!(
            h.model.requests(),
            2,
            "the primary: the charge, the broken sentence"
        );
        assert_eq!(fallback.requests(), 1, "the fallback: the sentence");
        assert_eq!(fallback.streamed_requests(), 1);
    }
);

// Seen failing: with `open()` reading the pieces without the bound
// (`Limited::new(incoming, usize::MAX)` in transport/mod.rs), the endless stream was read
// until the loop's deadline: RUN_ERROR `deadline_exceeded`, not `model_error` over the
// bound. The endless stream is the scripted model's `endless-stream` fault (no fake).
both_backends!(
    an_endless_provider_stream_is_cut_at_the_answer_bound,
    |backend| async move {
        let db = TestDb::new(backend).await;
        let model = scripted("endless-stream@1").await;
        let mut settings = test_settings(&db, &model);
        settings.model_request.timeout = Duration::from_millis(5_000);
        let h = Harness::serve(db, model, settings).await;
        let events = streamed(&h, "PS-4", "pstream-4").await;
        let text = deltas(&events, "pstream-4-1").concat();
        let last = events.last().unwrap();
        assert_eq!(last.kind(), "RUN_ERROR");
        assert_eq!(last.data["code"], "model_error");
        let message = last.data["message"].as_str().unwrap();
        assert!(
            message.contains("over the 65536 bytes an answer may take"),
            "{message}"
        );
        // What came before the cut was sent as written, then its message ended.
        assert!(
            text.starts_with("and on and on ") && text.len() < 65536,
            "{}",
            text.len()
        );
        assert_eq!(text.len() % "and on and on ".len(), 0);
        let n = kinds(&events).len();
        assert_eq!(kinds(&events)[n - 2], "TEXT_MESSAGE_END");
        assert_eq!(events[n - 2].id, None);
        assert_eq!(
            h.model.requests(),
            1,
            "not repeated: a repeat would get the same"
        );
        assert_eq!(h.db.receipts("PS-4").await, 0);
        // The JSON form's request (not streamed) is cut at the same bound, the same way.
        let plain = h
            .post("/checkout?orderId=PS-5&amount=1.00", &[], None)
            .await;
        let problem = plain.problem(502);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("over the 65536 bytes an answer may take"),
            "{problem}"
        );
        assert_eq!(h.model.requests(), 2);
        assert_eq!(h.model.streamed_requests(), 1);
    }
);
