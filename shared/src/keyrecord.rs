//! What Redis stores for an API key: its record (JSON under
//! [`crate::apikeys::record_key`]), the record's bounds, and the pure rules of
//! expiry and rotation.
//!
//! **Versions.** A v1 record holds `id`, `owner`, `plan`, `status` and `created`
//! only; every key stored before v2 is one. Each v2 field is optional and left
//! out of the JSON when unset, so a v1 record reads, validates and writes back
//! byte for byte as before, and a key nobody changes stays v1. The v2 fields:
//! - `identity`: the operator's external id of the customer owning the key (the
//!   keys of one identity share the buckets of `identity` policies,
//!   [`crate::keys::identity_bucket_key`]);
//! - `name`: a short label ("production", "CI");
//! - `metadata`: an operator-set JSON object, at most [`MAX_METADATA_BYTES`] as
//!   forwarded ([`metadata_header`]);
//! - `expires_at`: the Unix second from which the key is refused;
//! - `credits`: remaining uses and their refill ([`crate::credits`]; the record
//!   holds what the operator set, the live count is in the store);
//! - `updated`, `last_used`: Unix seconds;
//! - `rotation`: the previous secret's hash and the end of its overlap.
//!
//! An edge that predates v2 refuses a record with any v2 field as unreadable
//! (unknown fields are refused, not ignored: a key must never lose its expiry by
//! being read by an old reader), so every edge must read v2 before any v2 field
//! is written.
//!
//! **Rotation.** [`KeyRecord::rotate`] keeps the key (its id, so its buckets and
//! its credits) and records the hash of the secret it replaces and when that
//! secret stops working. The store then holds the same record under both
//! hashes, the old one for the overlap only; a lookup by the old secret's hash
//! finds a record naming that hash as `previous_hash`, and
//! [`KeyRecord::refusal`] refuses it once the overlap has ended.
//!
//! Every bound is checked by [`KeyRecord::check`], each failure a
//! [`RecordError`] naming its field. Timestamps are Unix seconds, like
//! `created` always was.

use serde::{Deserialize, Serialize};

use crate::credits::{Credits, Interval, MAX_CREDITS};
use crate::keys::validate_key_id;
use crate::policy::{PolicyError, validate_name};

/// The most bytes of a key's metadata, as forwarded ([`metadata_header`]).
pub const MAX_METADATA_BYTES: usize = 1024;
/// Identities (the operator's external ids): 1-64 of `A-Z a-z 0-9 _ - . @`.
pub const MAX_IDENTITY_LEN: usize = 64;
/// A key's name: at most this many characters.
pub const MAX_NAME_CHARS: usize = 64;
/// A key's owner (free text): at most this many characters.
pub const MAX_OWNER_CHARS: usize = 128;
/// The longest a rotated-out secret may keep working: 30 days.
pub const MAX_OVERLAP_SECS: i64 = 30 * 86_400;
/// The largest stored record read.
pub const MAX_RECORD_JSON: usize = 4096;

/// Operator-set metadata: a JSON object.
pub type Metadata = serde_json::Map<String, serde_json::Value>;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    #[default]
    Active,
    Revoked,
}

/// A rotation: the secret the key's current one replaced, and when it stops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rotation {
    /// The SHA-256 hex of the replaced secret ([`crate::apikeys::hash_secret`]).
    pub previous_hash: String,
    /// The Unix second from which the replaced secret is refused.
    pub overlap_ends: i64,
}

/// What Redis stores for a key (as JSON). See the module docs for the versions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    pub id: String,
    /// Who the key belongs to (free text for operators, at most 128 characters).
    pub owner: String,
    pub plan: String,
    pub status: KeyStatus,
    /// Unix seconds.
    pub created: i64,
    /// The operator's external id of the customer owning the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// A short label ("production", "CI").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Operator-set metadata, forwarded to the upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    /// The Unix second from which the key is refused (`API key expired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// Remaining uses and their refill, as the operator set them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credits: Option<Credits>,
    /// Unix seconds of the last change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<i64>,
    /// Unix seconds of the last use seen (coarse: hosts write it now and then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<Rotation>,
}

