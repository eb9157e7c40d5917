//! The admin HTTP API (`/api/v1/…`, served by the dashboard; its OpenAPI
//! document is `dashboard/openapi.json`): the operator-created tokens that
//! authenticate it, and the requests and answers it exchanges, as the dashboard
//! serves them and clients (the tests among them) read them. Also the key
//! records' compare-and-set script the API's and the dashboard's key changes
//! share.
//!
//! **Tokens.** `fga_<10 base62 id>_<32 base62>`; Redis holds only the SHA-256 of
//! the whole secret: `fg:apitoken:<sha256>` → [`TokenRecord`] (JSON), and the
//! index `fg:apitokens` (id → sha256) to list and revoke. A token is scoped
//! [`Scope::Read`] (reads and verification) or [`Scope::Write`] (everything), and
//! is revoked, never deleted, so the audit log's names stay resolvable.
//!
//! **Versions.** A key's `version` is the SHA-1 of its stored record's JSON (as
//! the configuration's is); a change sent with `If-Match: "<version>"` is saved
//! only over exactly that record ([`KEY_CAS`]), and one sent without it is
//! applied to whatever is stored, field by field, so no change is lost either way.

use serde::{Deserialize, Serialize};

use crate::apikeys::KeyStatus;
use crate::credits::Credits;
use crate::keyrecord::{KeyRecord, Metadata, Refusal};
use crate::policy::PolicyError;
use crate::script::LuaScript;

mod sha {
    include!(concat!(env!("OUT_DIR"), "/adminapi_sha1.rs"));
}

/// `lua/key_cas.lua`: saves a key's record if the stored one is still the version
/// the change was based on.
pub const KEY_CAS: LuaScript = LuaScript {
    source: sha::KEY_CAS_SOURCE,
    sha1: sha::KEY_CAS_SHA1,
};

pub const TOKEN_PREFIX: &str = "fga_";
pub const TOKEN_ID_LEN: usize = 10;
pub const TOKEN_RANDOM_LEN: usize = 32;
/// A token's length: `fga_` + id + `_` + random part.
pub const TOKEN_LEN: usize = TOKEN_PREFIX.len() + TOKEN_ID_LEN + 1 + TOKEN_RANDOM_LEN;
/// The index of tokens: id → sha256.
pub const TOKEN_INDEX: &str = "fg:apitokens";
/// A token's name: 1 to this many characters.
pub const MAX_TOKEN_NAME_CHARS: usize = 64;
/// The most keys a page of `GET /api/v1/keys` holds, and how many by default.
pub const MAX_PAGE: usize = 100;
pub const DEFAULT_PAGE: usize = 50;

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The Redis key holding a token's record.
pub fn token_record_key(hash_hex: &str) -> String {
    format!("fg:apitoken:{hash_hex}")
}

/// The bucket of a token's requests (Floodgate's own token-bucket script).
pub fn token_rate_key(id: &str) -> String {
    format!("fg:{{apitoken:{id}}}:rate")
}

/// A new token from random bytes (the caller supplies randomness). Returns (id,
/// secret).
pub fn new_token(random: &[u8; TOKEN_ID_LEN + TOKEN_RANDOM_LEN]) -> (String, String) {
    let text: String = random
        .iter()
        .map(|b| char::from(BASE62[usize::from(*b) % BASE62.len()]))
        .collect();
    let (id, rest) = text.split_at(TOKEN_ID_LEN);
    (id.to_string(), format!("{TOKEN_PREFIX}{id}_{rest}"))
}

/// The id a token names, if `text` has a token's shape (no lookup).
pub fn token_id(text: &str) -> Option<&str> {
    let body = text.strip_prefix(TOKEN_PREFIX)?;
    let ok = text.len() == TOKEN_LEN
        && body.as_bytes()[TOKEN_ID_LEN] == b'_'
        && body
            .bytes()
            .enumerate()
            .all(|(i, b)| i == TOKEN_ID_LEN || b.is_ascii_alphanumeric());
    ok.then(|| &body[..TOKEN_ID_LEN])
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Reads keys and verifies secrets.
    Read,
    /// Everything `read` may, and creates, changes, rotates and revokes keys.
    Write,
}

impl Scope {
    /// Whether a token of this scope may make a call that needs `needed`.
    pub fn allows(self, needed: Scope) -> bool {
        self >= needed
    }

    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" => Ok(Scope::Read),
            "write" => Ok(Scope::Write),
            _ => Err(format!("expected read or write, got {s:?}")),
        }
    }
}

