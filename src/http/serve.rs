//! Serving connections, with the bounds below the requests: a connection must send its
//! request head within the header timeout and is closed after the idle timeout; at most
//! `max_connections` are open (more wait in the kernel's queue, not in our memory); the
//! descriptor limit is raised to its hard limit at start-up, and the bounds on loops and
//! connections follow from it. A shutdown stops accepting, closes idle connections and
//! lets every request in flight (a checkout) finish.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tower::ServiceExt;

use crate::config::Settings;

/// Descriptors kept for what is not a connection or a loop: the log, SMTP, the mail
/// directory, migrations, the binary's own files.
const SPARE_DESCRIPTORS: u64 = 64;

/// The descriptor limit assumed when it cannot be read: the common soft limit.
pub const ASSUMED_DESCRIPTORS: u64 = 1024;

/// The descriptor limit (`RLIMIT_NOFILE`) before and after start-up raised it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptors {
    pub was: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft descriptor limit to the hard limit: the common soft limit of 1024
/// would otherwise bound the service long before its memory does.
pub fn raise_descriptor_limit() -> std::io::Result<Descriptors> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let was = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(Descriptors {
        was,
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

/// The bounds on loops and connections one descriptor limit carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub max_in_flight: usize,
    pub max_connections: usize,
    /// Descriptors one loop holds: its client's connection and its model connection(s).
    pub per_loop: u64,
    /// Descriptors kept for the database pool and the spare ones (`SPARE_DESCRIPTORS`).
    pub reserved: u64,
}

/// Sizes the bounds. A loop holds its client's connection (one each over HTTP/1.1, as
/// behind most load balancers) and its model connection: one over HTTP/1.1, two when
/// the scripted model serves in this process (both ends), none of its own over HTTP/2
/// (h2c, or an https provider, which ALPN puts on HTTP/2: requests share a
/// connection). A tenth of what is left after the reserve stays for connections
/// answered without a loop (refusals, replays, receipts, health).
pub fn bounds(settings: &Settings, descriptors: u64, model_in_process: bool) -> Bounds {
    let shared = settings.model.h2c || settings.model_over_https();
    let model = match (shared, model_in_process) {
        (true, _) => 0,
        (false, false) => 1,
        (false, true) => 2,
    };
    let per_loop = 1 + model;
    let reserved = u64::from(settings.database.pool.max_connections) + SPARE_DESCRIPTORS;
    let available = descriptors.saturating_sub(reserved);
    let loops = (available - available / 10) / per_loop;
    let max_in_flight = settings
        .overload
        .max_in_flight
        .min(usize::try_from(loops.max(1)).unwrap_or(usize::MAX));
    let connections = available
        .saturating_sub(max_in_flight as u64 * model)
        .max(1);
    let connections = usize::try_from(connections).unwrap_or(usize::MAX);
    let max_connections = match settings.overload.max_connections {
        0 => connections,
        set => set.min(connections),
    };
    Bounds {
        max_in_flight,
        max_connections,
        per_loop,
        reserved,
    }
}

/// The connection settings [`serve`] applies.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets every open
/// connection finish what it runs. Each request carries its peer's [`ConnectInfo`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let max = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let open = Arc::new(Semaphore::new(max as usize));
    let (stop, stopping) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    let mut out_of_descriptors = false;
    let mut at_bound = false;
    loop {
        let permit = match open.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if !at_bound {
                    tracing::warn!(
                        max_connections = max,
                        "{max} connections are open, the bound (CHECKOUT_MAX_CONNECTIONS, or the descriptor limit): new connections wait in the kernel's queue until one closes"
                    );
                    at_bound = true;
                }
                tokio::select! {
                    permit = open.clone().acquire_owned() => permit.expect("never closed"),
                    () = &mut shutdown => break,
                }
            }
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    refused_accept(&err, &mut out_of_descriptors).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if std::mem::take(&mut out_of_descriptors) {
            tracing::info!("accepting connections again: descriptors are free");
        }
        if at_bound && open.available_permits() > max as usize / 10 {
            at_bound = false;
        }
        tokio::spawn(connection(
            stream,
            remote,
            router.clone(),
            limits,
            stopping.clone(),
            permit,
        ));
    }
    drop(listener);
    tracing::info!("shutting down: finishing in-flight checkouts");
    let _ = stop.send(true);
    // Every connection gives its permit back when it has closed.
    let _all_closed = open.acquire_many(max).await;
    Ok(())
}

