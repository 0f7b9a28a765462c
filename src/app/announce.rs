//! The start-up lines: what the service is about to do, said once, before it listens.
//! The resilience chain is numbered outermost first, each layer with its unit and numbers.

use crate::caller;
use crate::config::{self, AuthMode, Settings};
use crate::db::Database;
use crate::http::ModelInfo;
use crate::http::serve::{ASSUMED_DESCRIPTORS, Bounds, Descriptors};
use crate::model::{ModelChain, WireApi};
use crate::outbox::MailTransport;

/// Memory one waiting loop holds, as figure 2 measured it (`config::BYTES_PER_LOOP_*`):
/// what the bound on loops stands for.
fn bytes_per_loop(settings: &Settings, bounds: &Bounds) -> usize {
    if bounds.per_loop > 1 {
        config::BYTES_PER_LOOP_HTTP1
    } else if settings.model_over_https() {
        config::BYTES_PER_LOOP_HTTPS
    } else {
        config::BYTES_PER_LOOP_H2C
    }
}

/// The start-up lines of the layers in front of the resilience chain: the descriptor
/// limit, the rate limit per caller, admission, and the connections.
pub(super) fn overload(
    settings: &Settings,
    descriptors: &std::io::Result<Descriptors>,
    bounds: &Bounds,
) {
    let overload = &settings.overload;
    let soft = match descriptors {
        Ok(d) if d.was < d.soft => {
            tracing::info!(
                was = d.was,
                soft = d.soft,
                "descriptors: soft limit raised from {} to {}, the hard limit",
                d.was,
                d.soft
            );
            d.soft
        }
        Ok(d) => {
            tracing::info!(
                soft = d.soft,
                "descriptors: soft limit {}, the hard limit",
                d.soft
            );
            d.soft
        }
        Err(err) => {
            tracing::warn!(error = %err, "descriptors: cannot read or raise the limit; the bounds below assume {ASSUMED_DESCRIPTORS}");
            ASSUMED_DESCRIPTORS
        }
    };
    if overload.rate_per_sec == 0 {
        tracing::info!(
            layer = "rate limit",
            "in front of the resilience chain: [rate limit] off (CHECKOUT_RATE_LIMIT_PER_SEC=0): a caller may take every loop of the instance"
        );
    } else {
        tracing::info!(
            layer = "rate limit",
            per_sec = overload.rate_per_sec,
            burst = overload.burst(),
            "in front of the resilience chain: [rate limit] {} checkouts per second per caller (its API key; its address when open), burst {}, GCRA, per instance: behind N instances a caller gets up to N times this; over it 429 rate_limited with Retry-After, RateLimit and RateLimit-Policy, nothing written",
            overload.rate_per_sec,
            overload.burst()
        );
    }
    let lowered = if bounds.max_in_flight < overload.max_in_flight {
        format!(
            "; CHECKOUT_MAX_IN_FLIGHT {} lowered to {}: {} descriptors less {} (database pool and spare), less a tenth for connections without a loop, carry {} loops of {} descriptor(s) each",
            overload.max_in_flight,
            bounds.max_in_flight,
            soft,
            bounds.reserved,
            bounds.max_in_flight,
            bounds.per_loop
        )
    } else {
        String::new()
    };
    tracing::info!(
        layer = "admission",
        max_in_flight = bounds.max_in_flight,
        "in front of the resilience chain: [admission] at most {} checkout loops at once (clients' checkouts and the recovery sweep's resumes), ~{} MB at ~{} KB per loop; one more is answered 503 overloaded with Retry-After before anything is written, its Idempotency-Key still usable; replays, receipts, health and metrics are served when full{lowered}",
        bounds.max_in_flight,
        bounds.max_in_flight * bytes_per_loop(settings, bounds) / 1_000_000,
        bytes_per_loop(settings, bounds) / 1000
    );
    tracing::info!(
        max_connections = bounds.max_connections,
        "connections: at most {} open (more wait in the kernel's queue); a request head must arrive within {} ms; a connection with no request for {} ms is closed",
        bounds.max_connections,
        overload.header_timeout.as_millis(),
        overload.idle_timeout.as_millis()
    );
}

