//! The native host's connections to its one upstream: hyper's HTTP/1.1 client
//! connections (over TCP, or TLS with rustls), kept alive and pooled here.
//!
//! hyper-util's general-purpose pool (any number of hosts, HTTP/2, checkouts
//! racing connects) cost the edge about as many instructions per request as
//! the rest of the proxying (`scripts/bench instructions`, docs/development.md);
//! one upstream needs a stack of idle connections:
//!
//! - a request takes the most recently used idle connection (its socket is the
//!   warmest), or connects;
//! - a connection goes back once its response body was read to the end (one cut
//!   short is closed, as hyper does with it), and is closed after
//!   [`Pool::new`]'s idle timeout, or when the upstream closes it;
//! - a request that a kept-alive connection could not take because the
//!   upstream had just closed it (nothing of it was sent) goes again on a new
//!   connection, once — what hyper-util retries.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

use super::body::{BoxError, RequestBody};
use crate::sync::lock;

/// An upstream request's body: none (most requests), or the client's, streamed.
pub enum UpBody {
    Empty(Empty<Bytes>),
    Client(RequestBody),
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpBody::Empty(e) => std::pin::Pin::new(e).poll_frame(cx).map_err(|e| match e {}),
            UpBody::Client(b) => std::pin::Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Empty(_) => true,
            UpBody::Client(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Empty(_) => SizeHint::with_exact(0),
            UpBody::Client(b) => b.size_hint(),
        }
    }
}

/// Why an upstream request failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connect: {0}")]
    Connect(BoxError),
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

struct Idle {
    sender: SendRequest<UpBody>,
    since: Instant,
}

struct Shared {
    idle: Mutex<VecDeque<Idle>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Shared {
    /// Keeps `sender` for the next request (unless the pool is full).
    fn put(&self, sender: SendRequest<UpBody>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = lock(&self.idle);
        self.expire(&mut idle, now);
        if idle.len() < self.max_idle {
            idle.push_back(Idle { sender, since: now });
        }
    }

    /// The most recently used idle connection the upstream has not closed.
    fn take(&self) -> Option<SendRequest<UpBody>> {
        let now = Instant::now();
        let mut idle = lock(&self.idle);
        self.expire(&mut idle, now);
        while let Some(i) = idle.pop_back() {
            if !i.sender.is_closed() {
                return Some(i.sender);
            }
        }
        None
    }

    /// Drops the connections idle for longer than the timeout (the oldest first).
    fn expire(&self, idle: &mut VecDeque<Idle>, now: Instant) {
        while idle
            .front()
            .is_some_and(|i| now.duration_since(i.since) >= self.idle_timeout)
        {
            idle.pop_front();
        }
    }
}

/// The upstream's pooled connections (cheap to clone).
#[derive(Clone)]
pub struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// Where to connect: the upstream's scheme and authority.
    origin: Uri,
    shared: Arc<Shared>,
}

/// A connection lent to one request: it goes back to the pool once the response
/// body was read to the end ([`Lease::finished`]), else it is closed.
pub struct Lease {
    sender: Option<SendRequest<UpBody>>,
    shared: Arc<Shared>,
    finished: bool,
}

impl Lease {
    /// The response body was read to its end: the connection can serve another.
    pub fn finished(&mut self) {
        self.finished = true;
    }

    /// [`Lease::finished`] when `body` says it has ended (with its last frame, or
    /// a response without one).
    pub fn finished_if_ended(&mut self, body: &Incoming) {
        if body.is_end_stream() {
            self.finished();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let (true, Some(sender)) = (self.finished, self.sender.take()) {
            self.shared.put(sender);
        }
    }
}

impl Pool {
    /// Connections to `origin` (its scheme and authority) through `connector`,
    /// at most `max_idle` kept idle, each for at most `idle_timeout`.
    pub fn new(
        connector: HttpsConnector<HttpConnector>,
        origin: Uri,
        max_idle: usize,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            connector,
            origin,
            shared: Arc::new(Shared {
                idle: Mutex::new(VecDeque::new()),
                max_idle,
                idle_timeout,
            }),
        }
    }

