//! Bucket key naming.
//!
//! ```text
//! fg:{k:<key id>}:<policy>[:e:<route>][:ip:<client ip>]   policies keyed by API key or identity,
//!                                                          for a key without an identity
//! fg:{i:<identity>}:<policy>[:k:<key id>][:e:<route>][:ip:<client ip>]
//!                                                          the same for a key with an identity
//!                                                          (`:k:` for api_key policies only)
//! fg:{ip:<client ip>}:<policy>[:e:<route>]                 keyed by IP, not by API key
//! fg:{e:<route>}:<policy>                                  keyed by route alone
//! fg:{k:<key id>}::credits                                 a key's live credits (no identity)
//! fg:{i:<identity>}::credits:k:<key id>                    a key's live credits (with identity)
//! ```
//!
//! - A key holds exactly the policy's dimensions and nothing else: a per-API-key
//!   policy has no route in its key, so its bucket is shared by every endpoint.
//! - An `identity` policy's bucket is shared by every key of the identity; a key
//!   without an identity falls back to its own id, so its bucket is named exactly
//!   as an `api_key` policy's of the same name would be.
//! - The policy name is part of the key, so two policies on the same dimensions
//!   (say 10/s and 1000/h) never share a bucket.
//! - The Redis Cluster hash tag (`{...}`) is the request's principal: its API key's
//!   identity when it has one, else the API key when the policy has one, else its
//!   IP, else its route. All buckets one request checks for one principal hash to
//!   one slot, so one atomic script can check them together, also on Redis
//!   Cluster. (So a key's own buckets are named by its identity once it has one:
//!   giving a key an identity, or another one, starts its buckets afresh.)
//! - Only validated values enter a key: key ids and names are `[A-Za-z0-9_-]`,
//!   identities `[A-Za-z0-9_.@-]`, routes are configured route names (never raw
//!   paths, so no request can mint a new key), IPv6 addresses are grouped by /64
//!   (one end site). A key is at most [`MAX_KEY_LEN`] bytes.
//! - A key's credits ([`credits_key`]) live next to its buckets, in the same hash
//!   tag, so they are decided in the same atomic call. The empty segment (`::`)
//!   cannot occur in a bucket key (policy names are never empty), so no policy,
//!   not even one named `credits`, can share their Redis key.

use std::net::IpAddr;

use crate::keyrecord::{MAX_IDENTITY_LEN, check_identity};
use crate::policy::{Dimension, MAX_NAME_LEN, Policy, PolicyError, validate_name};

pub const KEY_PREFIX: &str = "fg:";
/// The longest IP part: `ffff:ffff:ffff:ffff::/64`.
const MAX_IP_LEN: usize = 24;
/// The longest bucket key any policy and request can produce: an api_key policy
/// with endpoint and client_ip, for a key with an identity.
pub const MAX_KEY_LEN: usize = KEY_PREFIX.len()
    + "{i:}:".len()
    + MAX_IDENTITY_LEN
    + ":k:".len()
    + MAX_NAME_LEN * 3
    + ":e:".len()
    + ":ip:".len()
    + MAX_IP_LEN;

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

/// The bucket key of `policy` for `subject`, whose API key (if any) has no
/// identity.
pub fn bucket_key(policy: &Policy, subject: &Subject<'_>) -> Result<String, KeyError> {
    identity_bucket_key(policy, subject, None)
}

/// The API key id a policy keyed by api_key or identity needs (validated).
fn key_id<'a>(policy: &Policy, subject: &Subject<'a>) -> Result<Option<&'a str>, KeyError> {
    let dimension = if policy.has(Dimension::ApiKey) {
        Dimension::ApiKey
    } else if policy.has(Dimension::Identity) {
        Dimension::Identity
    } else {
        return Ok(None);
    };
    let id = subject.api_key_id.ok_or_else(|| KeyError::Missing {
        policy: policy.name().to_string(),
        dimension,
    })?;
    validate_key_id(id)?;
    Ok(Some(id))
}

