//! The tests' Stripe-compatible fake, alone, for trying the service with
//! CHECKOUT_PAYMENT_PROVIDER=stripe without Stripe (the curl in docs/effects.md):
//!
//!     cargo run --example stripe-fake -- 127.0.0.1:12111
//!
//! It is a fake of our own, not Stripe: see tests/spec/common/stripe.rs for what it keeps
//! of Stripe's behaviour and why it exists.

#[path = "../tests/spec/common/stripe.rs"]
mod stripe;

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:12111".into());
    let Ok(addr) = addr.parse() else {
        eprintln!("stripe-fake: {addr:?} is not an address such as 127.0.0.1:12111");
        std::process::exit(2);
    };
    let fake = stripe::StripeFake::start_on(addr).await;
    println!(
        "stripe-fake listening: STRIPE_BASE_URL={} STRIPE_API_KEY=sk_test_anything; pm_card_visa succeeds, pm_card_chargeDeclined is declined, pm_card_authenticationRequired needs 3-D Secure",
        fake.base_url()
    );
    let _ = tokio::signal::ctrl_c().await;
}
