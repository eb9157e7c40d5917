//! The response contract, as data the hosts render.
//!
//! Every response the limiter decided on, allowed or rejected, carries:
//!
//! | header | value |
//! |---|---|
//! | `X-RateLimit-Limit` | the bucket's capacity |
//! | `X-RateLimit-Remaining` | whole tokens left after this request |
//! | `X-RateLimit-Reset` | **Unix time in seconds**, rounded up, at which the bucket is full again |
//!
//! A rejection is `429 Too Many Requests` with the body `{"error":"Rate limit exceeded"}`
//! and `Retry-After`: **seconds from now**, rounded up and never 0, after which the same
//! request is admitted. Both come from the same clock (Redis' `TIME`), and
//! `Retry-After ≤ X-RateLimit-Reset − floor(now)` always holds (property-tested).
//! A request whose cost exceeds the bucket's capacity can never be admitted; its 429
//! carries no `Retry-After`, since no wait would help.

use crate::bucket::Decision;

pub const LIMIT: &str = "X-RateLimit-Limit";
pub const REMAINING: &str = "X-RateLimit-Remaining";
pub const RESET: &str = "X-RateLimit-Reset";
pub const RETRY_AFTER: &str = "Retry-After";
pub const DENIED_STATUS: u16 = 429;
pub const DENIED_BODY: &str = r#"{"error":"Rate limit exceeded"}"#;
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// Headers a proxy never forwards in either direction: the hop-by-hop headers of
/// RFC 9110 §7.6.1 plus `host` and `content-length` (recomputed for each hop).
/// Headers named in `Connection` are dropped too.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// The header the edge sets to the caller's API key id (any client value is replaced).
pub const IDENTITY_HEADER: &str = "x-floodgate-key-id";

/// The quota headers of one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitHeaders {
    pub limit: u64,
    pub remaining: u64,
    /// Unix seconds.
    pub reset: i64,
    /// Seconds; only on rejections that a wait can cure.
    pub retry_after: Option<i64>,
}

impl From<&Decision> for RateLimitHeaders {
    fn from(d: &Decision) -> Self {
        Self {
            limit: d.limit,
            remaining: d.remaining,
            reset: d.reset_unix_secs(),
            retry_after: d.retry_after_secs(),
        }
    }
}

impl RateLimitHeaders {
    /// Header name/value pairs, in a stable order.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            (LIMIT, self.limit.to_string()),
            (REMAINING, self.remaining.to_string()),
            (RESET, self.reset.to_string()),
        ];
        if let Some(s) = self.retry_after {
            out.push((RETRY_AFTER, s.to_string()));
        }
        out
    }
}

/// What a host does with a request the limiter decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Forward upstream and add these headers to the upstream's response.
    Forward { headers: RateLimitHeaders },
    /// Answer directly, without reaching the upstream.
    Reject {
        status: u16,
        headers: RateLimitHeaders,
        content_type: &'static str,
        body: &'static str,
    },
}

impl Answer {
    pub fn for_decision(d: &Decision) -> Self {
        let headers = RateLimitHeaders::from(d);
        if d.allowed() {
            Answer::Forward { headers }
        } else {
            Answer::Reject {
                status: DENIED_STATUS,
                headers,
                content_type: JSON_CONTENT_TYPE,
                body: DENIED_BODY,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{BucketState, decide};
    use crate::policy::Quota;

    const NOW: i64 = 1_764_000_000_250_000; // a quarter second past a whole second

    #[test]
    fn allowed_requests_carry_the_three_quota_headers() {
        let q = Quota::per_minute(1000).unwrap();
        let a = Answer::for_decision(&decide(None, &q, NOW, 1).decision);
        let Answer::Forward { headers } = a else {
            panic!("{a:?}")
        };
        assert_eq!(
            headers.pairs(),
            vec![
                (LIMIT, "1000".to_string()),
                (REMAINING, "999".to_string()),
                (RESET, "1764000001".to_string()), // full again 60 ms later, rounded up
            ]
        );
    }

    #[test]
    fn rejections_are_429_with_retry_after_and_the_json_body() {
        let q = Quota::per_minute(1000).unwrap();
        let empty = Some(BucketState {
            full_at: NOW + 60_000_000,
        });
        let a = Answer::for_decision(&decide(empty, &q, NOW, 1).decision);
        let Answer::Reject {
            status,
            headers,
            content_type,
            body,
        } = a
        else {
            panic!("{a:?}")
        };
        assert_eq!(status, 429);
        assert_eq!(content_type, "application/json");
        assert_eq!(body, r#"{"error":"Rate limit exceeded"}"#);
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"], "Rate limit exceeded");
        assert_eq!(headers.pairs()[3], (RETRY_AFTER, "1".to_string()));
        assert_eq!(headers.reset, 1_764_000_061);
        assert_eq!(headers.remaining, 0);
    }

    #[test]
    fn a_request_that_can_never_fit_gets_no_retry_after() {
        let q = Quota::per_minute(10).unwrap();
        let a = Answer::for_decision(&decide(None, &q, NOW, 11).decision);
        let Answer::Reject { headers, .. } = a else {
            panic!("{a:?}")
        };
        assert_eq!(headers.retry_after, None);
        assert_eq!(headers.pairs().len(), 3);
    }
}
