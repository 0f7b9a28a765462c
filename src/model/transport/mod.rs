//! How one chat-completions POST travels, and how much of its answer is read.
//!
//! - `http://` and `https://`, HTTP/1.1 or (by ALPN) HTTP/2: hyper-util's pooled client,
//!   which reaps idle connections, retries a request a reused connection refused before
//!   sending it, and (HTTP/2) sends keep-alive PINGs. A request whose connection ended
//!   after it was sent and before any byte of the answer came back (the server closed a
//!   kept-alive one as the request arrived: the keep-alive race; or a balancer dropped a
//!   new one) goes once more at once, on a new connection: only that one's outcome
//!   counts, for the request retry and the circuit breaker. A model request has no
//!   effect of ours, so sending it again is always safe.
//! - Over `https://`, a request given up (its timeout, or its caller gone) before any
//!   byte of its answer retires the pooled client it went on: its HTTP/2 connection may
//!   have gone silent (a NAT or balancer dropped the flow without FIN or RST), and
//!   hyper-util would go on giving that connection new streams until its keep-alive PING failed (up to
//!   `CHECKOUT_MODEL_KEEPALIVE_MS` + `CHECKOUT_MODEL_KEEPALIVE_TIMEOUT_MS`), each waiting
//!   out its timeout. hyper-util gives no handle on one pooled connection to PING it at
//!   once, as the h2c wire does; so a new client takes the retired one's turn, and the
//!   retired one's connections close once the requests on them end. The cost, for a live
//!   server slower than the timeout: a new connection (a TLS handshake) per request given
//!   up. Over `http://` the pool speaks HTTP/1.1 only, where a request given up closes its
//!   own connection already.
//! - `http://` with `CHECKOUT_MODEL_H2C`: HTTP/2 by prior knowledge on the `h2` crate's
//!   own connections (`h2c.rs`).
//! - Either through the forward proxy the environment names (`HTTPS_PROXY`,
//!   `HTTP_PROXY`, `NO_PROXY`), as reqwest and curl follow one (`proxy.rs`).
//!
//! Every answer is read up to [`TransportSettings::max_answer_bytes`]: a longer one is
//! cut off, its connection closed, and the request fails as [`Unusable`](super::ModelErrorKind::Unusable)
//! (a repeat on this endpoint would get the same). So are an answer head hyper cannot
//! read, an encoding the client did not ask for, and a redirect.

mod h2c;
mod proxy;

use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, TryStreamExt};
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{
    CONTENT_ENCODING, CONTENT_LENGTH, HeaderMap, HeaderValue, LOCATION, PROXY_AUTHORIZATION,
};
use hyper::{Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls_platform_verifier::ConfigVerifierExt;
use tower::BoxError;

use self::h2c::H2c;
use self::proxy::{Connector, Route};
use super::call::ModelCall;
use super::error::ModelError;

/// HTTP/2 connections an endpoint starts with, its requests spread over them in turn: a
/// broken connection fails only its share of the requests in flight, and the framing
/// runs on as many tasks. Over h2c more are opened (up to [`MAX_H2C_CONNECTIONS`]) when
/// every stream the server allows on these is taken. Over `https://`, one pooled client
/// each.
pub const CONNECTIONS: usize = 4;

/// The most h2c connections to one endpoint: a server that allows one stream per
/// connection gets up to this many requests at once before they queue in the service.
pub const MAX_H2C_CONNECTIONS: usize = 256;

/// The most bytes of answers an HTTP/2 connection to a model may have sent and the service
/// not yet read, all its streams together (the connection's flow-control window); a
/// stream's own window is its answer's bound. With hyper's larger default, the scripted
/// model's 10,000 answers of bench figure 12 all came in at once, and the service held
/// them in h2's receive queue (a slab, never shrunk), which figure 12's high-water mark
/// showed. A provider is not slowed by it: the service reads the bytes as they come and
/// hands the window back as it reads, and 1 MiB a round trip is 10 MB/s a connection at
/// 100 ms, for answers of a few KB.
pub const CONNECTION_WINDOW: u32 = 1 << 20;

/// How the model's connections are kept and how much of an answer is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportSettings {
    /// The most bytes of one answer's body that are read (`CHECKOUT_MODEL_MAX_ANSWER_BYTES`).
    pub max_answer_bytes: usize,
    /// A PING on each HTTP/2 connection this often (`CHECKOUT_MODEL_KEEPALIVE_MS`)…
    pub keep_alive: Duration,
    /// …and a connection whose PING is not answered within this is dropped and made
    /// again (`CHECKOUT_MODEL_KEEPALIVE_TIMEOUT_MS`).
    pub keep_alive_timeout: Duration,
    /// A TCP connect that takes longer fails (`CHECKOUT_MODEL_CONNECT_TIMEOUT_MS`).
    pub connect_timeout: Duration,
}

