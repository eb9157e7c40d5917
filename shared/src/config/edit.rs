//! Edits of a configuration as operators make them (the dashboard's forms): each
//! one a value, applied to a [`ConfigSpec`] by a pure function that says what it
//! changed (for the audit log) and where the edited item sits (so an error of the
//! whole result can be shown next to the form's field). Validating the result is
//! [`super::EdgeConfig::new`]'s job; an edit refuses only what it cannot apply (a
//! name taken, an item missing, a policy still in use).

use serde::Serialize;

use super::{ConfigSpec, HeaderSpec, IdentityOverride, RouteSpec};
use crate::deny::DenySpec;
use crate::policy::{PolicyError, PolicySpec};

/// One change to a configuration. `original: None` creates an item; `Some(name)`
/// replaces the item of that name (which may rename it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigEdit {
    /// A policy created or replaced; a renamed policy is renamed everywhere it is
    /// used (plans, routes, key overrides, IP policies).
    PutPolicy {
        original: Option<String>,
        policy: PolicySpec,
    },
    /// A policy removed, refused while anything still uses it.
    DeletePolicy {
        name: String,
    },
    /// A plan created or replaced: its name and its per-key policies.
    PutPlan {
        original: Option<String>,
        name: String,
        policies: Vec<String>,
    },
    DeletePlan {
        name: String,
    },
    /// A route created or replaced.
    PutRoute {
        original: Option<String>,
        route: RouteSpec,
    },
    DeleteRoute {
        name: String,
    },
    /// The policies that replace one key's plan (set, or replaced).
    PutKeyOverride {
        key_id: String,
        policies: Vec<String>,
    },
    DeleteKeyOverride {
        key_id: String,
    },
    /// What replaces the plans of one identity's keys (set, or replaced).
    PutIdentityOverride {
        identity: String,
        over: IdentityOverride,
    },
    DeleteIdentityOverride {
        identity: String,
    },
    /// The per-address policies, as a whole.
    SetIpPolicies(Vec<String>),
    /// The response header options, as a whole.
    SetHeaders(HeaderSpec),
    /// The deny lists, as a whole.
    SetDeny(DenySpec),
    /// A first configuration: one per-key `policy` on one `plan` (refused once
    /// any policy is stored).
    Start {
        plan: String,
        policy: PolicySpec,
    },
}

/// What an edit changed: the item before and after it, as JSON (`None`: it did not
/// exist before, or no longer does), and the field path of the edited item in the
/// configuration (`policies[3]`, `plans.gold`; `None` when its errors name their
/// fields in full already).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edited {
    pub before: Option<String>,
    pub after: Option<String>,
    pub at: Option<String>,
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The edit of a replacement: `after` in place of the item at `at`, which was
/// `before` (or is new).
fn put<T: Serialize>(before: Option<String>, after: &T, at: String) -> Edited {
    Edited {
        before,
        after: Some(json(after)),
        at: Some(at),
    }
}

/// The edit of a deletion: the item removed, or an error saying what is missing.
fn deleted<T: Serialize>(removed: Option<T>, missing: String) -> Result<Edited, PolicyError> {
    let removed = removed.ok_or_else(|| PolicyError::new("(form)", missing))?;
    Ok(Edited {
        before: Some(json(&removed)),
        after: None,
        at: None,
    })
}

/// A whole section replaced: `old` by `new`.
fn replaced<T: Serialize>(old: &mut T, new: T, at: Option<&str>) -> Edited {
    let before = Some(json(old));
    let after = Some(json(&new));
    *old = new;
    Edited {
        before,
        after,
        at: at.map(str::to_string),
    }
}

