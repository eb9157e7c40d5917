//! A TCP proxy on loopback that can go silent without closing anything: what a
//! dead NAT entry, a frozen load balancer or a peer that lost its network looks
//! like to a client. [`SilentProxy::blackhole`] stops forwarding on every open
//! connection for good (their sockets stay open, nothing is ever answered) and
//! holds new connections the same way; [`SilentProxy::restore`] forwards new
//! connections again — the frozen ones stay frozen, so a client only recovers by
//! reconnecting. Runs on its own thread and runtime; stops when dropped.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Default)]
struct State {
    blackholed: AtomicBool,
    accepted: AtomicUsize,
    /// One flag per connection: set, the connection is frozen for good.
    frozen: std::sync::Mutex<Vec<Arc<AtomicBool>>>,
}

pub struct SilentProxy {
    port: u16,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            // what arrived after the freeze is never delivered
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn hold(_socket: tokio::net::TcpStream) {
    std::future::pending::<()>().await
}

impl SilentProxy {
    /// Forwards a free loopback port to `target_port` on loopback.
    pub fn start(target_port: u16) -> Self {
        let std_listener =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let accept = async {
                    loop {
                        let Ok((client, _)) = listener.accept().await else {
                            continue;
                        };
                        shared.accepted.fetch_add(1, Ordering::SeqCst);
                        let frozen =
                            Arc::new(AtomicBool::new(shared.blackholed.load(Ordering::SeqCst)));
                        floodgate_edge::sync::lock(&shared.frozen).push(frozen.clone());
                        tokio::spawn(async move {
                            if frozen.load(Ordering::SeqCst) {
                                // held: accepted, never answered, never closed
                                return hold(client).await;
                            }
                            let Ok(upstream) =
                                tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, target_port))
                                    .await
                            else {
                                return;
                            };
                            let _ = client.set_nodelay(true);
                            let _ = upstream.set_nodelay(true);
                            let (cr, cw) = client.into_split();
                            let (ur, uw) = upstream.into_split();
                            tokio::join!(pump(cr, uw, frozen.clone()), pump(ur, cw, frozen));
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Self {
            port,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every open connection freezes for good; new ones are held silent.
    pub fn blackhole(&self) {
        self.state.blackholed.store(true, Ordering::SeqCst);
        for f in floodgate_edge::sync::lock(&self.state.frozen).iter() {
            f.store(true, Ordering::SeqCst);
        }
    }

    /// New connections are forwarded again (frozen ones stay frozen).
    pub fn restore(&self) {
        self.state.blackholed.store(false, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
