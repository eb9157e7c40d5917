//! The bodies the native host streams: the client's request body on its way
//! upstream (framing kept, size and pauses bounded, and its failures recorded as
//! the client's), and the response body on its way back (holding the request's
//! in-flight slots and connection accounting until it is done).

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::proxy::Refusal;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request body failed, when it was the client's doing.
#[derive(Default)]
pub struct BodyFault(OnceLock<Refusal>);

impl BodyFault {
    pub fn get(&self) -> Option<Refusal> {
        self.0.get().copied()
    }
    fn set(&self, r: Refusal) {
        let _ = self.0.set(r);
    }
}

/// The client's request body, forwarded as it arrives: its size hint (and so its
/// `Content-Length` framing) passes through; more than `max` bytes is a 413, a
/// pause longer than `pause` a 408, broken framing a 400 — each recorded in
/// `fault` so the host answers the client's error instead of blaming the upstream.
/// A body refused as too large is read out behind the 413 once the upstream
/// request drops it ([`super::linger`]): closing with unread data would reset the
/// connection, and a client still sending would see a broken pipe, not the 413.
pub struct RequestBody {
    /// `None` once handed to the lingering reader.
    inner: Option<Incoming>,
    max: Option<u64>,
    seen: u64,
    pause: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// The timer runs from the first poll (the upstream may take a while to ask).
    polled: bool,
    fault: Arc<BodyFault>,
}

impl RequestBody {
    pub fn new(inner: Incoming, max: Option<u64>, pause: Duration, fault: Arc<BodyFault>) -> Self {
        Self {
            inner: Some(inner),
            max,
            seen: 0,
            pause,
            timer: Box::pin(tokio::time::sleep(pause)),
            polled: false,
            fault,
        }
    }

    fn fail(&mut self, r: Refusal) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.fault.set(r);
        Poll::Ready(Some(Err(r.message().into())))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if !this.polled {
            this.polled = true;
            let deadline = tokio::time::Instant::now() + this.pause;
            this.timer.as_mut().reset(deadline);
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len() as u64;
                    if this.max.is_some_and(|m| this.seen > m) {
                        return this.fail(Refusal::BodyTooLarge);
                    }
                }
                let deadline = tokio::time::Instant::now() + this.pause;
                this.timer.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(_))) => this.fail(Refusal::BadRequestBody),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => this.fail(Refusal::RequestTimeout),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Incoming::size_hint)
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if self.fault.get() == Some(Refusal::BodyTooLarge)
            && let Some(rest) = self.inner.take()
        {
            super::linger(rest, self.pause);
        }
    }
}

/// A response body to the client: the host's own answer, or the upstream's body
/// streamed through. Whatever it holds (the request's in-flight slots, the
/// connection's accounting) is released when it is dropped: once the body is out,
/// or when the client goes away. An upstream body that fails mid-way fails the
/// response (the client sees a truncated message, never a complete one).
pub struct ProxyBody {
    kind: Kind,
    _held: Held,
}

enum Kind {
    Full(Full<Bytes>),
    /// The upstream's body, and its connection, given back once the body was
    /// read to its end.
    Upstream(Incoming, super::upstream::Lease),
}

/// What a response holds until it is done.
#[derive(Default)]
pub struct Held {
    pub in_flight: Option<super::server::InFlight>,
    pub slots: Option<super::SlotGuard>,
}

impl ProxyBody {
    pub fn full(bytes: impl Into<Bytes>, held: Held) -> Self {
        Self {
            kind: Kind::Full(Full::new(bytes.into())),
            _held: held,
        }
    }

    pub fn upstream(body: Incoming, mut lease: super::upstream::Lease, held: Held) -> Self {
        lease.finished_if_ended(&body);
        Self {
            kind: Kind::Upstream(body, lease),
            _held: held,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Full(f) => Pin::new(f).poll_frame(cx).map_err(|e| match e {}),
            Kind::Upstream(b, lease) => {
                let frame = Pin::new(&mut *b).poll_frame(cx).map_err(Into::into);
                // the end: polled past, or known with the last frame (hyper's
                // server polls a body no further once it says it ended)
                if matches!(frame, Poll::Ready(None)) {
                    lease.finished();
                } else {
                    lease.finished_if_ended(b);
                }
                frame
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(f) => f.is_end_stream(),
            Kind::Upstream(b, _) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(f) => f.size_hint(),
            Kind::Upstream(b, _) => b.size_hint(),
        }
    }
}