impl TransportSettings {
    /// A real answer is about 1 KB (tests/fixtures/llama-server); the loop asks for at
    /// most 512 tokens, some 12 KB of JSON even if every byte came `\u`-escaped. 64 KiB is
    /// five times that.
    pub const DEFAULT_MAX_ANSWER_BYTES: usize = 64 << 10;
}

impl Default for TransportSettings {
    fn default() -> Self {
        TransportSettings {
            max_answer_bytes: Self::DEFAULT_MAX_ANSWER_BYTES,
            keep_alive: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Where the requests go, and on what.
pub struct Transport {
    wire: Wire,
    uri: Uri,
    max_answer_bytes: usize,
    /// The proxy the requests go through, if any: for the start-up line.
    proxy: Option<String>,
    /// `Proxy-Authorization`, sent with each request to a forward proxy.
    proxy_auth: Option<HeaderValue>,
}

enum Wire {
    /// hyper-util's pooled clients.
    Pooled(Pooled),
    /// HTTP/2 by prior knowledge, on the `h2` crate.
    H2c(H2c),
}

type Http = Client<HttpsConnector<Connector>, Full<Bytes>>;

/// hyper-util's pooled clients, taken in turn, and one without a pool for a request whose
/// connection ended unanswered.
struct Pooled {
    /// Each client with the number of clients its turn has had: a client is retired only
    /// once, by the first request given up on it.
    clients: Box<[Mutex<(u64, Http)>]>,
    next: AtomicUsize,
    fresh: Http,
    /// What a retired client is made again from: over `https://` only.
    retire: Option<Box<Remake>>,
}

/// A pooled client's parts, to make it again.
struct Remake {
    tls: rustls::ClientConfig,
    route: Route,
    settings: TransportSettings,
}

impl Pooled {
    /// The client whose turn it is, its slot and its generation.
    fn take(&self) -> (usize, u64, Http) {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        let (generation, http) = &*self.clients[slot].lock().expect("never poisoned");
        (slot, *generation, http.clone())
    }

    /// A request on the client of `slot` and `generation` was given up with no byte of
    /// its answer: unless that client is retired already, a new one takes its turn.
    fn retire(&self, slot: usize, generation: u64) {
        let Some(remake) = &self.retire else { return };
        let mut client = self.clients[slot].lock().expect("never poisoned");
        if client.0 == generation {
            tracing::debug!(
                "a model request was given up with no byte of its answer; its pooled client is retired, a new one takes its turn"
            );
            *client = (
                generation + 1,
                pooled_client(
                    Some(remake.tls.clone()),
                    &remake.route,
                    &remake.settings,
                    true,
                ),
            );
        }
    }
}

/// Held while a request on a pooled client waits for its answer's head: dropped before
/// it is [`heard`](Unheard::heard) (its timeout, or its caller gone), it retires the
/// client.
struct Unheard<'a> {
    pooled: &'a Pooled,
    slot: usize,
    generation: u64,
    waiting: bool,
}

impl Unheard<'_> {
    fn heard(&mut self) {
        self.waiting = false;
    }
}

impl Drop for Unheard<'_> {
    fn drop(&mut self) {
        if self.waiting {
            self.pooled.retire(self.slot, self.generation);
        }
    }
}