/// Why a value cannot be part of a key record; [`RecordError::field`] names the
/// field, as the admin API's 400 answers do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("id: must be 1-32 characters of A-Z, a-z, 0-9, '_' and '-'")]
    Id,
    #[error("plan: {0}")]
    Plan(String),
    #[error("owner: must be at most {MAX_OWNER_CHARS} characters, without control characters")]
    Owner,
    #[error(
        "identity: must be 1-{MAX_IDENTITY_LEN} characters of A-Z, a-z, 0-9, '_', '-', '.' and '@'"
    )]
    Identity,
    #[error("name: must be at most {MAX_NAME_CHARS} characters, without control characters")]
    Name,
    #[error("metadata: must be a JSON object")]
    MetadataNotObject,
    #[error("metadata: is {bytes} bytes as JSON; at most {MAX_METADATA_BYTES} are allowed")]
    MetadataTooLarge { bytes: usize },
    #[error("expires_at: must be in the future (after Unix second {now}), got {expires_at}")]
    ExpiryInPast { expires_at: i64, now: i64 },
    #[error("{field}: must be a whole number, got a negative one")]
    NegativeCredits { field: &'static str },
    #[error("{field}: must be a whole number, got a fraction")]
    FractionalCredits { field: &'static str },
    #[error("{field}: must be at most {MAX_CREDITS}")]
    TooManyCredits { field: &'static str },
    #[error("credits.refill.amount: must be at least 1")]
    EmptyRefill,
    #[error("credits.refill.day: {0}")]
    RefillDay(&'static str),
    #[error("rotation.previous_hash: must be a SHA-256 in lowercase hex")]
    RotationHash,
    #[error("status: a revoked key cannot be rotated")]
    RotationOfRevoked,
    #[error("overlap_seconds: must be between 0 and {MAX_OVERLAP_SECS} (30 days), got {0}")]
    Overlap(i64),
}

impl RecordError {
    /// The field at fault, as the JSON names it (`credits.refill.day`, ...).
    pub fn field(&self) -> &'static str {
        match self {
            RecordError::Id => "id",
            RecordError::Plan(_) => "plan",
            RecordError::Owner => "owner",
            RecordError::Identity => "identity",
            RecordError::Name => "name",
            RecordError::MetadataNotObject | RecordError::MetadataTooLarge { .. } => "metadata",
            RecordError::ExpiryInPast { .. } => "expires_at",
            RecordError::NegativeCredits { field }
            | RecordError::FractionalCredits { field }
            | RecordError::TooManyCredits { field } => field,
            RecordError::EmptyRefill => "credits.refill.amount",
            RecordError::RefillDay(_) => "credits.refill.day",
            RecordError::RotationHash => "rotation.previous_hash",
            RecordError::RotationOfRevoked => "status",
            RecordError::Overlap(_) => "overlap_seconds",
        }
    }
}

impl From<RecordError> for PolicyError {
    fn from(e: RecordError) -> Self {
        let text = e.to_string();
        let message = text
            .strip_prefix(e.field())
            .and_then(|t| t.strip_prefix(": "))
            .unwrap_or(&text);
        PolicyError::new(e.field(), message)
    }
}

/// Why a stored key does not admit a request (the edge answers 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Revoked,
    /// Past its `expires_at`.
    Expired,
    /// The secret a rotation replaced, after its overlap.
    RotatedOut,
}

impl Refusal {
    /// The `error` of the 401 body.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Revoked => "API key revoked",
            Refusal::Expired => "API key expired",
            // as for a secret that does not exist (its copy is gone by then)
            Refusal::RotatedOut => "Invalid API key",
        }
    }
}

