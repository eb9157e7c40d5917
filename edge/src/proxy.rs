//! How the edge proxies, once for both hosts: which request and response headers
//! pass, who the upstream is told the caller is, what a client may send, how long
//! each side may take, and the JSON answers the hosts give themselves. The native
//! host (hyper) and the Worker (workerd's `fetch`) keep only their I/O; every rule
//! a client can observe lives here, as data and pure functions.

use std::net::IpAddr;
use std::time::Duration;

use floodgate_shared::contract::{
    HOP_BY_HOP, IDENTITY_HEADER, KEY_IDENTITY_HEADER, KEY_META_HEADER,
};
use floodgate_shared::routes::MAX_PATH_LEN;

use crate::pipeline::Reply;

/// The path both hosts answer themselves with the instance's health (never
/// forwarded).
pub const HEALTH_PATH: &str = "/__floodgate/health";

/// The path the native host answers with its Prometheus metrics (never forwarded;
/// under `/__floodgate/` like the health path, so no upstream path is shadowed).
pub const METRICS_PATH: &str = "/__floodgate/metrics";

/// The header carrying a request's id: the client's when well-formed
/// ([`request_id_ok`]), else one the edge makes; passed upstream.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Whether a client's request id is kept: 1 to 128 characters of letters, digits
/// and `-_.:/+=` (UUIDs, ULIDs, W3C trace ids, base64 ids); anything else is
/// replaced, so ids in logs can be neither forged lines nor unbounded.
pub fn request_id_ok(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=".contains(&b))
}

/// The request's id ([`REQUEST_ID_HEADER`]), on both hosts: the client's when
/// well-formed, else a new one from `fresh` (128 random bits, as 32 hex digits).
pub fn request_id(client: Option<&str>, fresh: impl FnOnce() -> u128) -> String {
    match client {
        Some(id) if request_id_ok(id) => id.to_string(),
        // 32 hex digits (what `format!("{v:032x}")` writes, at a fraction of
        // its cost: one per request)
        _ => floodgate_shared::hex::hex(&fresh().to_be_bytes()),
    }
}

/// A client's address as text (what `Display` writes; an IPv4 one without the
/// formatting machinery: one per request, for `X-Forwarded-For`).
fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let mut out = String::with_capacity(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
            out
        }
        IpAddr::V6(_) => ip.to_string(),
    }
}

/// What a client may send before the edge refuses it (each refusal is a JSON
/// answer, see [`Refusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest path, in bytes (414).
    pub max_path: usize,
    /// Longest query string, in bytes (414).
    pub max_query: usize,
    /// Most header bytes (names and values) in one request (431).
    pub max_header_bytes: usize,
    /// Most header lines in one request (431).
    pub max_headers: usize,
    /// Largest request body in bytes, declared or streamed (413); `None`: no limit.
    pub max_body: Option<u64>,
    /// Most client connections a native host holds at once: beyond it, idle ones
    /// are closed first, and a new connection finding none gets a 503.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_path: MAX_PATH_LEN,
            max_query: MAX_PATH_LEN,
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            max_body: Some(10 * 1024 * 1024),
            max_connections: 10_000,
        }
    }
}

/// How long each side may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From sending the request upstream to its response head (504).
    pub upstream: Duration,
    /// From a request head's first byte to its end (408).
    pub header: Duration,
    /// A connection with no request in progress is closed after this (also: a
    /// response the client stops reading for this long).
    pub idle: Duration,
    /// The longest pause inside a request body the client is sending (408).
    pub body: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            upstream: Duration::from_secs(30),
            header: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            body: Duration::from_secs(30),
        }
    }
}

/// The proxy's rules for one deployment.
#[derive(Debug, Clone)]
pub struct ProxyRules {
    /// The upstream's base URL (`http://127.0.0.1:9000`, no trailing slash); the
    /// request's path and query are appended.
    pub upstream: String,
    /// The header carrying the API key, lower case (`authorization` means
    /// `Authorization: Bearer <key>`).
    pub key_header: String,
    /// Forward the client's API key upstream.
    pub forward_key: bool,
    /// The header the edge sets to the caller's key id, lower case.
    pub identity_header: String,
    /// The header the edge sets to the caller's identity, lower case.
    pub key_identity_header: String,
    /// The header the edge sets to the caller's key metadata, lower case.
    pub key_meta_header: String,
    pub limits: Limits,
    pub timeouts: Timeouts,
}

