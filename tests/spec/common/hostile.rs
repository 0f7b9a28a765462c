//! A hostile model provider: a server of the suite's own that answers the way broken or
//! malicious OpenAI-compatible servers, and the networks in front of them, do, which
//! the scripted model (a well-behaved server) cannot: endless and huge bodies, an
//! encoding not asked for, a redirect, a head hyper cannot read, nested JSON, thousands of
//! tool calls, oversized arguments, the keep-alive race, a stream limit of one. What it
//! answers normally it takes from a real scripted model behind it (`Act::Forward`).
//!
//! HTTP/1.1 is written by hand on the socket (a library would refuse to send two
//! `Content-Length`s); HTTP/2 (`h2c_limited`) is hyper's server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use checkout::model::scripted::ScriptedModel;

/// What one request is answered with.
#[derive(Clone, Debug)]
pub enum Act {
    /// Relayed to the scripted model: a normal answer.
    Forward,
    /// 200, chunked, 16 KiB chunks for as long as the client reads.
    Endless,
    /// 200 with `Content-Length` of this many bytes, all of them sent.
    Huge(u64),
    /// 200, `Content-Encoding: gzip`, which the client never asked for.
    Gzip,
    /// 307 to another base URL.
    Redirect,
    /// 200 with a header of 1 MiB.
    HugeHeader,
    /// 200 with two `Content-Length`s that disagree.
    TwoLengths,
    /// 200 with a chat completion that has a field nested 10,000 deep.
    Nested,
    /// 200 with an answer asking for this many tool calls.
    ToolCalls(usize),
    /// 200 with one charge call whose arguments are this many bytes.
    Arguments(usize),
    /// 200 with `Content-Length: 1000`, 100 bytes of it, then the connection closed.
    CloseMidBody,
    /// 200, then one byte of the body every 50 ms, for as long as the client reads.
    Drip,
    /// The first request on each connection relayed; a later one on the same connection
    /// makes the server close it unanswered, as a server whose keep-alive ran out does
    /// when the next request arrives.
    Race,
}

pub struct Hostile {
    pub addr: SocketAddr,
    stats: Arc<Stats>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Stats {
    /// Chat-completions requests received, whatever they were answered with.
    requests: AtomicU64,
    /// Requests closed unanswered by `Act::Race`.
    raced: AtomicU64,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

struct Plan {
    /// The acts of the first requests, in order of arrival…
    first: Vec<Act>,
    /// …and of every request after them.
    then: Act,
    upstream: String,
    client: reqwest::Client,
}

impl Hostile {
    /// Answers its first requests with `first`, in order, and the rest with `then`,
    /// relaying normal answers to `upstream`.
    pub async fn start(first: Vec<Act>, then: Act, upstream: &ScriptedModel) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(Stats::default());
        let plan = Arc::new(Plan {
            first,
            then,
            upstream: upstream.base_url(),
            client: reqwest::Client::new(),
        });
        let accept = {
            let stats = stats.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(stream, plan.clone(), stats.clone()));
                }
            })
        };
        Hostile {
            addr,
            stats,
            accept,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn requests(&self) -> u64 {
        self.stats.requests.load(Ordering::SeqCst)
    }

    pub fn raced(&self) -> u64 {
        self.stats.raced.load(Ordering::SeqCst)
    }
}