/// The start-up line of the recovery sweep.
pub(super) fn recovery(settings: &Settings) {
    let idempotency = &settings.idempotency;
    if idempotency.recovery {
        tracing::info!(
            max_attempts = idempotency.recovery_max_attempts,
            "recovery sweep: every {} ms, an operation whose lease lapsed unfinished at least {} ms ago (its instance died, or its client left after a transient failure) is taken over, resumed from its journal and its answer saved for the client's retry; at most {} time(s), then it is marked as needing attention and logged at error level",
            idempotency.lease.as_millis(),
            idempotency.lease.as_millis(),
            idempotency.recovery_max_attempts
        );
    } else {
        tracing::warn!(
            "recovery sweep: off (CHECKOUT_RECOVERY=false): an operation whose instance died is resumed only by its client's retry with the same Idempotency-Key"
        );
    }
}

/// The start-up lines that say where events go: CHECKOUT_WEBHOOK_URL, and the `added`
/// endpoints of `checkout webhooks add` enabled now.
pub(super) fn webhooks(settings: &Settings, added: usize) {
    let hooks = &settings.webhooks;
    match &hooks.url {
        Some(url) => {
            let events: Vec<_> = hooks.wanted().types().map(|t| t.as_str()).collect();
            let schedule: Vec<_> = hooks
                .retry_schedule
                .iter()
                .map(|d| format!("{} ms", d.as_millis()))
                .collect();
            tracing::info!(
                url,
                "webhooks: {} sent to {url} as Standard Webhooks (signed with each secret of CHECKOUT_WEBHOOK_SECRET), each written in the transaction of its fact; an attempt takes at most {} ms, retried after {} (Retry-After on 429/503), then recorded failed; 410 disables the endpoint; an event claimed by an instance that died is sent again after {} ms, with the same webhook-id",
                events.join(", "),
                hooks.timeout.as_millis(),
                schedule.join(", "),
                hooks.lease.as_millis()
            );
        }
        None => tracing::info!(
            "webhooks: no CHECKOUT_WEBHOOK_URL is set; events are written only for the endpoints of `checkout webhooks add`"
        ),
    }
    tracing::info!(
        endpoints = added,
        "webhooks: {added} enabled endpoint(s) added by `checkout webhooks add`, each sent the events of its types with its own secret, retries and 410; read again every second"
    );
}

pub(super) fn mail(settings: &Settings, transport: &MailTransport) {
    let mail = &settings.mail;
    let from = mail.from.to_string();
    match transport {
        MailTransport::Smtp(_) => tracing::info!(
            smtp = mail.shown_url().unwrap_or_default(),
            from,
            "confirmation emails: sent to the SMTP server {} (pooled), from {from}; a transient failure is retried up to {} attempts, backoff {}..{} ms; a message claimed by an instance that died is sent again after {} ms, with the same Message-ID",
            mail.shown_url().unwrap_or_default(),
            mail.max_attempts,
            mail.backoff_min.as_millis(),
            mail.backoff_max.as_millis(),
            mail.lease.as_millis()
        ),
        MailTransport::Files(dir) => tracing::warn!(
            dir = %dir.display(),
            from,
            "confirmation emails: no CHECKOUT_SMTP_URL is set, so no email leaves this machine: each message is written as <message-id>.eml in {}",
            dir.display()
        ),
    }
}

/// The start-up line that says who may call.
pub(super) fn callers(settings: &Settings, keys_exist: bool) {
    let listen = settings.server.listen;
    let mode = settings.server.auth.as_str();
    match settings.server.auth {
        AuthMode::Off => tracing::warn!(
            auth = mode,
            "callers: CHECKOUT_AUTH=off: /checkout and /receipts are open to anyone who can reach {listen}; no API key is read"
        ),
        AuthMode::Required => tracing::info!(
            auth = mode,
            "callers: an API key is required on /checkout and /receipts (CHECKOUT_AUTH=required){}",
            if keys_exist {
                ""
            } else {
                "; none exists yet, so every request is refused until one is made (checkout api-keys create NAME)"
            }
        ),
        AuthMode::Auto if keys_exist => tracing::info!(
            auth = mode,
            "callers: an API key is required on /checkout and /receipts (CHECKOUT_AUTH=auto, and keys exist)"
        ),
        AuthMode::Auto => tracing::warn!(
            auth = mode,
            "callers: open, no API key asked for (CHECKOUT_AUTH=auto, no key exists yet, {listen} is loopback); within {} ms of the first `checkout api-keys create NAME`, every request needs a key",
            caller::KEYS_REFRESH.as_millis()
        ),
    }
}

