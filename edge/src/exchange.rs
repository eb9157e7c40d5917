//! One exchange between a client and the upstream through the edge, written once
//! for both hosts: what the edge answers itself (its health, a request head over
//! the limits, the pipeline's refusals), what the upstream is sent (the client's
//! headers as [`ProxyRules`] filter them, the caller's identity, the request id,
//! `X-Forwarded-For`), and what the client gets back (the upstream's headers
//! filtered, the quota headers added). Each host only converts its own request
//! and response types ([`HeaderList`]: hyper's `HeaderMap`, workerd's `Headers`)
//! and does the I/O: bodies, timeouts, `wait_until` or spawning.

use std::borrow::Cow;
use std::net::IpAddr;

use floodgate_shared::time::Clock;

use crate::pipeline::{Admit, Pipeline, Reply, RequestHead, Task};
use crate::proxy::{
    HEALTH_PATH, HeadSize, ProxyRules, REQUEST_ID_HEADER, connection_named, request_id,
};
use crate::store::{MaybeSend, MaybeSync, Store};

/// A host's header list, as the exchange reads and writes it.
pub trait HeaderList: Sized {
    /// Calls `f` with each header's name (lower case) and value, in order.
    fn each(&self, f: &mut dyn FnMut(&str, &[u8]));
    /// The first value of header `name` (lower case).
    fn first(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    /// An empty list with room for `n` headers.
    fn with_capacity(n: usize) -> Self;
    /// Appends each header of `from` whose name `keep` accepts, in order.
    fn copy_from(&mut self, from: &Self, keep: &mut dyn FnMut(&str) -> bool);
    /// Drops each header whose name `keep` refuses.
    fn retain(&mut self, keep: &mut dyn FnMut(&str) -> bool);
    /// Sets header `name` to `value`, replacing any it had.
    fn set(&mut self, name: &str, value: &str);
    /// [`HeaderList::set`] with a value the list may keep as it is (no copy).
    fn set_owned(&mut self, name: &str, value: String) {
        self.set(name, &value);
    }

    /// The values of header `name` that are text.
    fn texts(&self, name: &str) -> Vec<String> {
        let mut out = vec![];
        self.each(&mut |k, v| {
            if k.eq_ignore_ascii_case(name)
                && let Ok(v) = std::str::from_utf8(v)
            {
                out.push(v.to_string());
            }
        });
        out
    }

    /// The number of headers and their bytes (names and values).
    fn size(&self) -> (usize, usize) {
        let (mut count, mut bytes) = (0, 0);
        self.each(&mut |k, v| {
            count += 1;
            bytes += k.len() + v.len();
        });
        (count, bytes)
    }
}

/// A request as the exchange sees it.
pub struct Incoming<'r, H> {
    /// The request's own path (without the query), and its query's length.
    pub own_path: &'r str,
    pub query_len: usize,
    pub headers: &'r H,
    /// The address the request came from (the peer, or Cloudflare's
    /// `CF-Connecting-IP`).
    pub client_ip: Option<IpAddr>,
    /// The client's country, when the host knows it.
    pub country: Option<&'r str>,
    /// What the limits apply to: the request itself ([`Subject::of`]), or in
    /// forward-auth mode the original request a gateway describes — or the answer
    /// to an auth request that describes none.
    pub subject: Result<Subject<'r>, Reply>,
}

/// The request the limits apply to: its path and its client's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject<'r> {
    pub path: &'r str,
    pub client_ip: Option<IpAddr>,
}

impl<'r> Subject<'r> {
    /// The request itself.
    pub fn of(path: &'r str, client_ip: Option<IpAddr>) -> Result<Self, Reply> {
        Ok(Self { path, client_ip })
    }
}

/// The edge between a host and the pipeline: the pipeline, the proxy's rules,
/// and whether the limiter is on.
pub struct Exchange<'e, S, C> {
    pub pipeline: &'e Pipeline<S, C>,
    pub rules: &'e ProxyRules,
    /// `false`: proxy without limiting (the benchmark's baseline).
    pub limiter: bool,
}

