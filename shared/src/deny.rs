//! Deny lists: API key ids, client addresses (single IPs and CIDR ranges, v4 and
//! v6), countries (ISO 3166-1 alpha-2, as the Worker's `request.cf.country` or
//! the native host's `--country-header` gives them) and user-agent substrings
//! (case-insensitive). They are the `deny` section of the configuration, so they
//! are validated, versioned, audited and cached at the edge with it: checking
//! them costs no store call. A denied request is answered 403 before any bucket
//! is checked, naming nothing about which list matched, and is counted per list
//! ([`crate::stats::StatsField::Denied`]).
//!
//! ```json
//! "deny": {"key_ids": ["Ab3dE5gH1j"], "ips": ["203.0.113.7", "198.51.100.0/24", "2001:db8::/32"],
//!          "countries": ["KP"], "user_agents": ["BadBot"]}
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::policy::PolicyError;

/// The most entries one list may hold.
pub const MAX_DENY_ENTRIES: usize = 4096;
/// The longest user-agent substring.
pub const MAX_USER_AGENT_LEN: usize = 256;

/// The `deny` section as the operator writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenySpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_ids: Vec<String>,
    /// Addresses (`203.0.113.7`) and CIDR ranges (`198.51.100.0/24`, `2001:db8::/32`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// ISO 3166-1 alpha-2 codes, upper case (`DE`); Cloudflare's `T1` (Tor) and `XX`
    /// (unknown) are accepted too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub countries: Vec<String>,
    /// Substrings of the `User-Agent` header, matched case-insensitively.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_agents: Vec<String>,
}

impl DenySpec {
    pub fn is_empty(&self) -> bool {
        self.key_ids.is_empty()
            && self.ips.is_empty()
            && self.countries.is_empty()
            && self.user_agents.is_empty()
    }

    /// The entries of one list.
    pub fn list(&self, list: DenyList) -> &Vec<String> {
        match list {
            DenyList::KeyId => &self.key_ids,
            DenyList::Ip => &self.ips,
            DenyList::Country => &self.countries,
            DenyList::UserAgent => &self.user_agents,
        }
    }

    pub fn list_mut(&mut self, list: DenyList) -> &mut Vec<String> {
        match list {
            DenyList::KeyId => &mut self.key_ids,
            DenyList::Ip => &mut self.ips,
            DenyList::Country => &mut self.countries,
            DenyList::UserAgent => &mut self.user_agents,
        }
    }
}

/// One of the four lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyList {
    KeyId,
    Ip,
    Country,
    UserAgent,
}

impl DenyList {
    pub const ALL: [DenyList; 4] = [
        DenyList::KeyId,
        DenyList::Ip,
        DenyList::Country,
        DenyList::UserAgent,
    ];

    /// The list's name in stats fields, the CLI and forms: `key_id`, `ip`,
    /// `country`, `user_agent`.
    pub fn name(self) -> &'static str {
        match self {
            DenyList::KeyId => "key_id",
            DenyList::Ip => "ip",
            DenyList::Country => "country",
            DenyList::UserAgent => "user_agent",
        }
    }

    /// The field of [`DenySpec`] holding the list (in error messages).
    pub fn field(self) -> &'static str {
        match self {
            DenyList::KeyId => "deny.key_ids",
            DenyList::Ip => "deny.ips",
            DenyList::Country => "deny.countries",
            DenyList::UserAgent => "deny.user_agents",
        }
    }
}

impl fmt::Display for DenyList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Not one of the four list names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a deny list (key_id, ip, country, user_agent)")]
pub struct UnknownList(pub String);

impl FromStr for DenyList {
    type Err = UnknownList;
    fn from_str(s: &str) -> Result<Self, UnknownList> {
        DenyList::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| UnknownList(s.to_string()))
    }
}

