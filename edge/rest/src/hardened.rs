//! Serving the routes through the native host's hardened HTTP/1.1 server
//! (`floodgate_edge::native_host::server`): its header and idle timeouts and its
//! connection cap, with the endpoint's settings. Past the cap a new connection is
//! answered `503` with `Retry-After: 1` at once ([`AtCapacity::Refuse`]): a
//! client never waits unanswered in the listen backlog, and no connection in use
//! is closed to make room.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use floodgate_edge::native_host::server::{self, AtCapacity, InFlight, ServerLimits};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tower::{Service, ServiceExt as _};

use crate::EndpointConfig;

/// hyper's own bounds on a request head (header lines; read buffer bytes), which
/// the endpoint kept before it shared the edge's server (the edge's are tighter).
const MAX_HEADERS: usize = 100;
const MAX_BUF: usize = 8192 + 4096 * 100;

/// The server's limits for `config`: a request's headers within the header
/// timeout, idle connections closed after it too, at most `max_connections` open
/// and more answered `503` at once.
pub fn limits(config: &EndpointConfig) -> ServerLimits {
    ServerLimits {
        max_connections: config.max_connections.max(1),
        header_timeout: config.header_timeout,
        idle_timeout: config.header_timeout,
        max_headers: MAX_HEADERS,
        max_buf: MAX_BUF,
        at_capacity: AtCapacity::Refuse,
        // as before the edge's drain: its idle connections close at once
        drain: std::time::Duration::ZERO,
    }
}

/// Serves `app` (the endpoint's [`crate::app`], or its [`crate::metrics_app`]) on
/// `listener` until `shutdown` completes, then lets the requests in flight finish
/// (within the header timeout).
pub async fn serve<A>(
    listener: tokio::net::TcpListener,
    app: A,
    config: &EndpointConfig,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    A: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    A::Future: Send + 'static,
{
    server::serve(
        listener,
        limits(config),
        move |_peer, conn| {
            let app = app.clone();
            hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                // the connection is busy until the answer is written whole
                let in_flight = conn.in_flight();
                let answered = app.clone().oneshot(req.map(axum::body::Body::new));
                async move {
                    let response = answered.await.unwrap_or_else(|never| match never {});
                    Ok::<_, Infallible>(response.map(|body| WhileInFlight {
                        body,
                        _in_flight: in_flight,
                    }))
                }
            })
        },
        shutdown,
    )
    .await
}

/// A response body that keeps its request in flight on its connection until it
/// is written (so the server neither reaps the connection as idle nor takes its
/// client's next bytes for an unfinished request head meanwhile).
struct WhileInFlight {
    body: axum::body::Body,
    /// Held, not read: released when the body is dropped.
    _in_flight: InFlight,
}

impl Body for WhileInFlight {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
