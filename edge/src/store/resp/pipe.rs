//! One connection to Redis shared by any number of tasks: requests are queued,
//! written in batches and matched to replies in order (RESP pipelining). One driver
//! task owns the socket; callers only touch a channel.

use std::collections::VecDeque;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::wire::{Reply, parse};

type Responder = oneshot::Sender<Result<Reply, String>>;

struct Job {
    frame: Vec<u8>,
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
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job { frame, reply })
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
    let mut pending: VecDeque<Responder> = VecDeque::new();
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
                                match pending.pop_front() {
                                    // a caller that gave up (deadline) just drops its reply
                                    Some(to) => { let _ = to.send(Ok(reply)); }
                                    None => break Err("a reply nobody asked for".to_string()),
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
                    outbox.extend_from_slice(&job.frame);
                    pending.push_back(job.reply);
                    while let Ok(job) = rx.try_recv() {
                        outbox.extend_from_slice(&job.frame);
                        pending.push_back(job.reply);
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
    while let Ok(job) = rx.try_recv() {
        pending.push_back(job.reply);
    }
    for to in pending {
        let _ = to.send(Err(failure.clone()));
    }
}