/// The start-up lines: the database, the model, and the resilience chain, outermost
/// first, each layer with its unit, its numbers and what it retries.
pub(super) fn chain(settings: &Settings, db: &Database, model: &ModelInfo) {
    tracing::info!(database = db.kind(), "receipts are kept in {}", db.kind());
    match model.warning {
        Some(warning) => tracing::warn!(base_url = %model.base_url, "{warning}"),
        None => {
            tracing::info!(base_url = %model.base_url, model = %model.model, "model provider: OpenAI-compatible")
        }
    }
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    tracing::info!(
        layer = 1,
        unit = "the whole operation",
        "resilience chain, outermost first: [1] client POST + Idempotency-Key: the client may retry; a key's finished answer is replayed for {} s, a key in flight is held by a {} ms lease, a transient failure leaves the key usable",
        settings.idempotency.ttl.as_secs(),
        ms(settings.idempotency.lease)
    );
    tracing::info!(
        layer = 2,
        unit = "one HTTP request",
        timeout_ms = ms(settings.server.timeout),
        "[2] server timeout: {} ms per HTTP request (the loop layers' worst case is {} ms)",
        ms(settings.server.timeout),
        ms(settings.loop_worst_case())
    );
    tracing::info!(
        layer = 3,
        unit = "the whole assistant loop, tools included",
        max_retries = settings.assistant.retry.max_retries,
        journal = settings.assistant.journal,
        "[3] loop retry: repeats the whole assistant loop up to {} more time(s), backoff {}..{} ms; on a loop timeout, a model failure the request retry could not mend, a transient database error, a payment provider that gave no outcome; never on a model 4xx, invalid input, amount_conflict, model_did_not_charge, a declined payment. {}",
        settings.assistant.retry.max_retries,
        ms(settings.assistant.retry.backoff_min),
        ms(settings.assistant.retry.backoff_max),
        if settings.assistant.journal {
            "Journal on: a repeat (and a client's retry with the same Idempotency-Key, or another instance's) resumes from the journal, replaying the steps that ended instead of asking the model again"
        } else {
            "Journal off (CHECKOUT_JOURNAL=false): every repeat starts the loop over"
        }
    );
    tracing::info!(
        layer = 4,
        unit = "one run of the assistant loop",
        timeout_ms = ms(settings.assistant.retry.timeout),
        "[4] loop timeout: {} ms per run of the loop, at most {} model rounds; a model that ends without charging is asked again up to {} time(s) before model_did_not_charge",
        ms(settings.assistant.retry.timeout),
        settings.assistant.max_rounds,
        settings.assistant.max_nudges
    );
    tracing::info!(
        layer = 5,
        unit = "one chat-completions HTTP request",
        max_retries = settings.model_request.max_retries,
        "[5] request retry: repeats one model request up to {} more time(s), backoff {}..{} ms with jitter, Retry-After honoured up to {} ms, retry budget {}% + {}/s shared by all requests; on connect errors, timeouts, 408, 429 (not insufficient_quota), 500, 502, 503, 504; never on 400, 401, 403, 404, 422",
        settings.model_request.max_retries,
        ms(settings.model_request.backoff_min),
        ms(settings.model_request.backoff_max),
        ms(settings.model_request.retry_after_max),
        settings.model_request.budget_percent,
        settings.model_request.budget_min_per_sec
    );
    tracing::info!(
        layer = 6,
        unit = "one chat-completions HTTP request",
        timeout_ms = ms(settings.model_request.timeout),
        "[6] request timeout: {} ms per model request",
        ms(settings.model_request.timeout)
    );
    match settings.stripe() {
        None => tracing::info!(
            provider = "ledger",
            "payment provider: ledger (CHECKOUT_PAYMENT_PROVIDER=ledger): the receipts table is the record of charges; no money moves elsewhere"
        ),
        Some(stripe) => {
            tracing::info!(
                provider = "stripe",
                base_url = %stripe.base_url,
                "payment provider: stripe at {}: each charge commits an intent (order, amount, currency, payment method, attempt), then POST /v1/payment_intents with Idempotency-Key = charge key + attempt and the intent's parameters, then the receipt. An intent left open is re-sent by the next run of any unit within the key retention ({} s), looked up by its metadata after it, never charged anew",
                stripe.base_url,
                stripe.key_retention.as_secs()
            );
            tracing::info!(
                layer = 7,
                unit = "one payment-provider HTTP request",
                max_retries = stripe.max_retries,
                "[7] provider retry: re-sends one payment-provider request with the same Idempotency-Key and parameters up to {} more time(s), backoff {}..{} ms; on timeouts, dropped connections, 409 idempotency_key_in_use, 429, 5xx, then looks the payment up; never on 402 (declined: the attempt ends) or another 4xx (400 idempotency_error is a bug: 502)",
                stripe.max_retries,
                ms(stripe.backoff_min),
                ms(stripe.backoff_max)
            );
            tracing::info!(
                layer = 8,
                unit = "one payment-provider HTTP request",
                timeout_ms = ms(stripe.timeout),
                "[8] provider timeout: {} ms per payment-provider request",
                ms(stripe.timeout)
            );
        }
    }
    if settings.assistant.retry.max_retries > 0 && !settings.assistant.journal {
        tracing::warn!(
            "the loop retry re-runs tools that already ran, the charge included; it cannot double-charge here because every attempt charges with the charge key the handler made from the order id before the first attempt, and the receipts table's unique order_id hands a repeated charge the first receipt"
        );
    }
}

