//! The control API's guard: a request is served only with `Authorization: Bearer <token>` carrying the
//! configured token; any other gets `401` with `WWW-Authenticate: Bearer` (RFC 6750 §3).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! # Where the token could get out, and what stops it
//! - `Debug` of [`BearerToken`] prints [`crate::secret::REDACTED`].
//! - The refusal's body and its log line say that the token is needed, never what was sent or expected.
//! - The comparison takes the same time whichever byte differs (`subtle`), so timing the answers does not
//!   reveal the token a byte at a time; only its length can be learnt, as with any such comparison.
//!
//! # The header
//! `credentials = auth-scheme [ 1*SP token68 ]` (RFC 7235 §2.1); the scheme is case-insensitive (`bearer`,
//! `BEARER`), the token compared byte for byte.

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use subtle::ConstantTimeEq;

use crate::secret::Secret;

/// The token a control API client must present.
pub struct BearerToken(Secret);

/// Why a string cannot be a bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidToken {
    /// An empty token would let anyone in who sends `Bearer ` with nothing after it.
    #[error("the bearer token is empty")]
    Empty,
    /// A client could not send it in a header: only visible ASCII (letters, digits, punctuation) can be.
    #[error("the bearer token has a character other than visible ASCII (a space, a control character, non-ASCII)")]
    NotVisibleAscii,
}

impl BearerToken {
    /// The token clients must present.
    ///
    /// # Errors
    /// [`InvalidToken`] when it is empty or has a character no header can carry.
    pub fn new(token: String) -> Result<Self, InvalidToken> {
        if token.is_empty() {
            return Err(InvalidToken::Empty);
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InvalidToken::NotVisibleAscii);
        }
        Ok(BearerToken(Secret::new(token)))
    }

    /// Whether `headers` carry this token as `Authorization: Bearer <token>`.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(presented) = headers.get(AUTHORIZATION).and_then(|value| bearer_credentials(value.as_bytes())) else {
            return false;
        };
        presented.ct_eq(self.0.expose().as_bytes()).into()
    }
}

impl TryFrom<String> for BearerToken {
    type Error = InvalidToken;

    fn try_from(token: String) -> Result<Self, InvalidToken> {
        BearerToken::new(token)
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BearerToken").field(&self.0).finish()
    }
}

/// The token of an `Authorization` value in the `Bearer` scheme; `None` for another scheme or none.
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| rest.trim_ascii())
}

/// `router`, served only to requests that carry `token` (every route and the fallback: a client without it
/// learns no path). Apply it last, to the whole router: a route added afterwards is not guarded.
pub fn require_bearer(router: Router, token: BearerToken) -> Router {
    router.layer(middleware::from_fn_with_state(Arc::new(token), guard))
}

async fn guard(State(token): State<Arc<BearerToken>>, request: Request, next: Next) -> Response {
    if token.admits(request.headers()) {
        return next.run(request).await;
    }
    tracing::debug!(
        method = %request.method(),
        path = request.uri().path(),
        "control API: request refused, no or wrong bearer token"
    );
    (
        StatusCode::UNAUTHORIZED,
        [(WWW_AUTHENTICATE, "Bearer")],
        "the control API needs its bearer token: send `Authorization: Bearer <token>`\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    const TOKEN: &str = "s3cr3t-t0ken";

    fn guarded() -> Router {
        let app = Router::new().route("/status", get(|| async { "running\n" }));
        require_bearer(app, BearerToken::new(TOKEN.to_string()).unwrap())
    }

    /// `GET path` with `authorization` if any: status, `WWW-Authenticate`, body.
    async fn ask(path: &str, authorization: Option<&str>) -> (u16, String, String) {
        let mut request = Request::builder().uri(path);
        if let Some(value) = authorization {
            request = request.header(AUTHORIZATION, value);
        }
        let response = guarded().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
        let challenge = response.headers().get(WWW_AUTHENTICATE).map(|v| v.to_str().unwrap().to_string());
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, challenge.unwrap_or_default(), String::from_utf8(body.to_vec()).unwrap())
    }

    /// Each row: an `Authorization` header (or none), and whether the route answers (200) or the guard (401).
    #[tokio::test]
    async fn only_the_token_passes() {
        let right = format!("Bearer {TOKEN}");
        let rows: [(&str, Option<String>, u16); 12] = [
            ("no header", None, 401),
            ("the token", Some(right.clone()), 200),
            ("the scheme is case-insensitive (lower)", Some(format!("bearer {TOKEN}")), 200),
            ("the scheme is case-insensitive (upper)", Some(format!("BEARER {TOKEN}")), 200),
            ("more than one space after the scheme", Some(format!("Bearer   {TOKEN}")), 200),
            ("another token", Some("Bearer not-the-token".to_string()), 401),
            ("the token less its last byte", Some(right[..right.len() - 1].to_string()), 401),
            ("the token and more", Some(format!("{right}x")), 401),
            ("the token in another case", Some(format!("Bearer {}", TOKEN.to_uppercase())), 401),
            ("another scheme with the token", Some(format!("Basic {TOKEN}")), 401),
            ("the scheme without a token", Some("Bearer".to_string()), 401),
            ("the scheme and token without a space", Some(format!("Bearer{TOKEN}")), 401),
        ];
        for (rule, authorization, status) in rows {
            let (got, challenge, body) = ask("/status", authorization.as_deref()).await;
            assert_eq!(got, status, "{rule}");
            match status {
                200 => assert_eq!(body, "running\n", "{rule}"),
                _ => {
                    assert_eq!(challenge, "Bearer", "{rule}");
                    assert!(body.contains("needs its bearer token") && !body.contains(TOKEN), "{rule}: {body}");
                }
            }
        }
    }

    /// A client without the token learns nothing of the paths: an unknown one is refused like a known one;
    /// with the token it gets the router's own answer (404).
    #[tokio::test]
    async fn the_fallback_is_guarded_too() {
        assert_eq!(ask("/nope", None).await.0, 401);
        assert_eq!(ask("/nope", Some(&format!("Bearer {TOKEN}"))).await.0, 404);
    }

    #[test]
    fn a_token_must_be_sendable() {
        assert_eq!(BearerToken::new(String::new()).unwrap_err(), InvalidToken::Empty);
        for bad in ["two words", "tab\there", "new\nline", "caf\u{e9}"] {
            assert_eq!(BearerToken::new(bad.to_string()).unwrap_err(), InvalidToken::NotVisibleAscii, "{bad:?}");
        }
        assert!(BearerToken::try_from("A-z0-9._~+/=".to_string()).is_ok());
    }

    #[test]
    fn debug_never_shows_the_token() {
        let shown = format!("{:?}", BearerToken::new(TOKEN.to_string()).unwrap());
        assert!(!shown.contains(TOKEN), "{shown}");
        assert!(shown.contains(crate::secret::REDACTED), "{shown}");
    }
}