impl ConfigEdit {
    /// The audit log's name of the change (`create policy`, `set deny lists`).
    pub fn action(&self) -> &'static str {
        use ConfigEdit::*;
        let created = |original: &Option<String>| original.is_none();
        match self {
            PutPolicy { original, .. } if created(original) => "create policy",
            PutPolicy { .. } => "edit policy",
            DeletePolicy { .. } => "delete policy",
            PutPlan { original, .. } if created(original) => "create plan",
            PutPlan { .. } => "edit plan",
            DeletePlan { .. } => "delete plan",
            PutRoute { original, .. } if created(original) => "create route",
            PutRoute { .. } => "edit route",
            DeleteRoute { .. } => "delete route",
            PutKeyOverride { .. } => "set key override",
            DeleteKeyOverride { .. } => "delete key override",
            PutIdentityOverride { .. } => "set identity override",
            DeleteIdentityOverride { .. } => "delete identity override",
            SetIpPolicies(_) => "set IP policies",
            SetHeaders(_) => "set response headers",
            SetDeny(_) => "set deny lists",
            Start { .. } => "start configuration",
        }
    }

    /// What the change is about, for the audit log: the item's (new) name, a key
    /// id, or the section.
    pub fn target(&self) -> String {
        use ConfigEdit::*;
        match self {
            PutPolicy { policy, .. } => policy.name.clone(),
            PutRoute { route, .. } => route.name.clone(),
            PutPlan { name, .. } | DeletePolicy { name } | DeletePlan { name } => name.clone(),
            DeleteRoute { name } => name.clone(),
            PutKeyOverride { key_id, .. } | DeleteKeyOverride { key_id } => key_id.clone(),
            PutIdentityOverride { identity, .. } | DeleteIdentityOverride { identity } => {
                format!("identity {identity}")
            }
            SetIpPolicies(_) => "ip_policies".into(),
            SetHeaders(_) => "headers".into(),
            SetDeny(_) => "deny".into(),
            Start { plan, .. } => plan.clone(),
        }
    }

    /// Applies the edit to `c`. On an error `c` is left as it was.
    pub fn apply(self, c: &mut ConfigSpec) -> Result<Edited, PolicyError> {
        use ConfigEdit::*;
        match self {
            PutPolicy { original, policy } => put_policy(c, policy, original.as_deref()),
            DeletePolicy { name } => delete_policy(c, &name),
            PutPlan {
                original,
                name,
                policies,
            } => put_plan(c, original.as_deref(), name, policies),
            DeletePlan { name } => {
                deleted(c.plans.remove(&name), format!("no plan is named {name:?}"))
            }
            PutRoute { original, route } => put_route(c, route, original.as_deref()),
            DeleteRoute { name } => {
                let i = c.routes.iter().position(|r| r.name == name);
                deleted(
                    i.map(|i| c.routes.remove(i)),
                    format!("no route is named {name:?}"),
                )
            }
            PutKeyOverride { key_id, policies } => {
                let before = c.key_overrides.insert(key_id.clone(), policies.clone());
                Ok(put(
                    before.map(|b| json(&b)),
                    &policies,
                    format!("key_overrides.{key_id}"),
                ))
            }
            DeleteKeyOverride { key_id } => deleted(
                c.key_overrides.remove(&key_id),
                format!("no override for key {key_id:?}"),
            ),
            PutIdentityOverride { identity, over } => {
                let before = c.identity_overrides.insert(identity.clone(), over.clone());
                Ok(put(
                    before.map(|b| json(&b)),
                    &over,
                    format!("identity_overrides.{identity}"),
                ))
            }
            DeleteIdentityOverride { identity } => deleted(
                c.identity_overrides.remove(&identity),
                format!("no override for identity {identity:?}"),
            ),
            SetIpPolicies(list) => Ok(replaced(&mut c.ip_policies, list, Some("ip_policies"))),
            SetHeaders(headers) => Ok(replaced(&mut c.headers, headers, None)),
            SetDeny(deny) => Ok(replaced(&mut c.deny, deny, None)),
            Start { plan, policy } => start(c, plan, policy),
        }
    }
}

/// The first policy and the plan that uses it.
fn start(c: &mut ConfigSpec, plan: String, policy: PolicySpec) -> Result<Edited, PolicyError> {
    if !c.policies.is_empty() {
        return Err(PolicyError::new(
            "(form)",
            "a configuration is stored already: edit it below",
        ));
    }
    let after = serde_json::json!({"policies": [&policy], "plans": {&plan: [&policy.name]}});
    c.plans.insert(plan, vec![policy.name.clone()]);
    c.policies.push(policy);
    Ok(Edited {
        before: None,
        after: Some(after.to_string()),
        at: Some("policies[0]".into()),
    })
}