/// One connection: requests read one after the other, each answered by its act.
async fn serve(mut stream: TcpStream, plan: Arc<Plan>, stats: Arc<Stats>) {
    let _ = stream.set_nodelay(true);
    let mut on_this_connection = 0;
    while let Some(body) = read_request(&mut stream).await {
        let number = stats.requests.fetch_add(1, Ordering::SeqCst) as usize;
        on_this_connection += 1;
        let act = plan.first.get(number).unwrap_or(&plan.then).clone();
        let written = match act {
            Act::Race if on_this_connection > 1 => {
                stats.raced.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Act::Forward | Act::Race => {
                let (status, answer) = forward(&plan, body).await;
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    answer.len()
                );
                write_all(&mut stream, &[head.as_bytes(), &answer]).await
            }
            Act::Endless => endless(&mut stream).await,
            Act::CloseMidBody => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n";
                let _ = write_all(&mut stream, &[head.as_bytes(), &[b' '; 100]]).await;
                return;
            }
            Act::Drip => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n";
                let mut dripping = write_all(&mut stream, &[head.as_bytes()]).await;
                while dripping.is_ok() {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    dripping = write_all(&mut stream, &[b" "]).await;
                }
                dripping
            }
            Act::Huge(size) => huge(&mut stream, size).await,
            Act::Gzip => {
                // The start of a gzip stream (its magic bytes), which no client here asked for.
                let gzip = [
                    0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xab, 0xae, 5, 0, 0x43, 0xbf, 0xa6, 0xa3,
                    2, 0, 0, 0,
                ];
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n\r\n",
                    gzip.len()
                );
                write_all(&mut stream, &[head.as_bytes(), &gzip]).await
            }
            Act::Redirect => {
                let head = "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://models.example/v2/chat/completions\r\ncontent-length: 0\r\n\r\n";
                write_all(&mut stream, &[head.as_bytes()]).await
            }
            Act::HugeHeader => {
                let filler = "a".repeat(1 << 20);
                let head = format!(
                    "HTTP/1.1 200 OK\r\nx-filler: {filler}\r\ncontent-length: 2\r\n\r\n{{}}"
                );
                write_all(&mut stream, &[head.as_bytes()]).await
            }
            Act::TwoLengths => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\ncontent-length: 40\r\n\r\n{}";
                write_all(&mut stream, &[head.as_bytes()]).await
            }
            Act::Nested => {
                let nested = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
                let body = format!(r#"{{"id":"h","nested":{nested},"choices":[]}}"#);
                json_200(&mut stream, body.as_bytes()).await
            }
            Act::ToolCalls(n) => {
                let call =
                    r#"{"id":"c","type":"function","function":{"name":"charge","arguments":"{}"}}"#;
                let calls = vec![call; n].join(",");
                json_200(&mut stream, completion(&calls).as_bytes()).await
            }
            Act::Arguments(n) => {
                let arguments = serde_json::to_string(&"x".repeat(n)).unwrap();
                let call = format!(
                    r#"{{"id":"big","type":"function","function":{{"name":"charge","arguments":{arguments}}}}}"#
                );
                json_200(&mut stream, completion(&call).as_bytes()).await
            }
        };
        if written.is_err() {
            return;
        }
    }
}

/// A chat completion whose message asks for `calls` (JSON objects, comma-separated).
fn completion(calls: &str) -> String {
    format!(
        r#"{{"id":"h","object":"chat.completion","created":0,"model":"hostile","choices":[{{"index":0,"message":{{"role":"assistant","content":null,"tool_calls":[{calls}]}},"finish_reason":"tool_calls"}}]}}"#
    )
}

async fn forward(plan: &Plan, body: Vec<u8>) -> (u16, Bytes) {
    let answer = plan
        .client
        .post(format!("{}/chat/completions", plan.upstream))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the scripted model answers");
    let status = answer.status().as_u16();
    (status, answer.bytes().await.unwrap())
}

async fn json_200(stream: &mut TcpStream, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    write_all(stream, &[head.as_bytes(), body]).await
}

async fn endless(stream: &mut TcpStream) -> std::io::Result<()> {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    stream.write_all(head.as_bytes()).await?;
    let chunk = format!("4000\r\n{}\r\n", " ".repeat(0x4000));
    loop {
        stream.write_all(chunk.as_bytes()).await?;
    }
}

async fn huge(stream: &mut TcpStream, size: u64) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let block = vec![b' '; 1 << 16];
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        stream.write_all(&block[..n]).await?;
        left -= n as u64;
    }
    Ok(())
}

async fn write_all(stream: &mut TcpStream, parts: &[&[u8]]) -> std::io::Result<()> {
    for part in parts {
        stream.write_all(part).await?;
    }
    stream.flush().await
}

