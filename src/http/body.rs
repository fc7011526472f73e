//! A request's body as routes read it: at most so many bytes, and whole by the request's deadline.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! hyper bounds the head (its size and its time); the body is read only when a route reads it, so its bounds
//! travel with it. The size is `http_body_util::Limited`, whose error axum's extractors answer with `413`,
//! whatever limit a route sets for itself; the time is [`Deadline`] (axum answers `400`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use http_body_util::Limited;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

/// `body`, failing its read past `max_bytes` or once `deadline` has passed with the body not yet whole.
pub(super) fn bound(body: Incoming, deadline: Instant, max_bytes: usize) -> Body {
    Body::new(Limited::new(Deadline { body, expiry: Box::pin(tokio::time::sleep_until(deadline)) }, max_bytes))
}

/// A body that must be whole by a deadline.
struct Deadline {
    body: Incoming,
    /// Fires at the deadline; checked before every read, so a client trickling a byte at a time cannot
    /// outlast it.
    expiry: Pin<Box<Sleep>>,
}

/// Why a bounded body could not be read.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("the request body was not sent in time")]
    Late,
    #[error(transparent)]
    Read(hyper::Error),
}

impl hyper::body::Body for Deadline {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.body.is_end_stream() {
            return Poll::Ready(None);
        }
        if this.expiry.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(BodyError::Late)));
        }
        Pin::new(&mut this.body).poll_frame(cx).map_err(BodyError::Read)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