impl<S, C> Exchange<'_, S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// What happens to `req` before the upstream sees anything: the edge's own
    /// answer (health, a head over the limits, the pipeline's refusal), or the
    /// admission to forward. The pipeline's background work goes to `later`.
    pub async fn decide<H: HeaderList>(
        &self,
        req: &Incoming<'_, H>,
        later: &mut Vec<Task>,
    ) -> Result<Admit, Reply> {
        if req.own_path == HEALTH_PATH {
            let health = self.pipeline.health().to_json();
            return Err(Reply::uncached("application/json", health));
        }
        self.rules
            .check_head(&head_size(req))
            .map_err(|r| r.answer())?;
        if !self.limiter {
            return Ok(Admit::anonymous(None, vec![]));
        }
        let subject = req.subject.clone()?;
        let credentials = req.headers.first(&self.rules.key_header);
        let user_agent = req.headers.first("user-agent");
        let head = RequestHead {
            path: subject.path,
            credentials: credentials.as_deref(),
            client_ip: subject.client_ip,
            country: req.country,
            user_agent: user_agent.as_deref(),
        };
        let decided = self.pipeline.gate(head).await;
        later.extend(decided.background);
        decided.gate
    }

    /// The upstream request's headers, made from the client's in place
    /// ([`upstream_headers_in_place`]).
    pub fn upstream_headers_in_place<H: HeaderList>(
        &self,
        headers: &mut H,
        client_ip: Option<IpAddr>,
        admit: &Admit,
        request_id: &str,
    ) {
        upstream_headers_in_place(self.rules, headers, client_ip, admit, request_id);
    }

    /// The client's response headers ([`response_headers`]).
    pub fn response_headers<H: HeaderList>(&self, headers: &mut H, admit: &mut Admit) {
        response_headers(self.rules, headers, admit);
    }

    /// The release of the admitted request's in-flight slots, to run once its
    /// response is over (or the client or the upstream went away).
    pub fn release(&self, admit: &mut Admit) -> Option<Task> {
        self.pipeline
            .release_later(std::mem::take(&mut admit.slots))
    }
}

/// The request's id: the client's when well-formed, else a new one from `fresh`
/// ([`crate::proxy::request_id`]).
pub fn client_request_id<H: HeaderList>(headers: &H, fresh: impl FnOnce() -> u128) -> String {
    let client = headers.first(REQUEST_ID_HEADER);
    let client = client.as_deref().and_then(|v| std::str::from_utf8(v).ok());
    request_id(client, fresh)
}

/// The upstream request's headers: the client's, filtered by the rules, with the
/// caller's key id (and its identity and metadata, when the key has them), the
/// request id and `X-Forwarded-For` the edge sets.
pub fn upstream_headers<H: HeaderList>(
    rules: &ProxyRules,
    req: &Incoming<'_, H>,
    admit: &Admit,
    request_id: &str,
) -> H {
    let from = req.headers;
    let named = connection_named(from.texts("connection").iter().map(String::as_str));
    let mut out = H::with_capacity(from.size().0 + 3);
    out.copy_from(from, &mut |name| {
        rules.forwards_request_header(name, &named)
    });
    let forwarded = from.texts("x-forwarded-for");
    edge_set(
        rules,
        &mut out,
        &forwarded,
        req.client_ip,
        admit,
        request_id,
    );
    out
}

/// [`upstream_headers`], made of the client's own list (a host whose request's
/// headers are its to change: no second list is built).
pub fn upstream_headers_in_place<H: HeaderList>(
    rules: &ProxyRules,
    headers: &mut H,
    client_ip: Option<IpAddr>,
    admit: &Admit,
    request_id: &str,
) {
    let named = connection_named(headers.texts("connection").iter().map(String::as_str));
    let forwarded = headers.texts("x-forwarded-for");
    headers.retain(&mut |name| rules.forwards_request_header(name, &named));
    edge_set(rules, headers, &forwarded, client_ip, admit, request_id);
}

/// What the edge sets on an upstream request: the caller's key id, identity and
/// metadata, the request id, `X-Forwarded-For` (the client's, `forwarded`, with
/// the client's address).
fn edge_set<H: HeaderList>(
    rules: &ProxyRules,
    out: &mut H,
    forwarded: &[String],
    client_ip: Option<IpAddr>,
    admit: &Admit,
    request_id: &str,
) {
    if let Some(id) = &admit.key_id {
        out.set(&rules.identity_header, id);
    }
    if let Some(identity) = &admit.identity {
        out.set(&rules.key_identity_header, identity);
    }
    if let Some(meta) = &admit.key_meta {
        out.set(&rules.key_meta_header, meta);
    }
    out.set(REQUEST_ID_HEADER, request_id);
    if let Some(v) = rules.forwarded_for(forwarded.first().map(String::as_str), client_ip) {
        out.set("x-forwarded-for", &v);
    }
}

