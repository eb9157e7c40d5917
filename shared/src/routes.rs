//! Routes: the configured path patterns endpoint limits apply to, and the path
//! normalization that keeps clients from dodging them.
//!
//! A request path is matched in its most-decoded, most-collapsed form, so that
//! every spelling an upstream might treat as `/v1/search` counts as `/v1/search`:
//! percent-decoding (repeated, `%2F` included), `\` as `/`, `;params` dropped,
//! empty segments dropped (duplicate and trailing slashes), `.` and `..` resolved,
//! ASCII letters lowercased. The normalized form is only for matching; the request
//! is forwarded as it came. A path that matches no route maps to no route (the
//! key's default buckets): arbitrary paths never mint new bucket keys.

use crate::policy::{PolicyError, validate_name};

/// Longest request path considered (longer ones are rejected by the hosts: 414).
pub const MAX_PATH_LEN: usize = 8 * 1024;
/// Longest route pattern.
pub const MAX_PATTERN_LEN: usize = 256;
/// Most segments of a pattern.
pub const MAX_PATTERN_SEGMENTS: usize = 32;

/// Normalizes a request path (without its query) into lowercase segments.
pub fn normalize(path: &str) -> Vec<String> {
    let mut bytes = path.as_bytes().to_vec();
    // decode until stable (double encoding), a bounded number of times
    for _ in 0..3 {
        if !bytes.contains(&b'%') {
            break;
        }
        let decoded = percent_decode(&bytes);
        if decoded == bytes {
            break;
        }
        bytes = decoded;
    }
    let text = String::from_utf8_lossy(&bytes).replace('\\', "/");
    let mut out: Vec<String> = Vec::new();
    for raw in text.split('/') {
        let segment = raw.split(';').next().unwrap_or("");
        match segment {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s.to_ascii_lowercase()),
        }
    }
    out
}

/// Decodes `%XX` escapes once; malformed escapes stay as they are.
pub fn percent_decode(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    while i < b.len() {
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(h * 16 + l);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `:name`: exactly one segment.
    Param,
    /// `*` (last only): zero or more segments.
    Rest,
}

/// A route pattern: `/v1/search`, `/v1/users/:id`, `/v1/export/*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    segments: Vec<Segment>,
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let e = |m: String| Err(PolicyError::new("pattern", m));
        if text.len() > MAX_PATTERN_LEN {
            return e(format!("must be at most {MAX_PATTERN_LEN} characters"));
        }
        let Some(rest) = text.strip_prefix('/') else {
            return e(format!("must start with '/', got {text:?}"));
        };
        let parts: Vec<&str> = if rest.is_empty() {
            vec![]
        } else {
            rest.split('/').collect()
        };
        if parts.len() > MAX_PATTERN_SEGMENTS {
            return e(format!("must have at most {MAX_PATTERN_SEGMENTS} segments"));
        }
        let mut segments = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            let seg = if *p == "*" {
                if i + 1 != parts.len() {
                    return e("'*' may only be the last segment".into());
                }
                Segment::Rest
            } else if let Some(name) = p.strip_prefix(':') {
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    return e(format!(
                        "parameter {p:?} needs a name of letters, digits and '_'"
                    ));
                }
                Segment::Param
            } else if !p.is_empty()
                && *p != "."
                && *p != ".."
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._~".contains(&b))
            {
                Segment::Literal(p.to_string())
            } else {
                return e(format!(
                    "segment {p:?} must be lowercase letters, digits, '-', '.', '_', '~', a :param or a final *"
                ));
            };
            segments.push(seg);
        }
        Ok(Self {
            text: text.to_string(),
            segments,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn matches(&self, path: &[String]) -> bool {
        let mut i = 0;
        for seg in &self.segments {
            match seg {
                Segment::Rest => return true,
                Segment::Param if i < path.len() => i += 1,
                Segment::Literal(l) if path.get(i) == Some(l) => i += 1,
                _ => return false,
            }
        }
        i == path.len()
    }

    /// Sort key: literal beats parameter beats rest, segment by segment; then longer first.
    fn specificity(&self) -> (Vec<u8>, usize) {
        let ranks = self
            .segments
            .iter()
            .map(|s| match s {
                Segment::Literal(_) => 2,
                Segment::Param => 1,
                Segment::Rest => 0,
            })
            .collect();
        (ranks, self.segments.len())
    }
}

/// A named route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub name: String,
    pub pattern: Pattern,
}

