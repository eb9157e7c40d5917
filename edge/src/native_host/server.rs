//! A hardened HTTP/1.1 server loop for the native hosts: what `axum::serve` does,
//! plus what a server facing the internet needs.
//!
//! - **Connection cap** ([`ServerLimits::max_connections`], by default derived from
//!   the process's descriptor limit). When it is reached, the connections that are
//!   doing nothing make room first: an idle kept-alive connection is closed, then
//!   the one that has spent longest sending an unfinished request head (it gets a
//!   408). Only when every held connection is inside a request does a new one get
//!   `503 {"error":"Too many connections"}`. So clients that hold connections
//!   without finishing requests can never lock normal clients out. (Or, with
//!   [`AtCapacity::Wait`], new connections wait in the listen backlog until one
//!   closes; or, with [`AtCapacity::Refuse`], a new connection gets the `503` at
//!   once and no other is closed: floodgate-rest's choice.)
//! - **Header timeout**: a request head must be complete within
//!   [`ServerLimits::header_timeout`] of its first byte: `408` JSON, then closed.
//! - **Idle timeout**: a connection with no request in progress is closed after
//!   [`ServerLimits::idle_timeout`] (also one that never sends anything), and so
//!   is one whose client stops reading a response for that long.
//! - Running out of descriptors at `accept` closes an idle connection and backs off
//!   instead of spinning.
//! - **Graceful stop**: when its shutdown signal completes, the server stops
//!   accepting (the connections already in the listen backlog are served), and
//!   for [`ServerLimits::drain`] answers every request on the open connections
//!   with `Connection: close` (those in progress too), closing each after its
//!   answer; then hyper's graceful shutdown closes the idle ones. So a client
//!   whose request was on its way when the process was told to stop gets its
//!   answer, not a reset.
//!
//! One reaper task scans the connections every [`REAP_EVERY`]; each connection's
//! state is a few atomics its socket wrapper and its requests update.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::proxy::Refusal;
use crate::sync::lock;

/// How often the reaper looks at every connection.
pub const REAP_EVERY: Duration = Duration::from_millis(100);

/// The drain period by default ([`ServerLimits::drain`]): long enough for a
/// client with a request on its way to get its answer, short enough for a
/// rolling replacement (systemd waits 90 s for a stop, Kubernetes 30 s).
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);

/// The header lines hyper takes by default (and parses without allocating).
pub const HYPER_MAX_HEADERS: usize = 100;

/// The server's limits (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// hyper's own bounds, at or above the proxy's checks (which answer with
    /// JSON): header lines and the read buffer (bytes). Up to hyper's default of
    /// [`HYPER_MAX_HEADERS`] lines hyper parses a head into arrays on the stack;
    /// a higher bound makes it allocate (and fill) two arrays of that many entries
    /// per request, which cost the edge more than a tenth of its proxying
    /// instructions (`scripts/bench instructions`): above 100 lines hyper itself
    /// answers 431, without a body.
    pub max_headers: usize,
    pub max_buf: usize,
    /// What a new connection meets while `max_connections` are open.
    pub at_capacity: AtCapacity,
    /// After the shutdown signal, how long open connections may still send
    /// requests (each answered with `Connection: close`) before the idle ones
    /// are closed; the server stops sooner once every connection has closed.
    pub drain: Duration,
}

/// What the server does with a new connection while it holds
/// [`ServerLimits::max_connections`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AtCapacity {
    /// Accept it, closing a connection that does nothing to make room (see the
    /// module's documentation); `503` when every one is inside a request.
    #[default]
    MakeRoom,
    /// Accept none until one closes: new connections wait in the listen backlog.
    Wait,
    /// Accept it and answer `503` with `Retry-After: 1` at once, closing no other
    /// connection. The refused connection is then read (what arrives dropped)
    /// until its client closes it, for [`REFUSED_LINGER`] at most, so the client
    /// reads the answer rather than a reset; at most half the cap of refused
    /// connections linger at once (more are closed right after the answer).
    Refuse,
}

/// How long a connection refused with [`AtCapacity::Refuse`] is read after its
/// `503` at most (nginx's lingering close).
pub const REFUSED_LINGER: Duration = Duration::from_secs(2);

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: default_max_connections(),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_headers: HYPER_MAX_HEADERS,
            max_buf: 64 * 1024,
            at_capacity: AtCapacity::MakeRoom,
            drain: DEFAULT_DRAIN,
        }
    }
}