impl Transport {
    pub fn new(uri: Uri, h2c: bool, settings: &TransportSettings) -> Result<Self, BoxError> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("the model's URL {uri} is not http:// or https://").into()),
        };
        let route = Route::from_env(&uri)?;
        let wire = match uri.authority() {
            Some(authority) if h2c && !https => {
                let port = authority.port_u16().unwrap_or(80);
                let tunnel = match &route {
                    Route::Direct => None,
                    Route::Proxy { proxy, auth } => {
                        Some(proxy::tunnel(proxy, auth, tcp_connector(settings)))
                    }
                };
                Wire::H2c(H2c::new(
                    format!("{}:{port}", authority.host()),
                    tunnel,
                    settings,
                ))
            }
            _ => {
                // The platform's verifier (every CA root read) only for an https:// endpoint,
                // once for its clients.
                let tls = match https {
                    true => {
                        // One TLS provider for the process: ring, as sqlx's rustls has it.
                        let _ = rustls::crypto::ring::default_provider().install_default();
                        Some(rustls::ClientConfig::with_platform_verifier()?)
                    }
                    false => None,
                };
                let count = if https { CONNECTIONS } else { 1 };
                let clients = (0..count)
                    .map(|_| Mutex::new((0, pooled_client(tls.clone(), &route, settings, true))))
                    .collect();
                Wire::Pooled(Pooled {
                    clients,
                    next: AtomicUsize::new(0),
                    fresh: pooled_client(tls.clone(), &route, settings, false),
                    retire: tls.map(|tls| {
                        Box::new(Remake {
                            tls,
                            route: route.clone(),
                            settings: *settings,
                        })
                    }),
                })
            }
        };
        Ok(Transport {
            wire,
            uri,
            max_answer_bytes: settings.max_answer_bytes,
            proxy: route.describe(),
            proxy_auth: route.forward_auth(https),
        })
    }

    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The proxy the requests go through (`http://host:port`), if the environment names
    /// one for this endpoint.
    pub fn proxy(&self) -> Option<&str> {
        self.proxy.as_deref()
    }

    /// The request's head, and the proxy's credentials when it goes to a forward proxy.
    fn request(&self, head: &impl Fn() -> Request<()>, call: &ModelCall) -> Request<Full<Bytes>> {
        let mut request = head().map(|()| Full::new(call.body()));
        if let Some(auth) = &self.proxy_auth {
            request
                .headers_mut()
                .insert(PROXY_AUTHORIZATION, auth.clone());
        }
        request
    }

    /// POSTs the call's body with the head of `head()`, and reads the answer up to the
    /// bound. The call hears when the request has a connection or stream to go on (time
    /// before it was spent waiting in the service, not on the endpoint) and when it is
    /// sent again on a new connection (a request more).
    pub async fn send(
        &self,
        head: impl Fn() -> Request<()>,
        call: &ModelCall,
    ) -> Result<Response<Bytes>, ModelError> {
        let limit = self.max_answer_bytes;
        let incoming = match &self.wire {
            Wire::H2c(h2c) => return h2c.send(head, call, limit).await,
            Wire::Pooled(pooled) => self.pooled(pooled, head, call).await?,
        };
        let (head, incoming) = incoming.into_parts();
        check_head(head.status.as_u16(), &head.headers, limit)?;
        let body = Limited::new(incoming, limit)
            .collect()
            .await
            .map_err(|err| body_error(err, limit))?
            .to_bytes();
        Ok(Response::from_parts(head, body))
    }

    /// As [`send`](Self::send), but the answer's body is handed over as it comes, in
    /// the pieces it comes in (a streamed answer, `stream: true`): the bound holds for the
    /// whole of it, the pieces counted as they come; past it the stream fails as a whole
    /// answer over the bound does.
    pub async fn open(
        &self,
        head: impl Fn() -> Request<()>,
        call: &ModelCall,
    ) -> Result<Response<Chunks>, ModelError> {
        let limit = self.max_answer_bytes;
        let incoming = match &self.wire {
            Wire::H2c(h2c) => return h2c.open(head, call, limit).await,
            Wire::Pooled(pooled) => self.pooled(pooled, head, call).await?,
        };
        let (head, incoming) = incoming.into_parts();
        check_head(head.status.as_u16(), &head.headers, limit)?;
        let chunks = Limited::new(incoming, limit)
            .into_data_stream()
            .map_err(move |err| body_error(err, limit));
        Ok(Response::from_parts(head, Box::pin(chunks) as Chunks))
    }

    /// The answer's head over hyper-util's pooled client, sent once more on a new
    /// connection when its connection ended unanswered.
    async fn pooled(
        &self,
        pooled: &Pooled,
        head: impl Fn() -> Request<()>,
        call: &ModelCall,
    ) -> Result<Response<hyper::body::Incoming>, ModelError> {
        call.on_wire();
        let (slot, generation, http) = pooled.take();
        // The body goes with the request, not held here while the model thinks: a resend
        // writes it again.
        let request = self.request(&head, call);
        let mut unheard = Unheard {
            pooled,
            slot,
            generation,
            waiting: true,
        };
        let sent = http.request(request).await;
        unheard.heard();
        match sent {
            Ok(response) => Ok(response),
            Err(err) if dropped_unanswered(&err) => {
                tracing::debug!(error = %err, "the model connection ended before any byte of an answer (the keep-alive race, or a dropped connection); sending the request again on a new connection");
                call.sending();
                pooled
                    .fresh
                    .request(self.request(&head, call))
                    .await
                    .map_err(pooled_error)
            }
            Err(err) => Err(pooled_error(err)),
        }
    }
}

