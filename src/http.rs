//! The operations endpoint: `/metrics` (OpenMetrics text), `/healthz` (the process is alive) and `/readyz`
//! (connected to source and broker, not failed; 503 with the reason otherwise).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! A deliberately small HTTP/1.1 responder over tokio: GET only, one request per connection. A misbehaving
//! or hostile client (a slowloris that trickles its request, one that never reads the response, a flood of
//! connections) can hold neither the connector's memory nor its tasks:
//! - at most [`MAX_CONNECTIONS`] connections are served at once, each with at most [`MAX_REQUEST_BYTES`] of
//!   request; one more is answered `503` by a write that never waits, and closed at once (the refusals are
//!   logged with their count, at most once a minute, so a flood does not flood the log too);
//! - the request must arrive within [`READ_TIMEOUT`], and the response be taken within [`WRITE_TIMEOUT`];
//!   otherwise the connection is closed and its slot freed.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::health::health;
use crate::metrics::metrics;

/// Connections served at once: a scraper and a few probes need a handful.
const MAX_CONNECTIONS: usize = 16;
const MAX_REQUEST_BYTES: usize = 8 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often refused connections are logged, at most.
const REFUSALS_LOG_INTERVAL: Duration = Duration::from_secs(60);
const REFUSED: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n";

/// Binds the endpoint.
///
/// # Errors
/// A definite error when the address cannot be bound (in use, not local).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        Error::definite(format!(
            "cannot listen on {addr} for /metrics: {e}; set [metrics] listen to a free address or enabled = false"
        ))
    })
}

/// Serves requests until the task is dropped.
pub async fn serve(listener: TcpListener) {
    let limits = Limits { max_connections: MAX_CONNECTIONS, read_timeout: READ_TIMEOUT, write_timeout: WRITE_TIMEOUT };
    serve_with(listener, limits, route).await
}

/// The bounds of the endpoint.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Connections served at once; more are refused.
    max_connections: usize,
    /// Time a client has to send its whole request.
    read_timeout: Duration,
    /// Time a client has to take the whole response.
    write_timeout: Duration,
}

/// What to answer to a request.
struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
}

/// Answers `method` `path`.
type Route = fn(&str, &str) -> Response;

fn route(method: &str, path: &str) -> Response {
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => {
            ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics().render())
        }
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") => match health().readiness() {
            Ok(()) => ("200 OK", "text/plain", "ready\n".to_string()),
            Err(reason) => ("503 Service Unavailable", "text/plain", format!("not ready: {reason}\n")),
        },
        ("GET", _) => ("404 Not Found", "text/plain", "try /metrics, /healthz or /readyz\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".to_string()),
    };
    Response { status, content_type, body }
}

async fn serve_with(listener: TcpListener, limits: Limits, route: Route) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut refusals = Refusals { count: 0, logged_at: None };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => match slots.clone().try_acquire_owned() {
                Ok(slot) => {
                    tokio::spawn(async move {
                        if let Err(e) = respond(stream, limits, route).await {
                            tracing::debug!(error = %e, %peer, "metrics request failed");
                        }
                        drop(slot);
                    });
                }
                Err(_) => {
                    refuse(stream);
                    refusals.note(limits.max_connections);
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers `503` and closes, without waiting for anything: the socket is taken out of tokio and used
/// non-blocking, so a client that sends or reads nothing costs no task. What already arrived of its
/// request is read first, so that closing sends a FIN the client can read the answer before, not a reset.
fn refuse(stream: TcpStream) {
    let Ok(mut stream) = stream.into_std() else { return };
    let _ = stream.read(&mut [0u8; 1024]);
    let _ = stream.write(REFUSED);
}

/// Connections refused since the last warning.
struct Refusals {
    count: u64,
    logged_at: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, max_connections: usize) {
        self.count += 1;
        if self.logged_at.is_none_or(|at| at.elapsed() >= REFUSALS_LOG_INTERVAL) {
            tracing::warn!(
                refused = self.count,
                max_connections,
                "metrics endpoint: connection(s) refused, {max_connections} already being served; is a client \
                 opening connections without closing them?"
            );
            self.count = 0;
            self.logged_at = Some(Instant::now());
        }
    }
}

async fn respond(mut stream: TcpStream, limits: Limits, route: Route) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let read = tokio::time::timeout(limits.read_timeout, async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST_BYTES {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let request = String::from_utf8_lossy(&buf);
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let Response { status, content_type, body } = route(method, path);
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(limits.write_timeout, write).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client did not take the response in time"))
    })
}