impl ProxyRules {
    pub fn new(upstream: &str) -> Self {
        Self {
            upstream: upstream.trim_end_matches('/').to_string(),
            key_header: "authorization".into(),
            forward_key: false,
            identity_header: IDENTITY_HEADER.into(),
            key_identity_header: KEY_IDENTITY_HEADER.into(),
            key_meta_header: KEY_META_HEADER.into(),
            limits: Limits::default(),
            timeouts: Timeouts::default(),
        }
    }

    /// Whether the credentials are `Bearer <key>` (the key header is
    /// `Authorization`) rather than the key itself.
    pub fn bearer(&self) -> bool {
        self.key_header == "authorization"
    }

    /// The upstream URL for a request's path and query (`/p?q`).
    pub fn target(&self, path_and_query: &str) -> String {
        format!("{}{}", self.upstream, path_and_query)
    }

    /// Whether a request header named `name` is forwarded upstream. `named`: the
    /// names the request's `Connection` header lists (see [`connection_named`]).
    /// Dropped: hop-by-hop headers, the ones `Connection` names, every spelling of
    /// the headers the edge sets about the caller (the key id, the identity and
    /// the key's metadata, under their configured names and, for the last two,
    /// their default names too, so an upstream still reading those after a
    /// rename never sees a client's value: the edge sets its own) and of the key header unless
    /// the key is forwarded — "spelling" in the CGI sense: `X_Floodgate_Key_Id`
    /// reaches a WSGI/CGI application as the same variable as
    /// `X-Floodgate-Key-Id`.
    pub fn forwards_request_header(&self, name: &str, named: &[String]) -> bool {
        !(is_hop_by_hop(name, named)
            || same_variable(name, &self.identity_header)
            || same_variable(name, &self.key_identity_header)
            || same_variable(name, &self.key_meta_header)
            || same_variable(name, KEY_IDENTITY_HEADER)
            || same_variable(name, KEY_META_HEADER)
            || (!self.forward_key && same_variable(name, &self.key_header)))
    }

    /// Whether a response header named `name` is passed to the client. `named`:
    /// what the response's `Connection` header lists.
    pub fn forwards_response_header(&self, name: &str, named: &[String]) -> bool {
        !is_hop_by_hop(name, named)
    }

    /// The `X-Forwarded-For` to send upstream: the client's value with the client's
    /// address appended, unless the last hop already is that address (Cloudflare
    /// appends it itself before the Worker runs). `None`: leave it as it is.
    pub fn forwarded_for(&self, existing: Option<&str>, client: Option<IpAddr>) -> Option<String> {
        let client = ip_text(client?);
        match existing.map(str::trim).filter(|e| !e.is_empty()) {
            Some(prev) if prev.rsplit(',').next().map(str::trim) == Some(client.as_str()) => None,
            Some(prev) => Some(format!("{prev}, {client}")),
            None => Some(client),
        }
    }

    /// The checks on a request head both hosts apply before anything else.
    pub fn check_head(&self, head: &HeadSize) -> Result<(), Refusal> {
        let l = &self.limits;
        if head.path > l.max_path || head.query > l.max_query {
            return Err(Refusal::UriTooLong);
        }
        if head.header_count > l.max_headers || head.header_bytes > l.max_header_bytes {
            return Err(Refusal::HeadersTooLarge);
        }
        if let (Some(max), Some(len)) = (l.max_body, head.content_length)
            && len > max
        {
            return Err(Refusal::BodyTooLarge);
        }
        Ok(())
    }
}

/// The sizes of a request head, as a host measured them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadSize {
    pub path: usize,
    pub query: usize,
    pub header_count: usize,
    pub header_bytes: usize,
    /// The declared `Content-Length`, if any.
    pub content_length: Option<u64>,
}

/// The lower-case names a `Connection` header lists (its values, comma-separated):
/// headers that are hop-by-hop for this one message.
pub fn connection_named<'a>(values: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

fn is_hop_by_hop(name: &str, named: &[String]) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
        || named.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Whether two header names reach a CGI/WSGI application as the same variable
/// (`HTTP_X_FLOODGATE_KEY_ID`): case-insensitive, `-` and `_` alike.
pub fn same_variable(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes().zip(b.bytes()).all(|(x, y)| {
            let norm = |c: u8| {
                if c == b'_' {
                    b'-'
                } else {
                    c.to_ascii_lowercase()
                }
            };
            norm(x) == norm(y)
        })
}

/// Whether the response to a `method` request with `status` carries a body: not
/// for `HEAD`, 1xx, 204 and 304 (RFC 9110 §6.4.1). The hosts must not try to
/// stream one then.
pub fn has_body(method: &str, status: u16) -> bool {
    !(method.eq_ignore_ascii_case("HEAD")
        || (100..200).contains(&status)
        || status == 204
        || status == 304)
}

