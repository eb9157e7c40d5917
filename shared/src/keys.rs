//! Bucket key naming.
//!
//! ```text
//! fg:{k:<key id>}:<policy>[:e:<route>][:ip:<client ip>]   policies keyed by API key
//! fg:{ip:<client ip>}:<policy>[:e:<route>]                 keyed by IP, not by API key
//! fg:{e:<route>}:<policy>                                  keyed by route alone
//! ```
//!
//! - A key holds exactly the policy's dimensions and nothing else: a per-API-key
//!   policy has no route in its key, so its bucket is shared by every endpoint.
//! - The policy name is part of the key, so two policies on the same dimensions
//!   (say 10/s and 1000/h) never share a bucket.
//! - The Redis Cluster hash tag (`{...}`) is the request's principal: its API key
//!   when the policy has one, else its IP, else its route. All buckets one request
//!   checks for one principal hash to one slot, so one atomic script can check them
//!   together, also on Redis Cluster.
//! - Only validated values enter a key: key ids and names are `[A-Za-z0-9_-]`,
//!   routes are configured route names (never raw paths, so no request can mint a
//!   new key), IPv6 addresses are grouped by /64 (one end site). A key is at most
//!   [`MAX_KEY_LEN`] bytes.

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::policy::{Dimension, MAX_NAME_LEN, Policy, PolicyError, validate_name};

pub const KEY_PREFIX: &str = "fg:";
/// The longest IP part: `ffff:ffff:ffff:ffff::/64`.
const MAX_IP_LEN: usize = 24;
/// The longest bucket key any policy and request can produce.
pub const MAX_KEY_LEN: usize =
    KEY_PREFIX.len() + "{k:}:".len() + MAX_NAME_LEN * 3 + ":e:".len() + ":ip:".len() + MAX_IP_LEN;

/// Who and what a request is, as far as bucket keys are concerned.
#[derive(Debug, Clone, Copy, Default)]
pub struct Subject<'a> {
    /// The authenticated API key's id (never its secret).
    pub api_key_id: Option<&'a str>,
    /// The configured route the request matched.
    pub route: Option<&'a str>,
    pub client_ip: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("policy {policy:?} is keyed by {dimension:?} but the request has none")]
    Missing {
        policy: String,
        dimension: Dimension,
    },
    #[error(transparent)]
    Invalid(#[from] PolicyError),
}

/// Validates an API key id: 1-32 characters of `[A-Za-z0-9_-]`.
pub fn validate_key_id(id: &str) -> Result<(), PolicyError> {
    if id.is_empty()
        || id.len() > MAX_NAME_LEN
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(PolicyError::new(
            "api_key_id",
            "must be 1-32 characters of A-Z, a-z, 0-9, '_' and '-'",
        ));
    }
    Ok(())
}

/// The client address as it appears in keys: IPv4 as is (also when mapped into
/// IPv6), IPv6 as its /64 prefix.
pub fn ip_part(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                let prefix = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{prefix}/64")
            }
        },
    }
}

/// The bucket key of `policy` for `subject`.
pub fn bucket_key(policy: &Policy, subject: &Subject<'_>) -> Result<String, KeyError> {
    let missing = |dimension| KeyError::Missing {
        policy: policy.name().to_string(),
        dimension,
    };
    let key_id = if policy.has(Dimension::ApiKey) {
        let id = subject
            .api_key_id
            .ok_or_else(|| missing(Dimension::ApiKey))?;
        validate_key_id(id)?;
        Some(id)
    } else {
        None
    };
    let route = if policy.has(Dimension::Endpoint) {
        let r = subject.route.ok_or_else(|| missing(Dimension::Endpoint))?;
        validate_name("route", r)?;
        Some(r)
    } else {
        None
    };
    let ip = if policy.has(Dimension::ClientIp) {
        Some(ip_part(
            subject
                .client_ip
                .ok_or_else(|| missing(Dimension::ClientIp))?,
        ))
    } else {
        None
    };

    let mut key = String::with_capacity(64);
    key.push_str(KEY_PREFIX);
    // writing into a String cannot fail
    let _ = match (key_id, &ip, route) {
        (Some(id), _, _) => write!(key, "{{k:{id}}}:{}", policy.name()),
        (None, Some(ip), _) => write!(key, "{{ip:{ip}}}:{}", policy.name()),
        (None, None, Some(r)) => write!(key, "{{e:{r}}}:{}", policy.name()),
        (None, None, None) => unreachable!("a validated policy has at least one dimension"),
    };
    if let (Some(r), true) = (route, key_id.is_some() || ip.is_some()) {
        let _ = write!(key, ":e:{r}");
    }
    if let (Some(ip), Some(_)) = (&ip, key_id) {
        let _ = write!(key, ":ip:{ip}");
    }
    debug_assert!(key.len() <= MAX_KEY_LEN);
    Ok(key)
}