#[cfg(test)]
mod tests {
    //! Real TCP clients against the endpoint. The assertions are about behaviour (refused, served, cut
    //! off); the only clock is a guard against hanging forever when the behaviour is missing.

    use super::*;

    /// How long a test client waits for anything before the test fails instead of hanging.
    const GUARD: Duration = Duration::from_secs(30);
    const HOUR: Duration = Duration::from_secs(3600);
    const BIG_BODY_BYTES: usize = 64 * 1024 * 1024;

    fn test_route(method: &str, path: &str) -> Response {
        match path {
            "/big" => Response { status: "200 OK", content_type: "text/plain", body: "x".repeat(BIG_BODY_BYTES) },
            _ => route(method, path),
        }
    }

    async fn start(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_with(listener, limits, test_route));
        addr
    }

    /// Reads until the server closes; the bytes, or what went wrong (a reset, or the guard).
    async fn read_to_close(stream: &mut TcpStream) -> std::result::Result<Vec<u8>, String> {
        let mut out = Vec::new();
        match tokio::time::timeout(GUARD, stream.read_to_end(&mut out)).await {
            Ok(Ok(_)) => Ok(out),
            Ok(Err(e)) => Err(format!("{e} after {} bytes", out.len())),
            Err(_) => Err(format!("still open after {GUARD:?} ({} bytes read)", out.len())),
        }
    }

    /// `GET path`: the status line's code, or what went wrong.
    async fn get(addr: SocketAddr, path: &str) -> std::result::Result<u16, String> {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        stream.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes()).await.map_err(|e| e.to_string())?;
        let response = read_to_close(&mut stream).await?;
        let text = String::from_utf8_lossy(&response);
        text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("no status: {text:?}"))
    }

    /// Polls `GET /healthz` until it is served (200): a slot became free.
    async fn until_served(addr: SocketAddr) {
        let deadline = Instant::now() + GUARD;
        let mut last = Ok(0);
        while Instant::now() < deadline {
            last = get(addr, "/healthz").await;
            if last == Ok(200) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no slot became free within {GUARD:?}; last answer {last:?}");
    }

    /// Regression: every connection got a task of its own, so a client opening connections and sending
    /// nothing could hold any number of tasks and buffers. Now the connection past the bound is answered
    /// 503 and closed at once, and the bound is on connections served at the same time.
    #[tokio::test]
    async fn connections_beyond_the_bound_are_refused_at_once() {
        let addr = start(Limits { max_connections: 4, read_timeout: HOUR, write_timeout: HOUR }).await;
        let mut idle = Vec::new();
        for _ in 0..4 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // Accepted in order: the fifth finds every slot taken. It sends nothing and is answered anyway.
        let mut fifth = TcpStream::connect(addr).await.unwrap();
        let answer = read_to_close(&mut fifth).await.expect("the fifth connection is answered and closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");

        // A client that leaves frees its slot.
        drop(idle.pop());
        until_served(addr).await;
    }

    /// Regression: the response was written without a timeout, so a client that sends a request and never
    /// reads held its task (and the response) forever. Now it is cut off and its slot freed.
    #[tokio::test]
    async fn a_client_that_never_reads_is_cut_off() {
        let addr =
            start(Limits { max_connections: 1, read_timeout: HOUR, write_timeout: Duration::from_millis(200) }).await;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stalled = socket.connect(addr).await.unwrap();
        stalled.write_all(b"GET /big HTTP/1.1\r\n\r\n").await.unwrap();
        // The stalled client holds the only slot until the server gives up on it.
        until_served(addr).await;
        // What the kernels had buffered, then the close (or a reset): never the whole response.
        if let Ok(received) = read_to_close(&mut stalled).await {
            assert!(received.len() < BIG_BODY_BYTES, "the server sent everything: {} bytes", received.len());
        }
    }

    /// A slowloris that never finishes its request is dropped after the read timeout, freeing its slot.
    #[tokio::test]
    async fn a_client_that_never_finishes_its_request_is_cut_off() {
        let addr =
            start(Limits { max_connections: 1, read_timeout: Duration::from_millis(200), write_timeout: HOUR }).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ").await.unwrap();
        until_served(addr).await;
        assert_eq!(read_to_close(&mut slow).await.map(|b| b.len()), Ok(0), "closed without an answer");
    }
}
