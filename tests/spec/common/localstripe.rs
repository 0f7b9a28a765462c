//! localstripe (PyPI `localstripe`, pinned 1.15.10 by scripts/test): a real, stateful
//! Stripe-compatible server, for the provider's happy paths. It keeps no Idempotency-Key
//! (a repeated key executes again), so the faults and the key semantics are the suite's
//! own fake's (`stripe.rs`).

use std::process::{Child, Command};

use serde_json::Value;

use super::servers::{on_free_ports, tool};

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
        let http = super::client();
        let (child, [port]) = on_free_ports(
            "localstripe",
            |[port]| {
                let mut command = Command::new(&program);
                command.args(["--port", &port.to_string(), "--from-scratch"]);
                command
            },
            async |[port]| {
                http.get(format!("http://127.0.0.1:{port}/v1/customers"))
                    .bearer_auth("sk_test_localstripe")
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
        Localstripe { child, port }
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
