//! A TCP proxy in front of a server (Postgres, a model) that a test can break the way a
//! restart breaks it (live connections die, new ones are refused, replies go missing) or
//! the way a NAT or balancer that drops a flow breaks it (live connections go silent,
//! with no FIN and no RST, while new ones relay).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const PASS: u8 = 0;
/// Forward what the service sends, drop what the database answers.
const SWALLOW_REPLIES: u8 = 1;
/// Refuse new connections (accept and close at once).
const DOWN: u8 = 2;
/// Take new connections and never answer on them (hold them open, relay nothing).
const BLACKHOLE: u8 = 3;

pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    cut: watch::Sender<u64>,
    /// Times `freeze` was called: a relay born before the last call forwards nothing.
    frozen: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(PASS));
        let (cut, _) = watch::channel(0u64);
        let frozen = Arc::new(AtomicU64::new(0));
        let accept = {
            let (mode, cut, frozen) = (mode.clone(), cut.clone(), frozen.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    match mode.load(Ordering::SeqCst) {
                        DOWN => {
                            drop(client);
                            continue;
                        }
                        BLACKHOLE => {
                            let mut cut = cut.subscribe();
                            tokio::spawn(async move {
                                let _held = client;
                                let _ = cut.changed().await;
                            });
                            continue;
                        }
                        _ => {}
                    }
                    let Ok(server) = TcpStream::connect(target).await else {
                        continue;
                    };
                    let silent = Silent {
                        frozen: frozen.clone(),
                        born: frozen.load(Ordering::SeqCst),
                    };
                    tokio::spawn(relay(client, server, mode.clone(), cut.subscribe(), silent));
                }
            })
        };
        Proxy {
            addr,
            mode,
            cut,
            frozen,
            accept,
        }
    }

    /// Drops what the database sends back: statements still run, their answers are lost.
    pub fn swallow_replies(&self) {
        self.mode.store(SWALLOW_REPLIES, Ordering::SeqCst);
    }

    /// The database goes away: every live connection is closed, new ones are refused.
    pub fn down(&self) {
        self.mode.store(DOWN, Ordering::SeqCst);
        self.cut.send_modify(|generation| *generation += 1);
    }

    /// New connections are taken and never answered (a server that accepts and hangs);
    /// live ones relay on.
    pub fn blackhole(&self) {
        self.mode.store(BLACKHOLE, Ordering::SeqCst);
    }

    /// The database is back.
    pub fn up(&self) {
        self.mode.store(PASS, Ordering::SeqCst);
    }

    /// Every live connection goes silent: what either side sends is dropped, and neither
    /// is told (no FIN, no RST). Connections made after it relay as usual.
    pub fn freeze(&self) {
        self.frozen.fetch_add(1, Ordering::SeqCst);
    }
}

/// Whether a relay's flow was dropped: it was born before the last `freeze`.
struct Silent {
    frozen: Arc<AtomicU64>,
    born: u64,
}

impl Silent {
    fn now(&self) -> bool {
        self.frozen.load(Ordering::SeqCst) > self.born
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    mode: Arc<AtomicU8>,
    mut cut: watch::Receiver<u64>,
    silent: Silent,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if !silent.now() {
                server_write.write_all(&buf[..n]).await?;
            }
        }
    };
    let downstream = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if mode.load(Ordering::SeqCst) != SWALLOW_REPLIES && !silent.now() {
                client_write.write_all(&buf[..n]).await?;
            }
        }
    };
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = cut.changed() => {}
    }
}
