//! A request's body, taken whole before its command runs. A body past the limit
//! is answered 413 as soon as it passes it (a declared `Content-Length` over it
//! at once, before any of the body is read), as nginx does; what the client
//! still sends is read out behind the answer (up to [`DRAIN_LIMIT`], nginx's
//! lingering close) so the client sees the 413 rather than a reset while it
//! sends. A malformed body (bad chunking) is a 400, a slow one a 408.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt;

use crate::Endpoint;
use crate::reply::{error, error_closing};

/// Bodies past the limit are read out and dropped up to this size (so the
/// client gets its 413); beyond it the connection is closed.
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
        let expects_continue = headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let body = req.into_body();
        if declared.is_some_and(|n| n > ep.max_body as u64) {
            // not asked for yet (100-continue), or too much to read out: not read
            let rest =
                (!expects_continue && declared.is_some_and(|n| n <= DRAIN_LIMIT)).then_some(body);
            return Err(BodyRefusal::TooLarge(rest).answer(ep));
        }
        match tokio::time::timeout(ep.body_timeout, read_body(body, ep.max_body)).await {
            Ok(Ok(body)) => Ok(Sent { body, base64 }),
            Ok(Err(refusal)) => Err(refusal.answer(ep)),
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
#[derive(Debug)]
enum BodyRefusal {
    /// Past the limit: what is left of the body, to be read out behind the
    /// answer (`None`: not to be read, the connection closes).
    TooLarge(Option<Body>),
    Malformed(String),
}

impl BodyRefusal {
    /// The answer; the connection closes after it (the body was not read whole).
    fn answer(self, ep: &Endpoint) -> Response {
        match self {
            BodyRefusal::TooLarge(rest) => {
                if let Some(rest) = rest {
                    floodgate_edge::native_host::linger(rest, ep.body_timeout);
                }
                error_closing(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("ERR request body larger than {} bytes", ep.max_body),
                )
            }
            BodyRefusal::Malformed(why) => error_closing(
                StatusCode::BAD_REQUEST,
                format!("ERR malformed request body: {why}"),
            ),
        }
    }
}

/// Reads the body whole, up to `max` bytes; the moment it passes `max`, stops
/// with what is left of it.
async fn read_body(mut body: Body, max: usize) -> Result<Bytes, BodyRefusal> {
    let mut kept: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyRefusal::Malformed(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if kept.len() + data.len() > max {
            return Err(BodyRefusal::TooLarge(Some(body)));
        }
        kept.extend_from_slice(&data);
    }
    Ok(Bytes::from(kept))
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn bodies_are_kept_up_to_the_limit_and_refused_the_moment_they_pass_it() {
        let read = |body: &'static [u8]| read_body(Body::from(body), 4);
        assert_eq!(read(b"abcd").await.unwrap(), &b"abcd"[..]);
        assert_eq!(read(b"").await.unwrap(), &b""[..]);
        assert!(matches!(
            read(b"abcde").await,
            Err(BodyRefusal::TooLarge(Some(_)))
        ));
        // a body that never ends: refused once past the limit, the rest left
        let parts = futures_util::stream::iter([b"ab", b"cd", b"ef", b"gh"])
            .map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p)))
            .chain(futures_util::stream::pending());
        let Err(BodyRefusal::TooLarge(Some(mut rest))) =
            read_body(Body::from_stream(parts), 4).await
        else {
            panic!("refused past the limit");
        };
        let next = rest.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(next, &b"gh"[..]);
    }
}