/// An address entry: a single IP or a CIDR range whose host bits are zero.
pub fn parse_net(entry: &str) -> Result<IpNet, String> {
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Ok(IpNet::from(ip));
    }
    let net: IpNet = entry.parse().map_err(|_| {
        format!("{entry:?} is not an IP address or CIDR range (203.0.113.7, 198.51.100.0/24, 2001:db8::/32)")
    })?;
    if net.trunc() != net {
        return Err(format!(
            "{entry:?} has host bits set: did you mean {}?",
            net.trunc()
        ));
    }
    Ok(net)
}

/// A country entry: two upper-case ASCII letters (ISO 3166-1 alpha-2), or `T1`.
pub fn valid_country(entry: &str) -> bool {
    let b = entry.as_bytes();
    entry == "T1" || (b.len() == 2 && b.iter().all(u8::is_ascii_uppercase))
}

/// The validated lists, ready to match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deny {
    key_ids: BTreeSet<String>,
    nets: Vec<IpNet>,
    countries: BTreeSet<String>,
    /// Lower case.
    user_agents: Vec<String>,
}

/// What a request shows the deny lists.
#[derive(Debug, Clone, Copy, Default)]
pub struct Visitor<'a> {
    pub key_id: Option<&'a str>,
    pub ip: Option<IpAddr>,
    pub country: Option<&'a str>,
    pub user_agent: Option<&'a [u8]>,
}

fn entry_error(list: DenyList, i: usize, message: impl Into<String>) -> PolicyError {
    PolicyError::new(format!("{}[{i}]", list.field()), message)
}

impl Deny {
    /// Validates `spec`; every error names its entry (`deny.ips[2]`).
    pub fn new(spec: &DenySpec) -> Result<Self, PolicyError> {
        let mut deny = Deny::default();
        for list in DenyList::ALL {
            let entries = spec.list(list);
            if entries.len() > MAX_DENY_ENTRIES {
                return Err(PolicyError::new(
                    list.field(),
                    format!("must hold at most {MAX_DENY_ENTRIES} entries"),
                ));
            }
            for (i, e) in entries.iter().enumerate() {
                let bad = |m: String| entry_error(list, i, m);
                match list {
                    DenyList::KeyId => {
                        crate::keys::validate_key_id(e).map_err(|k| bad(k.message))?;
                        deny.key_ids.insert(e.clone());
                    }
                    DenyList::Ip => deny.nets.push(parse_net(e).map_err(bad)?),
                    DenyList::Country => {
                        if !valid_country(e) {
                            return Err(bad(format!(
                                "{e:?} is not an ISO 3166-1 alpha-2 country code (two upper-case letters, such as DE)"
                            )));
                        }
                        deny.countries.insert(e.clone());
                    }
                    DenyList::UserAgent => {
                        if e.trim().is_empty() {
                            return Err(bad("must not be empty".into()));
                        }
                        if e.len() > MAX_USER_AGENT_LEN || e.chars().any(char::is_control) {
                            return Err(bad(format!(
                                "must be at most {MAX_USER_AGENT_LEN} bytes of printable text"
                            )));
                        }
                        deny.user_agents.push(e.to_lowercase());
                    }
                }
            }
        }
        Ok(deny)
    }

    pub fn is_empty(&self) -> bool {
        self.key_ids.is_empty()
            && self.nets.is_empty()
            && self.countries.is_empty()
            && self.user_agents.is_empty()
    }