/// The next request's body, or `None` when the client closed the connection.
async fn read_request(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 4096];
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut byte).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&byte[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = buf[end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut byte).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&byte[..n]);
    }
    Some(body)
}

/// An h2c server that allows one stream per connection (`SETTINGS_MAX_CONCURRENT_STREAMS`
/// 1), relaying every request to `upstream`: a server that is never slow, but that takes
/// one request at a time on a connection. Its connections, counted.
pub async fn h2c_limited(upstream: &ScriptedModel) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicU64::new(0));
    let upstream = format!("{}/chat/completions", upstream.base_url());
    let client = reqwest::Client::new();
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let (client, upstream) = (client.clone(), upstream.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let (client, upstream) = (client.clone(), upstream.clone());
                    async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        let answer = client
                            .post(upstream)
                            .header("content-type", "application/json")
                            .body(body)
                            .send()
                            .await
                            .expect("the scripted model answers");
                        let status = answer.status();
                        let body = answer.bytes().await.unwrap();
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(body))
                                .unwrap(),
                        )
                    }
                });
                let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                builder.max_concurrent_streams(1);
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, connections)
}

/// What the h2c server of [`h2c_faulty`] does to its first request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum H2Fault {
    /// Resets its stream (RST_STREAM INTERNAL_ERROR) without an answer: the server's own
    /// failure of that request.
    ResetFirst,
    /// Answers it, then says GOAWAY (graceful: no stream above it is taken) and closes
    /// the connection once its streams are done, as a server going away does.
    GoAwayAfterFirst,
    /// Goes silent on the connection its first request came on, as that request
    /// arrives: reads and writes nothing more on it, and keeps it open, as a connection
    /// looks whose flow a NAT or balancer dropped without FIN or RST. A real server cannot
    /// be made to do that to one connection and not to the next.
    Silent,
}

/// Checkouts `SILENT-1` to `SILENT-9`, one after another, through `checkout`, against a
/// model whose first connection goes silent ([`H2Fault::Silent`]): each answered 200, and
/// each after the first within `timeout`, the model request's (none waited on the silent
/// connection). How long the nine took.
pub async fn past_a_silent_connection(
    checkout: impl AsyncFn(&str) -> crate::common::Reply,
    timeout: std::time::Duration,
) -> std::time::Duration {
    let started = std::time::Instant::now();
    for i in 1..=9 {
        let begun = std::time::Instant::now();
        let reply = checkout(&format!("SILENT-{i}")).await;
        assert_eq!(reply.status, 200, "checkout {i}: {}", reply.text());
        let took = begun.elapsed();
        assert!(
            i == 1 || took < timeout,
            "checkout SILENT-{i} took {took:.1?}, waiting on the silent connection"
        );
    }
    started.elapsed()
}

/// An h2c server on the `h2` crate itself (hyper's would not misbehave on request),
/// relaying to `upstream` except for what `fault` does to the first request. Its
/// requests and connections, counted.
pub async fn h2c_faulty(
    upstream: &ScriptedModel,
    fault: H2Fault,
) -> (SocketAddr, Arc<AtomicU64>, Arc<AtomicU64>) {
    h2_faulty(upstream, fault, None).await
}

/// As [`h2c_faulty`], over TLS when `tls` is given (its ALPN offering `h2`).
pub async fn h2_faulty(
    upstream: &ScriptedModel,
    fault: H2Fault,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (SocketAddr, Arc<AtomicU64>, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (requests, connections) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let plan = Arc::new(Plan {
        first: Vec::new(),
        then: Act::Forward,
        upstream: upstream.base_url(),
        client: reqwest::Client::new(),
    });
    let (counted, connected) = (requests.clone(), connections.clone());
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            connected.fetch_add(1, Ordering::SeqCst);
            let (plan, counted, tls) = (plan.clone(), counted.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    None => serve_h2(stream, plan, counted, fault).await,
                    Some(tls) => {
                        if let Ok(stream) = tls.accept(stream).await {
                            serve_h2(stream, plan, counted, fault).await;
                        }
                    }
                }
            });
        }
    });
    (addr, requests, connections)
}

