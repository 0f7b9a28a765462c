//! HTTP/2 without TLS (prior knowledge) to a model server that takes it: each request a
//! stream on one of [`CONNECTIONS`] connections held open, made when a request first
//! needs one and again after it closes.
//!
//! On the `h2` crate itself rather than hyper's client, which runs on it: a request
//! waiting for its answer holds its stream and this small future, where hyper's pooled
//! client holds a boxed future of some 3 KB and a spawned task of some 3 KB more for
//! each (docs/benchmark.md, figure 2). HTTP/1.1 over `http://` is `h1.rs`; over
//! `https://` hyper's pooled client stays (`client.rs`), and ALPN picks the protocol.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use h2::SendStream;
use h2::client::{ResponseFuture, SendRequest};
use hyper::header::{CONTENT_LENGTH, HeaderValue};
use hyper::{Request, Response};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::client::{CONNECTIONS, tcp};
use super::error::ModelError;

pub struct H2c {
    /// `host:port` of the base URL.
    authority: String,
    slots: Box<[Mutex<Option<Connection>>]>,
    next: AtomicUsize,
    made: AtomicU64,
}

/// One open connection: the handle that opens streams on it, and the task that runs it.
struct Connection {
    send: SendRequest<Bytes>,
    task: JoinHandle<()>,
    /// Which connection this is, so that a request that found it broken closes this one
    /// and not the one made since.
    number: u64,
}

impl H2c {
    pub fn new(authority: String) -> Self {
        H2c {
            authority,
            slots: (0..CONNECTIONS).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            made: AtomicU64::new(0),
        }
    }

    /// POSTs `body` with the URI and headers of `head()`, and reads the whole answer. A
    /// request its connection refused before anything was sent (the server said GOAWAY,
    /// or closed it) goes once more, on a new connection, as hyper's client does it.
    pub async fn send(
        &self,
        head: impl Fn() -> Request<()>,
        body: Bytes,
    ) -> Result<Response<Bytes>, ModelError> {
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        // As hyper's client writes it: some servers want it even over HTTP/2.
        let length = HeaderValue::from(body.len());
        let head = || {
            let mut head = head();
            head.headers_mut().insert(CONTENT_LENGTH, length.clone());
            head
        };
        let (response, mut stream) = match self.start(slot, head()).await {
            Ok(started) => started,
            Err(Refused(None, err)) => return Err(err),
            Err(Refused(Some(number), _)) => {
                self.forget(slot, number).await;
                self.start(slot, head())
                    .await
                    .map_err(|Refused(_, err)| err)?
            }
        };
        // Buffered whole: the window a stream opens with (64 KiB) holds a chat request.
        stream
            .send_data(body, true)
            .map_err(ModelError::transport)?;
        let (head, mut incoming) = response.await.map_err(ModelError::transport)?.into_parts();
        let mut body = BytesMut::new();
        while let Some(chunk) = incoming.data().await {
            let chunk = chunk.map_err(ModelError::transport)?;
            let _ = incoming.flow_control().release_capacity(chunk.len());
            if body.is_empty() && incoming.is_end_stream() {
                return Ok(Response::from_parts(head, chunk));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Response::from_parts(head, body.freeze()))
    }

    /// Opens the request's stream and sends its head.
    async fn start(
        &self,
        slot: &Mutex<Option<Connection>>,
        head: Request<()>,
    ) -> Result<(ResponseFuture, SendStream<Bytes>), Refused> {
        let (send, number) = self
            .connection(slot)
            .await
            .map_err(|err| Refused(None, err))?;
        let refused = |err| Refused(Some(number), ModelError::transport(err));
        send.ready()
            .await
            .map_err(refused)?
            .send_request(head, false)
            .map_err(refused)
    }

    /// The slot's connection, made first if it has none or the one it has closed.
    async fn connection(
        &self,
        slot: &Mutex<Option<Connection>>,
    ) -> Result<(SendRequest<Bytes>, u64), ModelError> {
        let mut held = slot.lock().await;
        if let Some(open) = held.as_ref().filter(|c| !c.task.is_finished()) {
            return Ok((open.send.clone(), open.number));
        }
        // Boxed: a waiting request keeps no room for a handshake it did not make.
        let open = Box::pin(self.connect()).await?;
        let handle = (open.send.clone(), open.number);
        *held = Some(open);
        Ok(handle)
    }

    async fn connect(&self) -> Result<Connection, ModelError> {
        let tcp = tcp(&self.authority).await?;
        // hyper's client's windows: an answer comes whole without waiting on ours.
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(2 << 20)
            .initial_connection_window_size(5 << 20)
            .max_header_list_size(16 << 10)
            .enable_push(false)
            .handshake(tcp)
            .await
            .map_err(ModelError::connect)?;
        let task = tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "model connection closed");
            }
        });
        let number = self.made.fetch_add(1, Ordering::Relaxed);
        Ok(Connection { send, task, number })
    }

    /// Drops the slot's connection if it is still `number`: its requests in flight run
    /// on, and new ones get a new connection.
    async fn forget(&self, slot: &Mutex<Option<Connection>>, number: u64) {
        let mut held = slot.lock().await;
        if held.as_ref().is_some_and(|c| c.number == number) {
            *held = None;
        }
    }
}

/// A request that could not start on connection `.0`, or found none to start on.
struct Refused(Option<u64>, ModelError);
