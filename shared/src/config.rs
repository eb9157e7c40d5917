//! The edge's configuration: policies, the plans that attach them to API keys, the
//! routes that attach endpoint limits, and the per-IP limits. One JSON document,
//! validated as a whole (every error names its field), stored in Redis under
//! [`CONFIG_KEY`] and cached by the edge.
//!
//! ```json
//! {"policies": [
//!    {"name":"default","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed"},
//!    {"name":"search","dimensions":["api_key","endpoint"],"quota":{"capacity":100,"period":"1m"},"failure_mode":"fail_closed"},
//!    {"name":"checkout","dimensions":["api_key","endpoint"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_closed"}],
//!  "plans": {"free": ["default"]},
//!  "routes": [{"name":"search","pattern":"/v1/search","policies":["search"]},
//!             {"name":"checkout","pattern":"/v1/checkout","policies":["checkout"]}],
//!  "ip_policies": []}
//! ```
//!
//! For a request by a key on plan P that matched route R from IP A, the buckets
//! checked are: P's policies (per key), R's policies (per key and route) and the IP
//! policies (per IP) — all in one atomic call.
//!
//! The per-key policies come from the first of: the key's override
//! (`key_overrides`), its identity's override's policies (`identity_overrides`),
//! its identity's override's plan, the key's own plan ([`EdgeConfig::applicable`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::deny::{Deny, DenySpec};
use crate::keys::{KeyError, Subject, identity_bucket_key};
use crate::policy::{Dimension, Policy, PolicyError, PolicySpec, validate_name};
use crate::routes::{Route, RouteTable};
use crate::script::MAX_CHECKS;

mod edit;
pub use edit::{ConfigEdit, Edited};

/// Where the configuration lives in Redis.
pub const CONFIG_KEY: &str = "fg:config";
/// The largest configuration document accepted.
pub const MAX_CONFIG_JSON: usize = 256 * 1024;
pub const MAX_POLICIES: usize = 64;
pub const MAX_ROUTES: usize = 256;
pub const MAX_PLANS: usize = 64;
pub const MAX_KEY_OVERRIDES: usize = 4096;
pub const MAX_IDENTITY_OVERRIDES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub name: String,
    pub pattern: String,
    pub policies: Vec<String>,
}

/// The operator-facing configuration (`Default`: empty, which does not validate).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigSpec {
    pub policies: Vec<PolicySpec>,
    pub plans: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    #[serde(default)]
    pub ip_policies: Vec<String>,
    /// Per API key overrides: key id → the per-key policies that replace its plan's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub key_overrides: BTreeMap<String, Vec<String>>,
    /// Per identity overrides: identity → the plan and/or the per-key policies
    /// that replace the plans of the identity's keys (a key's own override wins).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub identity_overrides: BTreeMap<String, IdentityOverride>,
    /// Response header options.
    #[serde(default, skip_serializing_if = "HeaderSpec::is_default")]
    pub headers: HeaderSpec,
    /// How many regions decide bounded policies from regional pools (0: none, the
    /// default). Each such region may admit the first requests of a key it holds no
    /// tokens for on credit, up to `max_overshoot / (2 × regions)` per key; the
    /// global store leases out the rest of the bound (see docs/consistency.md).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub regions: u32,
    /// Requests refused (403) before any limit: API key ids, addresses and
    /// ranges, countries, user-agent substrings ([`crate::deny`]).
    #[serde(default, skip_serializing_if = "DenySpec::is_empty")]
    pub deny: DenySpec,
}

/// What replaces the plans of one identity's keys: a `plan` of the configuration
/// in place of each key's own, and/or `policies` (per key or identity, as a key
/// override's) in place of the plan's. At least one is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<String>>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The most regions a configuration may name.
pub const MAX_REGIONS: u32 = 64;

/// Response header options (the `X-RateLimit-*` contract is always sent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderSpec {
    /// Also send the IETF `RateLimit-Policy` and `RateLimit` fields
    /// (draft-ietf-httpapi-ratelimit-headers-11), describing every matching policy.
    #[serde(default)]
    pub ietf: bool,
    /// Adds 0..=N seconds to `Retry-After` (spreads retries; never earlier). 0-60.
    #[serde(default)]
    pub retry_jitter_secs: u32,
}

