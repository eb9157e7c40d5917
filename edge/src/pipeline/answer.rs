//! What the pipeline tells a host to do with a request, and the answers it builds.

use floodgate_shared::contract::{DENIED_BODY, DENIED_STATUS, JSON_CONTENT_TYPE, RateLimitHeaders};

/// Marks every answer given without Redis: `fail-open`, `fail-closed` or
/// `local-fallback` (see `docs/failure.md`).
pub const DEGRADED_HEADER: &str = "X-RateLimit-Degraded";

/// What the host does with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Answer now; the upstream never sees the request.
    Respond {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// Forward upstream, identifying the caller by `key_id` (`None`: a caller the
    /// edge could not verify while the store was down, forwarded by a fail-open
    /// policy without an identity), and add `headers` to the upstream's response.
    Forward {
        key_id: Option<String>,
        route: Option<String>,
        headers: Vec<(&'static str, String)>,
        /// In-flight slots taken for this request (policies with `max_in_flight`).
        /// The host releases them with [`super::Pipeline::release`] when the
        /// response is complete, the client goes away or the upstream times out;
        /// slots never released expire after
        /// [`super::PipelineConfig::in_flight_ttl`].
        slots: Vec<Slot>,
    },
}

/// One in-flight slot: its set and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub key: String,
    pub id: String,
}

impl Gate {
    /// An answer with a JSON body `{"error": ..., "hint": ...}`.
    pub fn json(status: u16, error: &str, hint: Option<&str>) -> Gate {
        let body = match hint {
            Some(h) => serde_json::json!({ "error": error, "hint": h }),
            None => serde_json::json!({ "error": error }),
        };
        Gate::Respond {
            status,
            headers: vec![("Content-Type", JSON_CONTENT_TYPE.into())],
            body: body.to_string(),
        }
    }

    /// The contract's 429: quota headers, Retry-After and the JSON body.
    pub fn rate_limited(headers: &RateLimitHeaders) -> Gate {
        let mut h = headers.pairs();
        h.push(("Content-Type", JSON_CONTENT_TYPE.into()));
        Gate::Respond {
            status: DENIED_STATUS,
            headers: h,
            body: DENIED_BODY.into(),
        }
    }

    /// 503: the limiter cannot decide (`why` is the hint); retry in a second.
    pub fn unavailable(why: &str) -> Gate {
        Gate::json(503, "Rate limiter unavailable", Some(why)).with_header("Retry-After", "1")
    }

    /// Forwards an identified caller.
    pub fn forward(
        key_id: &str,
        route: Option<&str>,
        headers: Vec<(&'static str, String)>,
        slots: Vec<Slot>,
    ) -> Gate {
        Gate::Forward {
            key_id: Some(key_id.to_string()),
            route: route.map(str::to_string),
            headers,
            slots,
        }
    }

    /// The same answer with one more header.
    pub fn with_header(self, name: &'static str, value: impl Into<String>) -> Gate {
        self.with_headers([(name, value.into())])
    }

    /// The same answer with more headers.
    pub fn with_headers(mut self, more: impl IntoIterator<Item = (&'static str, String)>) -> Gate {
        match &mut self {
            Gate::Respond { headers, .. } | Gate::Forward { headers, .. } => headers.extend(more),
        }
        self
    }

    /// The status a client sees from the edge itself (`None`: forwarded).
    pub fn status(&self) -> Option<u16> {
        match self {
            Gate::Respond { status, .. } => Some(*status),
            Gate::Forward { .. } => None,
        }
    }

    /// The value of a header the pipeline set.
    pub fn header(&self, name: &str) -> Option<&str> {
        match self {
            Gate::Respond { headers, .. } | Gate::Forward { headers, .. } => headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_keep_the_body_and_add_headers() {
        let g = Gate::unavailable("store down").with_header(DEGRADED_HEADER, "fail-closed");
        let Gate::Respond {
            status,
            headers,
            body,
        } = &g
        else {
            panic!("{g:?}")
        };
        assert_eq!(*status, 503);
        assert_eq!(g.header("retry-after"), Some("1"));
        assert_eq!(g.header("x-ratelimit-degraded"), Some("fail-closed"));
        assert_eq!(headers[0], ("Content-Type", "application/json".to_string()));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["hint"], "store down");
        let f = Gate::forward("k", Some("r"), vec![], vec![]).with_header("A", "b");
        assert_eq!(f.status(), None);
        assert_eq!(f.header("a"), Some("b"));
    }
}