/// A new policy (`original: None`), else `policy` in place of the policy named
/// `original`, renamed everywhere.
fn put_policy(
    c: &mut ConfigSpec,
    policy: PolicySpec,
    original: Option<&str>,
) -> Result<Edited, PolicyError> {
    let Some(original) = original else {
        if c.policies.iter().any(|p| p.name == policy.name) {
            return Err(PolicyError::new(
                "name",
                format!("a policy named {:?} exists already", policy.name),
            ));
        }
        c.policies.push(policy);
        let i = c.policies.len() - 1;
        return Ok(put(None, &c.policies[i], format!("policies[{i}]")));
    };
    let i = c
        .policies
        .iter()
        .position(|p| p.name == original)
        .ok_or_else(|| {
            PolicyError::new(
                "(form)",
                format!("no policy is named {original:?} any more"),
            )
        })?;
    let before = Some(json(&c.policies[i]));
    let new_name = policy.name.clone();
    c.policies[i] = policy;
    if new_name != original {
        rename_policy(c, original, &new_name);
    }
    Ok(put(before, &c.policies[i], format!("policies[{i}]")))
}

/// Renames a policy everywhere the configuration refers to it.
fn rename_policy(c: &mut ConfigSpec, from: &str, to: &str) {
    let fix = |names: &mut Vec<String>| {
        for n in names.iter_mut().filter(|n| *n == from) {
            *n = to.to_string();
        }
    };
    c.plans.values_mut().for_each(fix);
    c.key_overrides.values_mut().for_each(fix);
    c.identity_overrides
        .values_mut()
        .filter_map(|o| o.policies.as_mut())
        .for_each(fix);
    c.routes.iter_mut().for_each(|r| fix(&mut r.policies));
    fix(&mut c.ip_policies);
}

fn delete_policy(c: &mut ConfigSpec, name: &str) -> Result<Edited, PolicyError> {
    if let Some(field) = policy_user(c, name) {
        return Err(PolicyError::new(
            field,
            format!("still uses the limit {name:?}: take it out there first"),
        ));
    }
    let i = c.policies.iter().position(|p| p.name == name);
    deleted(
        i.map(|i| c.policies.remove(i)),
        format!("no policy is named {name:?}"),
    )
}

/// The first place that uses policy `name`, as a validation error names it
/// (`plans.free[0]`, `routes[1].policies[0]`, ...).
fn policy_user(c: &ConfigSpec, name: &str) -> Option<String> {
    let lists = c
        .plans
        .iter()
        .map(|(p, l)| (format!("plans.{p}"), l))
        .chain(
            c.routes
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("routes[{i}].policies"), &r.policies)),
        )
        .chain(
            c.key_overrides
                .iter()
                .map(|(k, l)| (format!("key_overrides.{k}"), l)),
        )
        .chain(c.identity_overrides.iter().filter_map(|(i, o)| {
            let list = o.policies.as_ref()?;
            Some((format!("identity_overrides.{i}.policies"), list))
        }))
        .chain(std::iter::once(("ip_policies".to_string(), &c.ip_policies)));
    for (field, list) in lists {
        if let Some(j) = list.iter().position(|n| n == name) {
            return Some(format!("{field}[{j}]"));
        }
    }
    None
}

fn put_plan(
    c: &mut ConfigSpec,
    original: Option<&str>,
    name: String,
    policies: Vec<String>,
) -> Result<Edited, PolicyError> {
    let before = match original {
        None if c.plans.contains_key(&name) => {
            return Err(PolicyError::new(
                "name",
                format!("a plan named {name:?} exists already"),
            ));
        }
        None => None,
        Some(original) => {
            let before = c.plans.remove(original).map(|p| json(&p));
            // identities on the plan follow it to its new name
            for o in c.identity_overrides.values_mut() {
                if o.plan.as_deref() == Some(original) {
                    o.plan = Some(name.clone());
                }
            }
            before
        }
    };
    let edited = put(before, &policies, format!("plans.{name}"));
    c.plans.insert(name, policies);
    Ok(edited)
}