/// What the hosts answer themselves, as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400: the request's framing is broken (a bad chunk, a body shorter than
    /// its `Content-Length`). The client's error, not the upstream's.
    BadRequestBody,
    /// 408: the client stopped sending its request head or body.
    RequestTimeout,
    /// 413: the body is larger than [`Limits::max_body`].
    BodyTooLarge,
    /// 414: the path or query is longer than its limit.
    UriTooLong,
    /// 431: too many header lines or header bytes.
    HeadersTooLarge,
    /// 502: the upstream could not be reached or failed before its response head.
    UpstreamUnavailable,
    /// 503: the host holds as many connections as it may.
    Overloaded,
    /// 504: the upstream did not answer within [`Timeouts::upstream`].
    UpstreamTimeout,
    /// 499 (nginx's "client closed request"; never seen by the client, which is
    /// gone): the client closed its connection before the upstream answered,
    /// and the upstream request was cancelled.
    ClientGone,
}

impl Refusal {
    pub fn status(self) -> u16 {
        match self {
            Refusal::BadRequestBody => 400,
            Refusal::RequestTimeout => 408,
            Refusal::BodyTooLarge => 413,
            Refusal::UriTooLong => 414,
            Refusal::HeadersTooLarge => 431,
            Refusal::UpstreamUnavailable => 502,
            Refusal::Overloaded => 503,
            Refusal::UpstreamTimeout => 504,
            Refusal::ClientGone => 499,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::BadRequestBody => "Malformed request body",
            Refusal::RequestTimeout => "Request timed out",
            Refusal::BodyTooLarge => "Request body too large",
            Refusal::UriTooLong => "Request URI too long",
            Refusal::HeadersTooLarge => "Request headers too large",
            Refusal::UpstreamUnavailable => "Upstream unavailable",
            Refusal::Overloaded => "Too many connections",
            Refusal::UpstreamTimeout => "Upstream timed out",
            Refusal::ClientGone => "Client closed request",
        }
    }

    /// The answer: the status, `{"error": ...}`, and `Retry-After: 1` on a 503.
    pub fn answer(self) -> Reply {
        let g = Reply::json(self.status(), self.message(), None);
        match self {
            Refusal::Overloaded => g.with_header("Retry-After", "1"),
            _ => g,
        }
    }