/// An accept that failed: for want of descriptors, said once until accepting works
/// again (not once per try), then a pause so that the loop does not spin.
async fn refused_accept(err: &std::io::Error, out_of_descriptors: &mut bool) {
    let starved = matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
    if starved {
        if !*out_of_descriptors {
            tracing::error!(error = %err, "cannot accept connections: no descriptor is free; new connections wait in the kernel's queue until one closes (the descriptor limit bounds connections, loops, the database and the model together)");
            *out_of_descriptors = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    } else {
        // A connection reset before it was accepted, and the like: that client's loss.
        tracing::debug!(error = %err, "accept failed");
    }
}

/// What one connection is doing, as the timeouts need it: requests running, when it last
/// had none, and whether a request head has begun to arrive.
struct Activity {
    running: AtomicUsize,
    quiet: Mutex<Quiet>,
    changed: Notify,
}

struct Quiet {
    /// When the connection opened, or its last request ended.
    since: Instant,
    /// When the first byte of a request head arrived while no request ran (HTTP/1.1).
    head_since: Option<Instant>,
    served: bool,
    /// Whether the client opened with the HTTP/2 preface (`None` before its first bytes):
    /// its frames between requests (pings, settings) are no request head.
    http2: Option<bool>,
}

/// Why a connection is closed.
enum Ending {
    /// No request for the idle timeout (the header timeout before its first request).
    Idle,
    /// A request head began and did not end within the header timeout.
    StalledHead,
}

/// One request running; ends it when dropped.
struct Busy(Arc<Activity>);

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            running: AtomicUsize::new(0),
            quiet: Mutex::new(Quiet {
                since: Instant::now(),
                head_since: None,
                served: false,
                http2: None,
            }),
            changed: Notify::new(),
        })
    }

    fn quiet(&self) -> std::sync::MutexGuard<'_, Quiet> {
        self.quiet
            .lock()
            .expect("never poisoned: no code panics holding it")
    }

    /// A request's head has arrived: its handler runs.
    fn begin(self: &Arc<Self>) -> Busy {
        self.running.fetch_add(1, Ordering::SeqCst);
        let mut quiet = self.quiet();
        quiet.head_since = None;
        quiet.served = true;
        drop(quiet);
        self.changed.notify_one();
        Busy(self.clone())
    }

    /// Bytes came in. The header timeout runs from a head's first byte, not from the end
    /// of the previous request: a kept-alive connection may wait the idle timeout.
    fn read(&self, bytes: &[u8]) {
        let mut quiet = self.quiet();
        let http2 = *quiet
            .http2
            .get_or_insert_with(|| bytes.starts_with(b"PRI "));
        if !http2 && quiet.head_since.is_none() && self.running.load(Ordering::SeqCst) == 0 {
            quiet.head_since = Some(Instant::now());
            drop(quiet);
            self.changed.notify_one();
        }
    }

    /// Resolves when the connection should close, and why.
    async fn ending(&self, header: Duration, idle: Duration) -> Ending {
        loop {
            let (deadline, ending) = {
                let quiet = self.quiet();
                if self.running.load(Ordering::SeqCst) > 0 {
                    (None, Ending::Idle)
                } else if let Some(began) = quiet.head_since {
                    (Some(began + header), Ending::StalledHead)
                } else if !quiet.served {
                    (Some(quiet.since + header), Ending::Idle)
                } else {
                    (Some(quiet.since + idle), Ending::Idle)
                }
            };
            match deadline {
                Some(deadline) if Instant::now() >= deadline => return ending,
                Some(deadline) => tokio::select! {
                    () = tokio::time::sleep_until(deadline.into()) => {}
                    () = self.changed.notified() => {}
                },
                None => self.changed.notified().await,
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.quiet().since = Instant::now();
        self.0.changed.notify_one();
    }
}

/// The client's socket, telling [`Activity`] when bytes come in.
struct Watched {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read
            && buf.filled().len() > before
        {
            self.activity.read(&buf.filled()[before..]);
        }
        read
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

async fn connection(
    stream: TcpStream,
    remote: SocketAddr,
    router: Router,
    limits: ConnectionLimits,
    mut stopping: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let activity = Activity::new();
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(remote));
            let busy = activity.begin();
            let router = router.clone();
            async move {
                let _busy = busy;
                router
                    .oneshot(request.map(axum::body::Body::new))
                    .await
                    .map_err(|never: Infallible| match never {})
            }
        })
    };
    // No hyper header timer: over HTTP/1.1 it also runs while a kept-alive connection
    // waits for its next request, which would make the header timeout its idle timeout.
    let builder = auto::Builder::new(TokioExecutor::new());
    let io = Watched {
        io: stream,
        activity: activity.clone(),
    };
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = stopping.changed(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            ending = activity.ending(limits.header_timeout, limits.idle_timeout), if !closing => {
                match ending {
                    Ending::Idle => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    // Its head never came: nothing to finish.
                    Ending::StalledHead => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::testing::CapturedLogs;

    #[tokio::test]
    async fn running_out_of_descriptors_is_said_once_until_accepting_works_again() {
        let written = CapturedLogs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(written.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        let mut out_of_descriptors = false;
        // Ten failed accepts, a second of them, as a process out of descriptors meets.
        for _ in 0..10 {
            refused_accept(&emfile, &mut out_of_descriptors).await;
        }
        let text = written.text();
        assert_eq!(text.matches("no descriptor is free").count(), 1, "{text}");
        assert!(out_of_descriptors);
    }

    #[test]
    fn the_bounds_follow_from_the_descriptor_limit() {
        let mut settings = Settings::default();
        // Pool 16 + 64 spare = 80 kept; a tenth of the rest for loopless connections.
        settings.model.base_url = Some("http://127.0.0.1:9/v1".into());
        let wide = bounds(&settings, 1_048_576, false);
        assert_eq!((wide.per_loop, wide.max_in_flight), (2, 10_000));
        assert_eq!(wide.max_connections, 1_048_576 - 80 - 10_000);
        // The 20,000: 10,000 loops over h2c, a connection each from the clients.
        settings.model.h2c = true;
        let h2c = bounds(&settings, 20_000, false);
        assert_eq!((h2c.per_loop, h2c.max_in_flight), (1, 10_000));
        assert_eq!(h2c.max_connections, 20_000 - 80);
        // The common soft limit, the scripted model in this process over HTTP/1.1.
        let narrow = bounds(&Settings::default(), 1024, true);
        assert_eq!(narrow.per_loop, 3);
        assert_eq!(narrow.max_in_flight, (944 - 94) / 3);
        assert_eq!(narrow.max_connections, 944 - 283 * 2);
    }
}
