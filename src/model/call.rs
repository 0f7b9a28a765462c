//! [`ModelCall`]: one chat-completions request as the model stack carries it, from the
//! loop through the request retry to the transport.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use bytes::Bytes;

use super::live::LiveText;
use super::responses::{self, WireApi};
use super::wire::ChatRequest;

/// One chat-completions request, cloned cheaply for each retry. Its own file, so that the
/// client (which sends it) and the request retry (which repeats it) both depend on it and
/// not on each other.
#[derive(Clone, Debug)]
pub struct ModelCall {
    /// The conversation, shared with the loop that asks it. Serialized as each send goes
    /// ([`ModelCall::body`]) and not kept as JSON: kept for the retries, the request's
    /// bytes were held beside every waiting loop for as long as the model thought (bench
    /// figures 2 and 12).
    pub chat: Arc<ChatRequest>,
    /// The API it is written for: chat completions, or the Responses API's items.
    pub wire: WireApi,
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
    /// The request's JSON, for one send: written into a buffer of a chat's usual size (not
    /// grown from empty, a reallocation per doubling), then shrunk to its exact size in
    /// place.
    pub fn body(&self) -> Bytes {
        let mut body = Vec::with_capacity(2048);
        match self.wire {
            WireApi::Chat => serde_json::to_writer(&mut body, &*self.chat)
                .expect("chat requests always serialize"),
            WireApi::Responses => responses::write_request(&self.chat, &mut body),
        }
        Bytes::from(body.into_boxed_slice())
    }

    /// Counts one request sent.
    pub fn sending(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// This send has a connection or stream to go on.
    pub fn on_wire(&self) {
        self.on_wire.store(true, Ordering::Relaxed);
    }
}
