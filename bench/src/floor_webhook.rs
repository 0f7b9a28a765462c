//! `floor-webhook --url URL --requests N`: what one webhook delivery cannot do without,
//! whatever the service around it: N signed Standard Webhooks POSTs of a
//! `charge.succeeded` the shape and size the service sends, one after the other, with a
//! bare reqwest client built as the deliverer builds its own (no redirect followed, a
//! timeout) and signed by the service's `SigningKeys`. Figure 7 with `--webhooks` counts
//! its instructions under callgrind, a run of a few and a run of many differenced, beside
//! the service's (bench/src/bench/counts.rs).

use std::time::Duration;

use checkout::secret::Secret;
use checkout::webhooks::{EventType, NewEvent, SigningKeys};
use reqwest::header::CONTENT_TYPE;

use crate::args::Args;
use crate::floor::install_tls_provider;

/// `whsec_` + base64 of 32 bytes, as the bench's endpoint's.
const SECRET: &str = "whsec_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

pub fn main(args: &mut Args) -> Result<(), String> {
    let url = args
        .value("--url")?
        .ok_or("floor-webhook: --url is required")?;
    let requests: u32 = args.number("--requests")?.unwrap_or(20);
    args.done()?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        install_tls_provider();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(15))
            .build()
            .map_err(|e| e.to_string())?;
        let url = reqwest::Url::parse(&url).map_err(|e| format!("{url}: {e}"))?;
        let keys = SigningKeys::parse(&Secret::new(SECRET))?;
        // The receipt as the service's charge.succeeded carries it.
        let receipt = uuid::Uuid::now_v7().to_string();
        let data = serde_json::json!({
            "id": receipt,
            "orderId": "floor-webhook-0",
            "amount": "1.00",
            "currency": "USD",
            "createdAt": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "receiptId": receipt,
            "operationKey": uuid::Uuid::now_v7().to_string(),
        });
        let event = NewEvent::new(EventType::ChargeSucceeded, data, chrono::Utc::now());
        for _ in 0..requests {
            let timestamp = chrono::Utc::now().timestamp();
            let answer = client
                .post(url.clone())
                .header(CONTENT_TYPE, "application/json")
                .header("webhook-id", &event.id)
                .header("webhook-timestamp", timestamp)
                .header(
                    "webhook-signature",
                    keys.sign(&event.id, timestamp, &event.body),
                )
                .body(event.body.clone())
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !answer.status().is_success() {
                return Err(format!("the consumer answered {}", answer.status()));
            }
        }
        Ok(())
    })
}
