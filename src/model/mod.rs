//! The model: OpenAI-compatible wire types, the client with its request retry, and the
//! scripted model that stands in for a provider.

pub mod client;
pub mod error;
pub mod retry;
pub mod scripted;
pub mod wire;

pub use client::{ModelCall, ModelClient, ModelEndpoint, Secret};
pub use error::{ModelError, ModelErrorKind, Stop};
pub use retry::{RequestRetry, RequestRetrySettings};
