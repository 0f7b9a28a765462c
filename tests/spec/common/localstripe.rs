//! localstripe (PyPI `localstripe`, pinned 1.15.10 by scripts/test): a real, stateful
//! Stripe-compatible server, for the provider's happy paths. It keeps no Idempotency-Key
//! (a repeated key executes again), so the faults and the key semantics are the suite's
//! own fake's (`stripe.rs`).

use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::smtp::{free_port, tool};

pub struct Localstripe {
    child: Child,
    port: u16,
}

impl Localstripe {
    pub async fn start() -> Localstripe {
        let program = tool(
            "CHECKOUT_TEST_LOCALSTRIPE",
            "target/tools/localstripe-venv/bin/localstripe",
        );
        let port = free_port();
        let child = Command::new(program)
            .args(["--port", &port.to_string(), "--from-scratch"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start localstripe");
        let server = Localstripe { child, port };
        let http = super::client();
        let url = format!("{}/v1/customers", server.base_url());
        super::until("localstripe answers", async || {
            http.get(&url)
                .bearer_auth("sk_test_localstripe")
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        server
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The payment intent's refunds, as localstripe lists them.
    pub async fn refunds_of(&self, payment_intent: &str) -> Vec<Value> {
        let reply = super::client()
            .get(format!(
                "{}/v1/refunds?payment_intent={payment_intent}",
                self.base_url()
            ))
            .bearer_auth("sk_test_localstripe")
            .send()
            .await
            .expect("GET /v1/refunds");
        let body: Value = reply.json().await.expect("a list");
        body["data"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Localstripe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
