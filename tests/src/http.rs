//! Raw HTTP/1.1 over a loopback TCP socket, for tests that must control exactly
//! what the client sends and when (slow, partial, malformed or oversized
//! requests), and see exactly what comes back — including a closed connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// `host:port` of an `http://host:port` base URL.
pub fn authority(url: &str) -> &str {
    url.trim_start_matches("http://").trim_end_matches('/')
}

/// A connected client socket with a read timeout.
pub fn connect(url: &str) -> TcpStream {
    let s = TcpStream::connect(authority(url)).expect("connect to the endpoint");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A parsed response: status and body (headers are not needed by the tests).
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

/// Reads one response (Content-Length or to EOF). `None` when the server closed
/// the connection (or reset it) before a complete status line arrived.
pub fn read_response(s: &mut TcpStream) -> Option<RawResponse> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    let mut body = buf[head_end..].to_vec();
    match length {
        Some(n) => {
            while body.len() < n {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => body.extend_from_slice(&chunk[..k]),
                }
            }
        }
        None => {
            if !head.to_ascii_lowercase().contains("transfer-encoding") {
                while let Ok(k) = s.read(&mut chunk) {
                    if k == 0 {
                        break;
                    }
                    body.extend_from_slice(&chunk[..k]);
                }
            }
        }
    }
    Some(RawResponse { status, head, body })
}

/// Sends `request` whole and reads the response.
pub fn exchange(url: &str, request: &[u8]) -> Option<RawResponse> {
    let mut s = connect(url);
    s.write_all(request).ok()?;
    read_response(&mut s)
}

/// Waits (bounded by `limit`) for the server to close `s`; returns how long it took,
/// or `None` if it was still open at the limit. Any bytes received are ignored.
pub fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}