/// What Redis stores for a token (as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    pub id: String,
    pub name: String,
    pub scope: Scope,
    pub status: KeyStatus,
    /// Unix seconds.
    pub created: i64,
    /// Who created it, as the audit log names them (`cli:ops`, an operator).
    pub created_by: String,
}

/// Checks a token's name: 1-64 characters without control characters.
pub fn check_token_name(name: &str) -> Result<(), PolicyError> {
    let n = name.chars().count();
    if n == 0 || n > MAX_TOKEN_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(PolicyError::new(
            "name",
            format!("must be 1-{MAX_TOKEN_NAME_CHARS} characters, without control characters"),
        ));
    }
    Ok(())
}

impl TokenRecord {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a token record serializes")
    }

    /// Parses a stored record; anything unreadable is `None` (an invalid token).
    pub fn from_json(text: &[u8]) -> Option<Self> {
        let r: Self = serde_json::from_slice(text).ok()?;
        check_token_name(&r.name).ok().map(|()| r)
    }

    /// Whether this token (found by the request's secret, or `None`) may make a
    /// call that needs `needed`.
    pub fn admits(record: Option<&TokenRecord>, needed: Scope) -> Result<(), TokenRefusal> {
        match record {
            None => Err(TokenRefusal::Invalid),
            Some(r) if r.status == KeyStatus::Revoked => Err(TokenRefusal::Revoked),
            Some(r) if !r.scope.allows(needed) => Err(TokenRefusal::Scope {
                has: r.scope,
                needs: needed,
            }),
            Some(_) => Ok(()),
        }
    }
}

/// Why a request is not admitted by its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// Not a token's shape, or no such token.
    Invalid,
    Revoked,
    /// The token's scope does not allow the call.
    Scope {
        has: Scope,
        needs: Scope,
    },
}

impl TokenRefusal {
    /// 401, or 403 for a valid token of too narrow a scope.
    pub fn status(self) -> u16 {
        match self {
            TokenRefusal::Scope { .. } => 403,
            _ => 401,
        }
    }

    pub fn error(self) -> ApiError {
        let text = match self {
            TokenRefusal::Missing => {
                "Missing API token: send Authorization: Bearer <token> (floodgate-cli token create)"
                    .to_string()
            }
            TokenRefusal::Invalid => "Invalid API token".to_string(),
            TokenRefusal::Revoked => "API token revoked".to_string(),
            TokenRefusal::Scope { has, needs } => format!(
                "this token's scope is {}; this call needs {}",
                has.name(),
                needs.name()
            ),
        };
        ApiError::new(text)
    }
}

/// The largest request body read.
pub const MAX_REQUEST_JSON: usize = 16 * 1024;

/// Parses a request body (bounded; a type error or an unknown field names its
/// field path, `(document)` for the whole).
pub fn parse_request<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, PolicyError> {
    crate::policy::parse_json(text, MAX_REQUEST_JSON)
}

/// Every error answer's body: what went wrong and, for bad input, the field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(error: impl Into<String>) -> Self {
        ApiError {
            error: error.into(),
            field: None,
        }
    }
}

impl From<PolicyError> for ApiError {
    fn from(e: PolicyError) -> Self {
        ApiError {
            error: e.to_string(),
            field: Some(e.field),
        }
    }
}

/// A key as the API shows it: its record without the rotated-out secret's hash,
/// and its version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyView {
    pub id: String,
    pub owner: String,
    pub plan: String,
    pub status: KeyStatus,
    pub created: i64,
    pub identity: Option<String>,
    pub name: Option<String>,
    pub metadata: Option<Metadata>,
    pub expires_at: Option<i64>,
    pub credits: Option<Credits>,
    pub updated: Option<i64>,
    /// Until when (Unix seconds) the secret the last rotation replaced works.
    pub previous_secret_expires_at: Option<i64>,
    /// The SHA-1 of the stored record: send it as `If-Match` to change exactly it.
    pub version: String,
}

impl KeyView {
    pub fn of(r: &KeyRecord, version: &str) -> Self {
        KeyView {
            id: r.id.clone(),
            owner: r.owner.clone(),
            plan: r.plan.clone(),
            status: r.status,
            created: r.created,
            identity: r.identity.clone(),
            name: r.name.clone(),
            metadata: r.metadata.clone(),
            expires_at: r.expires_at,
            credits: r.credits,
            updated: r.updated,
            previous_secret_expires_at: r.rotation.as_ref().map(|r| r.overlap_ends),
            version: version.to_string(),
        }
    }
}

