//! What the dashboard's forms post, as the server functions take them (each form's
//! fields by their names in the page, deserialised by Leptos from a plain form
//! post or an island's call alike), and how each becomes a [`ConfigEdit`]: every
//! field's size bounded first, then parsed by the edge's own rules, errors naming
//! the field. Pure; tested natively.

use floodgate_shared::config::{ConfigEdit, HeaderSpec, RouteSpec};
use floodgate_shared::policy::{Policy, PolicyError, PolicySpec};
use serde::{Deserialize, Deserializer, Serialize};

use crate::describe::{dimension_name, failure_mode_name};
use crate::error::AppError;

/// An error of a form's own fields (no configuration to name its indexes).
fn invalid(e: PolicyError) -> AppError {
    AppError::from_policy(e, None)
}

/// A form's `original` field: the name of the item it edits, empty for a new one.
fn named(original: &str) -> Option<String> {
    (!original.is_empty()).then(|| original.to_string())
}

/// A checkbox: `on` (what a browser sends), `true` or `1` is ticked, anything else
/// (or no field at all: `#[serde(default)]`) is not. Also reads a JSON boolean
/// (an island's props).
fn checkbox<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct Ticked;
    impl serde::de::Visitor<'_> for Ticked {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a checkbox (on) or a boolean")
        }
        fn visit_bool<E>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E>(self, v: &str) -> Result<bool, E> {
            Ok(matches!(v, "on" | "true" | "1"))
        }
    }
    d.deserialize_any(Ticked)
}

/// The most characters any text field of a form takes (names, labels, patterns).
pub const MAX_FIELD_CHARS: usize = 256;

/// Checks one raw form field's size before anything parses it.
pub fn bounded<'a>(field: &str, raw: &'a str) -> Result<&'a str, PolicyError> {
    let t = raw.trim();
    if t.chars().count() > MAX_FIELD_CHARS {
        return Err(PolicyError::new(
            field,
            format!("is longer than {MAX_FIELD_CHARS} characters"),
        ));
    }
    Ok(t)
}

fn whole_number(field: &str, raw: &str) -> Result<Option<serde_json::Value>, PolicyError> {
    let t = bounded(field, raw)?;
    if t.is_empty() {
        return Ok(None);
    }
    // Digits go to the shared parser as numbers, so its range checks apply
    // (zero, overflow); anything else is refused here with a plain message.
    if t.bytes().all(|b| b.is_ascii_digit()) && t.len() <= 20 {
        return match t.parse::<u64>() {
            Ok(n) => Ok(Some(serde_json::Value::from(n))),
            Err(_) => Err(PolicyError::new(field, "is too large")),
        };
    }
    let shown: String = t.chars().take(24).collect();
    Err(PolicyError::new(
        field,
        format!("must be a whole number, got {shown:?}"),
    ))
}

/// The policy form's raw fields (the form's own names; `shadow` a checkbox).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyForm {
    pub name: String,
    /// Comma-separated: `api_key`, `endpoint`, `client_ip`.
    pub dimensions: String,
    pub capacity: String,
    pub period: String,
    pub refill: String,
    pub cost: String,
    pub failure_mode: String,
    /// With `local_fallback`: the share (1–100 %) of the quota each instance
    /// enforces alone while Redis is unavailable.
    #[serde(default)]
    pub local_share_percent: String,
    /// Requests of one bucket in flight at once (empty: no limit).
    #[serde(default)]
    pub max_in_flight: String,
    /// `token_bucket` (default when empty), `fixed_window`, `sliding_log`,
    /// `sliding_counter`.
    #[serde(default)]
    pub algorithm: String,
    /// Shadow (dry-run) mode.
    #[serde(default, deserialize_with = "checkbox")]
    pub shadow: bool,
    /// `exact` (default when empty), `bounded` or `auto`.
    #[serde(default)]
    pub consistency: String,
    /// With `bounded` or `auto`: the most tokens admitted above the quota in any
    /// window, all edges together (empty: none).
    #[serde(default)]
    pub max_overshoot: String,
}