/// The part of a key Redis Cluster hashes: the text between the first `{` and the
/// next `}` when non-empty, else the whole key.
pub fn hash_tag(key: &str) -> &str {
    match key
        .find('{')
        .and_then(|open| Some((open, key[open + 1..].find('}')?)))
    {
        Some((open, len)) if len > 0 => &key[open + 1..open + 1 + len],
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, dims: &str) -> Policy {
        Policy::from_json(&format!(
            r#"{{"name":"{name}","dimensions":{dims},"quota":{{"capacity":10,"period":"1m"}},"failure_mode":"fail_open"}}"#
        ))
        .unwrap()
    }

    fn subject() -> Subject<'static> {
        Subject {
            api_key_id: Some("Ab3_x-9"),
            route: Some("search"),
            client_ip: Some("203.0.113.7".parse().unwrap()),
        }
    }

    #[test]
    fn keys_hold_exactly_the_enforced_dimensions() {
        let s = subject();
        let cases = [
            (r#"["api_key"]"#, "fg:{k:Ab3_x-9}:default"),
            (
                r#"["api_key","endpoint"]"#,
                "fg:{k:Ab3_x-9}:default:e:search",
            ),
            (
                r#"["endpoint","api_key"]"#,
                "fg:{k:Ab3_x-9}:default:e:search",
            ),
            (
                r#"["api_key","client_ip"]"#,
                "fg:{k:Ab3_x-9}:default:ip:203.0.113.7",
            ),
            (
                r#"["api_key","endpoint","client_ip"]"#,
                "fg:{k:Ab3_x-9}:default:e:search:ip:203.0.113.7",
            ),
            (r#"["client_ip"]"#, "fg:{ip:203.0.113.7}:default"),
            (
                r#"["client_ip","endpoint"]"#,
                "fg:{ip:203.0.113.7}:default:e:search",
            ),
            (r#"["endpoint"]"#, "fg:{e:search}:default"),
        ];
        for (dims, expected) in cases {
            assert_eq!(
                bucket_key(&policy("default", dims), &s).unwrap(),
                expected,
                "{dims}"
            );
        }
    }

    #[test]
    fn all_buckets_of_one_api_key_share_a_hash_tag() {
        let s = subject();
        let tags: Vec<_> = [
            r#"["api_key"]"#,
            r#"["api_key","endpoint"]"#,
            r#"["api_key","client_ip"]"#,
        ]
        .iter()
        .map(|d| hash_tag(&bucket_key(&policy("p", d), &s).unwrap()).to_string())
        .collect();
        assert!(tags.iter().all(|t| t == "k:Ab3_x-9"), "{tags:?}");
    }

    #[test]
    fn ipv6_is_grouped_by_64_and_mapped_ipv4_is_plain_ipv4() {
        assert_eq!(
            ip_part("2001:db8:1:2:aaaa:bbbb:cccc:dddd".parse().unwrap()),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            ip_part("2001:db8:1:2::1".parse().unwrap()),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            ip_part("::ffff:198.51.100.1".parse().unwrap()),
            "198.51.100.1"
        );
        let longest = ip_part("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap());
        assert_eq!(longest.len(), MAX_IP_LEN);
    }

    #[test]
    fn a_missing_or_hostile_dimension_value_is_an_error_not_a_key() {
        let p = policy("p", r#"["api_key","endpoint"]"#);
        let mut s = subject();
        s.route = None;
        assert!(matches!(
            bucket_key(&p, &s),
            Err(KeyError::Missing {
                dimension: Dimension::Endpoint,
                ..
            })
        ));
        for bad_route in [
            "",
            "/v1/search",
            "Search",
            "a}b",
            "a{b",
            "x".repeat(33).as_str(),
            "s\u{0}",
        ] {
            let s = Subject {
                route: Some(bad_route),
                ..subject()
            };
            assert!(bucket_key(&p, &s).is_err(), "{bad_route:?}");
        }
        for bad_id in ["", "a b", "k}x", "é", &"k".repeat(33)] {
            let s = Subject {
                api_key_id: Some(bad_id),
                ..subject()
            };
            assert!(bucket_key(&p, &s).is_err(), "{bad_id:?}");
        }
    }

    #[test]
    fn the_longest_key_fits_the_bound() {
        let name = "n".repeat(MAX_NAME_LEN);
        let p = policy(&name, r#"["api_key","endpoint","client_ip"]"#);
        let id = "i".repeat(MAX_NAME_LEN);
        let route = "r".repeat(MAX_NAME_LEN);
        let s = Subject {
            api_key_id: Some(&id),
            route: Some(&route),
            client_ip: Some("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap()),
        };
        assert_eq!(bucket_key(&p, &s).unwrap().len(), MAX_KEY_LEN);
    }

    #[test]
    fn hash_tag_follows_redis_rules() {
        assert_eq!(hash_tag("fg:{k:a}:p"), "k:a");
        assert_eq!(hash_tag("plain"), "plain");
        assert_eq!(hash_tag("a{}b"), "a{}b");
        assert_eq!(hash_tag("a{b"), "a{b");
    }
}