/// The default connection cap: half the descriptors the process may open (the
/// other half is for upstream connections), less a reserve, at most 16,384.
pub fn default_max_connections() -> usize {
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse::<usize>().ok())
        })
        .unwrap_or(1024);
    (limit.saturating_sub(32) / 2).clamp(16, 16_384)
}

/// What the reaper knows of one connection.
struct ConnState {
    /// Requests being handled (until their response body is done).
    in_flight: AtomicUsize,
    /// ms since the server started: the last byte read or written.
    last_activity: AtomicU64,
    /// ms since start when the current request head began (0: none begun).
    head_started: AtomicU64,
    /// ms since start when a write began waiting on a client that does not read.
    write_blocked: AtomicU64,
    /// Why the connection is being closed (0: it is not): a [`Refusal`] written to
    /// the socket first.
    closing: AtomicU8,
    close: Notify,
    /// The socket's descriptor (the connection owns it; [`Connection::gone`]
    /// duplicates it while a request of the connection is being handled).
    fd: std::os::fd::RawFd,
}

const CLOSE_SILENT: u8 = 1;
const CLOSE_408: u8 = 2;
const CLOSE_503: u8 = 3;

impl ConnState {
    fn new(now: u64, fd: std::os::fd::RawFd) -> Self {
        Self {
            fd,
            in_flight: AtomicUsize::new(0),
            last_activity: AtomicU64::new(now),
            head_started: AtomicU64::new(0),
            write_blocked: AtomicU64::new(0),
            closing: AtomicU8::new(0),
            close: Notify::new(),
        }
    }

    fn shut(&self, how: u8) {
        if self
            .closing
            .compare_exchange(0, how, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.close.notify_one();
        }
    }
}

/// The server's clock: ms since it started (never 0).
#[derive(Clone, Copy)]
struct Epoch(Instant);

impl Epoch {
    fn ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64 + 1
    }
}

