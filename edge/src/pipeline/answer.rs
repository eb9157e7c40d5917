//! What the pipeline tells a host to do with a request: forward it ([`Admit`]) or
//! answer it itself ([`Reply`]) — a `Result<Admit, Reply>`, so a host never has to
//! guess which one it holds — and the answers it builds.

use floodgate_shared::apikeys::KeyRecord;
use floodgate_shared::contract::{DENIED_BODY, DENIED_STATUS, JSON_CONTENT_TYPE, RateLimitHeaders};
use floodgate_shared::keyrecord::metadata_header;

/// Marks every answer given without Redis: `fail-open`, `fail-closed` or
/// `local-fallback` (see `docs/failure.md`).
pub const DEGRADED_HEADER: &str = "X-RateLimit-Degraded";

/// Forward the request upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admit {
    /// Who the upstream is told the caller is (`None`: a caller the edge could not
    /// verify while the store was down, forwarded by a fail-open policy without an
    /// identity).
    pub key_id: Option<String>,
    /// The caller's identity and its key's metadata as one header value
    /// ([`metadata_header`]), for the upstream: each `None` when the key has
    /// none (or the caller is unverified).
    pub identity: Option<String>,
    pub key_meta: Option<String>,
    pub route: Option<String>,
    /// Added to the upstream's response (the quota headers).
    pub headers: Vec<(&'static str, String)>,
    /// In-flight slots taken for this request (policies with `max_in_flight`).
    /// The host releases them with [`super::Pipeline::release`] when the response
    /// is complete, the client goes away or the upstream fails; slots never
    /// released expire after [`super::PipelineConfig::in_flight_ttl`].
    pub slots: Vec<Slot>,
}

/// The edge's own answer; the upstream never sees the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// One in-flight slot: its set and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub key: String,
    pub id: String,
}

impl Admit {
    /// Forwards the caller whose key is `record`.
    pub fn caller(
        record: &KeyRecord,
        route: Option<&str>,
        headers: Vec<(&'static str, String)>,
        slots: Vec<Slot>,
    ) -> Admit {
        Admit {
            key_id: Some(record.id.clone()),
            identity: record.identity.clone(),
            key_meta: record.metadata.as_ref().map(metadata_header),
            route: route.map(str::to_string),
            headers,
            slots,
        }
    }

    /// Forwards a caller without an identity (the limiter is off, or a key the
    /// edge could not verify under a fail-open policy).
    pub fn anonymous(route: Option<String>, headers: Vec<(&'static str, String)>) -> Admit {
        Admit {
            key_id: None,
            identity: None,
            key_meta: None,
            route,
            headers,
            slots: vec![],
        }
    }

    /// The same admission with one more header.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Admit {
        self.headers.push((name, value.into()));
        self
    }

    /// The value of a header the pipeline set.
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
}

impl Reply {
    /// An answer with a JSON body `{"error": ..., "hint": ...}`.
    pub fn json(status: u16, error: &str, hint: Option<&str>) -> Reply {
        let body = match hint {
            Some(h) => serde_json::json!({ "error": error, "hint": h }),
            None => serde_json::json!({ "error": error }),
        };
        Reply {
            status,
            headers: vec![("Content-Type", JSON_CONTENT_TYPE.into())],
            body: body.to_string(),
        }
    }

    /// The contract's 429: quota headers, Retry-After and the JSON body.
    pub fn rate_limited(headers: &RateLimitHeaders) -> Reply {
        let mut h = headers.pairs();
        h.push(("Content-Type", JSON_CONTENT_TYPE.into()));
        Reply {
            status: DENIED_STATUS,
            headers: h,
            body: DENIED_BODY.into(),
        }
    }

    /// 503: the limiter cannot decide (`why` is the hint); retry in a second.
    pub fn unavailable(why: &str) -> Reply {
        Reply::json(503, "Rate limiter unavailable", Some(why)).with_header("Retry-After", "1")
    }

    /// A 200 with a body of `content_type` that no cache keeps (the health and
    /// metrics answers).
    pub fn uncached(content_type: &str, body: String) -> Reply {
        Reply {
            status: 200,
            headers: vec![
                ("Content-Type", content_type.to_string()),
                ("Cache-Control", "no-store".to_string()),
            ],
            body,
        }
    }

    /// The same answer with one more header.
    pub fn with_header(self, name: &'static str, value: impl Into<String>) -> Reply {
        self.with_headers([(name, value.into())])
    }

    /// The same answer with more headers.
    pub fn with_headers(mut self, more: impl IntoIterator<Item = (&'static str, String)>) -> Reply {
        self.headers.extend(more);
        self
    }

    /// The value of a header the pipeline set.
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
}

fn find<'a>(headers: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_keep_the_body_and_add_headers() {
        let r = Reply::unavailable("store down").with_header(DEGRADED_HEADER, "fail-closed");
        assert_eq!(r.status, 503);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.header("x-ratelimit-degraded"), Some("fail-closed"));
        assert_eq!(
            r.headers[0],
            ("Content-Type", "application/json".to_string())
        );
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["hint"], "store down");
        let a = Admit::caller(
            &KeyRecord::new("k", "", "free", 0),
            Some("r"),
            vec![],
            vec![],
        )
        .with_header("A", "b");
        assert_eq!(a.key_id.as_deref(), Some("k"));
        assert_eq!(a.header("a"), Some("b"));
        assert_eq!((a.identity, a.key_meta), (None, None));
    }

    #[test]
    fn an_admitted_caller_carries_its_identity_and_metadata_as_forwarded() {
        let mut record = KeyRecord::new("k", "", "free", 0);
        record.identity = Some("cus_42".into());
        record.metadata = serde_json::json!({"tier": "gold", "n": 1})
            .as_object()
            .cloned();
        let a = Admit::caller(&record, None, vec![], vec![]);
        assert_eq!(a.identity.as_deref(), Some("cus_42"));
        assert_eq!(a.key_meta.as_deref(), Some(r#"{"n":1,"tier":"gold"}"#));
    }

    #[test]
    fn an_uncached_answer_says_so() {
        let r = Reply::uncached("application/json", "{}".into());
        assert_eq!(r.status, 200);
        assert_eq!(r.header("cache-control"), Some("no-store"));
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
}
