//! A TCP proxy on a free loopback port in front of a server, for network faults that neither side
//! causes: [`Proxy::cut`] resets every open connection and keeps accepting new ones;
//! [`Proxy::blackhole`] keeps connections open but moves no byte for a while (a silent partition:
//! no RST, no FIN, nothing for the peers to notice but silence).
//!
//! # Invariants
//! - While a blackhole lasts, nothing is forwarded in either direction, on old or new connections, and a
//!   connection accepted during it is not connected upstream before it ends. Bytes read just before
//!   it started are held, never dropped: if both peers are still there afterwards, the stream
//!   continues intact.
//! - Every socket has `SO_LINGER = 0`, so a connection closed by the proxy (a cut, or one peer leaving)
//!   is reset (RST) on both sides, as when a middlebox drops the flow.
//! - The tasks run on the tokio runtime that created the proxy and are aborted when it is dropped.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// State shared by the accept loop, the connection tasks and the test.
#[derive(Debug)]
struct Shared {
    /// Where new connections are forwarded to ([`Proxy::retarget`] changes it).
    upstream: Mutex<SocketAddr>,
    /// Tasks of the connections accepted so far (finished ones are pruned on the next accept or cut).
    links: Mutex<Vec<AbortHandle>>,
    /// Nothing moves until this instant, when set.
    blackhole_until: Mutex<Option<Instant>>,
    /// Connections accepted since the start.
    accepted: AtomicUsize,
}

impl Shared {
    /// Returns once no blackhole is in force.
    async fn wait_open(&self) {
        loop {
            let until = *self.blackhole_until.lock().unwrap_or_else(|e| e.into_inner());
            match until {
                Some(t) if Instant::now() < t => {
                    let left = t.saturating_duration_since(Instant::now());
                    tokio::time::sleep(left.min(Duration::from_millis(20))).await;
                }
                _ => return,
            }
        }
    }

    fn links(&self) -> std::sync::MutexGuard<'_, Vec<AbortHandle>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A TCP proxy `127.0.0.1:<port>` -> `127.0.0.1:<upstream port>`; see the module docs.
#[derive(Debug)]
pub struct Proxy {
    /// Listening port on 127.0.0.1.
    port: u16,
    /// Shared with the tasks.
    shared: Arc<Shared>,
    /// The accept loop.
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream_port` on a free loopback port.
    ///
    /// # Panics
    /// Outside a tokio runtime, or when no loopback port can be bound.
    pub fn start(upstream_port: u16) -> Proxy {
        let std_listener =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0 for the proxy");
        std_listener.set_nonblocking(true).expect("non-blocking proxy listener");
        let port = std_listener.local_addr().expect("proxy local_addr").port();
        let listener = TcpListener::from_std(std_listener).expect("proxy listener (needs a tokio runtime)");
        let shared = Arc::new(Shared {
            upstream: Mutex::new(SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port))),
            links: Mutex::new(Vec::new()),
            blackhole_until: Mutex::new(None),
            accepted: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Proxy { port, shared, accept }
    }

    /// Listening port on 127.0.0.1 (point the client here).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently open (accepted and not yet closed).
    pub fn open_connections(&self) -> usize {
        let mut links = self.shared.links();
        links.retain(|h| !h.is_finished());
        links.len()
    }

    /// Resets every open connection on both sides (RST) and keeps accepting new ones. Returns how
    /// many were open.
    pub fn cut(&self) -> usize {
        let links: Vec<AbortHandle> = std::mem::take(&mut *self.shared.links());
        let open = links.iter().filter(|h| !h.is_finished()).count();
        for link in links {
            link.abort();
        }
        open
    }

    /// Forwards connections accepted from now on to `127.0.0.1:upstream_port`; open ones stay where they
    /// are (a DNS name or a proxy that fails over: the old server keeps its sessions while it is up).
    pub fn retarget(&self, upstream_port: u16) {
        *self.shared.upstream.lock().unwrap_or_else(|e| e.into_inner()) =
            SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port));
    }

    /// From now on for `duration`, no byte moves in either direction and new connections are held
    /// before they reach the upstream; everything stays open. Does not wait.
    pub fn blackhole(&self, duration: Duration) {
        *self.shared.blackhole_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + duration);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for link in self.shared.links().drain(..) {
            link.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                eprintln!("proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let link = tokio::spawn(forward(client, shared.clone()));
        let mut links = shared.links();
        links.retain(|h| !h.is_finished());
        links.push(link.abort_handle());
    }
}

/// Forwards one connection until either side closes or fails, or the task is aborted (a cut).
async fn forward(client: TcpStream, shared: Arc<Shared>) {
    shared.wait_open().await;
    let target = *shared.upstream.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(upstream) = TcpStream::connect(target).await else {
        return; // dropping `client` resets it: the same as a refused connection, seen by the client
    };
    for s in [&client, &upstream] {
        let _ = s.set_nodelay(true);
        // Zero linger: closing sends RST at once (never blocks), as a middlebox dropping the flow.
        #[allow(deprecated)]
        let _ = s.set_linger(Some(Duration::ZERO));
    }
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut upstream_rd, mut upstream_wr) = upstream.into_split();
    // Either direction ending ends both: dropping the halves closes (resets) both sockets.
    tokio::select! {
        _ = pump(&mut client_rd, &mut upstream_wr, &shared) => {}
        _ = pump(&mut upstream_rd, &mut client_wr, &shared) => {}
    }
}

/// Copies `from` to `to`, pausing while a blackhole is in force.
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        shared.wait_open().await;
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        // Bytes read just before a blackhole began are held until it ends, not delivered during it.
        shared.wait_open().await;
        to.write_all(&buf[..n]).await?;
    }
}