fn put_route(
    c: &mut ConfigSpec,
    route: RouteSpec,
    original: Option<&str>,
) -> Result<Edited, PolicyError> {
    let after = json(&route);
    let (i, before) = match original {
        None if c.routes.iter().any(|r| r.name == route.name) => {
            return Err(PolicyError::new(
                "name",
                format!("a route named {:?} exists already", route.name),
            ));
        }
        None => {
            c.routes.push(route);
            (c.routes.len() - 1, None)
        }
        Some(original) => {
            let i = c
                .routes
                .iter()
                .position(|r| r.name == original)
                .ok_or_else(|| {
                    PolicyError::new("(form)", format!("no route is named {original:?} any more"))
                })?;
            let before = json(&c.routes[i]);
            c.routes[i] = route;
            (i, Some(before))
        }
    };
    Ok(Edited {
        before,
        after: Some(after),
        at: Some(format!("routes[{i}]")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EdgeConfig;

    fn spec() -> ConfigSpec {
        EdgeConfig::from_json(
            r#"{"policies":[
                {"name":"default","dimensions":["api_key"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_closed"},
                {"name":"search","dimensions":["api_key","endpoint"],"quota":{"capacity":5,"period":"1m"},"failure_mode":"fail_closed"},
                {"name":"heavy","dimensions":["api_key"],"quota":{"capacity":50,"period":"1m"},"failure_mode":"fail_closed"}],
              "plans":{"free":["default"],"pro":["heavy"]},
              "routes":[{"name":"search","pattern":"/v1/search","policies":["search"]}],
              "key_overrides":{"K1":["heavy"]}}"#,
        )
        .unwrap()
        .spec()
        .clone()
    }

    fn policy(name: &str, capacity: u64) -> PolicySpec {
        serde_json::from_str(&format!(
            r#"{{"name":"{name}","dimensions":["api_key"],"quota":{{"capacity":{capacity},"period":"1m"}},"failure_mode":"fail_closed"}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_first_configuration_is_one_limit_on_one_plan_and_only_once() {
        let mut c = ConfigSpec::default();
        let start = ConfigEdit::Start {
            plan: "free".into(),
            policy: policy("default", 100),
        };
        assert_eq!(
            (start.action(), start.target().as_str()),
            ("start configuration", "free")
        );
        let done = start.clone().apply(&mut c).unwrap();
        assert_eq!(done.before, None);
        assert!(done.after.unwrap().contains("\"free\""));
        assert_eq!(c.plans["free"], ["default"]);
        assert!(
            EdgeConfig::new(c.clone()).is_ok(),
            "a configuration the edge takes"
        );
        let e = start.apply(&mut c).unwrap_err();
        assert!(e.message.contains("stored already"), "{e}");
        assert_eq!(c.policies.len(), 1);
    }

    #[test]
    fn a_new_policy_is_appended_and_a_taken_name_is_refused() {
        let mut c = spec();
        let edit = ConfigEdit::PutPolicy {
            original: None,
            policy: policy("burst", 3),
        };
        assert_eq!(
            (edit.action(), edit.target().as_str()),
            ("create policy", "burst")
        );
        let done = edit.apply(&mut c).unwrap();
        assert_eq!(done.at.as_deref(), Some("policies[3]"));
        assert_eq!(done.before, None);
        assert!(done.after.unwrap().contains("\"burst\""));
        let again = ConfigEdit::PutPolicy {
            original: None,
            policy: policy("burst", 4),
        };
        let e = again.apply(&mut c).unwrap_err();
        assert_eq!(e.field, "name");
        assert!(e.message.contains("exists already"), "{e}");
        assert_eq!(c.policies.len(), 4, "nothing added");
    }

    #[test]
    fn a_renamed_policy_is_renamed_everywhere_it_is_used() {
        let mut c = spec();
        c.ip_policies = vec!["heavy".into()];
        let edit = ConfigEdit::PutPolicy {
            original: Some("heavy".into()),
            policy: policy("big", 7),
        };
        assert_eq!(edit.action(), "edit policy");
        let done = edit.apply(&mut c).unwrap();
        assert_eq!(done.at.as_deref(), Some("policies[2]"));
        assert!(done.before.unwrap().contains("\"heavy\""));
        assert_eq!(c.policies[2].quota.capacity, 7);
        assert_eq!(c.plans["pro"], ["big"]);
        assert_eq!(c.key_overrides["K1"], ["big"]);
        assert_eq!(c.ip_policies, ["big"]);
        c.ip_policies.clear();
        assert!(EdgeConfig::new(c.clone()).is_ok(), "still valid");
        let mut search = c.policies[1].clone();
        search.name = "find".into();
        ConfigEdit::PutPolicy {
            original: Some("search".into()),
            policy: search,
        }
        .apply(&mut c)
        .unwrap();
        assert_eq!(c.routes[0].policies, ["find"]);
        let gone = ConfigEdit::PutPolicy {
            original: Some("search".into()),
            policy: policy("x", 1),
        };
        let e = gone.apply(&mut c).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.contains("any more")),
            ("(form)", true)
        );
    }

    #[test]
    fn a_policy_in_use_is_not_deleted_and_its_first_user_is_named() {
        let mut c = spec();
        let e = ConfigEdit::DeletePolicy {
            name: "search".into(),
        }
        .apply(&mut c)
        .unwrap_err();
        assert_eq!(e.field, "routes[0].policies[0]");
        assert_eq!(policy_user(&c, "default").as_deref(), Some("plans.free[0]"));
        c.routes.clear();
        let done = ConfigEdit::DeletePolicy {
            name: "search".into(),
        }
        .apply(&mut c)
        .unwrap();
        assert!(done.before.unwrap().contains("\"search\""));
        assert_eq!((done.after, done.at), (None, None));
        assert_eq!(c.policies.len(), 2);
        let e = ConfigEdit::DeletePolicy {
            name: "search".into(),
        }
        .apply(&mut c)
        .unwrap_err();
        assert_eq!(e.field, "(form)");
    }

    #[test]
    fn plans_and_routes_are_created_replaced_and_deleted_by_name() {
        let mut c = spec();
        let plan = |original: Option<&str>, name: &str| ConfigEdit::PutPlan {
            original: original.map(str::to_string),
            name: name.into(),
            policies: vec!["default".into()],
        };
        assert_eq!(plan(None, "free").apply(&mut c).unwrap_err().field, "name");
        let done = plan(Some("free"), "basic").apply(&mut c).unwrap();
        assert_eq!(done.at.as_deref(), Some("plans.basic"));
        assert_eq!(done.before.as_deref(), Some(r#"["default"]"#));
        assert!(c.plans.contains_key("basic") && !c.plans.contains_key("free"));
        assert_eq!(plan(Some("basic"), "x").action(), "edit plan");
        let route = |original: Option<&str>, pattern: &str| ConfigEdit::PutRoute {
            original: original.map(str::to_string),
            route: RouteSpec {
                name: "search".into(),
                pattern: pattern.into(),
                policies: vec!["search".into()],
            },
        };
        assert_eq!(route(None, "/s").apply(&mut c).unwrap_err().field, "name");
        let done = route(Some("search"), "/v2/search").apply(&mut c).unwrap();
        assert_eq!(done.at.as_deref(), Some("routes[0]"));
        assert_eq!(c.routes[0].pattern, "/v2/search");
        let e = route(Some("nope"), "/s").apply(&mut c).unwrap_err();
        assert_eq!(e.field, "(form)");
        let del = ConfigEdit::DeleteRoute {
            name: "search".into(),
        };
        assert_eq!(
            (del.action(), del.target().as_str()),
            ("delete route", "search")
        );
        del.apply(&mut c).unwrap();
        assert!(c.routes.is_empty());
        let e = ConfigEdit::DeletePlan {
            name: "free".into(),
        }
        .apply(&mut c)
        .unwrap_err();
        assert!(e.message.contains("no plan is named"), "{e}");
    }

    #[test]
    fn whole_sections_are_replaced_with_what_they_held_before() {
        let mut c = spec();
        let done = ConfigEdit::PutKeyOverride {
            key_id: "K1".into(),
            policies: vec!["default".into()],
        }
        .apply(&mut c)
        .unwrap();
        assert_eq!(done.before.as_deref(), Some(r#"["heavy"]"#));
        assert_eq!(done.at.as_deref(), Some("key_overrides.K1"));
        let ip = ConfigEdit::SetIpPolicies(vec!["default".into()]);
        assert_eq!(
            (ip.action(), ip.target().as_str()),
            ("set IP policies", "ip_policies")
        );
        let done = ip.apply(&mut c).unwrap();
        assert_eq!(
            (done.before.as_deref(), done.at.as_deref()),
            (Some("[]"), Some("ip_policies"))
        );
        let headers = HeaderSpec {
            ietf: true,
            retry_jitter_secs: 3,
        };
        let done = ConfigEdit::SetHeaders(headers.clone())
            .apply(&mut c)
            .unwrap();
        assert_eq!((c.headers.clone(), done.at), (headers, None));
        let deny = DenySpec {
            ips: vec!["203.0.113.7".into()],
            ..DenySpec::default()
        };
        ConfigEdit::SetDeny(deny.clone()).apply(&mut c).unwrap();
        assert_eq!(c.deny, deny);
        let e = ConfigEdit::DeleteKeyOverride {
            key_id: "K9".into(),
        }
        .apply(&mut c)
        .unwrap_err();
        assert!(e.message.contains("no override for key"), "{e}");
        assert_eq!(
            ConfigEdit::DeleteKeyOverride {
                key_id: "K1".into()
            }
            .apply(&mut c)
            .unwrap()
            .after,
            None
        );
        // the per-address list takes policies keyed by client_ip: none here
        c.ip_policies.clear();
        assert!(EdgeConfig::new(c).is_ok());
    }

    #[test]
    fn identity_overrides_are_set_replaced_deleted_and_follow_renames() {
        let mut c = spec();
        let over = |plan: Option<&str>, policies: Option<&[&str]>| IdentityOverride {
            plan: plan.map(str::to_string),
            policies: policies.map(|l| l.iter().map(|p| p.to_string()).collect()),
        };
        let set = ConfigEdit::PutIdentityOverride {
            identity: "cus_42".into(),
            over: over(Some("pro"), Some(&["heavy"])),
        };
        assert_eq!(
            (set.action(), set.target().as_str()),
            ("set identity override", "identity cus_42")
        );
        let done = set.apply(&mut c).unwrap();
        assert_eq!(
            (done.before, done.at.as_deref(), done.after.as_deref()),
            (
                None,
                Some("identity_overrides.cus_42"),
                Some(r#"{"plan":"pro","policies":["heavy"]}"#)
            )
        );
        assert!(EdgeConfig::new(c.clone()).is_ok());
        // a policy it uses is not deleted, and is renamed in it
        let e = ConfigEdit::DeletePolicy {
            name: "heavy".into(),
        }
        .apply(&mut c.clone())
        .unwrap_err();
        assert!(e.field.ends_with("[0]"), "{e}");
        c.key_overrides.clear();
        c.plans.insert("pro".into(), vec!["default".into()]);
        let e = ConfigEdit::DeletePolicy {
            name: "heavy".into(),
        }
        .apply(&mut c.clone())
        .unwrap_err();
        assert_eq!(e.field, "identity_overrides.cus_42.policies[0]");
        ConfigEdit::PutPolicy {
            original: Some("heavy".into()),
            policy: policy("big", 7),
        }
        .apply(&mut c)
        .unwrap();
        assert_eq!(
            c.identity_overrides["cus_42"],
            over(Some("pro"), Some(&["big"]))
        );
        // a renamed plan is renamed in it
        ConfigEdit::PutPlan {
            original: Some("pro".into()),
            name: "team".into(),
            policies: vec!["default".into()],
        }
        .apply(&mut c)
        .unwrap();
        assert_eq!(c.identity_overrides["cus_42"].plan.as_deref(), Some("team"));
        assert!(EdgeConfig::new(c.clone()).is_ok(), "still valid");
        // replaced, then deleted
        let done = ConfigEdit::PutIdentityOverride {
            identity: "cus_42".into(),
            over: over(None, Some(&["default"])),
        }
        .apply(&mut c)
        .unwrap();
        assert_eq!(
            done.before.as_deref(),
            Some(r#"{"plan":"team","policies":["big"]}"#)
        );
        let del = ConfigEdit::DeleteIdentityOverride {
            identity: "cus_42".into(),
        };
        assert_eq!(del.action(), "delete identity override");
        assert_eq!(
            del.clone().apply(&mut c).unwrap().before.as_deref(),
            Some(r#"{"policies":["default"]}"#)
        );
        assert!(c.identity_overrides.is_empty());
        let e = del.apply(&mut c).unwrap_err();
        assert!(e.message.contains("no override for identity"), "{e}");
    }
}
