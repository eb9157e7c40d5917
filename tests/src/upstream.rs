//! A raw HTTP/1.1 upstream for proxy tests: it answers from the socket, so it can
//! misbehave in ways a framework never would (die mid-body, never answer) and report
//! the request exactly as it arrived (header names as spelled, framing).
//!
//! Behaviour by path:
//! - `/status/<code>`: that status with no body (`204`, `304`, ...).
//! - `/truncate`: `Content-Length: 100000`, 1,000 bytes, then a reset.
//! - `/hang`: reads the request and never answers (the socket is held for 60 s).
//! - `/slow`: `Content-Length: 10`, 5 bytes at once, the other 5 a second later.
//! - anything else: 200 with a JSON echo of the request: method, target, every
//!   header line as `[name, value]` in arrival order, the body's framing
//!   (`content-length`, `chunked` or `none`) and its length. A HEAD gets the
//!   headers of that answer and no body.
//!
//! Every answer closes the connection. Requests are counted per path.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The tally of whole bodies, per path, beside the requests' (`\0` sorts first
/// and starts no path).
const COMPLETE: &str = "\0complete ";

/// A running raw upstream; stops accepting when dropped.
pub struct RawUpstream {
    pub url: String,
    seen: Arc<Mutex<HashMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawUpstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind loopback");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let counts = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let counts = counts.clone();
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(60), serve(socket, counts)).await;
                });
            }
        });
        RawUpstream { url, seen, task }
    }

    /// Requests that reached the upstream, in total.
    pub fn total(&self) -> u64 {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(k, _)| !k.starts_with(COMPLETE))
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests for `path` whose body arrived whole, as its framing says.
    pub fn complete(&self, path: &str) -> u64 {
        let seen = self.seen.lock().unwrap();
        seen.get(&format!("{COMPLETE}{path}")).copied().unwrap_or(0)
    }

    /// Requests that reached the upstream for `path`.
    pub fn path(&self, path: &str) -> u64 {
        self.seen.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

async fn serve(socket: TcpStream, seen: Arc<Mutex<HashMap<String, u64>>>) {
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
        return;
    }
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default().to_string();
    let path = target.split('?').next().unwrap_or_default().to_string();
    let mut headers: Vec<(String, String)> = vec![];
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).await.unwrap_or(0) == 0 {
            return;
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.to_string(), v.trim().to_string()));
        }
    }
    *seen.lock().unwrap().entry(path.clone()).or_default() += 1;
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let chunked =
        get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let (framing, body_len) = if chunked {
        ("chunked", read_chunked(&mut reader).await)
    } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        let mut body = vec![0u8; n];
        let got = reader.read_exact(&mut body).await.map(|_| n).ok();
        ("content-length", got)
    } else {
        ("none", Some(0))
    };
    if body_len.is_some() {
        *seen
            .lock()
            .unwrap()
            .entry(format!("{COMPLETE}{path}"))
            .or_default() += 1;
    }
    let mut socket = reader.into_inner();
    if path == "/hang" {
        tokio::time::sleep(Duration::from_secs(60)).await;
        return;
    }
    if path == "/truncate" {
        let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n".to_vec();
        out.extend(std::iter::repeat_n(b'x', 1000));
        let _ = socket.write_all(&out).await;
        let _ = socket.flush().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // a reset, not an orderly close (a zero linger does not block on drop)
        #[allow(deprecated)]
        let _ = socket.set_linger(Some(Duration::ZERO));
        drop(socket);
        return;
    }
    if path == "/slow" {
        let _ = socket
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nfirst")
            .await;
        let _ = socket.flush().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = socket.write_all(b"later").await;
        let _ = socket.shutdown().await;
        return;
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let code: u16 = code.parse().unwrap_or(500);
        let _ = socket
            .write_all(format!("HTTP/1.1 {code} Status\r\nConnection: close\r\n\r\n").as_bytes())
            .await;
        return;
    }
    let echo = serde_json::json!({
        "method": method,
        "target": target,
        "headers": headers,
        "framing": framing,
        "body_bytes": body_len,
    })
    .to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        echo.len()
    );
    let mut out = head.into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(echo.as_bytes());
    }
    let _ = socket.write_all(&out).await;
    let _ = socket.shutdown().await;
}

/// Reads a chunked body; its length, or `None` when the framing is broken.
async fn read_chunked(reader: &mut BufReader<TcpStream>) -> Option<usize> {
    let mut total = 0;
    loop {
        let mut size = String::new();
        reader.read_line(&mut size).await.ok()?;
        let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
        let mut chunk = vec![0u8; size + 2];
        reader.read_exact(&mut chunk).await.ok()?;
        if size == 0 {
            return Some(total);
        }
        total += size;
    }
}

/// The echo of one request, as the raw upstream saw it.
#[derive(Debug)]
pub struct Echo(pub serde_json::Value);

impl Echo {
    /// Every value of the header `name` (exact spelling, case-insensitive).
    pub fn header(&self, name: &str) -> Vec<String> {
        self.0["headers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
            .filter_map(|h| h[1].as_str().map(str::to_string))
            .collect()
    }

    /// The header names as they arrived.
    pub fn names(&self) -> Vec<String> {
        self.0["headers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h[0].as_str().map(str::to_string))
            .collect()
    }

    pub fn framing(&self) -> &str {
        self.0["framing"].as_str().unwrap_or_default()
    }
}
