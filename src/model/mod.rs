//! The model: OpenAI-compatible wire types, the client with its request retry, and the
//! scripted model that stands in for a provider.

pub mod breaker;
pub mod call;
pub mod chain;
pub mod client;
pub mod error;
pub mod live;
pub mod observe;
pub mod reasoning;
pub mod responses;
mod responses_stream;
pub mod retry;
pub mod scripted;
mod stream;
pub mod transport;
pub mod wire;

pub use breaker::{Breaker, BreakerSettings, BreakerState};
pub use call::ModelCall;
pub use chain::ModelChain;
pub use client::{ClientSettings, Completion, ModelClient, ModelEndpoint};
pub use error::{ModelError, ModelErrorKind, Stop};
pub use live::{LiveOps, LiveText};
pub use reasoning::ReasoningEffort;
pub use responses::WireApi;
pub use retry::{RequestRetry, RequestRetrySettings};
pub use transport::TransportSettings;