/// One connection of [`h2_faulty`].
async fn serve_h2<S>(stream: S, plan: Arc<Plan>, counted: Arc<AtomicU64>, fault: H2Fault)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Ok(mut connection) = h2::server::handshake(stream).await else {
        return;
    };
    // Each stream in a task of its own, so that the connection is polled (its frames
    // read) while a stream waits for its body or its relayed answer.
    let (answered, mut first_answered) = tokio::sync::mpsc::unbounded_channel();
    loop {
        tokio::select! {
            next = connection.accept() => {
                let Some(Ok((request, mut respond))) = next else { return };
                let number = counted.fetch_add(1, Ordering::SeqCst);
                if number == 0 && fault == H2Fault::ResetFirst {
                    respond.send_reset(h2::Reason::INTERNAL_ERROR);
                    continue;
                }
                if number == 0 && fault == H2Fault::Silent {
                    // Held, never polled again: not even a PING is answered.
                    let _silent = (connection, request, respond);
                    let never: std::convert::Infallible = std::future::pending().await;
                    match never {}
                }
                let (plan, answered) = (plan.clone(), answered.clone());
                tokio::spawn(async move {
                    let mut incoming = request.into_body();
                    let mut body = Vec::new();
                    while let Some(Ok(chunk)) = incoming.data().await {
                        let _ = incoming.flow_control().release_capacity(chunk.len());
                        body.extend_from_slice(&chunk);
                    }
                    let (status, answer) = forward(&plan, body).await;
                    let head = hyper::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(())
                        .unwrap();
                    if let Ok(mut send) = respond.send_response(head, false) {
                        let _ = send.send_data(answer, true);
                    }
                    let _ = answered.send(number);
                });
            }
            Some(number) = first_answered.recv() => {
                if number == 0 && fault == H2Fault::GoAwayAfterFirst {
                    connection.graceful_shutdown();
                }
            }
        }
    }
}

/// A certificate for 127.0.0.1 signed by a CA of the test's own (both made by
/// `openssl`), as a TLS server's config offering `h2` by ALPN; and the CA's PEM file,
/// for a client to trust (`SSL_CERT_FILE`). The directory holds the files.
pub fn trusted_tls() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Arc<rustls::ServerConfig>,
) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    std::fs::write(
        dir.path().join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    for command in [
        format!(
            "req -x509 -days 1 -subj /CN=checkout-test-CA {key} -keyout {d}/ca.key -out {d}/ca.pem"
        ),
        format!("req -subj /CN=localhost {key} -keyout {d}/leaf.key -out {d}/leaf.csr"),
        format!(
            "x509 -req -days 1 -CAcreateserial -in {d}/leaf.csr -CA {d}/ca.pem -CAkey {d}/ca.key -extfile {d}/leaf.ext -out {d}/leaf.pem"
        ),
    ] {
        let made = std::process::Command::new("openssl")
            .args(command.split_whitespace())
            .output()
            .expect("openssl runs");
        assert!(made.status.success(), "{made:?}");
    }
    let file = |name: &str| dir.path().join(name);
    let chain = vec![CertificateDer::from_pem_file(file("leaf.pem")).unwrap()];
    let key = PrivateKeyDer::from_pem_file(file("leaf.key")).unwrap();
    crate::common::install_tls();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let ca = dir.path().join("ca.pem");
    (dir, ca, Arc::new(config))
}

/// A TLS server whose certificate no trusted CA signed (self-signed, made by `openssl`
/// for the test): it takes handshakes and nothing more. Its address and the handshakes
/// begun, counted.
pub fn untrusted_tls() -> (SocketAddr, Arc<AtomicU64>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(made.status.success(), "{made:?}");
    let chain = vec![CertificateDer::from_pem_file(&cert).unwrap()];
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    crate::common::install_tls();
    let config = Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicU64::new(0));
    let counted = handshakes.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            let mut tls = rustls::ServerConnection::new(config.clone()).unwrap();
            // Until the client gives up on the certificate.
            while tls.complete_io(&mut stream).is_ok() && tls.is_handshaking() {}
        }
    });
    (addr, handshakes)
}