/// The form fields a policy error can name, as `PolicySpec` names them.
pub const POLICY_FIELDS: [&str; 13] = [
    "algorithm",
    "shadow",
    "name",
    "dimensions",
    "quota.capacity",
    "quota.period",
    "quota.refill",
    "cost",
    "failure_mode",
    "local_share_percent",
    "max_in_flight",
    "consistency",
    "max_overshoot",
];

impl PolicyForm {
    /// Validates the form with the edge's own parser and rules; errors name the
    /// field as the edge would (`quota.capacity`, ...).
    pub fn to_spec(&self) -> Result<PolicySpec, PolicyError> {
        let mut quota = serde_json::Map::new();
        let capacity = whole_number("quota.capacity", &self.capacity)?
            .ok_or_else(|| PolicyError::new("quota.capacity", "is required"))?;
        quota.insert("capacity".into(), capacity);
        if let Some(refill) = whole_number("quota.refill", &self.refill)? {
            quota.insert("refill".into(), refill);
        }
        quota.insert(
            "period".into(),
            bounded("quota.period", &self.period)?.into(),
        );
        let dimensions: Vec<&str> = bounded("dimensions", &self.dimensions)?
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .collect();
        let mut doc = serde_json::Map::new();
        doc.insert("name".into(), bounded("name", &self.name)?.into());
        doc.insert("dimensions".into(), dimensions.into());
        doc.insert("quota".into(), quota.into());
        if let Some(cost) = whole_number("cost", &self.cost)? {
            doc.insert("cost".into(), cost);
        }
        doc.insert(
            "failure_mode".into(),
            bounded("failure_mode", &self.failure_mode)?.into(),
        );
        if let Some(share) = whole_number("local_share_percent", &self.local_share_percent)? {
            doc.insert("local_share_percent".into(), share);
        }
        if let Some(n) = whole_number("max_in_flight", &self.max_in_flight)? {
            doc.insert("max_in_flight".into(), n);
        }
        let algorithm = bounded("algorithm", &self.algorithm)?;
        if !algorithm.is_empty() {
            doc.insert("algorithm".into(), algorithm.into());
        }
        if self.shadow {
            doc.insert("shadow".into(), true.into());
        }
        let consistency = bounded("consistency", &self.consistency)?;
        if !consistency.is_empty() {
            doc.insert("consistency".into(), consistency.into());
        }
        if let Some(n) = whole_number("max_overshoot", &self.max_overshoot)? {
            doc.insert("max_overshoot".into(), n);
        }
        let policy = Policy::from_json(&serde_json::Value::Object(doc).to_string())?;
        Ok(serde_json::from_str(&policy.to_json()).expect("a valid policy's JSON is a spec"))
    }

    /// The edit this form makes: a new limit (`original` empty), else the one
    /// named `original` replaced.
    pub fn edit(&self, original: &str) -> Result<ConfigEdit, AppError> {
        Ok(ConfigEdit::PutPolicy {
            original: named(original),
            policy: self.to_spec().map_err(invalid)?,
        })
    }

    pub fn from_spec(p: &PolicySpec) -> Self {
        PolicyForm {
            name: p.name.clone(),
            dimensions: p
                .dimensions
                .iter()
                .map(|d| dimension_name(*d))
                .collect::<Vec<_>>()
                .join(","),
            capacity: p.quota.capacity.to_string(),
            period: p.quota.period.clone(),
            refill: p.quota.refill.map(|r| r.to_string()).unwrap_or_default(),
            cost: p.cost.to_string(),
            failure_mode: failure_mode_name(p),
            local_share_percent: p
                .local_share_percent
                .map(|v| v.to_string())
                .unwrap_or_default(),
            max_in_flight: p.max_in_flight.map(|v| v.to_string()).unwrap_or_default(),
            algorithm: p.algorithm.name().to_string(),
            shadow: p.shadow,
            consistency: p.consistency.name().to_string(),
            max_overshoot: p.max_overshoot.map(|v| v.to_string()).unwrap_or_default(),
        }
    }
}