    /// The whole HTTP/1.1 response, for a host that writes it to a bare socket
    /// (the connection closes after it).
    pub fn raw_response(self) -> Vec<u8> {
        let body = serde_json::json!({ "error": self.message() }).to_string();
        let reason = match self.status() {
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "Error",
        };
        let retry = if self == Refusal::Overloaded {
            "Retry-After: 1\r\n"
        } else {
            ""
        };
        format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{retry}Connection: close\r\n\r\n{body}",
            self.status(),
            body.len()
        )
        .into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn request_ids_and_addresses_read_as_display_writes_them(
            v in proptest::prelude::any::<u128>(),
            v4 in proptest::prelude::any::<[u8; 4]>(),
            v6 in proptest::prelude::any::<[u8; 16]>(),
        ) {
            proptest::prop_assert_eq!(request_id(None, || v), format!("{v:032x}"));
            for ip in [IpAddr::from(v4), IpAddr::from(v6)] {
                proptest::prop_assert_eq!(ip_text(ip), ip.to_string());
            }
        }
    }

    fn rules() -> ProxyRules {
        ProxyRules::new("http://up:9000/")
    }

    #[test]
    fn request_ids_are_kept_only_when_well_formed() {
        for ok in [
            "0f8b7c1e-2d4a-4b7e-9c3f-5a6b7c8d9e0f",
            "01HZX3K9Q2M4N5P6R7S8T9V0W1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "a",
            &"x".repeat(128),
        ] {
            assert!(request_id_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "two words",
            "line\nbreak",
            "quote\"",
            "é",
            &"x".repeat(129),
        ] {
            assert!(!request_id_ok(bad), "{bad:?}");
        }
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_stay_behind() {
        let r = rules();
        let named = connection_named(["keep-alive, X-Hop", " x-other "]);
        assert_eq!(named, ["keep-alive", "x-hop", "x-other"]);
        for h in [
            "Connection",
            "transfer-encoding",
            "Upgrade",
            "X-Hop",
            "x-other",
            "Host",
        ] {
            assert!(!r.forwards_request_header(h, &named), "{h}");
            assert!(!r.forwards_response_header(h, &named), "{h}");
        }
        assert!(r.forwards_request_header("x-kept", &named));
        assert!(r.forwards_response_header("content-type", &named));
    }

    #[test]
    fn every_cgi_spelling_of_the_identity_and_key_headers_is_dropped() {
        let mut r = rules();
        for h in [
            "X-Floodgate-Key-Id",
            "x_floodgate_key_id",
            "X_Floodgate-Key_ID",
            "X-Floodgate-Identity",
            "x_floodgate_identity",
            "X-FLOODGATE-KEY-META",
            "X_Floodgate_Key-Meta",
            "authorization",
            "AUTHORIZATION",
        ] {
            assert!(!r.forwards_request_header(h, &[]), "{h}");
        }
        assert!(r.forwards_request_header("x-floodgate-key-idx", &[]));
        assert!(r.forwards_request_header("x-floodgate-identity-hint", &[]));
        r.forward_key = true;
        assert!(r.forwards_request_header("Authorization", &[]));
        r.key_header = "x-api-key".into();
        r.forward_key = false;
        assert!(!r.forwards_request_header("X_API_KEY", &[]));
        assert!(!r.bearer());
        // renamed: the configured names are dropped in every spelling
        r.key_identity_header = "x-customer".into();
        r.key_meta_header = "x-customer-meta".into();
        for h in [
            "X-Customer",
            "x_customer",
            "X_CUSTOMER-META",
            "x-customer_meta",
            "X-Floodgate-Identity",
            "x_floodgate_key_meta",
        ] {
            assert!(!r.forwards_request_header(h, &[]), "{h}");
        }
        assert!(r.forwards_request_header("x-customer-id", &[]));
    }

    #[test]
    fn forwarded_for_appends_the_client_once() {
        let r = rules();
        let ip: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(
            r.forwarded_for(None, Some(ip)).as_deref(),
            Some("203.0.113.9")
        );
        assert_eq!(
            r.forwarded_for(Some("10.0.0.1"), Some(ip)).as_deref(),
            Some("10.0.0.1, 203.0.113.9")
        );
        assert_eq!(
            r.forwarded_for(Some("10.0.0.1, 203.0.113.9"), Some(ip)),
            None
        );
        assert_eq!(r.forwarded_for(Some("10.0.0.1"), None), None);
    }

    #[test]
    fn bodies_exist_except_for_head_1xx_204_and_304() {
        assert!(has_body("GET", 200));
        assert!(!has_body("HEAD", 200));
        assert!(!has_body("get", 204));
        assert!(!has_body("GET", 304));
        assert!(!has_body("GET", 101));
        assert!(has_body("POST", 500));
    }

    #[test]
    fn limits_refuse_with_their_statuses() {
        let r = rules();
        let ok = HeadSize {
            path: 10,
            ..HeadSize::default()
        };
        assert_eq!(r.check_head(&ok), Ok(()));
        let cases = [
            (
                HeadSize {
                    path: MAX_PATH_LEN + 1,
                    ..ok
                },
                Refusal::UriTooLong,
                414,
            ),
            (
                HeadSize {
                    query: MAX_PATH_LEN + 1,
                    ..ok
                },
                Refusal::UriTooLong,
                414,
            ),
            (
                HeadSize {
                    header_count: 101,
                    ..ok
                },
                Refusal::HeadersTooLarge,
                431,
            ),
            (
                HeadSize {
                    header_bytes: 40_000,
                    ..ok
                },
                Refusal::HeadersTooLarge,
                431,
            ),
            (
                HeadSize {
                    content_length: Some(11 << 20),
                    ..ok
                },
                Refusal::BodyTooLarge,
                413,
            ),
        ];
        for (head, refusal, status) in cases {
            assert_eq!(r.check_head(&head), Err(refusal));
            assert_eq!(refusal.status(), status);
            let Reply {
                status: s,
                body,
                headers,
            } = refusal.answer();
            assert_eq!(s, status);
            assert!(headers.contains(&("Content-Type", "application/json".to_string())));
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(v["error"].is_string());
        }
    }

    #[test]
    fn a_raw_refusal_is_a_whole_http_response() {
        let raw = String::from_utf8(Refusal::RequestTimeout.raw_response()).unwrap();
        assert!(raw.starts_with("HTTP/1.1 408 Request Timeout\r\n"));
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert_eq!(body, r#"{"error":"Request timed out"}"#);
        assert!(
            String::from_utf8(Refusal::Overloaded.raw_response())
                .unwrap()
                .contains("Retry-After: 1")
        );
    }
}