/// The client's response headers from the upstream's: hop-by-hop ones (and those
/// its `Connection` names) dropped, the admission's headers (the quota headers)
/// moved onto them.
pub fn response_headers<H: HeaderList>(rules: &ProxyRules, headers: &mut H, admit: &mut Admit) {
    let named = connection_named(headers.texts("connection").iter().map(String::as_str));
    headers.retain(&mut |name| rules.forwards_response_header(name, &named));
    for (k, v) in admit.headers.drain(..) {
        headers.set_owned(k, v);
    }
}

/// The sizes of a request head, as the rules limit them.
fn head_size<H: HeaderList>(req: &Incoming<'_, H>) -> HeadSize {
    let (header_count, header_bytes) = req.headers.size();
    HeadSize {
        path: req.own_path.len(),
        query: req.query_len,
        header_count,
        header_bytes,
        content_length: req
            .headers
            .first("content-length")
            .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok()),
    }
}

/// A plain header list (tests, and hosts that build one).
impl HeaderList for Vec<(String, Vec<u8>)> {
    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (k, v) in self {
            f(k, v);
        }
    }

    fn first(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| Cow::Borrowed(v.as_slice()))
    }

    fn with_capacity(n: usize) -> Self {
        Vec::with_capacity(n)
    }

    fn copy_from(&mut self, from: &Self, keep: &mut dyn FnMut(&str) -> bool) {
        self.extend(from.iter().filter(|(k, _)| keep(k)).cloned());
    }

    fn retain(&mut self, keep: &mut dyn FnMut(&str) -> bool) {
        Vec::retain(self, |(k, _)| keep(k));
    }

    fn set(&mut self, name: &str, value: &str) {
        Vec::retain(self, |(k, _)| !k.eq_ignore_ascii_case(name));
        self.push((name.to_ascii_lowercase(), value.as_bytes().to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_shared::apikeys::KeyRecord;

    type List = Vec<(String, Vec<u8>)>;

    fn list(pairs: &[(&str, &str)]) -> List {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn exchange_rules() -> ProxyRules {
        ProxyRules::new("http://127.0.0.1:9")
    }

    /// A request to `/v1` from `ip` with `headers`.
    fn request(headers: &List, ip: Option<IpAddr>) -> Incoming<'_, List> {
        Incoming {
            own_path: "/v1",
            query_len: 0,
            headers,
            client_ip: ip,
            country: None,
            subject: Subject::of("/v1", ip),
        }
    }

    #[test]
    fn the_upstream_gets_the_filtered_headers_and_those_the_edge_sets() {
        let rules = exchange_rules();
        let from = list(&[
            ("authorization", "Bearer fg_x"),
            ("x-floodgate-key-id", "forged"),
            ("X_Floodgate_Key_Id", "forged too"),
            ("x-floodgate-identity", "forged"),
            ("X_FLOODGATE_KEY_META", "{}"),
            ("connection", "keep-alive, x-drop"),
            ("x-drop", "1"),
            ("accept", "*/*"),
            ("x-forwarded-for", "10.0.0.1"),
        ]);
        let ip = Some("127.0.0.9".parse().unwrap());
        let req = request(&from, ip);
        let admit = Admit::caller(&KeyRecord::new("k1", "", "free", 0), None, vec![], vec![]);
        let out: List = upstream_headers(&rules, &req, &admit, "rid");
        let get = |n: &str| out.first(n).map(|v| String::from_utf8(v.to_vec()).unwrap());
        assert_eq!(get("accept").as_deref(), Some("*/*"));
        assert_eq!(get("authorization"), None, "the key is not forwarded");
        assert_eq!(get("x-drop"), None, "named by Connection");
        assert_eq!(get("connection"), None);
        assert_eq!(get("x-floodgate-key-id").as_deref(), Some("k1"));
        let identities = out
            .iter()
            .filter(|(k, _)| k.to_ascii_lowercase().replace('_', "-") == "x-floodgate-key-id");
        assert_eq!(
            identities.count(),
            1,
            "every spelling the client sent is dropped"
        );
        assert_eq!(get("x-request-id").as_deref(), Some("rid"));
        assert_eq!(
            get("x-forwarded-for").as_deref(),
            Some("10.0.0.1, 127.0.0.9")
        );
        let spelled = |name: &str| {
            out.iter()
                .filter(|(k, _)| k.to_ascii_lowercase().replace('_', "-") == name)
                .count()
        };
        assert_eq!(
            (
                spelled("x-floodgate-identity"),
                spelled("x-floodgate-key-meta")
            ),
            (0, 0),
            "a key without identity or metadata: none, and no client copy"
        );
        let mut record = KeyRecord::new("k1", "", "free", 0);
        record.identity = Some("cus_7".into());
        record.metadata = serde_json::json!({"tier": "gold"}).as_object().cloned();
        let admit = Admit::caller(&record, None, vec![], vec![]);
        let out: List = upstream_headers(&rules, &req, &admit, "rid");
        let all = |name: &str| -> Vec<String> {
            out.iter()
                .filter(|(k, _)| k.to_ascii_lowercase().replace('_', "-") == name)
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
                .collect()
        };
        assert_eq!(all("x-floodgate-identity"), ["cus_7"]);
        assert_eq!(all("x-floodgate-key-meta"), [r#"{"tier":"gold"}"#]);
    }

    #[test]
    fn headers_made_in_place_are_the_copys() {
        let rules = exchange_rules();
        let from = list(&[
            ("authorization", "Bearer fg_x"),
            ("X_Floodgate_Key_Id", "forged"),
            ("connection", "keep-alive, x-drop"),
            ("x-drop", "1"),
            ("accept", "*/*"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2"),
            ("accept", "text/plain"),
        ]);
        let ip = Some("127.0.0.9".parse().unwrap());
        let req = request(&from, ip);
        let mut record = KeyRecord::new("k1", "", "free", 0);
        record.identity = Some("cus_7".into());
        let admit = Admit::caller(&record, None, vec![], vec![]);
        let copied: List = upstream_headers(&rules, &req, &admit, "rid");
        let mut in_place = from.clone();
        upstream_headers_in_place(&rules, &mut in_place, ip, &admit, "rid");
        assert_eq!(in_place, copied);
        assert_eq!(
            in_place.first("x-forwarded-for").as_deref(),
            Some(&b"10.0.0.1, 127.0.0.9"[..])
        );
    }

    #[test]
    fn a_request_id_is_kept_when_well_formed() {
        let h = list(&[("x-request-id", "abc-1")]);
        assert_eq!(client_request_id(&h, || 7), "abc-1");
        let bad = list(&[("x-request-id", "a b")]);
        assert_eq!(client_request_id(&bad, || 7), format!("{:032x}", 7));
    }

    #[test]
    fn the_client_gets_the_upstreams_headers_filtered_and_the_quota_headers() {
        let rules = exchange_rules();
        let mut h = list(&[
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("content-type", "text/plain"),
            ("x-ratelimit-limit", "forged"),
        ]);
        let record = KeyRecord::new("k", "", "free", 0);
        let mut admit = Admit::caller(
            &record,
            None,
            vec![("X-RateLimit-Limit", "10".into())],
            vec![],
        );
        response_headers(&rules, &mut h, &mut admit);
        let names: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["content-type", "x-ratelimit-limit"]);
        assert_eq!(h.first("x-ratelimit-limit").as_deref(), Some(&b"10"[..]));
    }

    #[test]
    fn head_sizes_count_every_header() {
        let h = list(&[("content-length", " 12 "), ("a", "bc")]);
        let req = Incoming {
            own_path: "/p",
            query_len: 3,
            headers: &h,
            client_ip: None,
            country: None,
            subject: Subject::of("/p", None),
        };
        let s = head_size(&req);
        assert_eq!((s.path, s.query, s.header_count), (2, 3, 2));
        assert_eq!(s.header_bytes, "content-length".len() + 4 + 3);
        assert_eq!(s.content_length, Some(12));
    }
}