/// Splits a comma-separated list of names (policy lists in plan/route forms).
pub fn name_list(field: &str, raw: &str) -> Result<Vec<String>, PolicyError> {
    Ok(bounded(field, raw)?
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
}

/// The first-run form: one per-key limit (a capacity per period) on one plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartForm {
    pub plan: String,
    pub capacity: String,
    pub period: String,
}

impl StartForm {
    pub fn edit(&self) -> Result<ConfigEdit, AppError> {
        let plan = bounded("plan", &self.plan).map_err(invalid)?.to_string();
        floodgate_shared::policy::validate_name("plan", &plan).map_err(invalid)?;
        let form = PolicyForm {
            name: "default".into(),
            dimensions: "api_key".into(),
            capacity: self.capacity.clone(),
            period: self.period.clone(),
            failure_mode: "fail_closed".into(),
            ..PolicyForm::default()
        };
        Ok(ConfigEdit::Start {
            plan,
            policy: form.to_spec().map_err(invalid)?,
        })
    }
}

/// The plan form: a plan's name and its limits, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanForm {
    pub original: String,
    pub name: String,
    pub policies: String,
}

impl PlanForm {
    pub fn edit(&self) -> Result<ConfigEdit, AppError> {
        let name = bounded("name", &self.name).map_err(invalid)?.to_string();
        let policies = name_list("policies", &self.policies).map_err(invalid)?;
        Ok(ConfigEdit::PutPlan {
            original: named(&self.original),
            name,
            policies,
        })
    }
}

/// The route form: a route's name, path pattern and limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteForm {
    pub original: String,
    pub name: String,
    pub pattern: String,
    pub policies: String,
}

impl RouteForm {
    pub fn edit(&self) -> Result<ConfigEdit, AppError> {
        let route = RouteSpec {
            name: bounded("name", &self.name).map_err(invalid)?.to_string(),
            pattern: bounded("pattern", &self.pattern)
                .map_err(invalid)?
                .to_string(),
            policies: name_list("policies", &self.policies).map_err(invalid)?,
        };
        Ok(ConfigEdit::PutRoute {
            original: named(&self.original),
            route,
        })
    }
}

/// The key override form: a key id and the limits that replace its plan's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideForm {
    pub key_id: String,
    pub policies: String,
}

impl OverrideForm {
    pub fn edit(&self) -> Result<ConfigEdit, AppError> {
        let key_id = bounded("key_id", &self.key_id)
            .map_err(invalid)?
            .to_string();
        let policies = name_list("policies", &self.policies).map_err(invalid)?;
        if let Err(e) = floodgate_shared::keys::validate_key_id(&key_id) {
            return Err(AppError::invalid("key_id", e.message));
        }
        Ok(ConfigEdit::PutKeyOverride { key_id, policies })
    }
}

/// The response header options: the IETF fields on or off, and the Retry-After
/// jitter (whole seconds, 0-60; empty is 0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadersForm {
    #[serde(default, deserialize_with = "checkbox")]
    pub ietf: bool,
    pub retry_jitter_secs: String,
}

impl HeadersForm {
    pub fn edit(&self) -> Result<ConfigEdit, AppError> {
        let field = "headers.retry_jitter_secs";
        let retry_jitter_secs = match bounded(field, &self.retry_jitter_secs).map_err(invalid)? {
            "" => 0,
            t => t.parse::<u32>().map_err(|_| {
                AppError::invalid(field, "must be a whole number of seconds (0-60)")
            })?,
        };
        Ok(ConfigEdit::SetHeaders(HeaderSpec {
            ietf: self.ietf,
            retry_jitter_secs,
        }))
    }
}

