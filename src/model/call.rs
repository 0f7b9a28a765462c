//! [`ModelCall`]: one chat-completions request as the model stack carries it, from the
//! loop through the request retry to the transport.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use bytes::Bytes;

use super::live::LiveText;

/// One chat-completions request: the serialized body, cloned cheaply for each retry. Its
/// own file, so that the client (which sends it) and the request retry (which repeats it)
/// both depend on it and not on each other.
#[derive(Clone, Debug)]
pub struct ModelCall {
    pub body: Bytes,
    /// The loop round this request belongs to (1 = the first request of a loop attempt).
    pub round: u32,
    /// 1 for the first send, 2 for the first retry, …
    pub attempt: u32,
    /// The checkout's count of requests sent, shared by the retries' clones.
    pub sent: Arc<AtomicU32>,
    /// Another endpoint is next in line: a transient failure goes to it rather than
    /// being repeated here.
    pub failover: bool,
    /// Set once this send has a connection or stream to go on: until then its time was
    /// spent waiting in the service, which is not the endpoint's failure. Each send gets
    /// its own (the circuit breaker gives it).
    pub on_wire: Arc<AtomicBool>,
    /// Someone watches the operation: the body asks for a streamed answer
    /// (`stream: true`), and its text is published here as it comes.
    pub live: Option<LiveText>,
}

impl ModelCall {
    /// Counts one request sent.
    pub fn sending(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// This send has a connection or stream to go on.
    pub fn on_wire(&self) {
        self.on_wire.store(true, Ordering::Relaxed);
    }
}