/// A rotated record, and the hash whose stored copy must now go: the secret
/// replaced by an earlier rotation (its overlap ends now, if it had not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    pub record: KeyRecord,
    pub retired_hash: Option<String>,
}

fn bad_text(text: &str, max_chars: usize) -> bool {
    text.chars().count() > max_chars || text.chars().any(char::is_control)
}

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks an identity (the operator's external id).
pub fn check_identity(id: &str) -> Result<(), RecordError> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"_-.@".contains(&b);
    if id.is_empty() || id.len() > MAX_IDENTITY_LEN || !id.bytes().all(ok) {
        return Err(RecordError::Identity);
    }
    Ok(())
}

/// Metadata as one header value: compact JSON with every non-ASCII character
/// and DEL escaped (`\uXXXX`; JSON escapes the other control characters), so it
/// is printable ASCII that any HTTP stack carries.
pub fn metadata_header(meta: &Metadata) -> String {
    let json = serde_json::to_string(meta).expect("a JSON object serializes");
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() && c != '\x7f' {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// Checks metadata: its [`metadata_header`] form is at most
/// [`MAX_METADATA_BYTES`].
pub fn check_metadata(meta: &Metadata) -> Result<(), RecordError> {
    let bytes = metadata_header(meta).len();
    if bytes > MAX_METADATA_BYTES {
        return Err(RecordError::MetadataTooLarge { bytes });
    }
    Ok(())
}

/// Metadata from any JSON value: an object within the bound.
pub fn metadata_from_value(value: &serde_json::Value) -> Result<Metadata, RecordError> {
    let meta = value.as_object().ok_or(RecordError::MetadataNotObject)?;
    check_metadata(meta)?;
    Ok(meta.clone())
}

/// Checks an expiry set at `now` (Unix seconds): it must be in the future.
pub fn check_expiry(expires_at: i64, now: i64) -> Result<(), RecordError> {
    if expires_at <= now {
        return Err(RecordError::ExpiryInPast { expires_at, now });
    }
    Ok(())
}

/// Checks credits' bounds: counts up to [`MAX_CREDITS`], a refill of at least 1,
/// a monthly day of 1-31 and no day on a daily refill.
pub fn check_credits(credits: &Credits) -> Result<(), RecordError> {
    if credits.remaining > MAX_CREDITS {
        return Err(RecordError::TooManyCredits {
            field: "credits.remaining",
        });
    }
    let Some(refill) = credits.refill else {
        return Ok(());
    };
    if refill.amount == 0 {
        return Err(RecordError::EmptyRefill);
    }
    if refill.amount > MAX_CREDITS {
        return Err(RecordError::TooManyCredits {
            field: "credits.refill.amount",
        });
    }
    match (refill.interval, refill.day) {
        (Interval::Daily, Some(_)) => {
            Err(RecordError::RefillDay("only a monthly refill names a day"))
        }
        (Interval::Monthly, Some(d)) if !(1..=31).contains(&d) => Err(RecordError::RefillDay(
            "must be a day of the month, 1 to 31",
        )),
        _ => Ok(()),
    }
}

impl KeyRecord {
    /// A new key's record, with no v2 field set.
    pub fn new(id: &str, owner: &str, plan: &str, created: i64) -> Self {
        KeyRecord {
            id: id.to_string(),
            owner: owner.to_string(),
            plan: plan.to_string(),
            created,
            ..KeyRecord::default()
        }
    }

    /// The instant (µs) the record's credits stand as of while the store holds no
    /// live count for them: the key's creation (`shared/src/credits.rs`).
    pub fn credits_origin(&self) -> crate::time::Micros {
        self.created
            .saturating_mul(crate::time::MICROS_PER_SEC)
            .clamp(0, crate::time::MAX_INSTANT)
    }

    /// Every bound of a stored record (none depends on the time: a stored key
    /// may have expired).
    pub fn check(&self) -> Result<(), RecordError> {
        validate_key_id(&self.id).map_err(|_| RecordError::Id)?;
        validate_name("plan", &self.plan).map_err(|e| RecordError::Plan(e.message))?;
        if bad_text(&self.owner, MAX_OWNER_CHARS) {
            return Err(RecordError::Owner);
        }
        if let Some(i) = &self.identity {
            check_identity(i)?;
        }
        if self
            .name
            .as_deref()
            .is_some_and(|n| bad_text(n, MAX_NAME_CHARS))
        {
            return Err(RecordError::Name);
        }
        if let Some(m) = &self.metadata {
            check_metadata(m)?;
        }
        if let Some(c) = &self.credits {
            check_credits(c)?;
        }
        if let Some(r) = &self.rotation
            && !is_sha256_hex(&r.previous_hash)
        {
            return Err(RecordError::RotationHash);
        }
        Ok(())
    }

    /// [`check`](Self::check), as the error type the admin code has always used.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.check().map_err(PolicyError::from)
    }

    /// Parses a stored record; anything unreadable is `None` (treated as unknown).
    pub fn from_json(text: &[u8]) -> Option<Self> {
        if text.len() > MAX_RECORD_JSON {
            return None;
        }
        let r: Self = serde_json::from_slice(text).ok()?;
        r.check().ok().map(|()| r)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a key record always serializes")
    }

    /// Whether the key is past its expiry at `now` (Unix seconds).
    pub fn expired(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// Why this record, found under the hash `presented_hash` of the secret a
    /// request presented, does not admit it at `now` (Unix seconds); `None` when
    /// it does.
    pub fn refusal(&self, presented_hash: &str, now: i64) -> Option<Refusal> {
        if self.status == KeyStatus::Revoked {
            return Some(Refusal::Revoked);
        }
        if self.expired(now) {
            return Some(Refusal::Expired);
        }
        match &self.rotation {
            Some(r) if r.previous_hash == presented_hash && now >= r.overlap_ends => {
                Some(Refusal::RotatedOut)
            }
            _ => None,
        }
    }

    /// The key rotated at `now` (Unix seconds) away from the secret whose hash is
    /// `current_hash`, which keeps working `overlap_secs` more (0: it stops at
    /// once). Everything else of the key stays.
    pub fn rotate(
        &self,
        current_hash: &str,
        now: i64,
        overlap_secs: i64,
    ) -> Result<Rotated, RecordError> {
        if self.status == KeyStatus::Revoked {
            return Err(RecordError::RotationOfRevoked);
        }
        if !(0..=MAX_OVERLAP_SECS).contains(&overlap_secs) {
            return Err(RecordError::Overlap(overlap_secs));
        }
        if !is_sha256_hex(current_hash) {
            return Err(RecordError::RotationHash);
        }
        let retired_hash = self
            .rotation
            .as_ref()
            .filter(|r| r.previous_hash != current_hash)
            .map(|r| r.previous_hash.clone());
        let record = KeyRecord {
            rotation: Some(Rotation {
                previous_hash: current_hash.to_string(),
                overlap_ends: now + overlap_secs,
            }),
            updated: Some(now),
            ..self.clone()
        };
        Ok(Rotated {
            record,
            retired_hash,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credits::Refill;

    /// A record exactly as `floodgate-cli keys create` and the dashboard store one
    /// today (v1): the five fields, in this order.
    const V1: &str = r#"{"id":"Ab3dE5gH1j","owner":"Acme <ops@acme.test>","plan":"pro","status":"active","created":1764000000}"#;
    const NOW: i64 = 1_764_000_000;

    fn hash(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn v2() -> KeyRecord {
        let metadata = serde_json::json!({"tier": "gold", "café": [1, 2]});
        KeyRecord {
            identity: Some("cus_42@acme.test".into()),
            name: Some("production".into()),
            metadata: metadata.as_object().cloned(),
            expires_at: Some(NOW + 100),
            credits: Some(Credits {
                remaining: 5,
                refill: Some(Refill {
                    amount: 1000,
                    interval: Interval::Monthly,
                    day: Some(15),
                }),
            }),
            updated: Some(NOW + 1),
            last_used: Some(NOW + 2),
            rotation: Some(Rotation {
                previous_hash: hash('a'),
                overlap_ends: NOW + 50,
            }),
            ..KeyRecord::new("Ab3dE5gH1j", "Acme", "pro", NOW)
        }
    }

    #[test]
    fn a_v1_record_reads_and_writes_back_byte_for_byte() {
        let r = KeyRecord::from_json(V1.as_bytes()).expect("a v1 record is readable");
        assert_eq!(
            r,
            KeyRecord::new("Ab3dE5gH1j", "Acme <ops@acme.test>", "pro", NOW)
        );
        assert_eq!(r.to_json(), V1);
        let revoked = V1.replace("active", "revoked");
        let r = KeyRecord::from_json(revoked.as_bytes()).unwrap();
        assert_eq!((r.status, r.to_json()), (KeyStatus::Revoked, revoked));
        assert_eq!(r.identity, None);
        assert!(!r.expired(i64::MAX));
    }

    #[test]
    fn a_v2_record_round_trips_with_every_field() {
        let r = v2();
        let json = r.to_json();
        assert_eq!(KeyRecord::from_json(json.as_bytes()), Some(r.clone()));
        assert!(json.starts_with(&V1[..V1.len() - 1].replace("Acme <ops@acme.test>", "Acme")));
        assert!(json.contains(
            r#""credits":{"remaining":5,"refill":{"amount":1000,"interval":"monthly","day":15}}"#
        ));
    }

    #[test]
    fn the_largest_record_every_bound_allows_is_still_read() {
        // every text at its bound, in the characters that take the most bytes
        let metadata = serde_json::json!({ "a": "\"".repeat((MAX_METADATA_BYTES - 8) / 2) });
        let r = KeyRecord {
            id: "i".repeat(32),
            owner: "😀".repeat(MAX_OWNER_CHARS),
            plan: "p".repeat(32),
            identity: Some("c".repeat(MAX_IDENTITY_LEN)),
            name: Some("\"".repeat(MAX_NAME_CHARS)),
            metadata: Some(metadata_from_value(&metadata).unwrap()),
            created: i64::MIN,
            expires_at: Some(i64::MIN),
            updated: Some(i64::MIN),
            last_used: Some(i64::MIN),
            ..v2()
        };
        assert_eq!(r.check(), Ok(()));
        let json = r.to_json();
        assert!(json.len() <= MAX_RECORD_JSON, "{} bytes", json.len());
        assert_eq!(KeyRecord::from_json(json.as_bytes()), Some(r));
    }

    #[test]
    fn garbage_and_out_of_bounds_records_are_unknown() {
        for bad in [
            &b"{}"[..],
            b"null",
            b"[1]",
            b"\xff",
            br#"{"id":"x y","owner":"","plan":"pro","status":"active","created":1}"#,
            br#"{"id":"Ab3dE5gH1j","owner":"","plan":"pro","status":"gone","created":1}"#,
            br#"{"id":"Ab3dE5gH1j","owner":"","plan":"pro","status":"active","created":1,"colour":1}"#,
            br#"{"id":"Ab3dE5gH1j","owner":"","plan":"pro","status":"active","created":1,"metadata":[1]}"#,
            br#"{"id":"Ab3dE5gH1j","owner":"","plan":"pro","status":"active","created":1,"credits":{"remaining":-1}}"#,
        ] {
            assert_eq!(KeyRecord::from_json(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let mut r = v2();
        r.rotation.as_mut().unwrap().previous_hash = "A".repeat(64);
        assert_eq!(KeyRecord::from_json(r.to_json().as_bytes()), None);
        let mut long = v2();
        long.owner = "o".repeat(129);
        assert_eq!(long.validate().unwrap_err().field, "owner");
        assert_eq!(long.check(), Err(RecordError::Owner));
    }

    #[test]
    fn every_bound_is_a_typed_error_naming_its_field() {
        type Case = (fn(&mut KeyRecord), RecordError, &'static str);
        let cases: Vec<Case> = vec![
            (|r| r.id = "a b".into(), RecordError::Id, "id"),
            (
                |r| r.identity = Some("a b".into()),
                RecordError::Identity,
                "identity",
            ),
            (
                |r| r.identity = Some("x".repeat(65)),
                RecordError::Identity,
                "identity",
            ),
            (|r| r.name = Some("n".repeat(65)), RecordError::Name, "name"),
            (|r| r.name = Some("a\nb".into()), RecordError::Name, "name"),
            (
                |r| r.credits.as_mut().unwrap().remaining = MAX_CREDITS + 1,
                RecordError::TooManyCredits {
                    field: "credits.remaining",
                },
                "credits.remaining",
            ),
            (
                |r| r.credits.as_mut().unwrap().refill.as_mut().unwrap().day = Some(32),
                RecordError::RefillDay("must be a day of the month, 1 to 31"),
                "credits.refill.day",
            ),
            (
                |r| r.credits.as_mut().unwrap().refill.as_mut().unwrap().day = Some(0),
                RecordError::RefillDay("must be a day of the month, 1 to 31"),
                "credits.refill.day",
            ),
            (
                |r| {
                    r.credits
                        .as_mut()
                        .unwrap()
                        .refill
                        .as_mut()
                        .unwrap()
                        .interval = Interval::Daily
                },
                RecordError::RefillDay("only a monthly refill names a day"),
                "credits.refill.day",
            ),
            (
                |r| r.credits.as_mut().unwrap().refill.as_mut().unwrap().amount = 0,
                RecordError::EmptyRefill,
                "credits.refill.amount",
            ),
        ];
        for (change, error, field) in cases {
            let mut r = v2();
            change(&mut r);
            assert_eq!(r.check(), Err(error.clone()));
            assert_eq!(error.field(), field);
            let p = PolicyError::from(error.clone());
            assert_eq!(p.field, field);
            assert!(!p.message.starts_with(field), "{p}");
        }
        assert_eq!(v2().check(), Ok(()));
    }

    #[test]
    fn metadata_must_be_an_object_within_one_kilobyte_as_forwarded() {
        let v = |j: serde_json::Value| metadata_from_value(&j);
        assert_eq!(
            v(serde_json::json!([1, 2])),
            Err(RecordError::MetadataNotObject)
        );
        assert_eq!(
            v(serde_json::json!("x")),
            Err(RecordError::MetadataNotObject)
        );
        assert_eq!(
            v(serde_json::json!(null)),
            Err(RecordError::MetadataNotObject)
        );
        // {"a":"…"}: 8 bytes around the value
        let fits = v(serde_json::json!({ "a": "x".repeat(MAX_METADATA_BYTES - 8) })).unwrap();
        assert_eq!(metadata_header(&fits).len(), MAX_METADATA_BYTES);
        let over = serde_json::json!({ "a": "x".repeat(MAX_METADATA_BYTES - 7) });
        assert_eq!(v(over), Err(RecordError::MetadataTooLarge { bytes: 1025 }));
        // non-ASCII counts as forwarded: é is \u00e9 (6 bytes), 😀 two escapes (12)
        let m = v(serde_json::json!({"é": "😀"})).unwrap();
        assert_eq!(metadata_header(&m), r#"{"\u00e9":"\ud83d\ude00"}"#);
        let back: Metadata = serde_json::from_str(&metadata_header(&m)).unwrap();
        assert_eq!(back, m);
        let wide = serde_json::json!({ "a": "é".repeat(170) });
        assert_eq!(v(wide).unwrap_err().field(), "metadata");
    }

    #[test]
    fn forwarded_metadata_is_printable_ascii_whatever_the_values_hold() {
        let m = metadata_from_value(&serde_json::json!({"c": "\u{7f}\u{1}\t\n\u{80}"})).unwrap();
        let header = metadata_header(&m);
        assert_eq!(header, r#"{"c":"\u007f\u0001\t\n\u0080"}"#);
        assert!(
            header.bytes().all(|b| (0x20..0x7f).contains(&b)),
            "{header}"
        );
        let back: Metadata = serde_json::from_str(&header).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn an_expiry_must_be_after_now() {
        assert_eq!(
            check_expiry(NOW, NOW),
            Err(RecordError::ExpiryInPast {
                expires_at: NOW,
                now: NOW
            })
        );
        assert_eq!(
            check_expiry(NOW - 1, NOW).unwrap_err().field(),
            "expires_at"
        );
        assert_eq!(check_expiry(NOW + 1, NOW), Ok(()));
        let r = v2();
        assert!(!r.expired(NOW + 99));
        assert!(r.expired(NOW + 100));
    }

    #[test]
    fn a_request_is_refused_when_revoked_expired_or_rotated_out() {
        let r = v2();
        let (current, previous) = (hash('c'), hash('a'));
        assert_eq!(r.refusal(&current, NOW), None);
        // the previous secret works until its overlap ends, not a second longer
        assert_eq!(r.refusal(&previous, NOW + 49), None);
        assert_eq!(r.refusal(&previous, NOW + 50), Some(Refusal::RotatedOut));
        assert_eq!(r.refusal(&current, NOW + 50), None);
        assert_eq!(r.refusal(&current, NOW + 100), Some(Refusal::Expired));
        let revoked = KeyRecord {
            status: KeyStatus::Revoked,
            ..r
        };
        assert_eq!(revoked.refusal(&current, NOW), Some(Refusal::Revoked));
        assert_eq!(Refusal::Expired.message(), "API key expired");
        assert_eq!(Refusal::Revoked.message(), "API key revoked");
    }

    #[test]
    fn a_rotation_keeps_the_key_and_bounds_the_overlap() {
        let r = KeyRecord::new("Ab3dE5gH1j", "", "free", NOW);
        let first = r.rotate(&hash('1'), NOW + 10, 3_600).unwrap();
        assert_eq!(first.retired_hash, None);
        let rotation = first.record.rotation.clone().unwrap();
        assert_eq!(
            (rotation.previous_hash, rotation.overlap_ends),
            (hash('1'), NOW + 3_610)
        );
        assert_eq!(first.record.updated, Some(NOW + 10));
        assert_eq!(
            (&first.record.id, &first.record.identity),
            (&r.id, &r.identity),
            "same key, same identity: same buckets"
        );
        assert_eq!(
            KeyRecord {
                rotation: None,
                updated: None,
                ..first.record.clone()
            },
            r
        );
        // a second rotation retires the first one's old secret
        let second = first.record.rotate(&hash('2'), NOW + 20, 0).unwrap();
        assert_eq!(second.retired_hash, Some(hash('1')));
        assert_eq!(
            second.record.refusal(&hash('2'), NOW + 20),
            Some(Refusal::RotatedOut)
        );
        // bounds
        assert_eq!(r.rotate(&hash('1'), NOW, -1), Err(RecordError::Overlap(-1)));
        assert_eq!(
            r.rotate(&hash('1'), NOW, MAX_OVERLAP_SECS + 1)
                .unwrap_err()
                .field(),
            "overlap_seconds"
        );
        assert!(r.rotate(&hash('1'), NOW, MAX_OVERLAP_SECS).is_ok());
        assert_eq!(r.rotate("nope", NOW, 0), Err(RecordError::RotationHash));
        let revoked = KeyRecord {
            status: KeyStatus::Revoked,
            ..r
        };
        assert_eq!(
            revoked.rotate(&hash('1'), NOW, 60),
            Err(RecordError::RotationOfRevoked)
        );
        assert_eq!(RecordError::RotationOfRevoked.field(), "status");
    }
}