/// The deny lists, one entry per line each, saved together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyForm {
    #[serde(default)]
    pub key_ids: String,
    #[serde(default)]
    pub ips: String,
    #[serde(default)]
    pub countries: String,
    #[serde(default)]
    pub user_agents: String,
}

impl DenyForm {
    /// An invalid entry is refused on its list's field (`deny.ips`), naming its
    /// line.
    pub fn edit(&self) -> Result<ConfigEdit, AppError> {
        use floodgate_shared::deny::{Deny, DenyList, DenySpec};
        let lines = |t: &str| -> Vec<String> {
            t.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        };
        let deny = DenySpec {
            key_ids: lines(&self.key_ids),
            ips: lines(&self.ips),
            countries: lines(&self.countries),
            user_agents: lines(&self.user_agents),
        };
        // each list is one field of the form: the error names the entry in its text
        if let Err(e) = Deny::new(&deny) {
            let list = DenyList::ALL
                .into_iter()
                .find(|l| e.field.starts_with(l.field()))
                .map_or("deny", DenyList::field);
            let entry = e.field[list.len()..]
                .trim_matches(['[', ']'])
                .parse::<usize>()
                .map(|i| format!("line {}: ", i + 1))
                .unwrap_or_default();
            return Err(AppError::invalid(list, format!("{entry}{}", e.message)));
        }
        Ok(ConfigEdit::SetDeny(deny))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe::describe_consistency;
    use floodgate_shared::policy::Consistency;

    fn form() -> PolicyForm {
        PolicyForm {
            name: "search".into(),
            dimensions: "api_key,endpoint".into(),
            capacity: "100".into(),
            period: "1m".into(),
            refill: "".into(),
            cost: "".into(),
            failure_mode: "fail_closed".into(),
            local_share_percent: "".into(),
            max_in_flight: "".into(),
            algorithm: "".into(),
            shadow: false,
            consistency: "".into(),
            max_overshoot: "".into(),
        }
    }

    fn bounded_form(bound: &str) -> PolicyForm {
        PolicyForm {
            consistency: "bounded".into(),
            max_overshoot: bound.into(),
            ..form()
        }
    }

    #[test]
    fn a_valid_form_becomes_the_spec_the_edge_parses() {
        let spec = form().to_spec().unwrap();
        assert_eq!(spec.quota.capacity, 100);
        assert_eq!(spec.cost, 1);
        assert_eq!(PolicyForm::from_spec(&spec).to_spec().unwrap(), spec);
        let mut f = form();
        f.failure_mode = "local_fallback".into();
        f.local_share_percent = "10".into();
        f.max_in_flight = "20".into();
        let spec = f.to_spec().unwrap();
        assert_eq!(
            (spec.local_share_percent, spec.max_in_flight),
            (Some(10), Some(20))
        );
        f.cost = "1".into();
        f.algorithm = "token_bucket".into();
        f.consistency = "exact".into();
        assert_eq!(PolicyForm::from_spec(&spec), f);
        let mut f = form();
        f.algorithm = "fixed_window".into();
        f.shadow = true;
        let spec = f.to_spec().unwrap();
        assert!(spec.shadow);
        assert_eq!(
            spec.algorithm,
            floodgate_shared::policy::Algorithm::FixedWindow
        );
    }

    #[test]
    fn a_bounded_form_round_trips_and_an_exact_one_stores_no_consistency() {
        let spec = bounded_form("20").to_spec().unwrap();
        assert_eq!(
            (spec.consistency, spec.max_overshoot),
            (Consistency::Bounded, Some(20))
        );
        let back = PolicyForm::from_spec(&spec);
        assert_eq!(
            (back.consistency.as_str(), back.max_overshoot.as_str()),
            ("bounded", "20")
        );
        assert_eq!(back.to_spec().unwrap(), spec);
        assert_eq!(describe_consistency(&spec), "bounded, at most 20 over");
        let mut auto = bounded_form("100");
        auto.consistency = "auto".into();
        assert_eq!(auto.to_spec().unwrap().consistency, Consistency::Auto);
        // exact, chosen or by default: nothing in the JSON the edge stores
        for c in ["", "exact"] {
            let mut f = form();
            f.consistency = c.into();
            let spec = f.to_spec().unwrap();
            assert_eq!(
                (spec.consistency, spec.max_overshoot),
                (Consistency::Exact, None)
            );
            let json = serde_json::to_string(&spec).unwrap();
            assert!(
                !json.contains("consistency") && !json.contains("max_overshoot"),
                "{json}"
            );
            assert_eq!(describe_consistency(&spec), "exact");
        }
    }

    #[test]
    fn a_bad_consistency_or_bound_is_named_by_the_edges_rules() {
        type Edit = fn(&mut PolicyForm);
        let cases: [(PolicyForm, Edit, &str, &str); 11] = [
            (bounded_form(""), |_| {}, "max_overshoot", "is required"),
            (
                bounded_form("0"),
                |_| {},
                "max_overshoot",
                "between 1 and quota.capacity",
            ),
            (bounded_form("101"), |_| {}, "max_overshoot", "got 101"),
            (bounded_form("-1"), |_| {}, "max_overshoot", "whole number"),
            (bounded_form("1.5"), |_| {}, "max_overshoot", "whole number"),
            (
                form(),
                |f| f.max_overshoot = "5".into(),
                "max_overshoot",
                "only applies",
            ),
            (
                bounded_form("5"),
                |f| f.algorithm = "sliding_log".into(),
                "consistency",
                "cannot lease",
            ),
            (
                bounded_form("5"),
                |f| f.algorithm = "fixed_window".into(),
                "consistency",
                "cannot lease",
            ),
            (
                bounded_form("5"),
                |f| f.shadow = true,
                "consistency",
                "shadow",
            ),
            (
                bounded_form("5"),
                |f| f.max_in_flight = "3".into(),
                "consistency",
                "max_in_flight",
            ),
            (
                bounded_form("5"),
                |f| f.consistency = "eventual".into(),
                "consistency",
                "unknown variant",
            ),
        ];
        for (mut f, edit, field, says) in cases {
            edit(&mut f);
            let e = f.to_spec().unwrap_err();
            assert_eq!(e.field, field, "{f:?} → {e}");
            assert!(e.message.contains(says), "{f:?} → {e}");
            assert!(POLICY_FIELDS.contains(&e.field.as_str()));
        }
    }

    #[test]
    fn each_bad_field_is_named_as_the_edge_names_it() {
        type Edit = fn(&mut PolicyForm);
        let cases: [(Edit, &str); 16] = [
            (|f| f.algorithm = "leaky".into(), "algorithm"),
            (
                |f| {
                    f.algorithm = "sliding_log".into();
                    f.capacity = "20000".into()
                },
                "quota.capacity",
            ),
            (|f| f.max_in_flight = "0".into(), "max_in_flight"),
            (
                |f| {
                    f.failure_mode = "local_fallback".into();
                    f.local_share_percent = "101".into()
                },
                "local_share_percent",
            ),
            (|f| f.capacity = "abc".into(), "quota.capacity"),
            (|f| f.capacity = "".into(), "quota.capacity"),
            (|f| f.capacity = "0".into(), "quota.capacity"),
            (|f| f.capacity = "-5".into(), "quota.capacity"),
            (|f| f.capacity = "1.5".into(), "quota.capacity"),
            (
                |f| f.capacity = "99999999999999999999999".into(),
                "quota.capacity",
            ),
            (|f| f.period = "1 fortnight".into(), "quota.period"),
            (|f| f.refill = "1e3".into(), "quota.refill"),
            (|f| f.cost = "x".into(), "cost"),
            (|f| f.name = "<script>".into(), "name"),
            (|f| f.dimensions = "api_key,planet".into(), "dimensions[1]"),
            (|f| f.failure_mode = "maybe".into(), "failure_mode"),
        ];
        for (edit, field) in cases {
            let mut f = form();
            edit(&mut f);
            let e = f.to_spec().unwrap_err();
            assert_eq!(e.field, field, "{f:?} → {e}");
        }
        let e = PolicyError::new("dimensions[1]", "unknown");
        assert_eq!(
            AppError::from_policy(e, None).message_for("dimensions"),
            Some("unknown".into())
        );
        let e = PolicyError::new("plans.a[0]", "no policy");
        assert!(
            matches!(AppError::from_policy(e, None), AppError::Invalid { field, .. } if field == "plans.a")
        );
        let mut f = form();
        f.name = "x".repeat(1 << 20);
        assert!(f.to_spec().unwrap_err().message.contains("longer than"));
    }

    #[test]
    fn a_checkbox_is_ticked_by_what_browsers_send_and_islands_serialize() {
        let read = |q: &str| -> PolicyForm {
            serde_json::from_value(serde_json::json!({
                "name": "n", "dimensions": "api_key", "capacity": "1", "period": "1m",
                "refill": "", "cost": "", "failure_mode": "fail_closed", "shadow": q,
            }))
            .unwrap()
        };
        assert!(read("on").shadow && read("true").shadow && read("1").shadow);
        assert!(!read("").shadow && !read("off").shadow);
        let mut ticked = form();
        ticked.shadow = true;
        let props = serde_json::to_string(&ticked).unwrap();
        assert_eq!(serde_json::from_str::<PolicyForm>(&props).unwrap(), ticked);
        let mut bare = serde_json::to_value(form()).unwrap();
        bare.as_object_mut().unwrap().retain(|k, _| {
            !matches!(
                k.as_str(),
                "shadow"
                    | "algorithm"
                    | "consistency"
                    | "max_overshoot"
                    | "local_share_percent"
                    | "max_in_flight"
            )
        });
        assert_eq!(
            serde_json::from_value::<PolicyForm>(bare).unwrap(),
            form(),
            "optional fields default"
        );
    }

    #[test]
    fn each_form_becomes_its_edit_or_names_its_bad_field() {
        let plan = PlanForm {
            original: "".into(),
            name: " gold ".into(),
            policies: "default, search,".into(),
        };
        assert_eq!(
            plan.edit().unwrap(),
            ConfigEdit::PutPlan {
                original: None,
                name: "gold".into(),
                policies: vec!["default".into(), "search".into()]
            }
        );
        let field = |r: Result<ConfigEdit, AppError>| match r {
            Err(AppError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let long = "x".repeat(MAX_FIELD_CHARS + 1);
        assert_eq!(
            field(
                PlanForm {
                    name: long.clone(),
                    ..plan.clone()
                }
                .edit()
            ),
            "name"
        );
        let route = RouteForm {
            original: "search".into(),
            name: "search".into(),
            pattern: long.clone(),
            policies: "search".into(),
        };
        assert_eq!(field(route.edit()), "pattern");
        let o = OverrideForm {
            key_id: "<b>".into(),
            policies: "default".into(),
        };
        assert_eq!(field(o.edit()), "key_id");
        let h = HeadersForm {
            ietf: true,
            retry_jitter_secs: "".into(),
        };
        assert_eq!(
            h.edit().unwrap(),
            ConfigEdit::SetHeaders(HeaderSpec {
                ietf: true,
                retry_jitter_secs: 0
            })
        );
        let soon = HeadersForm {
            retry_jitter_secs: "soon".into(),
            ..h
        };
        assert_eq!(field(soon.edit()), "headers.retry_jitter_secs");
        let deny = DenyForm {
            ips: "203.0.113.7\n\nnot an address\n".into(),
            ..DenyForm::default()
        };
        match deny.edit() {
            Err(AppError::Invalid { field, message, .. }) => {
                assert_eq!(field, "deny.ips");
                assert!(message.starts_with("line 2: "), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let limit = form().edit("search").unwrap();
        assert!(matches!(limit, ConfigEdit::PutPolicy { original: Some(o), .. } if o == "search"));
    }
}
