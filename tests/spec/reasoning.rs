//! OpenAI's reasoning models on chat completions: function tools are refused beside any
//! reasoning effort but `none` (issue 48). The scripted model plays that refusal
//! (`refuse-tools-with-reasoning`, a fake of our own: OpenAI is not reachable from here);
//! a fallback endpoint stands by to show the refusal never goes to it.

use std::time::Duration;

use checkout::config::Settings;
use checkout::model::ReasoningEffort;
use checkout::model::scripted::ScriptedModel;

use crate::common::{Backend, Harness, TestDb, scripted, test_settings};

/// The harness's scripted model refusing tools with reasoning, a healthy fallback after
/// it, and a breaker that one counted failure would open (window 1, 100 %).
async fn start(backend: Backend, tune: impl FnOnce(&mut Settings)) -> (Harness, ScriptedModel) {
    let fallback = scripted("").await;
    let db = TestDb::new(backend).await;
    let primary = scripted("refuse-tools-with-reasoning").await;
    let mut s = test_settings(&db, &primary);
    s.model.name = "gpt-5.6-luna".into();
    s.model.fallback_base_url = Some(fallback.base_url());
    s.model.fallback_model = Some("fallback-model".into());
    s.model.breaker.window = 1;
    s.model.breaker.failure_percent = 100;
    s.model.breaker.open = Duration::from_secs(60);
    tune(&mut s);
    (Harness::serve(db, primary, s).await, fallback)
}

both_backends!(
    a_refusal_of_tools_beside_a_reasoning_effort_is_asked_once_and_names_the_settings_that_fix_it,
    |backend| async move {
        // Seen failing: without the hint in `model::reasoning::refusal_hint` the detail
        // quoted the provider and named neither setting.
        let (h, fallback) = start(backend, |_| {}).await;
        let problem = h.checkout("EFFORT-1", "12.00").await.problem(502);
        assert_eq!(problem["code"], "model_error", "{problem}");
        assert_eq!(problem["upstreamStatus"], 400, "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("Function tools with reasoning_effort are not supported"),
            "{detail}"
        );
        assert!(detail.contains("OPENAI_REASONING_EFFORT=none"), "{detail}");
        assert!(detail.contains("OPENAI_WIRE_API=responses"), "{detail}");
        assert_eq!(
            h.model.requests(),
            1,
            "neither request nor loop retry repeats it"
        );
        assert_eq!(fallback.requests(), 0, "not a turn for the fallback");
        let ready = h.get("/health/ready").await.json();
        assert_eq!(
            ready["endpoints"][0]["breaker"], "closed",
            "not counted by the breaker: {ready}"
        );
        assert_eq!(h.db.all_receipts().await, 0);
    }
);

both_backends!(
    with_reasoning_effort_none_the_reasoning_model_takes_the_payment,
    |backend| async move {
        // Seen failing: before `OPENAI_REASONING_EFFORT` existed the request carried no
        // `reasoning_effort`, and the checkout was the 502 above.
        let (h, fallback) = start(backend, |s| {
            s.model.reasoning_effort = Some(ReasoningEffort::None);
        })
        .await;
        let reply = h.checkout("EFFORT-2", "12.00").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["usage"]["models"][0], "gpt-5.6-luna");
        assert_eq!(h.db.receipts("EFFORT-2").await, 1);
        // Round 1 charges, round 2 confirms: both with the effort.
        assert_eq!(h.model.requests(), 2);
        assert_eq!(fallback.requests(), 0);
        let sent = h.model.recent_requests();
        assert_eq!(sent.len(), 2);
        for request in &sent {
            assert_eq!(request["reasoning_effort"], "none", "{request}");
        }
    }
);