/// A key just created or rotated, with its secret: shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyWithSecret {
    pub key: KeyView,
    pub secret: String,
}

/// A page of keys, by id; `next_cursor` (the last id) asks for the next one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyPage {
    pub keys: Vec<KeyView>,
    pub next_cursor: Option<String>,
}

/// The most minutes `GET /api/v1/keys/{id}/usage` sums (a day), and how many by
/// default.
pub const MAX_USAGE_MINUTES: i64 = 1440;
pub const DEFAULT_USAGE_MINUTES: i64 = 60;

/// A key's decisions over the last `minutes` minutes (the current one
/// included), as the edges count them, and its last use seen (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyUsage {
    pub id: String,
    pub minutes: i64,
    pub allowed: u64,
    /// Refused with 429.
    pub throttled: u64,
    /// Decided while Redis could not be reached (a failure mode).
    pub degraded: u64,
    pub last_used: Option<i64>,
}

/// An identity (the operator's external id of a customer): its keys, and their
/// decisions over the last `minutes` minutes together (they share the buckets
/// of `identity` policies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityView {
    pub identity: String,
    pub keys: Vec<KeyView>,
    pub minutes: i64,
    pub allowed: u64,
    pub throttled: u64,
    pub degraded: u64,
}

/// `GET|PUT|DELETE /api/v1/identities/{identity}/overrides`: what replaces the
/// plans of the identity's keys (the configuration's `identity_overrides` entry,
/// [`crate::config::IdentityOverride`]; the PUT's body is that entry), and the
/// configuration's version after the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityOverrideView {
    pub identity: String,
    pub plan: Option<String>,
    pub policies: Option<Vec<String>>,
    pub config_version: String,
}

impl IdentityOverrideView {
    pub fn of(identity: &str, o: &crate::config::IdentityOverride, version: &str) -> Self {
        IdentityOverrideView {
            identity: identity.to_string(),
            plan: o.plan.clone(),
            policies: o.policies.clone(),
            config_version: version.to_string(),
        }
    }
}

/// An error of an identity override's edit on the field of the PUT's body that
/// caused it: `identity_overrides.<identity>.policies[0]` → `policies[0]`, the
/// override as a whole (`identity_overrides.<identity>`) → `identity` when no
/// key holds it, `(document)` otherwise.
pub fn override_field(identity: &str, mut e: PolicyError) -> PolicyError {
    let at = format!("identity_overrides.{identity}");
    if let Some(rest) = e.field.strip_prefix(&at) {
        e.field = match rest.strip_prefix('.') {
            Some(inner) => inner.to_string(),
            None if rest.is_empty() && e.message.contains("no API key has") => "identity".into(),
            None if rest.is_empty() => "(document)".into(),
            None => e.field.clone(),
        };
    }
    e
}

/// `POST /api/v1/keys/{id}/rotate`: how long the replaced secret keeps working
/// (0 to 30 days; 0 stops it at once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateRequest {
    pub overlap_seconds: i64,
}

/// `POST /api/v1/verify`: a secret to check as the edge would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    pub key: String,
}

/// Why a secret is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyReason {
    /// Not a key's shape, or a checksum that does not match (no lookup made).
    Malformed,
    NotFound,
    Revoked,
    Expired,
    /// The secret a rotation replaced, after its overlap.
    RotatedOut,
}

/// The answer to a verification: valid (with the key), or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyAnswer {
    pub valid: bool,
    pub reason: Option<VerifyReason>,
    pub key: Option<KeyView>,
}

impl VerifyAnswer {
    pub fn refused(reason: VerifyReason) -> Self {
        VerifyAnswer {
            valid: false,
            reason: Some(reason),
            key: None,
        }
    }