impl HeaderSpec {
    fn is_default(&self) -> bool {
        *self == HeaderSpec::default()
    }
}

/// Where a policy that applies to a request comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    Plan(String),
    KeyOverride,
    /// The key's identity's override (its `policies`; its `plan` is a `Plan`).
    IdentityOverride(String),
    Route(String),
    ClientIp,
}

/// A [`Source`], borrowed from the configuration.
#[derive(Debug, Clone, Copy)]
enum SourceRef<'a> {
    Plan(&'a str),
    KeyOverride,
    IdentityOverride(&'a str),
    Route(&'a str),
    ClientIp,
}

impl SourceRef<'_> {
    fn to_source(self) -> Source {
        match self {
            SourceRef::Plan(p) => Source::Plan(p.to_string()),
            SourceRef::KeyOverride => Source::KeyOverride,
            SourceRef::IdentityOverride(i) => Source::IdentityOverride(i.to_string()),
            SourceRef::Route(r) => Source::Route(r.to_string()),
            SourceRef::ClientIp => Source::ClientIp,
        }
    }
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeConfig {
    spec: ConfigSpec,
    policies: Vec<Policy>,
    plans: BTreeMap<String, Vec<usize>>,
    overrides: BTreeMap<String, Vec<usize>>,
    /// Identity → its override's policies, when it names some.
    identity_policies: BTreeMap<String, Vec<usize>>,
    routes: RouteTable,
    route_policies: BTreeMap<String, Vec<usize>>,
    ip_policies: Vec<usize>,
    deny: Deny,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> PolicyError {
    PolicyError::new(field, message)
}

/// Every policy of `spec`, validated, each name used once.
fn validate_policies(spec: &ConfigSpec) -> Result<Vec<Policy>, PolicyError> {
    if spec.policies.is_empty() || spec.policies.len() > MAX_POLICIES {
        return Err(err(
            "policies",
            format!("must hold 1 to {MAX_POLICIES} policies"),
        ));
    }
    let mut policies: Vec<Policy> = Vec::with_capacity(spec.policies.len());
    for (i, p) in spec.policies.iter().enumerate() {
        let policy = p
            .validate()
            .map_err(|e| err(format!("policies[{i}].{}", e.field), e.message))?;
        if policies.iter().any(|q| q.name() == policy.name()) {
            return Err(err(
                format!("policies[{i}].name"),
                format!("{:?} is used twice", policy.name()),
            ));
        }
        policies.push(policy);
    }
    Ok(policies)
}

/// The bounds on how many plans, regions, overrides and routes a configuration
/// holds, and on the jitter.
fn check_sizes(spec: &ConfigSpec) -> Result<(), PolicyError> {
    if spec.plans.is_empty() || spec.plans.len() > MAX_PLANS {
        return Err(err("plans", format!("must hold 1 to {MAX_PLANS} plans")));
    }
    if spec.regions > MAX_REGIONS {
        return Err(err(
            "regions",
            format!("must be between 0 and {MAX_REGIONS}, got {}", spec.regions),
        ));
    }
    if spec.headers.retry_jitter_secs > 60 {
        return Err(err(
            "headers.retry_jitter_secs",
            format!(
                "must be between 0 and 60, got {}",
                spec.headers.retry_jitter_secs
            ),
        ));
    }
    if spec.key_overrides.len() > MAX_KEY_OVERRIDES {
        return Err(err(
            "key_overrides",
            format!("must hold at most {MAX_KEY_OVERRIDES} keys"),
        ));
    }
    if spec.identity_overrides.len() > MAX_IDENTITY_OVERRIDES {
        return Err(err(
            "identity_overrides",
            format!("must hold at most {MAX_IDENTITY_OVERRIDES} identities"),
        ));
    }
    if spec.routes.len() > MAX_ROUTES {
        return Err(err(
            "routes",
            format!("must hold at most {MAX_ROUTES} routes"),
        ));
    }
    Ok(())
}

/// Policies by name, for the lists that name them.
struct Names<'p>(&'p [Policy]);

impl Names<'_> {
    /// The index of each policy `list` (at `field`) names, each fit for its use.
    fn all(
        &self,
        field: &str,
        list: &[String],
        fit: fn(&Policy) -> Result<(), String>,
    ) -> Result<Vec<usize>, PolicyError> {
        list.iter()
            .enumerate()
            .map(|(i, name)| {
                let field = format!("{field}[{i}]");
                let at = self
                    .0
                    .iter()
                    .position(|p| p.name() == name)
                    .ok_or_else(|| err(field.clone(), format!("no policy is named {name:?}")))?;
                fit(&self.0[at]).map_err(|m| err(field, m))?;
                Ok(at)
            })
            .collect()
    }
}

/// A plan's or a key override's policy: per API key (or its identity), not per
/// endpoint.
fn per_key(p: &Policy) -> Result<(), String> {
    let keyed = p.has(Dimension::ApiKey) || p.has(Dimension::Identity);
    if !keyed || p.has(Dimension::Endpoint) {
        Err(format!(
            "policy {:?} must be keyed by api_key or identity and not by endpoint (endpoint limits go on routes)",
            p.name()
        ))
    } else {
        Ok(())
    }
}

/// The policies of each identity override that names some (by index), each
/// override checked: a valid identity, a configured plan, at least one of the two,
/// a non-empty list of per-key policies.
fn identity_policies(
    spec: &ConfigSpec,
    names: &Names<'_>,
) -> Result<BTreeMap<String, Vec<usize>>, PolicyError> {
    let mut out = BTreeMap::new();
    for (identity, o) in &spec.identity_overrides {
        let field = format!("identity_overrides.{identity}");
        crate::keyrecord::check_identity(identity).map_err(|e| {
            let message = e.to_string();
            let message = message.strip_prefix("identity: ").unwrap_or(&message);
            err(field.clone(), message)
        })?;
        if o.plan.is_none() && o.policies.is_none() {
            return Err(err(field, "must name a plan, policies or both"));
        }
        if let Some(plan) = o.plan.as_ref().filter(|p| !spec.plans.contains_key(*p)) {
            return Err(err(
                format!("{field}.plan"),
                format!("no plan is named {plan:?}"),
            ));
        }
        if let Some(list) = &o.policies {
            let field = format!("{field}.policies");
            if list.is_empty() {
                return Err(err(field, "must name at least one policy"));
            }
            out.insert(identity.clone(), names.all(&field, list, per_key)?);
        }
    }
    Ok(out)
}

/// A route's policy: keyed by endpoint.
fn per_endpoint(p: &Policy) -> Result<(), String> {
    if p.has(Dimension::Endpoint) {
        Ok(())
    } else {
        Err(format!(
            "policy {:?} must be keyed by endpoint to be attached to a route",
            p.name()
        ))
    }
}

/// An address policy: keyed by client_ip alone.
fn per_ip(p: &Policy) -> Result<(), String> {
    if p.dimensions() == [Dimension::ClientIp] {
        Ok(())
    } else {
        Err(format!(
            "policy {:?} must be keyed by client_ip alone",
            p.name()
        ))
    }
}

impl EdgeConfig {
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        let spec: ConfigSpec = crate::policy::parse_json(text, MAX_CONFIG_JSON)?;
        Self::new(spec)
    }

    pub fn new(spec: ConfigSpec) -> Result<Self, PolicyError> {
        let policies = validate_policies(&spec)?;
        let names = Names(&policies);
        check_sizes(&spec)?;
        let plans = spec
            .plans
            .iter()
            .map(|(plan, list)| {
                validate_name(&format!("plans.{plan}"), plan)?;
                Ok((
                    plan.clone(),
                    names.all(&format!("plans.{plan}"), list, per_key)?,
                ))
            })
            .collect::<Result<BTreeMap<_, _>, PolicyError>>()?;
        let overrides = spec
            .key_overrides
            .iter()
            .map(|(key_id, list)| {
                let field = format!("key_overrides.{key_id}");
                crate::keys::validate_key_id(key_id).map_err(|e| err(field.clone(), e.message))?;
                if list.is_empty() {
                    return Err(err(field, "must name at least one policy"));
                }
                Ok((key_id.clone(), names.all(&field, list, per_key)?))
            })
            .collect::<Result<BTreeMap<_, _>, PolicyError>>()?;
        let identity_policies = identity_policies(&spec, &names)?;
        let routes = RouteTable::new(
            spec.routes
                .iter()
                .map(|r| (r.name.clone(), r.pattern.clone()))
                .collect(),
        )?;
        let route_policies = spec
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let field = format!("routes[{i}].policies");
                Ok((
                    r.name.clone(),
                    names.all(&field, &r.policies, per_endpoint)?,
                ))
            })
            .collect::<Result<BTreeMap<_, _>, PolicyError>>()?;
        let ip_policies = names.all("ip_policies", &spec.ip_policies, per_ip)?;
        let most_route = route_policies.values().map(Vec::len).max().unwrap_or(0);
        let most_plan = plans
            .values()
            .chain(overrides.values())
            .chain(identity_policies.values())
            .map(Vec::len)
            .max()
            .unwrap_or(0);
        if most_route + most_plan + ip_policies.len() > MAX_CHECKS {
            return Err(err(
                "plans",
                format!("a request may be checked against at most {MAX_CHECKS} policies"),
            ));
        }
        let deny = Deny::new(&spec.deny)?;
        Ok(Self {
            deny,
            spec,
            policies,
            plans,
            overrides,
            identity_policies,
            routes,
            route_policies,
            ip_policies,
        })
    }

    pub fn spec(&self) -> &ConfigSpec {
        &self.spec
    }

    /// The deny lists, ready to match.
    pub fn deny(&self) -> &Deny {
        &self.deny
    }

    pub fn headers(&self) -> &HeaderSpec {
        &self.spec.headers
    }

    /// How many regions decide bounded policies from regional pools.
    pub fn regions(&self) -> u32 {
        self.spec.regions
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.spec).expect("a config always serializes")
    }

    pub fn routes(&self) -> &RouteTable {
        &self.routes
    }

    pub fn has_plan(&self, plan: &str) -> bool {
        self.plans.contains_key(plan)
    }

    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.policies.iter().find(|p| p.name() == name)
    }

    /// The policies one request must pass and where each comes from: the per-key
    /// ones of the first of the key's override, its identity's override's
    /// policies, its identity's override's plan and the key's own `plan`; the
    /// matched route's; and the client IP's (when known). `None` when the plan
    /// that applies (the identity's, else the key's) is not configured.
    pub fn applicable(
        &self,
        key: (&str, Option<&str>),
        plan: &str,
        route: Option<&Route>,
        has_ip: bool,
    ) -> Option<Vec<(&Policy, Source)>> {
        let found = self.applicable_from(key, plan, route, has_ip)?;
        Some(
            found
                .into_iter()
                .map(|(i, from)| (&self.policies[i], from.to_source()))
                .collect(),
        )
    }

    /// [`EdgeConfig::applicable`] as policy indices and borrowed sources (the
    /// request path's: one allocation).
    fn applicable_from<'a>(
        &'a self,
        (key_id, identity): (&str, Option<&str>),
        plan: &'a str,
        route: Option<&'a Route>,
        has_ip: bool,
    ) -> Option<Vec<(usize, SourceRef<'a>)>> {
        let by_identity = identity.and_then(|i| self.spec.identity_overrides.get_key_value(i));
        let plan = by_identity
            .and_then(|(_, o)| o.plan.as_deref())
            .unwrap_or(plan);
        let plan_idx = self.plans.get(plan)?;
        let identity_idx = by_identity.and_then(|(i, _)| Some((i, self.identity_policies.get(i)?)));
        let route_idx = route.and_then(|r| self.route_policies.get(&r.name).map(|v| (r, v)));
        let mut out = Vec::with_capacity(
            plan_idx.len() + route_idx.map_or(0, |(_, v)| v.len()) + self.ip_policies.len(),
        );
        match (self.overrides.get(key_id), identity_idx) {
            (Some(o), _) => out.extend(o.iter().map(|&i| (i, SourceRef::KeyOverride))),
            (None, Some((who, o))) => {
                out.extend(o.iter().map(|&i| (i, SourceRef::IdentityOverride(who))))
            }
            (None, None) => out.extend(plan_idx.iter().map(|&i| (i, SourceRef::Plan(plan)))),
        }
        if let Some((r, v)) = route_idx {
            out.extend(v.iter().map(|&i| (i, SourceRef::Route(&r.name))));
        }
        if has_ip {
            out.extend(self.ip_policies.iter().map(|&i| (i, SourceRef::ClientIp)));
        }
        Some(out)
    }

    /// Every enforced policy that may apply to a request on `route` whoever sends
    /// it: each plan's, key override's and identity override's, the route's and
    /// (with an address) the per-IP ones. What decides a request whose API key
    /// cannot be verified.
    pub fn any_caller(&self, route: Option<&Route>, has_ip: bool) -> Vec<&Policy> {
        let mut idx: Vec<usize> = self
            .plans
            .values()
            .chain(self.overrides.values())
            .chain(self.identity_policies.values())
            .flatten()
            .copied()
            .collect();
        if let Some(v) = route.and_then(|r| self.route_policies.get(&r.name)) {
            idx.extend(v);
        }
        if has_ip {
            idx.extend(&self.ip_policies);
        }
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| &self.policies[i])
            .filter(|p| !p.shadow())
            .collect()
    }

    /// The buckets one request must pass: `(bucket key, policy)` for each policy of
    /// [`EdgeConfig::applicable`], for the key `key_id` of `identity` (`None`: a
    /// key without one, whose `identity` policies count per key,
    /// [`identity_bucket_key`]). `None` when the plan is not configured.
    pub fn checks<'a>(
        &'a self,
        (key_id, identity): (&str, Option<&str>),
        plan: &str,
        route: Option<&Route>,
        ip: Option<IpAddr>,
    ) -> Option<Result<Vec<(String, &'a Policy)>, KeyError>> {
        let subject = Subject {
            api_key_id: Some(key_id),
            route: route.map(|r| r.name.as_str()),
            client_ip: ip,
        };
        Some(
            self.applicable_from((key_id, identity), plan, route, ip.is_some())?
                .into_iter()
                .map(|(i, _)| {
                    let p = &self.policies[i];
                    identity_bucket_key(p, &subject, identity).map(|k| (k, p))
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub const DEMO: &str = r#"{"policies":[
        {"name":"default","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed"},
        {"name":"search","dimensions":["api_key","endpoint"],"quota":{"capacity":100,"period":"1m"},"failure_mode":"fail_closed"},
        {"name":"checkout","dimensions":["api_key","endpoint"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_closed"},
        {"name":"per-ip","dimensions":["client_ip"],"quota":{"capacity":5000,"period":"1m"},"failure_mode":"fail_open"}],
      "plans":{"free":["default"]},
      "routes":[{"name":"search","pattern":"/v1/search","policies":["search"]},
                {"name":"checkout","pattern":"/v1/checkout","policies":["checkout"]}],
      "ip_policies":["per-ip"]}"#;

    #[test]
    fn the_demo_config_yields_the_expected_buckets() {
        let c = EdgeConfig::from_json(DEMO).unwrap();
        let ip = Some("203.0.113.9".parse().unwrap());
        let search = c.routes().resolve("/v1/search").cloned();
        let keys: Vec<String> = c
            .checks(("Ab3dE5gH1j", None), "free", search.as_ref(), ip)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            [
                "fg:{k:Ab3dE5gH1j}:default",
                "fg:{k:Ab3dE5gH1j}:search:e:search",
                "fg:{ip:203.0.113.9}:per-ip"
            ]
        );
        let other = c.routes().resolve("/v1/anything/else");
        assert!(other.is_none());
        assert_eq!(
            c.checks(("Ab3dE5gH1j", None), "free", None, None)
                .unwrap()
                .unwrap()
                .len(),
            1
        );
        assert!(c.checks(("Ab3dE5gH1j", None), "gold", None, None).is_none());
        assert_eq!(EdgeConfig::from_json(&c.to_json()).unwrap(), c);
    }

    #[test]
    fn an_identity_policy_keys_its_buckets_by_the_keys_identity() {
        let mut v: serde_json::Value = serde_json::from_str(DEMO).unwrap();
        v["policies"].as_array_mut().unwrap().push(serde_json::json!(
            {"name":"shared","dimensions":["identity"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_open"}));
        v["plans"]["team"] = serde_json::json!(["shared"]);
        let c = EdgeConfig::from_json(&v.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let bucket = |key: (&str, Option<&str>)| {
            let checks = c.checks(key, "team", None, None).unwrap().unwrap();
            checks.into_iter().map(|(k, _)| k).collect::<Vec<_>>()
        };
        let one = bucket(("Ab3dE5gH1j", Some("cus_42")));
        assert_eq!(
            one,
            bucket(("Zz9yX8wV7u", Some("cus_42"))),
            "one identity, one bucket"
        );
        assert!(one[0].contains("{i:cus_42}"), "{one:?}");
        assert_ne!(one, bucket(("Ab3dE5gH1j", Some("cus_43"))));
        // without an identity, a key counts alone, named as an api_key bucket
        assert_ne!(bucket(("Ab3dE5gH1j", None)), bucket(("Zz9yX8wV7u", None)));
        assert!(bucket(("Ab3dE5gH1j", None))[0].contains("Ab3dE5gH1j"));
        // identity and endpoint: on a route, per identity and route
        let mut v: serde_json::Value = serde_json::from_str(DEMO).unwrap();
        v["policies"].as_array_mut().unwrap().push(serde_json::json!(
            {"name":"team_search","dimensions":["identity","endpoint"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_open"}));
        v["routes"][0]["policies"] = serde_json::json!(["search", "team_search"]);
        let c = EdgeConfig::from_json(&v.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let route = c.routes().resolve("/v1/search");
        let keys = |key: (&str, Option<&str>)| {
            let checks = c.checks(key, "free", route, None).unwrap().unwrap();
            let mut keys: Vec<String> = checks.into_iter().map(|(k, _)| k).collect();
            keys.retain(|k| k.contains(":team_search"));
            keys
        };
        assert_eq!(
            keys(("Ab3dE5gH1j", Some("cus_42"))),
            ["fg:{i:cus_42}:team_search:e:search"]
        );
        assert_eq!(
            keys(("Ab3dE5gH1j", Some("cus_42"))),
            keys(("Zz9yX8wV7u", Some("cus_42")))
        );
        // an endpoint policy on a plan is refused, naming both ways to key it
        let mut v: serde_json::Value = serde_json::from_str(DEMO).unwrap();
        v["plans"]["free"] = serde_json::json!(["search"]);
        let e = EdgeConfig::from_json(&v.to_string()).unwrap_err();
        assert!(e.message.contains("api_key or identity"), "{e}");
    }

    #[test]
    fn a_key_override_replaces_the_plan_policies_for_that_key_only() {
        let mut v: serde_json::Value = serde_json::from_str(DEMO).unwrap();
        v["policies"].as_array_mut().unwrap().push(serde_json::json!(
            {"name":"vip","dimensions":["api_key"],"quota":{"capacity":50000,"period":"1m"},"failure_mode":"fail_open"}));
        v["key_overrides"] = serde_json::json!({"Ab3dE5gH1j": ["vip"]});
        let c = EdgeConfig::from_json(&v.to_string()).unwrap();
        let search = c.routes().resolve("/v1/search").cloned();
        let names = |id: &str| -> Vec<(String, Source)> {
            c.applicable((id, None), "free", search.as_ref(), false)
                .unwrap()
                .into_iter()
                .map(|(p, s)| (p.name().to_string(), s))
                .collect()
        };
        assert_eq!(
            names("Ab3dE5gH1j"),
            [
                ("vip".into(), Source::KeyOverride),
                ("search".into(), Source::Route("search".into()))
            ]
        );
        assert_eq!(
            names("Zz3dE5gH1j")[0],
            ("default".into(), Source::Plan("free".into()))
        );
        let keys: Vec<String> = c
            .checks(("Ab3dE5gH1j", None), "free", None, None)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["fg:{k:Ab3dE5gH1j}:vip"]);
        assert_eq!(EdgeConfig::from_json(&c.to_json()).unwrap(), c);
        for (bad, field) in [
            (
                serde_json::json!({"Ab3dE5gH1j": ["search"]}),
                "key_overrides.Ab3dE5gH1j[0]",
            ),
            (
                serde_json::json!({"Ab3dE5gH1j": []}),
                "key_overrides.Ab3dE5gH1j",
            ),
            (serde_json::json!({"a b": ["vip"]}), "key_overrides.a b"),
            (
                serde_json::json!({"x".repeat(300): ["vip"]}),
                &*format!("key_overrides.{}", "x".repeat(300)),
            ),
            (
                serde_json::json!({"Ab3dE5gH1j": ["nope"]}),
                "key_overrides.Ab3dE5gH1j[0]",
            ),
        ] {
            v["key_overrides"] = bad;
            assert_eq!(
                EdgeConfig::from_json(&v.to_string()).unwrap_err().field,
                field
            );
        }
    }

    /// The per-key policies of a request by `key` of `identity` on plan `plan`
    /// of `c`, with where each comes from (no route, no address).
    fn per_key(
        c: &EdgeConfig,
        key: (&str, Option<&str>),
        plan: &str,
    ) -> Option<Vec<(String, Source)>> {
        let rows = c.applicable(key, plan, None, false)?;
        Some(
            rows.into_iter()
                .map(|(p, s)| (p.name().to_string(), s))
                .collect(),
        )
    }

    #[test]
    fn identity_overrides_come_after_key_overrides_and_before_plans() {
        let mut v: serde_json::Value = serde_json::from_str(DEMO).unwrap();
        for (name, dimension) in [
            ("vip", "api_key"),
            ("team", "identity"),
            ("gold", "api_key"),
        ] {
            v["policies"].as_array_mut().unwrap().push(serde_json::json!(
                {"name": name, "dimensions": [dimension], "quota": {"capacity": 5, "period": "1m"}, "failure_mode": "fail_closed"}));
        }
        v["plans"]["gold"] = serde_json::json!(["gold"]);
        v["key_overrides"] = serde_json::json!({"Ab3dE5gH1j": ["vip"]});
        v["identity_overrides"] = serde_json::json!({
            "cus_42": {"policies": ["team"]},
            "cus_43": {"plan": "gold"},
            "cus_44": {"plan": "gold", "policies": ["team"]}});
        let c = EdgeConfig::from_json(&v.to_string()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(EdgeConfig::from_json(&c.to_json()).unwrap(), c);
        let plan = |p: &str| Source::Plan(p.into());
        let who = |i: &str| Source::IdentityOverride(i.into());
        let cases = [
            // the key's own override beats its identity's
            (
                ("Ab3dE5gH1j", Some("cus_42")),
                "free",
                ("vip", Source::KeyOverride),
            ),
            (
                ("Zz3dE5gH1j", Some("cus_42")),
                "free",
                ("team", who("cus_42")),
            ),
            // an identity's plan replaces the key's plan, even one not configured
            (
                ("Zz3dE5gH1j", Some("cus_43")),
                "free",
                ("gold", plan("gold")),
            ),
            (
                ("Zz3dE5gH1j", Some("cus_43")),
                "nope",
                ("gold", plan("gold")),
            ),
            (
                ("Zz3dE5gH1j", Some("cus_44")),
                "nope",
                ("team", who("cus_44")),
            ),
            // no override for this identity, or no identity: the key's plan
            (
                ("Zz3dE5gH1j", Some("cus_45")),
                "free",
                ("default", plan("free")),
            ),
            (("Zz3dE5gH1j", None), "free", ("default", plan("free"))),
        ];
        for (key, key_plan, (policy, source)) in cases {
            assert_eq!(
                per_key(&c, key, key_plan),
                Some(vec![(policy.to_string(), source)]),
                "{key:?} on {key_plan}"
            );
        }
        // the identity's policies alone need the key's plan configured, as a key override does
        assert_eq!(per_key(&c, ("Zz3dE5gH1j", Some("cus_42")), "nope"), None);
        // two keys of cus_42 share the override's identity bucket
        let bucket = |id: &str| {
            c.checks((id, Some("cus_42")), "free", None, None)
                .unwrap()
                .unwrap()[0]
                .0
                .clone()
        };
        assert_eq!(bucket("Zz3dE5gH1j"), "fg:{i:cus_42}:team");
        assert_eq!(bucket("Yy3dE5gH1j"), bucket("Zz3dE5gH1j"));
        assert!(
            c.any_caller(None, false).iter().any(|p| p.name() == "team"),
            "an identity override's policy can decide an unverified caller"
        );
        for (bad, field) in [
            (
                serde_json::json!({"cus_42": {}}),
                "identity_overrides.cus_42",
            ),
            (
                serde_json::json!({"two words": {"plan": "free"}}),
                "identity_overrides.two words",
            ),
            (
                serde_json::json!({"cus_42": {"plan": "platinum"}}),
                "identity_overrides.cus_42.plan",
            ),
            (
                serde_json::json!({"cus_42": {"policies": []}}),
                "identity_overrides.cus_42.policies",
            ),
            (
                serde_json::json!({"cus_42": {"policies": ["nope"]}}),
                "identity_overrides.cus_42.policies[0]",
            ),
            (
                serde_json::json!({"cus_42": {"policies": ["default", "search"]}}),
                "identity_overrides.cus_42.policies[1]",
            ),
            (
                serde_json::json!({"cus_42": {"plan": "free", "limits": []}}),
                "identity_overrides.cus_42.limits",
            ),
        ] {
            v["identity_overrides"] = bad.clone();
            let e = EdgeConfig::from_json(&v.to_string()).unwrap_err();
            assert_eq!(e.field, field, "{bad}: {e}");
        }
    }

    #[test]
    fn deny_lists_round_trip_and_bad_entries_name_their_field() {
        let mut v: serde_json::Value = serde_json::from_str(DEMO).unwrap();
        v["deny"] = serde_json::json!({
            "key_ids": ["Ab3dE5gH1j"], "ips": ["203.0.113.7", "198.51.100.0/24", "2001:db8::/32"],
            "countries": ["KP"], "user_agents": ["BadBot"]});
        let c = EdgeConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.spec().deny.ips.len(), 3);
        assert_eq!(EdgeConfig::from_json(&c.to_json()).unwrap(), c);
        let visitor = crate::deny::Visitor {
            ip: Some("198.51.100.20".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(c.deny().matches(&visitor), Some(crate::deny::DenyList::Ip));
        // no deny section: none written back
        let plain = EdgeConfig::from_json(DEMO).unwrap();
        assert!(!plain.to_json().contains("deny"));
        for (deny, field) in [
            (serde_json::json!({"ips": ["10.0.0.0/40"]}), "deny.ips[0]"),
            (
                serde_json::json!({"countries": ["UKR"]}),
                "deny.countries[0]",
            ),
            (
                serde_json::json!({"user_agents": [""]}),
                "deny.user_agents[0]",
            ),
            (serde_json::json!({"addresses": []}), "deny.addresses"),
        ] {
            v["deny"] = deny;
            let e = EdgeConfig::from_json(&v.to_string()).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }

    #[test]
    fn inconsistent_configs_are_rejected_naming_the_field() {
        let v: serde_json::Value = serde_json::from_str(DEMO).unwrap();
        type Mutation = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (
                Box::new(|v| v["plans"]["free"] = serde_json::json!(["nope"])),
                "plans.free[0]",
            ),
            (
                Box::new(|v| v["plans"]["free"] = serde_json::json!(["search"])),
                "plans.free[0]",
            ),
            (
                Box::new(|v| v["routes"][0]["policies"] = serde_json::json!(["default"])),
                "routes[0].policies[0]",
            ),
            (
                Box::new(|v| v["routes"][1]["pattern"] = serde_json::json!("no-slash")),
                "routes[1].pattern",
            ),
            (
                Box::new(|v| v["ip_policies"] = serde_json::json!(["default"])),
                "ip_policies[0]",
            ),
            (
                Box::new(|v| v["policies"][1]["name"] = serde_json::json!("default")),
                "policies[1].name",
            ),
            (
                Box::new(|v| v["policies"][0]["quota"]["capacity"] = serde_json::json!(0)),
                "policies[0].quota.capacity",
            ),
            (Box::new(|v| v["plans"] = serde_json::json!({})), "plans"),
            (
                Box::new(|v| v["plans"] = serde_json::json!({"Bad Plan": ["default"]})),
                "plans.Bad Plan",
            ),
            (
                Box::new(|v| v["policies"] = serde_json::json!([])),
                "policies",
            ),
            (Box::new(|v| v["extra"] = serde_json::json!(1)), "extra"),
        ];
        for (mutate, field) in cases {
            let mut doc = v.clone();
            mutate(&mut doc);
            let e = EdgeConfig::from_json(&doc.to_string()).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
        assert!(EdgeConfig::from_json(&" ".repeat(MAX_CONFIG_JSON + 1)).is_err());
        assert!(EdgeConfig::from_json("{").is_err());
    }
}
