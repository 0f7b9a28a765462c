//! HTTP/1.1 to a model server over `http://`: kept-alive connections, one request at a
//! time each, taken from a pool of idle ones (the most recently used first) or made when
//! none is idle, and given back once the answer is read whole.
//!
//! On hyper's connection itself rather than its pooled client (which `https://` still
//! uses, for ALPN): that client keys its pool by scheme and host in a hashed map, wraps
//! each connection, and spawns a task per request to give it back, some 20,000 of a
//! checkout's 300,000 instructions (docs/benchmark.md, figure 7); and its request future
//! is a box of some 3 KB for each waiting loop.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HOST, HeaderValue};
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;

use super::client::tcp;
use super::error::ModelError;

/// An idle connection older than this is closed, as hyper's pooled client does it.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

pub struct H1 {
    /// `host:port` of the base URL.
    authority: String,
    /// The `Host` header: HTTP/1.1 asks for it, and the request line has the path only.
    host: HeaderValue,
    /// The path of the chat-completions URL.
    path: Uri,
    /// Idle connections, the most recently given back last.
    idle: Mutex<VecDeque<(SendRequest<Full<Bytes>>, Instant)>>,
}

impl H1 {
    pub fn new(uri: &Uri) -> Result<Self, String> {
        let authority = uri.authority().ok_or("the model's URL names no host")?;
        let port = authority.port_u16().unwrap_or(80);
        let path = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .map_err(|err| format!("{err}"))?;
        Ok(H1 {
            authority: format!("{}:{port}", authority.host()),
            host: HeaderValue::from_str(authority.as_str()).map_err(|err| format!("{err}"))?,
            path,
            idle: Mutex::new(VecDeque::new()),
        })
    }

    /// POSTs `body` with the headers of `head()`, and reads the whole answer. A request an
    /// idle connection refused before it was sent (the server had closed it) goes once
    /// more, on a new connection, as hyper's pooled client does it.
    pub async fn send(
        &self,
        head: impl FnOnce() -> Request<()>,
        body: Bytes,
    ) -> Result<Response<Bytes>, ModelError> {
        let mut request = head().map(|()| Full::new(body));
        *request.uri_mut() = self.path.clone();
        request.headers_mut().insert(HOST, self.host.clone());
        let (mut sender, reused) = match self.ready_idle().await {
            Some(sender) => (sender, true),
            None => (Box::pin(self.connect()).await?, false),
        };
        let response = match sender.try_send_request(request).await {
            Ok(response) => response,
            Err(mut err) => match err.take_message() {
                Some(request) if reused => {
                    sender = Box::pin(self.connect()).await?;
                    sender
                        .send_request(request)
                        .await
                        .map_err(ModelError::transport)?
                }
                _ => return Err(ModelError::transport(err.into_error())),
            },
        };
        let (head, incoming) = response.into_parts();
        let body = incoming
            .collect()
            .await
            .map_err(ModelError::transport)?
            .to_bytes();
        self.give_back(sender);
        Ok(Response::from_parts(head, body))
    }

    /// An idle connection ready for a request, if one is open.
    async fn ready_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        loop {
            let mut sender = {
                let mut idle = self.idle.lock().expect("never poisoned");
                loop {
                    let (sender, _) = idle.pop_back()?;
                    if !sender.is_closed() {
                        break sender;
                    }
                }
            };
            // Ready at once, or as soon as its task has seen the last answer's end.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    fn give_back(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock().expect("never poisoned");
        while idle
            .front()
            .is_some_and(|(_, since)| now.duration_since(*since) > IDLE_TIMEOUT)
        {
            idle.pop_front();
        }
        idle.push_back((sender, now));
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, ModelError> {
        let tcp = tcp(&self.authority).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(ModelError::connect)?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "model connection closed");
            }
        });
        Ok(sender)
    }
}
