//! The HTTP server of the connector's endpoints: [`ops()`] (`/metrics`, `/healthz`, `/readyz`) on `[metrics]
//! listen`, and any other [`Router`] (the control API, behind [`require_bearer`]) on a listener of its own.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! axum routes and hyper speaks HTTP/1.1; the loop that accepts and the driver of each connection are ours,
//! because the bounds are. A misbehaving or hostile client (a slowloris that trickles its request, one that
//! never reads the response, a flood of connections) can hold neither the connector's memory nor its tasks:
//! - at most [`MAX_CONNECTIONS`] connections are served at once; one more is answered `503` by a write that
//!   never waits, and closed at once (the refusals are logged with their count, at most once a minute, so a
//!   flood does not flood the log too);
//! - a request head is at most [`MAX_HEAD_BYTES`] (hyper answers `431` past it), a body at most
//!   [`MAX_BODY_BYTES`] (past it a route's read fails: axum's extractors answer `413`);
//! - the request, head and body, must arrive within [`READ_TIMEOUT`] of the connection, and the response be
//!   taken within [`WRITE_TIMEOUT`] of being ready; otherwise the connection is closed and its slot freed.
//!
//! One request per connection (no keep-alive): a scraper or a probe sends one, and a kept-alive idle
//! connection would hold one of the few slots for nothing.
//!
//! The time a route takes to answer is the route's own: the ops routes answer at once; a route that waits
//! on something must bound its wait, as it holds a slot meanwhile.
//!
//! # Why not `axum::serve`
//! It spawns a task for every accepted connection, without a bound, and its hyper builder is not ours to
//! configure (the head's size and time, keep-alive, no time for the response): middleware around the router
//! runs only once a connection has its task and its head is read, too late for most of the bounds above.

mod bearer;
mod body;
mod ops;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

use crate::error::{Error, Result};

pub use bearer::{require_bearer, BearerToken, InvalidToken};
pub use ops::ops;

/// Connections served at once: a scraper and a few probes need a handful.
const MAX_CONNECTIONS: usize = 16;
/// The request line and headers, at most; also the least hyper's read buffer can be.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// A request body, at most: the control API takes small JSON documents.
const MAX_BODY_BYTES: usize = 64 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often refused connections are logged, at most.
const REFUSALS_LOG_INTERVAL: Duration = Duration::from_secs(60);
const REFUSED: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n";

/// Binds an endpoint: `what` names it in the error ("/metrics", "the control API"), `setting` says what the
/// operator can change (`set [metrics] listen to a free address or enabled = false`).
///
/// # Errors
/// A definite error when the address cannot be bound (in use, not local).
pub async fn bind(addr: SocketAddr, what: &str, setting: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::definite(format!("cannot listen on {addr} for {what}: {e}; {setting}")))
}

/// Serves `app` on `listener`, within the bounds in the module docs, until the task is dropped.
///
/// A route can take the client's address with axum's `ConnectInfo<SocketAddr>`.
pub async fn serve(listener: TcpListener, app: Router) {
    let limits = Limits { max_connections: MAX_CONNECTIONS, read_timeout: READ_TIMEOUT, write_timeout: WRITE_TIMEOUT };
    serve_with(listener, limits, app).await
}

/// The bounds of an endpoint that tests shrink.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Connections served at once; more are refused.
    max_connections: usize,
    /// Time a client has, from connecting, to send its whole request.
    read_timeout: Duration,
    /// Time a client has to take the whole response, from when it is ready.
    write_timeout: Duration,
}

