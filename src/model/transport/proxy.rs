//! The model's connections through a forward proxy, followed as reqwest and curl follow
//! one: `HTTPS_PROXY` for an `https://` endpoint, `HTTP_PROXY` for an `http://` one,
//! `ALL_PROXY` for either, `NO_PROXY` for the hosts reached directly, lower-case names
//! too: hyper-util's `Matcher::from_env`, the one reqwest uses, read once when the
//! endpoint's client is made.
//!
//! - `https://` endpoint: a CONNECT tunnel through the proxy (hyper-util's `Tunnel`), TLS
//!   inside it end to end, HTTP/2 by ALPN as without a proxy.
//! - `http://` endpoint: each request goes to the proxy with its absolute URI (the
//!   connection is marked proxied, and hyper-util's client then keeps the URI absolute),
//!   the proxy's credentials (`http://user:pass@proxy:3128`) as `Proxy-Authorization`.
//! - h2c (`CHECKOUT_MODEL_H2C`): a CONNECT tunnel, since HTTP/2 by prior knowledge
//!   cannot be forwarded request by request.
//!
//! Only `http://` proxies: another scheme (`socks5://`, `https://`) is refused at
//! start-up, never silently bypassed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::Uri;
use hyper::header::HeaderValue;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::{BoxError, Service};

/// How an endpoint's connections are made.
#[derive(Clone, Debug)]
pub enum Route {
    /// Straight to the endpoint.
    Direct,
    /// Through the proxy at `proxy`.
    Proxy {
        proxy: Uri,
        /// `Basic …`, from the proxy URL's credentials.
        auth: Option<HeaderValue>,
    },
}

impl Route {
    /// The route the environment names for `endpoint`.
    pub fn from_env(endpoint: &Uri) -> Result<Route, BoxError> {
        Route::matching(&Matcher::from_env(), endpoint)
    }

    fn matching(matcher: &Matcher, endpoint: &Uri) -> Result<Route, BoxError> {
        let Some(intercept) = matcher.intercept(endpoint) else {
            return Ok(Route::Direct);
        };
        let proxy = intercept.uri().clone();
        if proxy.scheme_str() != Some("http") {
            return Err(format!(
                "the proxy the environment names for the model at {endpoint} (HTTPS_PROXY, HTTP_PROXY or ALL_PROXY) is {}://{}; only http:// proxies are followed",
                proxy.scheme_str().unwrap_or("?"),
                proxy.authority().map_or("", |a| a.as_str()),
            )
            .into());
        }
        let auth = intercept.basic_auth().cloned().map(|mut auth| {
            auth.set_sensitive(true);
            auth
        });
        Ok(Route::Proxy { proxy, auth })
    }

    /// The proxy, for the start-up line: its address, never its credentials.
    pub fn describe(&self) -> Option<String> {
        let Route::Proxy { proxy, .. } = self else {
            return None;
        };
        let host = proxy.host().unwrap_or_default();
        Some(match proxy.port_u16() {
            Some(port) => format!("http://{host}:{port}"),
            None => format!("http://{host}"),
        })
    }

    /// `Proxy-Authorization` for each request, when they go to a forward proxy with
    /// credentials (an `http://` endpoint; a tunnel sends them in its CONNECT).
    pub fn forward_auth(&self, https: bool) -> Option<HeaderValue> {
        match self {
            Route::Proxy { auth, .. } if !https => auth.clone(),
            _ => None,
        }
    }
}

/// The TCP connector of hyper-util's pooled client: straight to the endpoint, to the
/// proxy for an `http://` endpoint (its connections marked proxied), or through a CONNECT
/// tunnel for an `https://` one.
#[derive(Clone)]
pub enum Connector {
    Direct(HttpConnector),
    Forward { tcp: HttpConnector, proxy: Uri },
    Tunnel(Tunnel<HttpConnector>),
}