    /// The first list `v` is on (key id, address, country, user agent), if any.
    pub fn matches(&self, v: &Visitor<'_>) -> Option<DenyList> {
        if v.key_id.is_some_and(|k| self.key_ids.contains(k)) {
            return Some(DenyList::KeyId);
        }
        if let Some(ip) = v.ip {
            // an IPv4-mapped IPv6 address is its IPv4 address
            let ip = match ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                v4 => v4,
            };
            if self.nets.iter().any(|n| n.contains(&ip)) {
                return Some(DenyList::Ip);
            }
        }
        if v.country.is_some_and(|c| {
            c.len() == 2 && self.countries.contains(c.to_ascii_uppercase().as_str())
        }) {
            return Some(DenyList::Country);
        }
        if let Some(ua) = v.user_agent
            && !self.user_agents.is_empty()
        {
            let ua = String::from_utf8_lossy(ua).to_lowercase();
            if self.user_agents.iter().any(|s| ua.contains(s.as_str())) {
                return Some(DenyList::UserAgent);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(ips: &[&str]) -> DenySpec {
        DenySpec {
            ips: ips.iter().map(|s| s.to_string()).collect(),
            ..DenySpec::default()
        }
    }

    fn ip_denied(d: &Deny, ip: &str) -> bool {
        let v = Visitor {
            ip: Some(ip.parse().unwrap()),
            ..Visitor::default()
        };
        d.matches(&v) == Some(DenyList::Ip)
    }

    #[test]
    fn addresses_and_ranges_of_both_families_match() {
        let d = Deny::new(&spec(&[
            "203.0.113.7",
            "198.51.100.0/24",
            "2001:db8::/32",
            "::1",
        ]))
        .unwrap();
        assert!(ip_denied(&d, "203.0.113.7"));
        assert!(!ip_denied(&d, "203.0.113.8"));
        assert!(ip_denied(&d, "198.51.100.0"));
        assert!(ip_denied(&d, "198.51.100.255"));
        assert!(!ip_denied(&d, "198.51.101.0"));
        assert!(ip_denied(&d, "2001:db8:ffff::1"));
        assert!(!ip_denied(&d, "2001:db9::1"));
        assert!(ip_denied(&d, "::1"));
        // a v4 client seen through a dual-stack socket
        assert!(ip_denied(&d, "::ffff:198.51.100.9"));
        assert!(!ip_denied(&d, "::ffff:198.51.101.9"));
    }

    proptest! {
        /// A /len range holds exactly the addresses sharing its first len bits.
        #[test]
        fn a_v4_range_holds_exactly_its_prefix(net in any::<u32>(), len in 0u8..=32, probe in any::<u32>()) {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            let base = std::net::Ipv4Addr::from(net & mask);
            let d = Deny::new(&spec(&[&format!("{base}/{len}")])).unwrap();
            let inside = probe & mask == net & mask;
            prop_assert_eq!(ip_denied(&d, &std::net::Ipv4Addr::from(probe).to_string()), inside);
        }

        #[test]
        fn a_v6_range_holds_exactly_its_prefix(net in any::<u128>(), len in 0u8..=128, probe in any::<u128>(), near in any::<bool>()) {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
            let base = std::net::Ipv6Addr::from(net & mask);
            let d = Deny::new(&spec(&[&format!("{base}/{len}")])).unwrap();
            // half the probes share the prefix, to hit both sides
            let probe = if near { (net & mask) | (probe & !mask) } else { probe };
            let inside = probe & mask == net & mask;
            let ip = std::net::Ipv6Addr::from(probe);
            // v4-mapped probes are matched as IPv4: keep them out of this property
            prop_assume!(ip.to_ipv4_mapped().is_none());
            prop_assert_eq!(ip_denied(&d, &ip.to_string()), inside);
        }

        #[test]
        fn user_agents_match_as_case_insensitive_substrings(
            needle in "[A-Za-z0-9/. ]{1,12}", before in "[A-Za-z0-9/. ]{0,12}", after in "[A-Za-z0-9/. ]{0,12}", flip in any::<bool>()
        ) {
            prop_assume!(!needle.trim().is_empty());
            let d = Deny::new(&DenySpec { user_agents: vec![needle.clone()], ..DenySpec::default() }).unwrap();
            let shown = if flip { needle.to_uppercase() } else { needle.to_lowercase() };
            let ua = format!("{before}{shown}{after}");
            let v = Visitor { user_agent: Some(ua.as_bytes()), ..Visitor::default() };
            prop_assert_eq!(d.matches(&v), Some(DenyList::UserAgent));
        }

        #[test]
        fn every_list_name_parses_back(list in prop::sample::select(DenyList::ALL.to_vec())) {
            prop_assert_eq!(list.name().parse::<DenyList>(), Ok(list));
            prop_assert_eq!(list.to_string(), list.name());
        }
    }

    #[test]
    fn keys_countries_and_agents_match_their_list() {
        let d = Deny::new(&DenySpec {
            key_ids: vec!["Ab3dE5gH1j".into()],
            ips: vec![],
            countries: vec!["KP".into(), "T1".into()],
            user_agents: vec!["BadBot".into()],
        })
        .unwrap();
        let v = |key_id, country, ua: Option<&'static str>| Visitor {
            key_id,
            ip: None,
            country,
            user_agent: ua.map(str::as_bytes),
        };
        assert_eq!(
            d.matches(&v(Some("Ab3dE5gH1j"), None, None)),
            Some(DenyList::KeyId)
        );
        assert_eq!(d.matches(&v(Some("Zz3dE5gH1j"), None, None)), None);
        assert_eq!(
            d.matches(&v(None, Some("KP"), None)),
            Some(DenyList::Country)
        );
        assert_eq!(
            d.matches(&v(None, Some("kp"), None)),
            Some(DenyList::Country)
        );
        assert_eq!(
            d.matches(&v(None, Some("T1"), None)),
            Some(DenyList::Country)
        );
        assert_eq!(d.matches(&v(None, Some("DE"), None)), None);
        assert_eq!(
            d.matches(&v(None, None, Some("Mozilla/5.0 (compatible; badbot/2.1)"))),
            Some(DenyList::UserAgent)
        );
        assert_eq!(d.matches(&v(None, None, Some("curl/8.0"))), None);
        assert_eq!(d.matches(&Visitor::default()), None);
        assert!(Deny::new(&DenySpec::default()).unwrap().is_empty());
    }

    #[test]
    fn bad_entries_are_refused_naming_the_entry() {
        let cases: Vec<(DenySpec, &str, &str)> = vec![
            (
                spec(&["10.0.0.0/8", "10.0.0.300"]),
                "deny.ips[1]",
                "not an IP address",
            ),
            (spec(&["10.0.0.0/33"]), "deny.ips[0]", "not an IP address"),
            (
                spec(&["10.1.2.3/8"]),
                "deny.ips[0]",
                "did you mean 10.0.0.0/8",
            ),
            (
                spec(&["2001:db8::1/32"]),
                "deny.ips[0]",
                "did you mean 2001:db8::/32",
            ),
            (spec(&[""]), "deny.ips[0]", "not an IP address"),
            (
                DenySpec {
                    countries: vec!["DE".into(), "deu".into()],
                    ..DenySpec::default()
                },
                "deny.countries[1]",
                "ISO 3166-1 alpha-2",
            ),
            (
                DenySpec {
                    countries: vec!["de".into()],
                    ..DenySpec::default()
                },
                "deny.countries[0]",
                "upper-case",
            ),
            (
                DenySpec {
                    user_agents: vec!["  ".into()],
                    ..DenySpec::default()
                },
                "deny.user_agents[0]",
                "must not be empty",
            ),
            (
                DenySpec {
                    user_agents: vec!["a\nb".into()],
                    ..DenySpec::default()
                },
                "deny.user_agents[0]",
                "printable",
            ),
            (
                DenySpec {
                    key_ids: vec!["no spaces".into()],
                    ..DenySpec::default()
                },
                "deny.key_ids[0]",
                "",
            ),
        ];
        for (spec, field, says) in cases {
            let e = Deny::new(&spec).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(says), "{e}");
        }
        let too_many = spec(&vec!["10.0.0.1"; MAX_DENY_ENTRIES + 1]);
        assert_eq!(Deny::new(&too_many).unwrap_err().field, "deny.ips");
    }
}