/// The bucket key of `policy` for `subject`, whose API key belongs to
/// `identity` (`None`: it has none, and falls back to its own id).
pub fn identity_bucket_key(
    policy: &Policy,
    subject: &Subject<'_>,
    identity: Option<&str>,
) -> Result<String, KeyError> {
    let missing = |dimension| KeyError::Missing {
        policy: policy.name().to_string(),
        dimension,
    };
    let key_id = key_id(policy, subject)?;
    let identity = match identity.filter(|_| key_id.is_some()) {
        Some(i) => {
            check_identity(i).map_err(|e| KeyError::Invalid(e.into()))?;
            Some(i)
        }
        None => None,
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

    // piece by piece, without the formatting machinery (a request names its
    // buckets on every check)
    let mut key = String::with_capacity(64);
    let mut push = |parts: &[&str]| parts.iter().for_each(|p| key.push_str(p));
    push(&[KEY_PREFIX]);
    match (key_id, identity, &ip, route) {
        (Some(_), Some(i), _, _) => push(&["{i:", i, "}:", policy.name()]),
        (Some(id), None, _, _) => push(&["{k:", id, "}:", policy.name()]),
        (None, _, Some(ip), _) => push(&["{ip:", ip, "}:", policy.name()]),
        (None, _, None, Some(r)) => push(&["{e:", r, "}:", policy.name()]),
        (None, _, None, None) => unreachable!("a validated policy has at least one dimension"),
    }
    if let (Some(id), Some(_), true) = (key_id, identity, policy.has(Dimension::ApiKey)) {
        push(&[":k:", id]);
    }
    if let (Some(r), true) = (route, key_id.is_some() || ip.is_some()) {
        push(&[":e:", r]);
    }
    if let (Some(ip), Some(_)) = (&ip, key_id) {
        push(&[":ip:", ip]);
    }
    debug_assert!(key.len() <= MAX_KEY_LEN);
    Ok(key)
}

/// The Redis key of the live credits of the API key `id` (its [`crate::credits`]),
/// in the hash tag of the key's own buckets: its identity's when it has one.
/// `id` and `identity` are validated record fields.
pub fn credits_key(id: &str, identity: Option<&str>) -> String {
    match identity {
        Some(i) => format!("{KEY_PREFIX}{{i:{i}}}::credits:k:{id}"),
        None => format!("{KEY_PREFIX}{{k:{id}}}::credits"),
    }
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
    fn credits_live_in_the_slot_of_the_keys_buckets_and_never_in_a_buckets_key() {
        let p = policy("credits", r#"["api_key"]"#);
        let s = subject();
        let plain = credits_key("Ab3_x-9", None);
        assert_eq!(plain, "fg:{k:Ab3_x-9}::credits");
        assert_eq!(hash_tag(&plain), hash_tag(&bucket_key(&p, &s).unwrap()));
        assert_ne!(plain, bucket_key(&p, &s).unwrap());
        let shared = credits_key("Ab3_x-9", Some("cus_1"));
        assert_eq!(shared, "fg:{i:cus_1}::credits:k:Ab3_x-9");
        let b = identity_bucket_key(&p, &s, Some("cus_1")).unwrap();
        assert_eq!(hash_tag(&shared), hash_tag(&b));
        assert_ne!(shared, b);
        assert!(shared.len() <= MAX_KEY_LEN);
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
    fn the_keys_of_one_identity_share_its_bucket_and_a_key_without_one_has_its_own() {
        let s = subject();
        let other = Subject {
            api_key_id: Some("Other-key"),
            ..subject()
        };
        let shared = policy("shared", r#"["identity"]"#);
        let ours = identity_bucket_key(&shared, &s, Some("cus_42@acme.test")).unwrap();
        assert_eq!(ours, "fg:{i:cus_42@acme.test}:shared");
        assert_eq!(
            identity_bucket_key(&shared, &other, Some("cus_42@acme.test")).unwrap(),
            ours
        );
        // no identity: the key's own id, named as an api_key policy's bucket would be
        let alone = identity_bucket_key(&shared, &s, None).unwrap();
        assert_eq!(alone, "fg:{k:Ab3_x-9}:shared");
        assert_eq!(
            alone,
            bucket_key(&policy("shared", r#"["api_key"]"#), &s).unwrap()
        );
        assert_eq!(bucket_key(&shared, &s).unwrap(), alone);
        let cases = [
            (r#"["identity","endpoint"]"#, "fg:{i:cus_1}:p:e:search"),
            (
                r#"["identity","client_ip"]"#,
                "fg:{i:cus_1}:p:ip:203.0.113.7",
            ),
            (r#"["api_key"]"#, "fg:{i:cus_1}:p:k:Ab3_x-9"),
            (
                r#"["api_key","endpoint","client_ip"]"#,
                "fg:{i:cus_1}:p:k:Ab3_x-9:e:search:ip:203.0.113.7",
            ),
            // no API key in the policy: the identity plays no part
            (
                r#"["client_ip","endpoint"]"#,
                "fg:{ip:203.0.113.7}:p:e:search",
            ),
            (r#"["endpoint"]"#, "fg:{e:search}:p"),
        ];
        for (dims, expected) in cases {
            let key = identity_bucket_key(&policy("p", dims), &s, Some("cus_1")).unwrap();
            assert_eq!(key, expected, "{dims}");
        }
    }

    #[test]
    fn without_an_identity_every_existing_key_name_is_unchanged() {
        let s = subject();
        for dims in [
            r#"["api_key"]"#,
            r#"["api_key","endpoint"]"#,
            r#"["api_key","client_ip"]"#,
            r#"["client_ip","endpoint"]"#,
            r#"["endpoint"]"#,
        ] {
            let p = policy("p", dims);
            assert_eq!(
                identity_bucket_key(&p, &s, None),
                bucket_key(&p, &s),
                "{dims}"
            );
        }
    }

    #[test]
    fn all_buckets_of_a_key_with_an_identity_share_its_hash_tag() {
        let s = subject();
        let tags: Vec<_> = [
            r#"["identity"]"#,
            r#"["identity","endpoint"]"#,
            r#"["api_key"]"#,
            r#"["api_key","client_ip"]"#,
        ]
        .iter()
        .map(|d| {
            let key = identity_bucket_key(&policy("p", d), &s, Some("cus_1")).unwrap();
            hash_tag(&key).to_string()
        })
        .collect();
        assert!(tags.iter().all(|t| t == "i:cus_1"), "{tags:?}");
    }

    #[test]
    fn a_missing_key_or_a_hostile_identity_is_an_error_not_a_key() {
        let p = policy("p", r#"["identity"]"#);
        let keyless = Subject {
            api_key_id: None,
            ..subject()
        };
        assert!(matches!(
            identity_bucket_key(&p, &keyless, Some("cus_1")),
            Err(KeyError::Missing {
                dimension: Dimension::Identity,
                ..
            })
        ));
        for bad in ["", "a b", "a}b", "a{b", "a:b", "é", &"i".repeat(65)] {
            let e = identity_bucket_key(&p, &subject(), Some(bad));
            assert!(
                matches!(&e, Err(KeyError::Invalid(p)) if p.field == "identity"),
                "{bad:?}: {e:?}"
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
        // without an identity: the longest key as it always was
        let v1_longest = KEY_PREFIX.len()
            + "{k:}:".len()
            + MAX_NAME_LEN * 3
            + ":e:".len()
            + ":ip:".len()
            + MAX_IP_LEN;
        assert_eq!(bucket_key(&p, &s).unwrap().len(), v1_longest);
        let identity = "c".repeat(MAX_IDENTITY_LEN);
        let longest = identity_bucket_key(&p, &s, Some(&identity)).unwrap();
        assert_eq!(longest.len(), MAX_KEY_LEN);
    }

    #[test]
    fn hash_tag_follows_redis_rules() {
        assert_eq!(hash_tag("fg:{k:a}:p"), "k:a");
        assert_eq!(hash_tag("plain"), "plain");
        assert_eq!(hash_tag("a{}b"), "a{}b");
        assert_eq!(hash_tag("a{b"), "a{b");
    }
}
