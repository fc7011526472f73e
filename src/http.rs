//! The operations endpoint: `/metrics` (OpenMetrics text), `/healthz` (the process is alive) and `/readyz`
//! (connected to source and broker, not failed; 503 with the reason otherwise).
//!
//! A deliberately small HTTP/1.1 responder over tokio: GET only, one request per connection, bounded
//! request size and read time, so a misbehaving scraper cannot hold memory or tasks.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::{Error, Result};
use crate::metrics::metrics;

const MAX_REQUEST_BYTES: usize = 8 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

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
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(async move {
                    if let Err(e) = respond(stream).await {
                        tracing::debug!(error = %e, "metrics request failed");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn respond(mut stream: TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let read = tokio::time::timeout(READ_TIMEOUT, async {
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
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => {
            ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics().render())
        }
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") => match metrics().readiness() {
            Ok(()) => ("200 OK", "text/plain", "ready\n".to_string()),
            Err(reason) => ("503 Service Unavailable", "text/plain", format!("not ready: {reason}\n")),
        },
        ("GET", _) => ("404 Not Found", "text/plain", "try /metrics, /healthz or /readyz\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".to_string()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