/// A streamed answer's body, piece by piece, within the bound.
pub type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, ModelError>> + Send>>;

/// The TCP connections' settings: no Nagle delay, the connect timeout.
fn tcp_connector(s: &TransportSettings) -> HttpConnector {
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(s.connect_timeout));
    tcp
}

/// One pooled client: HTTP/1.1 over `http://`; over `https://` (`tls`) what ALPN picks and
/// keep-alive PINGs on HTTP/2; through the `route`'s proxy if any. `pool`: false for the
/// client whose every request takes a new connection.
fn pooled_client(
    tls: Option<rustls::ClientConfig>,
    route: &Route,
    s: &TransportSettings,
    pool: bool,
) -> Http {
    let tcp = Connector::new(route, tls.is_some(), tcp_connector(s));
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let connector = match tls {
        Some(tls) => builder
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .enable_http2()
            .wrap_connector(tcp),
        // A plain `http://` endpoint: no root is ever asked for.
        None => builder
            .with_tls_config(
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp),
    };
    let mut http = Client::builder(TokioExecutor::new());
    http.pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .http2_initial_max_send_streams(100)
        .http2_initial_connection_window_size(CONNECTION_WINDOW)
        .http2_keep_alive_interval(s.keep_alive)
        .http2_keep_alive_timeout(s.keep_alive_timeout)
        .http2_keep_alive_while_idle(true);
    if !pool {
        http.pool_max_idle_per_host(0);
    }
    http.build(connector)
}

/// The request was sent, or was being sent, and the connection ended before any byte of
/// an answer: safe to send again, a model request has no effect of ours.
fn dropped_unanswered(err: &hyper_util::client::legacy::Error) -> bool {
    if err.is_connect() {
        return false;
    }
    let mut cause = std::error::Error::source(err);
    while let Some(err) = cause {
        if let Some(hyper) = err.downcast_ref::<hyper::Error>() {
            return hyper.is_incomplete_message() || hyper.is_canceled();
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            );
        }
        cause = err.source();
    }
    false
}

