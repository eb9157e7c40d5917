//! A request's body, taken whole before its command runs: bodies over the limit
//! are read to their end (up to [`DRAIN_LIMIT`], within the body timeout) and
//! answered 413, so the client sees the answer rather than a reset while it still
//! sends; a malformed body (bad chunking) is a 400, a slow one a 408.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt;

use crate::Endpoint;
use crate::reply::{error, error_closing};

/// Bodies over the limit are read and dropped up to this size (so the client
/// gets its 413); beyond it the connection is closed.
pub const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// What a command route takes from its request: the body, read whole within the
/// endpoint's bounds, and whether replies are to be base64 (`Upstash-Encoding`).
pub(crate) struct Sent {
    pub(crate) body: Bytes,
    pub(crate) base64: bool,
}

impl FromRequest<Arc<Endpoint>> for Sent {
    /// The answer instead: 400 (a response format other than JSON, a malformed
    /// body), 408 or 413.
    type Rejection = Response;

    async fn from_request(req: Request, ep: &Arc<Endpoint>) -> Result<Self, Response> {
        let headers = req.headers();
        if headers
            .get("upstash-response-format")
            .is_some_and(|v| v.as_bytes() != b"json")
        {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "ERR only the json response format is supported",
            ));
        }
        let base64 = headers
            .get("upstash-encoding")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"base64"));
        let declared = declared_length(headers);
        let read = read_body(req.into_body(), declared, ep.max_body);
        match tokio::time::timeout(ep.body_timeout, read).await {
            Ok(Ok(body)) => Ok(Sent { body, base64 }),
            Ok(Err(refusal)) => Err(refusal.answer(ep.max_body)),
            Err(_) => Err(error_closing(
                StatusCode::REQUEST_TIMEOUT,
                format!("ERR request body not received within {:?}", ep.body_timeout),
            )),
        }
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Why a body could not be taken.
#[derive(Debug, PartialEq, Eq)]
enum BodyRefusal {
    /// Over [`DRAIN_LIMIT`]: not read on (the connection closes).
    TooLarge,
    /// Read to its end, but over the limit.
    TooLargeDrained,
    Malformed(String),
}

impl BodyRefusal {
    fn answer(self, max_body: usize) -> Response {
        let too_large = || format!("ERR request body larger than {max_body} bytes");
        match self {
            BodyRefusal::TooLargeDrained => error(StatusCode::PAYLOAD_TOO_LARGE, too_large()),
            BodyRefusal::TooLarge => error_closing(StatusCode::PAYLOAD_TOO_LARGE, too_large()),
            BodyRefusal::Malformed(why) => error_closing(
                StatusCode::BAD_REQUEST,
                format!("ERR malformed request body: {why}"),
            ),
        }
    }
}

/// Reads the body whole, up to `max`; over it, reads on (discarding) to the end
/// so the client sees the 413 rather than a reset while it sends.
async fn read_body(body: Body, declared: Option<u64>, max: usize) -> Result<Bytes, BodyRefusal> {
    if declared.is_some_and(|n| n > DRAIN_LIMIT) {
        return Err(BodyRefusal::TooLarge);
    }
    let mut body = body;
    let mut kept: Vec<u8> = Vec::new();
    let mut seen: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyRefusal::Malformed(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        seen += data.len() as u64;
        if seen > DRAIN_LIMIT {
            return Err(BodyRefusal::TooLarge);
        }
        if seen <= max as u64 {
            kept.extend_from_slice(&data);
        }
    }
    if seen > max as u64 {
        return Err(BodyRefusal::TooLargeDrained);
    }
    Ok(Bytes::from(kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_are_kept_up_to_the_limit_and_drained_beyond_it() {
        let read = |body: &'static [u8], declared| read_body(Body::from(body), declared, 4);
        assert_eq!(read(b"abcd", Some(4)).await.unwrap(), &b"abcd"[..]);
        assert_eq!(read(b"", None).await.unwrap(), &b""[..]);
        assert_eq!(
            read(b"abcde", None).await.unwrap_err(),
            BodyRefusal::TooLargeDrained
        );
        assert_eq!(
            read(b"", Some(DRAIN_LIMIT + 1)).await.unwrap_err(),
            BodyRefusal::TooLarge
        );
    }
}
