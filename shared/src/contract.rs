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

/// The header the edge sets to the caller's identity (the operator's external id
/// of the customer owning the key), when the key has one. Any client value, in
/// any spelling, is dropped.
pub const KEY_IDENTITY_HEADER: &str = "x-floodgate-identity";

/// The header the edge sets to the caller's key metadata, as compact JSON of at
/// most 1 KB in printable ASCII ([`crate::keyrecord::metadata_header`]), when the
/// key has metadata. Any client value, in any spelling, is dropped.
pub const KEY_META_HEADER: &str = "x-floodgate-key-meta";

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
        use crate::script::int;
        let mut out = Vec::with_capacity(4);
        out.extend([
            (LIMIT, int(self.limit)),
            (REMAINING, int(self.remaining)),
            (RESET, int(self.reset)),
        ]);
        if let Some(s) = self.retry_after {
            out.push((RETRY_AFTER, int(s)));
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

/// A key out of credits ([`crate::credits`]) is refused with this body (429).
pub const USAGE_LIMITED_BODY: &str = r#"{"error":"Usage limit exceeded"}"#;
/// The credits a key has left after this request (every decided response of a
/// key with credits). Not an `X-RateLimit-*` name: those three describe the
/// request's bucket (a rate), and a client reading `X-RateLimit-Remaining` must
/// not mistake a count of uses for it; `X-Floodgate-` like the key id header.
pub const CREDITS_REMAINING: &str = "X-Floodgate-Credits-Remaining";
/// Unix seconds of the credits' next refill, when they refill (00:00 UTC).
pub const CREDITS_RESET: &str = "X-Floodgate-Credits-Reset";

/// The credit headers of a decision: [`CREDITS_REMAINING`] always,
/// [`CREDITS_RESET`] when the credits refill, and for a refusal a wait can cure,
/// `Retry-After` (seconds to the refill, never 0).
pub fn credit_headers(d: &crate::credits::CreditDecision) -> Vec<(&'static str, String)> {
    let mut out = vec![(CREDITS_REMAINING, d.state.remaining.to_string())];
    if let Some(next) = d.next_refill {
        out.push((CREDITS_RESET, crate::time::ceil_secs(next).to_string()));
    }
    if let (false, Some(wait)) = (d.admitted, d.retry_after) {
        out.push((RETRY_AFTER, crate::time::ceil_secs(wait).max(1).to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn credit_headers_tell_what_is_left_when_it_refills_and_how_long_to_wait() {
        use crate::calendar::{DAY, days_from_civil};
        use crate::credits::{CreditState, Interval, Refill};
        let refill = Refill {
            amount: 10,
            interval: Interval::Monthly,
            day: None,
        };
        let june = days_from_civil(2026, 6, 1) * DAY;
        let now = june - 1_500_000; // 1.5 s before the refill
        let s = CreditState {
            remaining: 1,
            as_of: june - 2 * DAY,
        };
        let ok = s.spend(Some(&refill), now, 1);
        let h = super::credit_headers(&ok);
        assert_eq!(
            h,
            [
                (super::CREDITS_REMAINING, "0".to_string()),
                (super::CREDITS_RESET, (june / 1_000_000).to_string()),
            ]
        );
        let refused = ok.state.spend(Some(&refill), now, 1);
        let h = super::credit_headers(&refused);
        assert_eq!(h[0].1, "0");
        assert_eq!(h[2], (super::RETRY_AFTER, "2".to_string()));
        // without a refill: no reset and no wait can help
        let spent = CreditState {
            remaining: 0,
            as_of: june - 2 * DAY,
        }
        .spend(None, now, 1);
        assert_eq!(
            super::credit_headers(&spent),
            [(super::CREDITS_REMAINING, "0".to_string())]
        );
    }

    /// Parses a field with a real RFC 9651 parser: (name, parameter → integer).
    fn parse_list(field: &str) -> Vec<(String, Vec<(String, i64)>)> {
        let list: sfv::List = sfv::Parser::new(field)
            .parse_list()
            .expect("a valid sf-list");
        list.into_iter()
            .map(|entry| match entry {
                sfv::ListEntry::Item(item) => (
                    item.bare_item
                        .as_string()
                        .expect("an sf-string")
                        .as_str()
                        .to_string(),
                    item.params
                        .iter()
                        .map(|(k, v)| {
                            (
                                k.as_str().to_string(),
                                i64::from(v.as_integer().expect("an integer")),
                            )
                        })
                        .collect(),
                ),
                other => panic!("not an item: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_ietf_fields_parse_as_structured_field_lists_describing_every_policy() {
        use crate::policy::{Algorithm, Quota};
        let bucket = Quota::per_minute(1000).unwrap();
        let window = Quota::new(100, 100, 60_000_000)
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap();
        let now = 1_764_000_000_500_000;
        let d1 = crate::bucket::decide(None, &bucket, now, 1).decision;
        let (d2, _) = crate::windows::fixed_window(40, 100, 60_000_000, now, 1);
        let fields = ietf_fields(&[
            PolicyState {
                name: "default",
                quota: &bucket,
                decision: &d1,
            },
            PolicyState {
                name: "search",
                quota: &window,
                decision: &d2,
            },
        ])
        .unwrap();
        assert_eq!(fields[0].0, "RateLimit-Policy");
        let policy = parse_list(&fields[0].1);
        assert_eq!(
            policy,
            [
                (
                    "default".to_string(),
                    vec![("q".to_string(), 1000), ("w".to_string(), 60)]
                ),
                (
                    "search".to_string(),
                    vec![("q".to_string(), 100), ("w".to_string(), 60)]
                ),
            ]
        );
        let state = parse_list(&fields[1].1);
        assert_eq!(state[0].0, "default");
        assert_eq!(state[0].1[0], ("r".to_string(), 999));
        assert_eq!(
            state[0].1[1],
            ("t".to_string(), 1),
            "full again in 60 ms: 1 s rounded up"
        );
        assert_eq!(state[1].1[0], ("r".to_string(), 59));
        // window ends at the next whole minute
        let end = (now / 60_000_000 + 1) * 60_000_000;
        assert_eq!(state[1].1[1].1, crate::time::ceil_secs(end - now));
        assert!(ietf_fields(&[]).is_none());
    }

    #[test]
    fn jitter_only_ever_delays_and_stays_in_range() {
        assert_eq!(jittered(7, 0, 42), 7);
        let seen: std::collections::BTreeSet<i64> = (0..500).map(|s| jittered(7, 3, s)).collect();
        assert_eq!(seen, (7..=10).collect(), "spread over 0..=3 extra seconds");
    }

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
    fn ietf_t_is_the_wait_of_a_denial_and_the_refill_of_an_admission() {
        let q = Quota::per_minute(10).unwrap(); // a token every 6 s
        let empty = Some(BucketState {
            full_at: NOW + 60_000_000,
        });
        let denied = decide(empty, &q, NOW, 1).decision;
        let admitted = decide(None, &q, NOW, 1).decision;
        let states = [
            PolicyState {
                name: "a",
                quota: &q,
                decision: &denied,
            },
            PolicyState {
                name: "b",
                quota: &q,
                decision: &admitted,
            },
        ];
        let [(_, policy), (_, state)] = ietf_fields(&states).unwrap();
        assert_eq!(policy, r#""a";q=10;w=60, "b";q=10;w=60"#);
        // a: the denied request fits in 6 s (Retry-After 6), not when full (60 s)
        assert_eq!(state, r#""a";r=0;t=6, "b";r=9;t=6"#);
        let Answer::Reject { headers, .. } = Answer::for_decision(&denied) else {
            panic!()
        };
        assert_eq!(headers.retry_after, Some(6));
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

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11):
/// Structured Field Lists naming every enforced policy a request matched.
pub const IETF_POLICY: &str = "RateLimit-Policy";
pub const IETF_RATELIMIT: &str = "RateLimit";

/// One matching policy as the IETF fields describe it.
#[derive(Debug, Clone, Copy)]
pub struct PolicyState<'a> {
    /// The policy's name (a-z, 0-9, `_`, `-`: a valid sf-string as is).
    pub name: &'a str,
    pub quota: &'a crate::policy::Quota,
    pub decision: &'a Decision,
}

/// The window (whole seconds, at least 1) a quota describes: the period of a
/// window algorithm, the time an empty token bucket takes to fill.
pub fn window_secs(q: &crate::policy::Quota) -> i64 {
    let us = if q.algorithm() == crate::policy::Algorithm::TokenBucket {
        q.burst_window()
    } else {
        q.period()
    };
    crate::time::ceil_secs(us).max(1)
}

/// The two IETF fields for `policies` (in order): `"name";q=<quota>;w=<window s>`
/// and `"name";r=<remaining>;t=<seconds>`, where `t` is, for a policy that denied
/// the request, the seconds until the same request fits again (draft-11 §6:
/// `Retry-After` must not point earlier than it), and otherwise the seconds until
/// the quota is whole again. `None` without policies.
pub fn ietf_fields(policies: &[PolicyState<'_>]) -> Option<[(&'static str, String); 2]> {
    if policies.is_empty() {
        return None;
    }
    let sf_string = |name: &str| {
        // names are validated to [a-z0-9_-]; escape anyway, per RFC 9651 §4.1.6
        let mut s = String::with_capacity(name.len() + 2);
        s.push('"');
        for c in name.chars().filter(|c| (' '..='~').contains(c)) {
            if c == '"' || c == '\\' {
                s.push('\\');
            }
            s.push(c);
        }
        s.push('"');
        s
    };
    let policy = policies
        .iter()
        .map(|p| {
            format!(
                "{};q={};w={}",
                sf_string(p.name),
                p.quota.capacity(),
                window_secs(p.quota)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let state = policies
        .iter()
        .map(|p| {
            let d = p.decision;
            let until = match d.outcome {
                // denied: when the denied request fits again, so Retry-After (which
                // takes the longest such wait, plus any jitter) is never earlier
                crate::Admission::Denied {
                    retry_after: Some(wait),
                } => wait,
                // admitted, or never fits: when the quota is whole again
                _ => d.full_at - d.now,
            };
            let t = crate::time::ceil_secs(until.max(0));
            format!("{};r={};t={}", sf_string(p.name), d.remaining, t)
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some([(IETF_POLICY, policy), (IETF_RATELIMIT, state)])
}

/// `Retry-After` plus a jitter of 0..=`max_jitter` seconds derived from `seed` (so
/// the edge stays deterministic): spreads the retries of clients denied together.
/// Only ever later than the exact value, never earlier.
pub fn jittered(retry_after: i64, max_jitter: u32, seed: u64) -> i64 {
    if max_jitter == 0 {
        return retry_after;
    }
    // splitmix64
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    retry_after + (z % (u64::from(max_jitter) + 1)) as i64
}
