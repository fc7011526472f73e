//! The operations endpoint: `/metrics` (OpenMetrics text), `/healthz` (the process is alive) and `/readyz`
//! (connected to source and broker, not failed; 503 with the reason otherwise). No authentication: it
//! belongs on a private address (deploy/connector.docker.toml says so).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use axum::http::header::{ALLOW, CONTENT_TYPE};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::health::health;
use crate::metrics::metrics;

/// What Prometheus asks for first; it then parses the page as OpenMetrics.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The routes of the operations endpoint, a whole app for its listener (its fallback answers every other
/// path). `GET` only (and `HEAD`, which axum derives from it); another method is answered `405`, another
/// path `404` naming the three.
pub fn ops() -> Router {
    Router::new()
        .route("/metrics", get(metrics_page).fallback(get_only))
        .route("/healthz", get(|| async { "ok\n" }).fallback(get_only))
        .route("/readyz", get(|| async { readiness(health().readiness()) }).fallback(get_only))
        .fallback(elsewhere)
}

async fn metrics_page() -> Response {
    ([(CONTENT_TYPE, OPENMETRICS)], metrics().render()).into_response()
}

/// `/readyz`'s answer to [`crate::health::Health::readiness`].
fn readiness(readiness: std::result::Result<(), String>) -> (StatusCode, String) {
    match readiness {
        // Paused by an operator: what they asked for, so ready (nothing is connected meanwhile).
        Ok(()) if health().paused() => (StatusCode::OK, "ready (paused by an operator)\n".to_string()),
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
    }
}

async fn get_only() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, [(ALLOW, "GET, HEAD")], "GET only\n").into_response()
}

async fn elsewhere(method: Method) -> Response {
    match method {
        Method::GET | Method::HEAD => (StatusCode::NOT_FOUND, "try /metrics, /healthz or /readyz\n").into_response(),
        _ => get_only().await,
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    /// What the routes answer, with the headers that matter here.
    #[derive(Debug, PartialEq)]
    struct Answer {
        status: StatusCode,
        content_type: String,
        allow: String,
        body: String,
    }

    async fn ask(method: Method, path: &str) -> Answer {
        let request = Request::builder().method(method).uri(path).body(Body::empty()).unwrap();
        let response = ops().oneshot(request).await.unwrap();
        let header = |name| response.headers().get(name).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let (status, content_type, allow) = (response.status(), header(CONTENT_TYPE), header(ALLOW));
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        Answer { status, content_type, allow, body: String::from_utf8(body.to_vec()).unwrap() }
    }

    /// The page Prometheus scrapes: its content type (what makes Prometheus parse OpenMetrics) and a whole
    /// page, ending as OpenMetrics requires, with the readiness gauge the alert rules query.
    #[tokio::test]
    async fn metrics_are_openmetrics_text() {
        let answer = ask(Method::GET, "/metrics").await;
        assert_eq!((answer.status, answer.content_type.as_str()), (StatusCode::OK, OPENMETRICS));
        assert!(answer.body.ends_with("# EOF\n"), "{}", answer.body);
        assert!(answer.body.contains("\noutbox_cdc_ready "), "{}", answer.body);
    }

    #[tokio::test]
    async fn healthz_says_the_process_is_alive() {
        let answer = ask(Method::GET, "/healthz").await;
        assert_eq!((answer.status, answer.body.as_str()), (StatusCode::OK, "ok\n"));
    }

    /// The state is the process's (other tests may change it), so the route is checked to answer one of the
    /// two shapes, and each shape is checked from a given state.
    #[tokio::test]
    async fn readyz_follows_the_readiness() {
        let answer = ask(Method::GET, "/readyz").await;
        let shapes = (answer.status, answer.body.starts_with("ready") || answer.body.starts_with("not ready: "));
        assert!(matches!(shapes, (StatusCode::OK | StatusCode::SERVICE_UNAVAILABLE, true)), "{answer:?}");

        assert_eq!(readiness(Ok(())), (StatusCode::OK, "ready\n".to_string()));
        assert_eq!(
            readiness(Err("no Kafka broker connection".to_string())),
            (StatusCode::SERVICE_UNAVAILABLE, "not ready: no Kafka broker connection\n".to_string())
        );
    }

    /// Each row: a request, and the status, `Allow` and body it gets.
    #[tokio::test]
    async fn other_methods_and_paths() {
        let rows = [
            (
                "POST on a route: 405, saying which methods are",
                Method::POST,
                "/metrics",
                405,
                "GET, HEAD",
                "GET only\n",
            ),
            ("DELETE on a route", Method::DELETE, "/readyz", 405, "GET, HEAD", "GET only\n"),
            ("PUT on a route", Method::PUT, "/healthz", 405, "GET, HEAD", "GET only\n"),
            ("GET elsewhere: 404 naming the routes", Method::GET, "/", 404, "", "try /metrics, /healthz or /readyz\n"),
            (
                "a route's path with more after it",
                Method::GET,
                "/healthz/x",
                404,
                "",
                "try /metrics, /healthz or /readyz\n",
            ),
            ("POST elsewhere: the method is wrong anywhere", Method::POST, "/nope", 405, "GET, HEAD", "GET only\n"),
            ("HEAD on a route: GET's answer without its body", Method::HEAD, "/healthz", 200, "", ""),
            ("a query string is not part of the path", Method::GET, "/healthz?verbose=1", 200, "", "ok\n"),
        ];
        for (rule, method, path, status, allow, body) in rows {
            let answer = ask(method, path).await;
            assert_eq!(
                (answer.status.as_u16(), answer.allow.as_str(), answer.body.as_str()),
                (status, allow, body),
                "{rule}"
            );
        }
    }
}