    /// Sends `req` (its URI in origin form, its `Host` set) on an idle
    /// connection or a new one: the response head, and the lease of its
    /// connection, to keep until the body is read.
    pub async fn send(
        &self,
        mut req: Request<UpBody>,
    ) -> Result<(Response<Incoming>, Lease), UpstreamError> {
        loop {
            let (mut sender, reused) = match self.shared.take() {
                Some(s) => (s, true),
                // boxed: connecting (TCP, maybe TLS, the handshake) is rare and its
                // future is kilobytes, which every request's future would carry
                // and copy at each move
                None => (Box::pin(self.connect()).await?, false),
            };
            // a connection given back as its response ended may take a turn of its
            // task to be ready again (or to see that the upstream closed it)
            if reused && sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let lease = Lease {
                        sender: Some(sender),
                        shared: self.shared.clone(),
                        finished: false,
                    };
                    return Ok((resp, lease));
                }
                Err(mut e) => match e.take_message() {
                    // a kept-alive connection the upstream closed before it
                    // took the request: nothing was sent, so send it again
                    Some(again) if reused => req = again,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<UpBody>, UpstreamError> {
        let mut connector = self.connector.clone();
        let io = connector
            .call(self.origin.clone())
            .await
            .map_err(UpstreamError::Connect)?;
        let (mut sender, conn) = http1::handshake(io).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender.ready().await?;
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// An upstream on loopback that answers every request with its
    /// connection's number, closing each connection after `per_connection`
    /// requests (0: never).
    async fn upstream(per_connection: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::spawn(async move {
                    let served = Arc::new(AtomicUsize::new(0));
                    let svc = hyper::service::service_fn(move |_req| {
                        let served = served.fetch_add(1, Ordering::SeqCst) + 1;
                        async move {
                            let mut r = Response::new(http_body_util::Full::new(Bytes::from(
                                n.to_string(),
                            )));
                            if per_connection > 0 && served >= per_connection {
                                r.headers_mut()
                                    .insert("connection", "close".parse().unwrap());
                            }
                            Ok::<_, Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        (format!("http://{addr}"), accepted)
    }

    fn pool(origin: &str, max_idle: usize, idle: Duration) -> Pool {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Pool::new(connector, origin.parse().unwrap(), max_idle, idle)
    }

    fn get(origin: &str) -> Request<UpBody> {
        let authority = origin.trim_start_matches("http://").to_string();
        Request::builder()
            .uri("/x")
            .header("host", authority)
            .body(UpBody::Empty(Empty::new()))
            .unwrap()
    }

    /// One request: the connection number the upstream answered with, the
    /// body read to its end (`true`) or dropped before.
    async fn one(p: &Pool, origin: &str, read: bool) -> String {
        use http_body_util::BodyExt;
        let (resp, mut lease) = p.send(get(origin)).await.unwrap();
        if !read {
            return String::new();
        }
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        lease.finished();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_connection_whose_body_was_read_serves_the_next_request() {
        let (origin, accepted) = upstream(0).await;
        let p = pool(&origin, 8, Duration::from_secs(60));
        for _ in 0..5 {
            assert_eq!(one(&p, &origin, true).await, "1");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_cut_short_closes_its_connection() {
        let (origin, accepted) = upstream(0).await;
        let p = pool(&origin, 8, Duration::from_secs(60));
        one(&p, &origin, false).await;
        assert_eq!(one(&p, &origin, true).await, "2", "a new connection");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_not_reused() {
        let (origin, accepted) = upstream(1).await;
        let p = pool(&origin, 8, Duration::from_secs(60));
        for i in 1..=4 {
            assert_eq!(one(&p, &origin, true).await, i.to_string());
            // let the connection see the upstream's close
            tokio::task::yield_now().await;
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn idle_connections_expire_and_the_pool_keeps_at_most_its_bound() {
        let (origin, accepted) = upstream(0).await;
        let p = pool(&origin, 1, Duration::from_millis(50));
        let (a, b) = tokio::join!(one(&p, &origin, true), one(&p, &origin, true));
        let mut both = [a, b];
        both.sort();
        assert_eq!(both, ["1", "2"], "two at once: two connections");
        assert_eq!(lock(&p.shared.idle).len(), 1, "one kept idle");
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(one(&p, &origin, true).await, "3", "the idle one expired");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_upstream_that_refuses_connections_is_a_connect_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let origin = format!("http://127.0.0.1:{port}");
        let p = pool(&origin, 8, Duration::from_secs(60));
        let Err(e) = p.send(get(&origin)).await else {
            panic!("nothing listens there");
        };
        assert!(matches!(e, UpstreamError::Connect(_)), "{e}");
    }
}