async fn serve_with(listener: TcpListener, limits: Limits, app: Router) {
    let endpoint = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut refusals = Refusals { count: 0, logged_at: None };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => match slots.clone().try_acquire_owned() {
                Ok(slot) => {
                    let app = app.clone();
                    tokio::spawn(async move {
                        if let Err(e) = serve_connection(stream, peer, limits, app).await {
                            tracing::debug!(error = %e, %peer, "HTTP connection closed without a whole exchange");
                        }
                        drop(slot);
                    });
                }
                Err(_) => {
                    refuse(stream);
                    refusals.note(&endpoint, limits.max_connections);
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, %endpoint, "HTTP endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Why a connection ended before its exchange did.
#[derive(Debug, thiserror::Error)]
enum Cut {
    /// Malformed, too large, too slow (the head), or the connection failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    #[error("the client did not take the response within {0:?}")]
    NotTaken(Duration),
}

/// Serves one request on `stream`. hyper times the head out and caps its size; the body's bounds travel
/// with it ([`body::bound`]); the response's time starts when the route has answered, which only the service
/// knows, so it tells the driver through `answered`.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    limits: Limits,
    app: Router,
) -> std::result::Result<(), Cut> {
    let request_deadline = tokio::time::Instant::now() + limits.read_timeout;
    let answered = Arc::new(Notify::new());
    let service = {
        let answered = answered.clone();
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let (app, answered) = (app.clone(), answered.clone());
            let mut request = request.map(|b| body::bound(b, request_deadline, MAX_BODY_BYTES));
            request.extensions_mut().insert(ConnectInfo(peer));
            async move {
                let response = app.oneshot(request).await;
                answered.notify_one();
                response
            }
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let taken_too_late = async {
        answered.notified().await;
        tokio::time::sleep(limits.write_timeout).await;
    };
    // Dropping the connection closes the socket.
    tokio::select! {
        served = connection => Ok(served?),
        () = taken_too_late => Err(Cut::NotTaken(limits.write_timeout)),
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
    fn note(&mut self, endpoint: &str, max_connections: usize) {
        self.count += 1;
        if self.logged_at.is_none_or(|at| at.elapsed() >= REFUSALS_LOG_INTERVAL) {
            tracing::warn!(
                refused = self.count,
                max_connections,
                %endpoint,
                "HTTP endpoint: connection(s) refused, {max_connections} already being served; is a client \
                 opening connections without closing them?"
            );
            self.count = 0;
            self.logged_at = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    //! Real TCP clients against the server. The assertions are about behaviour (refused, served, cut
    //! off); the only clock is a guard against hanging forever when the behaviour is missing.

    use axum::body::Bytes;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// How long a test client waits for anything before the test fails instead of hanging.
    const GUARD: Duration = Duration::from_secs(30);
    const HOUR: Duration = Duration::from_secs(3600);
    const BIG_BODY_BYTES: usize = 64 * 1024 * 1024;

    /// The ops routes, and routes that answer a lot, read a body, and say who asked.
    fn test_app() -> Router {
        ops()
            .route("/big", get(|| async { "x".repeat(BIG_BODY_BYTES) }))
            .route("/echo", post(|body: Bytes| async move { format!("{} bytes\n", body.len()) }))
            .route("/peer", get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }))
    }

    async fn start(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_with(listener, limits, test_app()));
        addr
    }

    fn patient() -> Limits {
        Limits { max_connections: 4, read_timeout: HOUR, write_timeout: HOUR }
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

    /// Sends `request` as it is; the status code and body of the answer, or what went wrong.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> std::result::Result<(u16, String), String> {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        stream.write_all(request).await.map_err(|e| e.to_string())?;
        let response = read_to_close(&mut stream).await?;
        let text = String::from_utf8_lossy(&response);
        let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok());
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        code.zip(body).ok_or_else(|| format!("no status or body: {text:?}"))
    }

    /// `GET path`: the status code, or what went wrong.
    async fn get_status(addr: SocketAddr, path: &str) -> std::result::Result<u16, String> {
        exchange(addr, format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes()).await.map(|(code, _)| code)
    }

    /// Polls `GET /healthz` until it is served (200): a slot became free.
    async fn until_served(addr: SocketAddr) {
        let deadline = Instant::now() + GUARD;
        let mut last = Ok(0);
        while Instant::now() < deadline {
            last = get_status(addr, "/healthz").await;
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
        let addr = start(patient()).await;
        let mut idle = Vec::new();
        for _ in 0..4 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // Accepted in order: the fifth finds every slot taken. It sends nothing and is answered anyway.
        let mut fifth = TcpStream::connect(addr).await.unwrap();
        let answer = read_to_close(&mut fifth).await.expect("the fifth connection is answered and closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 503 ") && answer.ends_with("\r\n\r\nbusy\n"), "{answer}");

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
        stalled.write_all(b"GET /big HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
        // The stalled client holds the only slot until the server gives up on it.
        until_served(addr).await;
        // What the kernels had buffered, then the close (or a reset): never the whole response.
        if let Ok(received) = read_to_close(&mut stalled).await {
            assert!(received.len() < BIG_BODY_BYTES, "the server sent everything: {} bytes", received.len());
        }
    }

    /// A slowloris that never finishes its request head is dropped after the read timeout, freeing its slot.
    #[tokio::test]
    async fn a_client_that_never_finishes_its_request_is_cut_off() {
        let addr =
            start(Limits { max_connections: 1, read_timeout: Duration::from_millis(200), write_timeout: HOUR }).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ").await.unwrap();
        until_served(addr).await;
        assert_eq!(read_to_close(&mut slow).await.map(|b| b.len()), Ok(0), "closed without an answer");
    }

    /// A slowloris that sends its head but never its whole body is answered (the route's read of the body
    /// fails) once the read timeout has passed, and its slot freed; hyper's head timeout alone would let it
    /// hold the slot for as long as it trickles.
    #[tokio::test]
    async fn a_client_that_never_finishes_its_body_is_cut_off() {
        let addr =
            start(Limits { max_connections: 1, read_timeout: Duration::from_millis(200), write_timeout: HOUR }).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\n12345").await.unwrap();
        until_served(addr).await;
        let answer = read_to_close(&mut slow).await.expect("answered and closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    }

    /// A head that has not ended within [`MAX_HEAD_BYTES`] is answered 431 and closed, unread beyond the
    /// bound; a head well within it is served. (Exactly the bound is sent, so the server has read every
    /// byte when it closes: a FIN after the answer, not a reset racing it.)
    #[tokio::test]
    async fn a_request_head_over_the_bound_is_refused() {
        let addr = start(patient()).await;
        let line = "GET /healthz HTTP/1.1\r\nHost: test\r\nX-Padding: ";
        let endless = format!("{line}{}", "p".repeat(MAX_HEAD_BYTES - line.len()));
        assert_eq!(exchange(addr, endless.as_bytes()).await.map(|(code, _)| code), Ok(431));

        let within = format!("{line}{}\r\n\r\n", "p".repeat(MAX_HEAD_BYTES / 2));
        assert_eq!(exchange(addr, within.as_bytes()).await, Ok((200, "ok\n".to_string())));
    }

    /// A body past [`MAX_BODY_BYTES`] fails the route's read: axum answers 413. Exactly one byte too many is
    /// sent, so the server has read every byte when it closes. One within the bound is read whole.
    #[tokio::test]
    async fn a_request_body_over_the_bound_is_refused() {
        let addr = start(patient()).await;
        let post = |declared: usize, sent: usize| {
            let mut request = format!("POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: {declared}\r\n\r\n");
            request.push_str(&"b".repeat(sent));
            request
        };
        let over = post(MAX_BODY_BYTES * 2, MAX_BODY_BYTES + 1);
        assert_eq!(exchange(addr, over.as_bytes()).await.map(|(code, _)| code), Ok(413));
        let within = post(MAX_BODY_BYTES, MAX_BODY_BYTES);
        assert_eq!(exchange(addr, within.as_bytes()).await, Ok((200, format!("{MAX_BODY_BYTES} bytes\n"))));
    }

    /// One request per connection: the answer says so and the server closes after it, even when the client
    /// would keep the connection (an HTTP/1.1 request without `Connection: close`).
    #[tokio::test]
    async fn one_request_per_connection() {
        let addr = start(patient()).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n").await.unwrap();
        let answer = read_to_close(&mut stream).await.expect("answered and closed");
        let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert_eq!(answer.matches("http/1.1 200 ").count(), 1, "{answer}");
        assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    }

    /// A route can ask who is calling (`ConnectInfo`), as the control API's log does.
    #[tokio::test]
    async fn a_route_sees_the_peer_address() {
        let addr = start(patient()).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let me = stream.local_addr().unwrap();
        stream.write_all(b"GET /peer HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
        let answer = read_to_close(&mut stream).await.expect("answered and closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.ends_with(&format!("\r\n\r\n{me}")), "{answer}");
    }

    /// The operator is told which endpoint could not listen and which setting to change.
    #[tokio::test]
    async fn a_taken_address_names_the_endpoint_and_the_setting() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let error = bind(addr, "the control API", "set [control] listen to a free address").await.unwrap_err();
        let message = error.to_string();
        assert!(error.is_definite(), "{message}");
        assert!(
            message.contains(&format!("cannot listen on {addr} for the control API: "))
                && message.ends_with("; set [control] listen to a free address"),
            "{message}"
        );
    }
}