    /// The edge's decision on the record found under `presented_hash` (the
    /// hash of the secret presented; `None`: no record), at `now` (Unix
    /// seconds): [`KeyRecord::refusal`], the check the edge makes.
    pub fn of(found: Option<(&KeyRecord, &str)>, presented_hash: &str, now: i64) -> Self {
        let Some((record, version)) = found else {
            return Self::refused(VerifyReason::NotFound);
        };
        match record.refusal(presented_hash, now) {
            None => VerifyAnswer {
                valid: true,
                reason: None,
                key: Some(KeyView::of(record, version)),
            },
            Some(Refusal::Revoked) => Self::refused(VerifyReason::Revoked),
            Some(Refusal::Expired) => Self::refused(VerifyReason::Expired),
            Some(Refusal::RotatedOut) => Self::refused(VerifyReason::RotatedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyrecord::Rotation;

    const NOW: i64 = 1_764_000_000;

    fn round_trip<T>(value: &T) -> String
    where
        T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let json = serde_json::to_string(value).unwrap();
        let back: T = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, value, "{json}");
        json
    }

    fn record() -> KeyRecord {
        KeyRecord {
            identity: Some("cus_1".into()),
            metadata: serde_json::json!({"tier": "gold"}).as_object().cloned(),
            expires_at: Some(NOW + 100),
            rotation: Some(Rotation {
                previous_hash: "a".repeat(64),
                overlap_ends: NOW + 50,
            }),
            ..KeyRecord::new("Ab3dE5gH1j", "Acme", "free", NOW)
        }
    }

    #[test]
    fn every_request_and_answer_round_trips_through_json() {
        let view = KeyView::of(&record(), "v1");
        let json = round_trip(&view);
        assert!(
            json.contains(r#""previous_secret_expires_at":1764000050"#),
            "{json}"
        );
        assert!(
            !json.contains(&"a".repeat(64)),
            "the old secret's hash is not shown"
        );
        round_trip(&KeyWithSecret {
            key: view.clone(),
            secret: "fg_x".into(),
        });
        round_trip(&KeyPage {
            keys: vec![view.clone()],
            next_cursor: Some("Ab3dE5gH1j".into()),
        });
        round_trip(&RotateRequest {
            overlap_seconds: 60,
        });
        round_trip(&IdentityView {
            identity: "cus_1".into(),
            keys: vec![view.clone()],
            minutes: 60,
            allowed: 7,
            throttled: 0,
            degraded: 1,
        });
        let over = crate::config::IdentityOverride {
            plan: Some("pro".into()),
            policies: None,
        };
        let shown = round_trip(&IdentityOverrideView::of("cus_1", &over, "v2"));
        assert_eq!(
            shown,
            r#"{"identity":"cus_1","plan":"pro","policies":null,"config_version":"v2"}"#
        );
        let body = parse_request::<crate::config::IdentityOverride>(r#"{"policies":["vip"]}"#);
        assert_eq!(body.unwrap().policies, Some(vec!["vip".to_string()]));
        let bad = parse_request::<crate::config::IdentityOverride>(r#"{"plan":"pro","x":1}"#);
        assert_eq!(bad.unwrap_err().field, "x");
        for (field, message, shown) in [
            (
                "identity_overrides.cus.1.policies[0]",
                "no policy",
                "policies[0]",
            ),
            ("identity_overrides.cus.1.plan", "no plan", "plan"),
            (
                "identity_overrides.cus.1",
                "no API key has the identity",
                "identity",
            ),
            ("identity_overrides.cus.1", "must name a plan", "(document)"),
            ("plans", "at most 16", "plans"),
        ] {
            let e = override_field("cus.1", PolicyError::new(field, message));
            assert_eq!(e.field, shown, "{field}");
        }
        round_trip(&KeyUsage {
            id: "Ab3dE5gH1j".into(),
            minutes: 60,
            allowed: 3,
            throttled: 1,
            degraded: 0,
            last_used: None,
        });
        round_trip(&VerifyRequest { key: "fg_x".into() });
        round_trip(&VerifyAnswer::refused(VerifyReason::RotatedOut));
        let e = round_trip(&ApiError::from(PolicyError::new("plan", "is required")));
        assert_eq!(e, r#"{"error":"plan: is required","field":"plan"}"#);
        assert_eq!(round_trip(&ApiError::new("x")), r#"{"error":"x"}"#);
        let t = TokenRecord {
            id: "Tk3dE5gH1j".into(),
            name: "billing backend".into(),
            scope: Scope::Write,
            status: KeyStatus::Active,
            created: NOW,
            created_by: "cli:ops".into(),
        };
        round_trip(&t);
        assert_eq!(TokenRecord::from_json(t.to_json().as_bytes()), Some(t));
        let bad = parse_request::<RotateRequest>(r#"{"overlap_seconds":1,"x":2}"#);
        assert_eq!(
            bad.unwrap_err().field,
            "x",
            "unknown fields are refused by name"
        );
        let bad = parse_request::<RotateRequest>(r#"{"overlap_seconds":"1"}"#);
        assert_eq!(bad.unwrap_err().field, "overlap_seconds");
        let bad = parse_request::<VerifyRequest>("[");
        assert_eq!(bad.unwrap_err().field, "(document)");
    }

    #[test]
    fn tokens_have_one_shape_and_name_their_id() {
        let mut random = [0u8; TOKEN_ID_LEN + TOKEN_RANDOM_LEN];
        for (i, b) in random.iter_mut().enumerate() {
            *b = (i * 41 + 7) as u8;
        }
        let (id, secret) = new_token(&random);
        assert_eq!(secret.len(), TOKEN_LEN);
        assert_eq!(token_id(&secret), Some(id.as_str()));
        assert!(secret.starts_with("fga_"));
        for bad in [
            &secret[1..],
            &secret[..TOKEN_LEN - 1],
            &format!("{secret}x"),
            &secret.replace("fga_", "fg_x"),
            &format!("{}-{}", &secret[..14], &secret[15..]),
            &format!("{}é", &secret[..TOKEN_LEN - 2]),
        ] {
            assert_eq!(token_id(bad), None, "{bad}");
        }
        assert_eq!(token_rate_key(&id), format!("fg:{{apitoken:{id}}}:rate"));
    }

    #[test]
    fn a_token_admits_what_its_scope_allows_until_revoked() {
        let t = TokenRecord {
            id: "Tk3dE5gH1j".into(),
            name: "ro".into(),
            scope: Scope::Read,
            status: KeyStatus::Active,
            created: NOW,
            created_by: "cli:ops".into(),
        };
        assert_eq!(TokenRecord::admits(Some(&t), Scope::Read), Ok(()));
        let needs_write = TokenRecord::admits(Some(&t), Scope::Write).unwrap_err();
        assert_eq!(needs_write.status(), 403);
        assert!(needs_write.error().error.contains("needs write"));
        let w = TokenRecord {
            scope: Scope::Write,
            ..t.clone()
        };
        assert_eq!(TokenRecord::admits(Some(&w), Scope::Write), Ok(()));
        assert_eq!(TokenRecord::admits(Some(&w), Scope::Read), Ok(()));
        let revoked = TokenRecord {
            status: KeyStatus::Revoked,
            ..w
        };
        assert_eq!(
            TokenRecord::admits(Some(&revoked), Scope::Read),
            Err(TokenRefusal::Revoked)
        );
        assert_eq!(
            TokenRecord::admits(None, Scope::Read),
            Err(TokenRefusal::Invalid)
        );
        assert_eq!(TokenRefusal::Missing.status(), 401);
        assert_eq!("write".parse::<Scope>(), Ok(Scope::Write));
        assert!("admin".parse::<Scope>().is_err());
        assert!(check_token_name("").is_err());
        assert!(check_token_name(&"n".repeat(65)).is_err());
        assert!(check_token_name("a\nb").is_err());
    }

    #[test]
    fn verification_makes_the_edges_checks() {
        let r = record();
        let (current, previous) = ("c".repeat(64), "a".repeat(64));
        let ok = VerifyAnswer::of(Some((&r, "v")), &current, NOW);
        assert!(ok.valid && ok.reason.is_none());
        assert_eq!(ok.key.unwrap().identity.as_deref(), Some("cus_1"));
        assert!(VerifyAnswer::of(Some((&r, "v")), &previous, NOW + 49).valid);
        let cases = [
            (None, NOW, VerifyReason::NotFound),
            (Some(&previous), NOW + 50, VerifyReason::RotatedOut),
            (Some(&current), NOW + 100, VerifyReason::Expired),
        ];
        for (hash, now, reason) in cases {
            let found = hash.map(|_| (&r, "v"));
            let a = VerifyAnswer::of(found, hash.unwrap_or(&current), now);
            assert_eq!(a, VerifyAnswer::refused(reason));
        }
        let revoked = KeyRecord {
            status: KeyStatus::Revoked,
            ..r
        };
        assert_eq!(
            VerifyAnswer::of(Some((&revoked, "v")), &current, NOW).reason,
            Some(VerifyReason::Revoked)
        );
    }
}