/// A socket that reports its activity to its [`ConnState`].
struct Watched {
    stream: TcpStream,
    state: Arc<ConnState>,
    epoch: Epoch,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.state.closing.load(Ordering::Relaxed) != 0 {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r
            && buf.filled().len() > before
        {
            let now = this.epoch.ms();
            this.state.last_activity.store(now, Ordering::Relaxed);
            if this.state.in_flight.load(Ordering::Relaxed) == 0 {
                let _ = this.state.head_started.compare_exchange(
                    0,
                    now,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write(cx, data);
        this.note_write(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.note_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Watched {
    fn note_write(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) if *n > 0 => {
                self.state
                    .last_activity
                    .store(self.epoch.ms(), Ordering::Relaxed);
                self.state.write_blocked.store(0, Ordering::Relaxed);
            }
            Poll::Pending => {
                let _ = self.state.write_blocked.compare_exchange(
                    0,
                    self.epoch.ms(),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            _ => {}
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // a refusal on a bare socket: the JSON answer, if the socket takes it now
        let refusal = match self.state.closing.load(Ordering::SeqCst) {
            CLOSE_408 => Some(Refusal::RequestTimeout),
            CLOSE_503 => Some(Refusal::Overloaded),
            _ => None,
        };
        if let Some(r) = refusal {
            let _ = self.stream.try_write(&r.raw_response());
        }
    }
}

/// How long a request waits for its upstream before it watches for its client
/// leaving ([`InFlight::gone`]): most upstreams answer sooner, and watching
/// costs a few system calls.
pub const WATCH_AFTER: Duration = Duration::from_millis(50);

/// Marks a request in progress on its connection until dropped (the response
/// body finished, or the request was abandoned).
pub struct InFlight(Arc<ConnState>);

impl InFlight {
    /// Completes once the client has closed its side of the connection (an
    /// end of stream where the next request would be) while a request of it is
    /// in progress: it left, and its upstream request is of use to nobody
    /// (nginx and Envoy cancel it too). Never completes when the client has
    /// sent more (a pipelined request: it is still there) or the socket cannot
    /// be watched. Only for requests whose body has been read; the host starts
    /// watching [`WATCH_AFTER`] into the wait.
    pub async fn gone(&self) {
        use std::os::fd::{BorrowedFd, OwnedFd};
        // SAFETY: the connection owns the descriptor and outlives the requests it
        // serves, this one included; the duplicate is ours to close
        let borrowed = unsafe { BorrowedFd::borrow_raw(self.0.fd) };
        let watch = borrowed
            .try_clone_to_owned()
            .map(|fd: OwnedFd| std::net::TcpStream::from(fd))
            .and_then(|s| {
                s.set_nonblocking(true)?;
                TcpStream::from_std(s)
            });
        let Ok(watch) = watch else {
            return std::future::pending().await;
        };
        let mut byte = [0u8; 1];
        match watch.peek(&mut byte).await {
            Ok(0) | Err(_) => {}
            Ok(_) => std::future::pending().await,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection a request arrived on, in the request's extensions: its service
/// keeps the returned guard as long as the response (body included) lives.
#[derive(Clone)]
pub struct Connection {
    state: Arc<ConnState>,
}

impl Connection {
    pub fn in_flight(&self) -> InFlight {
        self.state.in_flight.fetch_add(1, Ordering::Relaxed);
        self.state.head_started.store(0, Ordering::Relaxed);
        InFlight(self.state.clone())
    }
}

#[derive(Default)]
struct Registry {
    next: u64,
    conns: HashMap<u64, Arc<ConnState>>,
}

impl Registry {
    /// Picks the connection to close to make room: an idle one (the least recently
    /// active), else the oldest unfinished head. `None`: all are busy.
    fn victim(&self) -> Option<(u64, u8)> {
        let idle = self
            .conns
            .iter()
            .filter(|(_, s)| s.closing.load(Ordering::Relaxed) == 0)
            .filter(|(_, s)| s.in_flight.load(Ordering::Relaxed) == 0);
        let mut best: Option<(u64, u8, (u8, u64))> = None;
        for (id, s) in idle {
            let head = s.head_started.load(Ordering::Relaxed);
            // idle before unfinished heads; older first
            let rank = if head == 0 {
                (0, s.last_activity.load(Ordering::Relaxed))
            } else {
                (1, head)
            };
            let how = if head == 0 { CLOSE_SILENT } else { CLOSE_408 };
            if best.as_ref().is_none_or(|(_, _, r)| rank < *r) {
                best = Some((*id, how, rank));
            }
        }
        best.map(|(id, how, _)| (id, how))
    }

    /// Closes one connection doing nothing; whether there was one.
    fn make_room(&self) -> bool {
        match self.victim() {
            Some((id, how)) => {
                self.conns[&id].shut(how);
                true
            }
            None => false,
        }
    }
}

/// Serves HTTP/1.1 on `listener` with `make_service(peer)` per connection until
/// `shutdown` completes; then drains ([`ServerLimits::drain`]): no new
/// connections, every answer says `Connection: close`, and once the open
/// connections have all closed or the drain period is over, hyper's graceful
/// shutdown closes the idle ones and lets requests in progress finish (bounded
/// by the idle timeout).
pub async fn serve<F, S, B>(
    listener: TcpListener,
    limits: ServerLimits,
    make_service: F,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    F: Fn(std::net::SocketAddr, Connection) -> S,
    S: Service<hyper::Request<Incoming>, Response = hyper::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let server = Server::new(limits);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (permit, accepted) = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            a = admit(server.room.as_ref(), &listener) => a,
        };
        match accepted {
            Ok((stream, peer)) => server.start(stream, peer, permit, &make_service),
            Err(e) => accept_failed(&server.registry, &e).await,
        }
    }
    server.draining.store(true, Ordering::SeqCst);
    // the connections already waiting in the backlog are served too (closing the
    // listener would reset them), then the listener is closed
    while let Some((stream, peer, permit)) = waiting(server.room.as_ref(), &listener) {
        server.start(stream, peer, permit, &make_service);
    }
    drop(listener);
    server.drain().await;
    Ok(())
}

/// What the accept loop shares with the connections it starts.
struct Server {
    limits: ServerLimits,
    epoch: Epoch,
    registry: Arc<Mutex<Registry>>,
    reaper: tokio::task::JoinHandle<()>,
    builder: http1::Builder,
    /// With [`AtCapacity::Wait`]: a place per connection.
    room: Option<Arc<Semaphore>>,
    /// Every connection, for hyper's graceful shutdown at the end of the drain.
    graceful: GracefulShutdown,
    /// Set once the server drains: every answer then says `Connection: close`.
    draining: Arc<AtomicBool>,
    /// With [`AtCapacity::Refuse`]: the refused connections lingering.
    refused: Refused,
}

impl Server {
    fn new(limits: ServerLimits) -> Self {
        let epoch = Epoch(Instant::now());
        let registry = Arc::new(Mutex::new(Registry::default()));
        Self {
            reaper: tokio::spawn(reap(registry.clone(), limits, epoch)),
            builder: http1_builder(&limits),
            room: (limits.at_capacity == AtCapacity::Wait)
                .then(|| Arc::new(Semaphore::new(limits.max_connections.max(1)))),
            graceful: GracefulShutdown::new(),
            draining: Arc::new(AtomicBool::new(false)),
            refused: Refused::new(&limits, epoch),
            limits,
            epoch,
            registry,
        }
    }

    /// Serves a new connection in its own task (unless the server is at
    /// capacity and no idle connection can make room: 503, closed).
    fn start<F, S, B>(
        &self,
        stream: TcpStream,
        peer: std::net::SocketAddr,
        permit: Option<OwnedSemaphorePermit>,
        make_service: &F,
    ) where
        F: Fn(std::net::SocketAddr, Connection) -> S,
        S: Service<hyper::Request<Incoming>, Response = hyper::Response<B>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let epoch = self.epoch;
        let Some((stream, state, id)) =
            register(&self.registry, &self.limits, stream, &self.refused)
        else {
            return;
        };
        let io = TokioIo::new(Watched {
            stream,
            state: state.clone(),
            epoch,
        });
        let service = Closing {
            inner: make_service(
                peer,
                Connection {
                    state: state.clone(),
                },
            ),
            draining: self.draining.clone(),
        };
        let conn = self
            .graceful
            .watch(self.builder.serve_connection(io, service));
        let registry = self.registry.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = conn => {}
                _ = state.close.notified() => {}
            }
            lock(&registry).conns.remove(&id);
            drop(permit);
        });
    }

    /// The drain: requests on open connections are still answered (each with
    /// `Connection: close`, after which hyper closes its connection) until every
    /// connection has closed or the drain period is over; then hyper's graceful
    /// shutdown closes the idle connections, and the requests in progress finish
    /// (within the idle timeout).
    async fn drain(self) {
        let all_closed = async {
            while self.graceful.count() > 0 {
                tokio::time::sleep(REAP_EVERY).await;
            }
        };
        let _ = tokio::time::timeout(self.limits.drain, all_closed).await;
        let _ = tokio::time::timeout(self.limits.idle_timeout, self.graceful.shutdown()).await;
        self.reaper.abort();
    }
}

/// A connection already waiting in the listen backlog (with a place for it, under
/// [`AtCapacity::Wait`]), taken without waiting.
fn waiting(
    room: Option<&Arc<Semaphore>>,
    listener: &TcpListener,
) -> Option<(
    TcpStream,
    std::net::SocketAddr,
    Option<OwnedSemaphorePermit>,
)> {
    let permit = match room {
        Some(room) => Some(room.clone().try_acquire_owned().ok()?),
        None => None,
    };
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match listener.poll_accept(&mut cx) {
        Poll::Ready(Ok((stream, peer))) => Some((stream, peer, permit)),
        _ => None,
    }
}

pin_project_lite::pin_project! {
    /// A response on its way: it says `Connection: close` when the server drains
    /// by the time it is ready (hyper then closes the connection after it).
    struct Answer<F> {
        #[pin]
        inner: F,
        draining: Arc<AtomicBool>,
    }
}

impl<F, B, E> Future for Answer<F>
where
    F: Future<Output = Result<hyper::Response<B>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut answered = std::task::ready!(this.inner.poll(cx));
        if let Ok(response) = &mut answered
            && this.draining.load(Ordering::Relaxed)
        {
            response.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
        Poll::Ready(answered)
    }
}

/// A connection's service, whose answers say `Connection: close` while the
/// server drains: each is its connection's last (hyper closes the connection
/// after it), and the client knows to send its next request elsewhere. (hyper's
/// graceful shutdown does the same for a request in progress, but closes an
/// idle connection at once: a request its client is sending meanwhile meets a
/// closed connection. So it comes only at the end of the drain.)
struct Closing<S> {
    inner: S,
    draining: Arc<AtomicBool>,
}

impl<S, B> Service<hyper::Request<Incoming>> for Closing<S>
where
    S: Service<hyper::Request<Incoming>, Response = hyper::Response<B>>,
{
    type Response = hyper::Response<B>;
    type Error = S::Error;
    type Future = Answer<S::Future>;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        Answer {
            inner: self.inner.call(req),
            draining: self.draining.clone(),
        }
    }
}

/// Out of descriptors (or another transient error): make room, back off.
async fn accept_failed(registry: &Mutex<Registry>, e: &io::Error) {
    lock(registry).make_room();
    if !matches!(e.raw_os_error(), Some(23 | 24)) {
        tracing::warn!(target: "floodgate::server", error = %e, "accept failed: {e}");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}

fn http1_builder(limits: &ServerLimits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        // no hyper timer: the reaper bounds a request head from its first byte
        // (header timeout) and a connection between requests (idle timeout);
        // hyper's looser bound of both cost every request a timer (~1.5k
        // instructions, `scripts/bench instructions`)
        .half_close(true)
        .keep_alive(true)
        .max_buf_size(limits.max_buf.max(8192));
    if limits.max_headers > HYPER_MAX_HEADERS {
        builder.max_headers(limits.max_headers);
    }
    builder
}

/// What refusing a connection takes.
struct Refused {
    epoch: Epoch,
    /// Places for refused connections lingering after their `503`.
    lingering: Arc<Semaphore>,
}

impl Refused {
    /// Half the cap of refused connections may linger at once.
    fn new(limits: &ServerLimits, epoch: Epoch) -> Self {
        Self {
            epoch,
            lingering: Arc::new(Semaphore::new((limits.max_connections / 2).max(1))),
        }
    }
}

/// Registers a new connection (its state, under its id), or refuses it (`None`:
/// 503 and close) when the server is at capacity and no idle connection can
/// make room (with [`AtCapacity::Refuse`], none is asked to).
fn register(
    registry: &Mutex<Registry>,
    limits: &ServerLimits,
    stream: TcpStream,
    refused: &Refused,
) -> Option<(TcpStream, Arc<ConnState>, u64)> {
    let _ = stream.set_nodelay(true);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let state = Arc::new(ConnState::new(refused.epoch.ms(), fd));
    let mut reg = lock(registry);
    if reg.conns.len() >= limits.max_connections
        && (limits.at_capacity == AtCapacity::Refuse || !reg.make_room())
    {
        drop(reg);
        let lingering = (limits.at_capacity == AtCapacity::Refuse)
            .then(|| refused.lingering.clone().try_acquire_owned().ok())
            .flatten();
        match lingering {
            Some(place) => {
                tokio::spawn(linger_refused(stream, place));
            }
            None => {
                state.shut(CLOSE_503);
                drop(Watched {
                    stream,
                    state,
                    epoch: refused.epoch,
                });
            }
        }
        return None;
    }
    let id = reg.next;
    reg.next += 1;
    reg.conns.insert(id, state.clone());
    Some((stream, state, id))
}

/// Answers a refused connection `503`, then reads (and drops) what its client
/// sends until it closes, within [`REFUSED_LINGER`]: closing with unread data
/// would reset the connection, and the client could lose the answer.
async fn linger_refused(mut stream: TcpStream, _place: OwnedSemaphorePermit) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let answered = async {
        stream
            .write_all(&Refusal::Overloaded.raw_response())
            .await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSED_LINGER, answered).await;
}

/// The next connection, once there is room for it: with [`AtCapacity::Wait`],
/// after a place (the permit the connection holds while open) is free.
async fn admit(
    room: Option<&Arc<Semaphore>>,
    listener: &TcpListener,
) -> (
    Option<OwnedSemaphorePermit>,
    io::Result<(TcpStream, std::net::SocketAddr)>,
) {
    let permit = match room {
        Some(room) => room.clone().acquire_owned().await.ok(),
        None => None,
    };
    (permit, listener.accept().await)
}

/// Closes connections past their timeouts.
async fn reap(registry: Arc<Mutex<Registry>>, limits: ServerLimits, epoch: Epoch) {
    let header = limits.header_timeout.as_millis() as u64;
    let idle = limits.idle_timeout.as_millis() as u64;
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        let now = epoch.ms();
        let reg = lock(&registry);
        for s in reg.conns.values() {
            let busy = s.in_flight.load(Ordering::Relaxed) > 0;
            let head = s.head_started.load(Ordering::Relaxed);
            let last = s.last_activity.load(Ordering::Relaxed);
            let blocked = s.write_blocked.load(Ordering::Relaxed);
            let idle_too_long = !busy && head == 0 && now.saturating_sub(last) > idle;
            let unread_too_long = busy && blocked != 0 && now.saturating_sub(blocked) > idle;
            if !busy && head != 0 && now.saturating_sub(head) > header {
                s.shut(CLOSE_408);
            } else if idle_too_long || unread_too_long {
                s.shut(CLOSE_SILENT);
            }
        }
    }
}