/// Routes, most specific first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    /// Builds a table; names must be valid and unique, patterns valid and distinct.
    pub fn new(routes: Vec<(String, String)>) -> Result<Self, PolicyError> {
        let mut out: Vec<Route> = Vec::with_capacity(routes.len());
        for (i, (name, pattern)) in routes.into_iter().enumerate() {
            let at =
                |e: PolicyError| PolicyError::new(format!("routes[{i}].{}", e.field), e.message);
            validate_name("name", &name).map_err(at)?;
            let pattern = Pattern::parse(&pattern).map_err(at)?;
            if out.iter().any(|r| r.name == name) {
                return Err(at(PolicyError::new(
                    "name",
                    format!("{name:?} is used twice"),
                )));
            }
            if out.iter().any(|r| r.pattern.segments == pattern.segments) {
                return Err(at(PolicyError::new(
                    "pattern",
                    format!("{} is the same as another route's", pattern.text),
                )));
            }
            out.push(Route { name, pattern });
        }
        out.sort_by_key(|r| std::cmp::Reverse(r.pattern.specificity()));
        Ok(Self { routes: out })
    }

    /// The most specific route matching `path` (a raw request path, no query).
    pub fn resolve(&self, path: &str) -> Option<&Route> {
        if self.routes.is_empty() {
            // nothing to match: no need to normalize (a request's cost)
            return None;
        }
        let segments = normalize(path);
        self.routes.iter().find(|r| r.pattern.matches(&segments))
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table() -> RouteTable {
        RouteTable::new(vec![
            ("search".into(), "/v1/search".into()),
            ("checkout".into(), "/v1/checkout".into()),
            ("user".into(), "/v1/users/:id".into()),
            ("user-me".into(), "/v1/users/me".into()),
            ("export".into(), "/v1/export/*".into()),
        ])
        .unwrap()
    }

    fn route(path: &str) -> Option<String> {
        table().resolve(path).map(|r| r.name.clone())
    }

    #[test]
    fn paths_resolve_to_the_most_specific_route() {
        assert_eq!(route("/v1/search").as_deref(), Some("search"));
        assert_eq!(route("/v1/users/42").as_deref(), Some("user"));
        assert_eq!(route("/v1/users/me").as_deref(), Some("user-me"));
        assert_eq!(route("/v1/users/42/orders"), None);
        assert_eq!(route("/v1/export").as_deref(), Some("export"));
        assert_eq!(route("/v1/export/a/b/c").as_deref(), Some("export"));
        assert_eq!(route("/v1/searches"), None);
        assert_eq!(route("/"), None);
        assert_eq!(route(""), None);
    }

    /// Every spelling of /v1/search counts as /v1/search.
    #[test]
    fn spellings_cannot_dodge_a_route() {
        for p in [
            "/v1/search/",
            "//v1//search//",
            "/V1/SEARCH",
            "/v1/Search",
            "/v1/%73earch",
            "/v1%2Fsearch",
            "/v1%2fsearch",
            "/v1%252Fsearch",
            "/v1/./search",
            "/v1/x/../search",
            "/x/../v1/search",
            "/../v1/search",
            "\\v1\\search",
            "/v1/search;jsessionid=1",
            "/v1;x/search",
            "/%76%31/%73%65%61%72%63%68",
        ] {
            assert_eq!(route(p).as_deref(), Some("search"), "{p}");
        }
    }

    #[test]
    fn bad_patterns_are_rejected_naming_the_route() {
        for (pattern, bad) in [
            ("v1/search", "start with '/'"),
            ("/v1/*/x", "last segment"),
            ("/v1/Search", "lowercase"),
            ("/v1/:", "name"),
            ("/v1//x", "must be"),
            ("/v1/..", "must be"),
            ("/v1/a b", "must be"),
            ("/v1/<script>", "must be"),
        ] {
            let e = RouteTable::new(vec![("r".into(), pattern.into())]).unwrap_err();
            assert_eq!(e.field, "routes[0].pattern", "{pattern}");
            assert!(e.message.contains(bad), "{pattern}: {e}");
        }
        let long = format!("/{}", "a".repeat(MAX_PATTERN_LEN));
        assert!(RouteTable::new(vec![("r".into(), long)]).is_err());
        let many = "/a".repeat(MAX_PATTERN_SEGMENTS + 1);
        assert!(RouteTable::new(vec![("r".into(), many)]).is_err());
        let dup = RouteTable::new(vec![("a".into(), "/x".into()), ("a".into(), "/y".into())])
            .unwrap_err();
        assert_eq!(dup.field, "routes[1].name");
        let same = RouteTable::new(vec![
            ("a".into(), "/x/:id".into()),
            ("b".into(), "/x/:other".into()),
        ])
        .unwrap_err();
        assert_eq!(same.field, "routes[1].pattern");
        let name = RouteTable::new(vec![("Bad Name".into(), "/x".into())]).unwrap_err();
        assert_eq!(name.field, "routes[0].name");
    }

    fn spelling() -> impl Strategy<Value = String> {
        // /v1/search with random harmless variations per separator and letter
        let sep = prop::sample::select(vec![
            "/", "//", "/./", "/x/../", "%2F", "%2f", "\\", "/;p=1/",
        ]);
        let letters: Vec<char> = "search".chars().collect();
        (
            sep.clone(),
            sep,
            prop::collection::vec((any::<bool>(), any::<bool>()), 6),
            prop::sample::select(vec!["", "/", "//", ";a"]),
        )
            .prop_map(move |(s1, s2, flips, tail)| {
                let word: String = letters
                    .iter()
                    .zip(flips)
                    .map(|(c, (upper, encode))| match (upper, encode) {
                        (_, true) => format!("%{:02X}", *c as u8),
                        (true, false) => c.to_ascii_uppercase().to_string(),
                        (false, false) => c.to_string(),
                    })
                    .collect();
                let s1 = if s1 == "%2F" || s1 == "%2f" || s1 == "/;p=1/" {
                    "/"
                } else {
                    s1
                };
                format!("{s1}v1{s2}{word}{tail}")
            })
    }

    proptest! {
        #[test]
        fn random_spellings_of_a_route_all_match_it(p in spelling()) {
            let got = route(&p);
            prop_assert_eq!(got.as_deref(), Some("search"), "{}", p);
        }

        #[test]
        fn normalization_is_idempotent(p in "[ -~]{0,64}") {
            let once = normalize(&p);
            let again = normalize(&format!("/{}", once.join("/")));
            prop_assert_eq!(once, again);
        }

        #[test]
        fn arbitrary_paths_never_panic_and_stay_bounded(p in any::<String>()) {
            let segs = normalize(&p);
            prop_assert!(segs.iter().map(|s| s.len() + 1).sum::<usize>() <= p.len() * 3 + 1);
            let _ = table().resolve(&p);
        }
    }
}