impl Connector {
    pub fn new(route: &Route, https: bool, tcp: HttpConnector) -> Connector {
        match route {
            Route::Direct => Connector::Direct(tcp),
            Route::Proxy { proxy, .. } if !https => Connector::Forward {
                tcp,
                proxy: proxy.clone(),
            },
            Route::Proxy { proxy, auth } => Connector::Tunnel(tunnel(proxy, auth, tcp)),
        }
    }
}

/// A CONNECT tunnel through `proxy`, with its credentials.
pub fn tunnel(
    proxy: &Uri,
    auth: &Option<HeaderValue>,
    tcp: HttpConnector,
) -> Tunnel<HttpConnector> {
    let tunnel = Tunnel::new(proxy.clone(), tcp);
    match auth {
        Some(auth) => tunnel.with_auth(auth.clone()),
        None => tunnel,
    }
}

impl Service<Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Connector::Direct(tcp) | Connector::Forward { tcp, .. } => {
                tcp.poll_ready(cx).map_err(Into::into)
            }
            Connector::Tunnel(tunnel) => tunnel.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        match self {
            Connector::Direct(tcp) => {
                let connecting = tcp.call(dst);
                Box::pin(async move { Ok(Conn::new(connecting.await?, false)) })
            }
            Connector::Forward { tcp, proxy } => {
                let connecting = tcp.call(proxy.clone());
                Box::pin(async move { Ok(Conn::new(connecting.await?, true)) })
            }
            Connector::Tunnel(tunnel) => {
                let connecting = tunnel.call(dst);
                Box::pin(async move { Ok(Conn::new(connecting.await?, false)) })
            }
        }
    }
}

/// A TCP connection that knows whether it goes to a forward proxy.
pub struct Conn {
    io: TokioIo<TcpStream>,
    proxied: bool,
}

impl Conn {
    fn new(io: TokioIo<TcpStream>, proxied: bool) -> Conn {
        Conn { io, proxied }
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.proxied)
    }
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(http: &str, https: &str, no: &str, endpoint: &str) -> Result<Route, BoxError> {
        let matcher = Matcher::builder().http(http).https(https).no(no).build();
        Route::matching(&matcher, &endpoint.parse().unwrap())
    }

    #[test]
    fn each_scheme_takes_its_own_proxy_and_no_proxy_goes_direct() {
        let proxied = |r: Route| r.describe();
        assert_eq!(
            proxied(route("http://p:3128", "", "", "http://m:8000/v1/chat/completions").unwrap()),
            Some("http://p:3128".into())
        );
        assert_eq!(
            proxied(route("http://p:3128", "", "", "https://api.openai.com/v1").unwrap()),
            None,
            "HTTP_PROXY is not for https://"
        );
        assert_eq!(
            proxied(route("", "http://q:8080", "", "https://api.openai.com/v1").unwrap()),
            Some("http://q:8080".into())
        );
        assert_eq!(
            proxied(route("http://p:3128", "", "m,10.0.0.0/8", "http://m:8000/v1").unwrap()),
            None
        );
        assert_eq!(
            proxied(route("http://p:3128", "", "m,10.0.0.0/8", "http://10.1.2.3/v1").unwrap()),
            None
        );
    }

    #[test]
    fn a_proxy_s_credentials_go_as_basic_auth_and_are_never_shown() {
        let r = route("http://u:secret@p:3128", "", "", "http://m/v1").unwrap();
        let Route::Proxy { auth, .. } = &r else {
            panic!("{r:?}")
        };
        assert_eq!(auth.as_ref().unwrap(), "Basic dTpzZWNyZXQ=");
        assert!(auth.as_ref().unwrap().is_sensitive());
        assert_eq!(r.describe(), Some("http://p:3128".into()));
    }

    #[test]
    fn a_proxy_that_is_not_http_is_refused() {
        let err = route("socks5://p:1080", "", "", "http://m/v1").unwrap_err();
        assert!(
            err.to_string()
                .contains("is socks5://p:1080; only http:// proxies are followed"),
            "{err}"
        );
    }
}