fn pooled_error(err: hyper_util::client::legacy::Error) -> ModelError {
    if err.is_connect() {
        return match refused_certificate(&err) {
            Some(why) => ModelError::unusable(format!(
                "its TLS certificate was refused ({why}); a repeat would be refused the same"
            )),
            None => ModelError::connect(err),
        };
    }
    let mut cause = std::error::Error::source(&err);
    while let Some(inner) = cause {
        if let Some(hyper) = inner.downcast_ref::<hyper::Error>()
            && hyper.is_parse()
        {
            let what = if hyper.is_parse_too_large() {
                "its head is larger than the client reads"
            } else {
                "its head is not valid HTTP"
            };
            return ModelError::unusable(format!("{what} ({hyper})"));
        }
        cause = inner.source();
    }
    ModelError::transport(err)
}

/// The provider's certificate, refused by the verifier (no trusted CA signed it, another
/// name, expired), as the connect error's causes tell it. An `io::Error` is looked into
/// as well as past: hyper-rustls wraps tokio-rustls's `io::Error` in another, and an
/// `io::Error`'s `source` skips the error it wraps.
fn refused_certificate(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(
            tls @ (rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented),
        ) = err.downcast_ref::<rustls::Error>()
        {
            return Some(tls.to_string());
        }
        cause = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as _),
            None => err.source(),
        };
    }
    None
}

/// What the head alone says is wrong with an answer: a body declared over the bound, an
/// encoding the client did not ask for (it sends no `Accept-Encoding`), a redirect (the
/// client follows none: the base URL should name where it points).
fn check_head(status: u16, headers: &HeaderMap, limit: usize) -> Result<(), ModelError> {
    if let Some(length) = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && length > limit as u64
    {
        return Err(ModelError::unusable(format!(
            "its body is {length} bytes, over the {limit} bytes an answer may take (CHECKOUT_MODEL_MAX_ANSWER_BYTES)"
        )));
    }
    if let Some(encoding) = headers.get(CONTENT_ENCODING)
        && !encoding.as_bytes().eq_ignore_ascii_case(b"identity")
    {
        return Err(ModelError::unusable(format!(
            "it came with Content-Encoding: {}, which the client did not ask for",
            String::from_utf8_lossy(encoding.as_bytes())
        )));
    }
    if (300..400).contains(&status) {
        let location = headers
            .get(LOCATION)
            .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());
        return Err(ModelError::unusable(match location {
            Some(location) => format!(
                "the provider answered {status}, a redirect to {location}; the client follows none: set the base URL to where it points"
            ),
            None => format!("the provider answered {status}, a redirect without a Location"),
        }));
    }
    Ok(())
}

/// A body that could not be read whole: over the bound, or its connection broke.
fn body_error(err: BoxError, limit: usize) -> ModelError {
    if err.is::<http_body_util::LengthLimitError>() {
        over_bound(limit)
    } else {
        ModelError::transport(err)
    }
}

fn over_bound(limit: usize) -> ModelError {
    ModelError::unusable(format!(
        "its body is over the {limit} bytes an answer may take (CHECKOUT_MODEL_MAX_ANSWER_BYTES); it was cut off there"
    ))
}

/// A TCP connection to `authority` (`host:port`) within `timeout`, without Nagle's delay.
async fn tcp(authority: &str, timeout: Duration) -> Result<tokio::net::TcpStream, ModelError> {
    let tcp = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(authority))
        .await
        .map_err(|_| {
            ModelError::connect(format!(
                "no connection within {} ms (CHECKOUT_MODEL_CONNECT_TIMEOUT_MS)",
                timeout.as_millis()
            ))
        })?
        .map_err(ModelError::connect)?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}
