//! One connection to Redis shared by any number of tasks: requests are queued,
//! written in batches and matched to replies in order (RESP pipelining). One driver
//! task owns the socket; callers only touch a channel.

use std::collections::VecDeque;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::wire::{Reply, parse};

type Responder = oneshot::Sender<Result<Vec<Reply>, String>>;

/// Encoded commands written back to back (nothing else is interleaved, so a
/// MULTI ... EXEC batch stays atomic) and the number of replies they produce.
struct Job {
    frames: Vec<u8>,
    count: usize,
    reply: Responder,
}

/// A job whose replies are still arriving.
struct Waiting {
    want: usize,
    got: Vec<Reply>,
    reply: Responder,
}

/// A handle to a pipelined connection. Cheap to clone.
#[derive(Clone)]
pub struct Pipe {
    tx: mpsc::UnboundedSender<Job>,
}

impl Pipe {
    /// Starts the driver task for an already connected stream.
    pub fn start<R, W>(read: R, write: W) -> Self
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(drive(read, write, rx));
        Self { tx }
    }

    /// Sends one encoded command and waits for its reply. `Err` means the
    /// connection is gone (the message says why); Redis error replies are
    /// `Ok(Reply::Error)`.
    pub async fn call(&self, frame: Vec<u8>) -> Result<Reply, String> {
        let mut replies = self.call_batch(frame, 1).await?;
        Ok(replies.pop().expect("a batch of one has one reply"))
    }

    /// Sends `count` encoded commands back to back and waits for their replies.
    pub async fn call_batch(&self, frames: Vec<u8>, count: usize) -> Result<Vec<Reply>, String> {
        assert!(count > 0, "a batch holds at least one command");
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job {
                frames,
                count,
                reply,
            })
            .map_err(|_| "connection closed".to_string())?;
        rx.await.map_err(|_| "connection closed".to_string())?
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

async fn drive<R, W>(mut read: R, mut write: W, mut rx: mpsc::UnboundedReceiver<Job>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut pending: VecDeque<Waiting> = VecDeque::new();
    let mut inbox = Vec::with_capacity(16 * 1024);
    let mut outbox = Vec::with_capacity(16 * 1024);
    let mut accepting = true;
    let failure = loop {
        if !accepting && pending.is_empty() {
            return;
        }
        tokio::select! {
            biased;
            n = read.read_buf(&mut inbox) => match n {
                Ok(0) => break "the server closed the connection".to_string(),
                Err(e) => break format!("read: {e}"),
                Ok(_) => {
                    let mut used = 0;
                    let outcome = loop {
                        match parse(&inbox[used..]) {
                            Ok(Some((reply, n))) => {
                                used += n;
                                let Some(head) = pending.front_mut() else {
                                    break Err("a reply nobody asked for".to_string());
                                };
                                head.got.push(reply);
                                if head.got.len() == head.want {
                                    let done = pending.pop_front().expect("front exists");
                                    // a caller that gave up (deadline) just drops its reply
                                    let _ = done.reply.send(Ok(done.got));
                                }
                            }
                            Ok(None) => break Ok(()),
                            Err(e) => break Err(e.to_string()),
                        }
                    };
                    inbox.drain(..used);
                    if let Err(e) = outcome { break e; }
                }
            },
            job = rx.recv(), if accepting => match job {
                None => accepting = false,
                Some(job) => {
                    let mut next = Some(job);
                    while let Some(job) = next {
                        outbox.extend_from_slice(&job.frames);
                        pending.push_back(Waiting { want: job.count, got: Vec::with_capacity(job.count), reply: job.reply });
                        next = rx.try_recv().ok();
                    }
                    if let Err(e) = write.write_all(&outbox).await {
                        break format!("write: {e}");
                    }
                    outbox.clear();
                }
            },
        }
    };
    // The connection is unusable: fail everything in flight and everything queued.
    rx.close();
    let queued = std::iter::from_fn(|| rx.try_recv().ok()).map(|j| j.reply);
    for to in pending.into_iter().map(|w| w.reply).chain(queued) {
        let _ = to.send(Err(failure.clone()));
    }
}
