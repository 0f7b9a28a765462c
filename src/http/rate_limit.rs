//! The rate limit per caller on `POST /checkout`: GCRA (governor), keyed by the caller's
//! API key, or by the client's address when the service is open; per instance. Over it:
//! 429 `rate_limited` with `Retry-After`, before anything is run or written. Every answer
//! of the route carries the IETF fields (draft-ietf-httpapi-ratelimit-headers-11):
//! `RateLimit-Policy: "checkout";q=<burst>;w=<seconds to refill it>` and
//! `RateLimit: "checkout";r=<remaining>;t=<seconds until the quota is whole again>`.
//!
//! tower_governor has the shape, but answers with its own body and `x-ratelimit-*`
//! fields, and keys by address only; the limiter itself is governor's.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

use super::error::{Code, Problem};
use crate::caller::Caller;
use crate::config::OverloadSettings;
use crate::metrics::Metrics;
use crate::worker::{Worker, every};

/// The policy's name in the header fields.
const POLICY: &str = "checkout";

/// Forgets callers whose quota is whole again, every refill period, so that the limiter
/// holds only callers seen within one period, however many there are.
pub struct ForgetIdle(RateLimit);

impl Worker for ForgetIdle {
    const NAME: &'static str = "rate limit's forgetting";

    async fn run(self) {
        let inner = &self.0.0;
        let period =
            (inner.per_one * inner.burst).clamp(Duration::from_secs(1), Duration::from_secs(60));
        every(period, || async {
            inner.limiter.retain_recent();
            inner.limiter.shrink_to_fit();
        })
        .await
    }
}

/// Whom a request counts against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Who {
    Caller(String),
    Address(IpAddr),
    /// Served without the peer's address (the router driven without a listener).
    Unknown,
}

type Limiter =
    RateLimiter<Who, DefaultKeyedStateStore<Who>, DefaultClock, StateInformationMiddleware>;

/// The limiter of one instance. Cloning is cheap; clones share the callers' state.
#[derive(Clone)]
pub struct RateLimit(Arc<Inner>);

struct Inner {
    limiter: Limiter,
    clock: DefaultClock,
    /// Requests a second, as set.
    rate: u32,
    burst: u32,
    /// Time to earn one request back.
    per_one: Duration,
    policy: HeaderValue,
    metrics: Metrics,
}

impl std::fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.policy.to_str().unwrap_or("RateLimit"))
    }
}

impl RateLimit {
    /// The limiter the settings ask for; `None` when the rate is 0 (off).
    pub fn new(settings: &OverloadSettings, metrics: &Metrics) -> Option<RateLimit> {
        let rate = NonZeroU32::new(settings.rate_per_sec)?;
        let burst = NonZeroU32::new(settings.burst()).unwrap_or(rate);
        let quota = Quota::per_second(rate).allow_burst(burst);
        let clock = DefaultClock::default();
        let limiter = RateLimiter::dashmap_with_clock(quota, clock.clone())
            .with_middleware::<StateInformationMiddleware>();
        let per_one = quota.replenish_interval();
        let window = seconds(quota.burst_size_replenished_in());
        let policy = HeaderValue::from_str(&format!("\"{POLICY}\";q={burst};w={window}"))
            .expect("digits and a quoted token");
        Some(RateLimit(Arc::new(Inner {
            limiter,
            clock,
            rate: rate.get(),
            burst: burst.get(),
            per_one,
            policy,
            metrics: metrics.clone(),
        })))
    }

    /// The worker that forgets idle callers.
    pub fn forgetting(&self) -> ForgetIdle {
        ForgetIdle(self.clone())
    }

    /// Counts one request of `who`: the quota left, or how long until the next one.
    fn check(&self, who: &Who) -> Result<u32, Duration> {
        let inner = &self.0;
        inner
            .limiter
            .check_key(who)
            .map(|snapshot| snapshot.remaining_burst_capacity())
            .map_err(|not_until| not_until.wait_time_from(inner.clock.now()))
    }

    /// The two header fields, with `remaining` and the time until the quota is whole.
    fn fields(&self, headers: &mut HeaderMap, remaining: u32, whole_in: Duration) {
        headers.insert("ratelimit-policy", self.0.policy.clone());
        let value = format!("\"{POLICY}\";r={remaining};t={}", seconds(whole_in));
        headers.insert(
            "ratelimit",
            HeaderValue::from_str(&value).expect("digits and a quoted token"),
        );
    }
}

/// The middleware in front of `POST /checkout` (behind the API key check, so that the
/// caller is known), in the route only when the rate limit is on.
pub async fn limit(State(limit): State<RateLimit>, request: Request, next: Next) -> Response {
    let who = who(&request);
    let per_one = limit.0.per_one;
    match limit.check(&who) {
        Ok(remaining) => {
            let mut response = next.run(request).await;
            let used = limit.0.burst - remaining;
            limit.fields(response.headers_mut(), remaining, per_one * used);
            response
        }
        Err(wait) => {
            limit.0.metrics.refused(Code::RateLimited.as_str());
            let retry_after = seconds(wait).max(1);
            let mut response = Problem::new(
                Code::RateLimited,
                format!(
                    "this caller sent more checkouts than its limit of {} per second (burst {}) on this instance; nothing was run or recorded; send again after {retry_after} s",
                    limit.0.rate, limit.0.burst
                ),
            )
            .retry_after(retry_after)
            .into_response();
            let whole_in = wait + per_one * (limit.0.burst - 1);
            limit.fields(response.headers_mut(), 0, whole_in);
            response
        }
    }
}

fn who(request: &Request) -> Who {
    let extensions = request.extensions();
    // The anonymous caller of open mode is no one in particular: limited by address.
    if let Some(Caller { name, .. }) = extensions.get::<Caller>()
        && !name.is_empty()
    {
        return Who::Caller(name.clone());
    }
    match extensions.get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(addr)) => Who::Address(addr.ip()),
        None => Who::Unknown,
    }
}

/// Whole seconds, rounded up.
fn seconds(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000_000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(rate: u32, burst: u32) -> RateLimit {
        let mut settings = crate::config::Settings::default().overload;
        settings.rate_per_sec = rate;
        settings.rate_burst = burst;
        RateLimit::new(&settings, &Metrics::new()).expect("on")
    }

    #[test]
    fn off_at_rate_zero_and_burst_is_twice_the_rate_unless_set() {
        assert!(
            RateLimit::new(
                &crate::config::Settings::default().overload,
                &Metrics::new()
            )
            .is_none()
        );
        assert_eq!(limiter(5, 0).0.burst, 10);
        assert_eq!(limiter(5, 3).0.burst, 3);
        assert_eq!(limiter(2, 10).0.policy, "\"checkout\";q=10;w=5");
    }

    #[test]
    fn a_caller_gets_its_burst_then_waits_and_another_caller_is_not_counted() {
        let limit = limiter(1, 3);
        let alice = Who::Caller("alice".into());
        assert_eq!(limit.check(&alice), Ok(2));
        assert_eq!(limit.check(&alice), Ok(1));
        assert_eq!(limit.check(&alice), Ok(0));
        let wait = limit.check(&alice).unwrap_err();
        assert!(
            wait > Duration::from_millis(900) && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert_eq!(limit.check(&Who::Caller("bob".into())), Ok(2));
    }
}