/// The start-up lines of the model endpoints, in the order a turn asks them, with their
/// circuit breakers.
pub(super) fn endpoints(settings: &Settings, chain: &ModelChain) {
    for (i, client) in chain.endpoints().iter().enumerate() {
        let role = if i == 0 { "primary" } else { "fallback" };
        let route = match client.proxy() {
            Some(proxy) => format!("through the proxy {proxy} (HTTPS_PROXY/HTTP_PROXY)"),
            None => "direct".to_owned(),
        };
        let api = match client.wire() {
            WireApi::Chat => "chat completions",
            WireApi::Responses => "the Responses API (stateless)",
        };
        tracing::info!(
            endpoint = client.name(),
            role,
            wire = client.wire().as_str(),
            proxy = client.proxy(),
            "model endpoint {}: {} ({role}), {api}, {route}, its own client, request retry, request timeout and circuit breaker",
            i + 1,
            client.name()
        );
    }
    let breaker = settings.model.breaker;
    if chain.endpoints().len() > 1 {
        tracing::info!(
            endpoints = chain.endpoints().len(),
            "fallback, per model turn (between [4] and [5]): a turn whose endpoint failed transiently (connect error, timeout, 408, 429, 5xx: not repeated there, the next endpoint is the retry), whose breaker is open, or that answered 400 context_length_exceeded, is asked of the next endpoint, continuing the same conversation from the journal; the last endpoint's request retry repeats as in [5]. Once the order is charged, a turn no endpoint answers is written by the service from the receipt (200, messageSource service)"
        );
    } else {
        tracing::info!(
            "fallback: none (no OPENAI_FALLBACK_BASE_URL, no model_fallbacks); once the order is charged, a turn the model does not answer is written by the service from the receipt (200, messageSource service)"
        );
    }
    tracing::info!(
        window = breaker.window,
        failure_percent = breaker.failure_percent,
        open_ms = breaker.open.as_millis() as u64,
        "circuit breaker, per model endpoint (inside [5], around every request): opens when at least {}% of the last {} requests failed transiently; open, nothing is sent to the endpoint for {} ms, then one trial request, whose success closes it; a 400, 401, 403, 404 or 422 opens nothing",
        breaker.failure_percent,
        breaker.window,
        breaker.open.as_millis()
    );
    let transport = settings.model.transport;
    let answer = transport.max_answer_bytes;
    tracing::info!(
        max_answer_bytes = answer,
        keepalive_ms = transport.keep_alive.as_millis() as u64,
        keepalive_timeout_ms = transport.keep_alive_timeout.as_millis() as u64,
        "model answers: each read up to {answer} bytes (CHECKOUT_MODEL_MAX_ANSWER_BYTES), a longer one cut off there and not asked again of that endpoint: one answer's worth per loop in flight at most. HTTP/2 connections are PINGed every {} ms and dropped when a PING is not answered within {} ms",
        transport.keep_alive.as_millis(),
        transport.keep_alive_timeout.as_millis()
    );
}
