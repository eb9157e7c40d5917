//! What an operator asks of a key, as the admin API, the dashboard and the CLI
//! send it: a new key or a change of one ([`KeyChanges`]), validated here the
//! same for every caller, each error a [`RecordError`] naming its field.
//!
//! Input differs from the stored record where a typed error needs the raw value:
//! credit counts arrive as JSON numbers ([`CreditsInput`]), so `-1` and `2.5` are
//! [`RecordError::NegativeCredits`] and [`RecordError::FractionalCredits`] rather
//! than a parser's message; metadata arrives as any JSON value, so an array is
//! [`RecordError::MetadataNotObject`]; an expiry is checked against the `now` the
//! caller injects. Applying a change is pure: the record in, the changed record
//! (or the first error, nothing changed) out.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Number, Value};

use crate::credits::{Credits, Interval, MAX_CREDITS, Refill};
use crate::keyrecord::{
    KeyRecord, RecordError, check_credits, check_expiry, check_identity, metadata_from_value,
};
use crate::policy::PolicyError;

/// The largest change document read.
pub const MAX_CHANGES_JSON: usize = 16 * 1024;

/// Credits as an operator sends them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreditsInput {
    pub remaining: Number,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill: Option<RefillInput>,
}

/// A refill as an operator sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefillInput {
    pub amount: Number,
    pub interval: Interval,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<Number>,
}

/// A count of credits: a whole number from 0 to [`MAX_CREDITS`] (`5.0` is 5).
fn whole(field: &'static str, n: &Number) -> Result<u64, RecordError> {
    let too_many = RecordError::TooManyCredits { field };
    if let Some(u) = n.as_u64() {
        return if u <= MAX_CREDITS {
            Ok(u)
        } else {
            Err(too_many)
        };
    }
    if n.is_i64() {
        return Err(RecordError::NegativeCredits { field });
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    if f < 0.0 {
        Err(RecordError::NegativeCredits { field })
    } else if f.fract() != 0.0 || !f.is_finite() {
        Err(RecordError::FractionalCredits { field })
    } else if f > MAX_CREDITS as f64 {
        Err(too_many)
    } else {
        // whole, finite and in range: exact
        Ok(f as u64)
    }
}

impl CreditsInput {
    /// The credits this input states, every bound checked.
    pub fn to_credits(&self) -> Result<Credits, RecordError> {
        let refill = match &self.refill {
            None => None,
            Some(r) => Some(Refill {
                amount: whole("credits.refill.amount", &r.amount)?,
                interval: r.interval,
                day: r.day.as_ref().map(day_of_month).transpose()?,
            }),
        };
        let credits = Credits {
            remaining: whole("credits.remaining", &self.remaining)?,
            refill,
        };
        check_credits(&credits)?;
        Ok(credits)
    }
}

fn day_of_month(n: &Number) -> Result<u8, RecordError> {
    n.as_u64()
        .filter(|d| (1..=31).contains(d))
        .map(|d| d as u8)
        .ok_or(RecordError::RefillDay(
            "must be a day of the month, 1 to 31",
        ))
}

/// A field that may be left out (unchanged), `null` (cleared) or a value.
fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A new key's fields, or a change of a key's: a field left out stays as it
/// is, `null` clears an optional one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyChanges {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub identity: Option<Option<String>>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<Option<String>>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub metadata: Option<Option<Value>>,
    /// Unix seconds; must be after the `now` of the change.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub expires_at: Option<Option<i64>>,
    /// New credits: the live count starts again from `remaining` ([`Self::sets_credits`]).
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub credits: Option<Option<CreditsInput>>,
}

impl KeyChanges {
    /// Parses a change document (bounded; a type error names its field path).
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        crate::policy::parse_json(text, MAX_CHANGES_JSON)
    }

    /// `record` with these changes, made at `now` (Unix seconds): validated,
    /// `updated` set. On an error nothing is changed.
    pub fn apply(&self, record: &KeyRecord, now: i64) -> Result<KeyRecord, RecordError> {
        let mut r = record.clone();
        if let Some(owner) = &self.owner {
            r.owner.clone_from(owner);
        }
        if let Some(plan) = &self.plan {
            r.plan.clone_from(plan);
        }
        if let Some(identity) = &self.identity {
            if let Some(i) = identity {
                check_identity(i)?;
            }
            r.identity.clone_from(identity);
        }
        if let Some(name) = &self.name {
            r.name.clone_from(name);
        }
        if let Some(meta) = &self.metadata {
            r.metadata = meta.as_ref().map(metadata_from_value).transpose()?;
        }
        if let Some(at) = self.expires_at {
            if let Some(at) = at {
                check_expiry(at, now)?;
            }
            r.expires_at = at;
        }
        if let Some(credits) = &self.credits {
            r.credits = credits.as_ref().map(CreditsInput::to_credits).transpose()?;
        }
        r.updated = Some(now);
        r.check()?;
        Ok(r)
    }

    /// The record of a new key `id` created at `now` with these fields (a plan is
    /// required; `updated` stays unset).
    pub fn create(&self, id: &str, now: i64) -> Result<KeyRecord, RecordError> {
        if self.plan.is_none() {
            return Err(RecordError::Plan("is required".into()));
        }
        let mut r = self.apply(&KeyRecord::new(id, "", "", now), now)?;
        r.updated = None;
        Ok(r)
    }

    /// Whether the change sets (or removes) the key's credits: the live count
    /// must then be written too.
    pub fn sets_credits(&self) -> bool {
        self.credits.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyrecord::MAX_METADATA_BYTES;

    const NOW: i64 = 1_764_000_000;
    const ID: &str = "Ab3dE5gH1j";

    fn changes(json: &str) -> KeyChanges {
        KeyChanges::from_json(json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    fn create_error(json: &str) -> RecordError {
        changes(json).create(ID, NOW).unwrap_err()
    }

    #[test]
    fn negative_and_fractional_credits_are_typed_errors_naming_the_field() {
        let cases = [
            (
                r#"{"remaining":-1}"#,
                RecordError::NegativeCredits {
                    field: "credits.remaining",
                },
            ),
            (
                r#"{"remaining":-2.0}"#,
                RecordError::NegativeCredits {
                    field: "credits.remaining",
                },
            ),
            (
                r#"{"remaining":2.5}"#,
                RecordError::FractionalCredits {
                    field: "credits.remaining",
                },
            ),
            (
                r#"{"remaining":1e300}"#,
                RecordError::TooManyCredits {
                    field: "credits.remaining",
                },
            ),
            (
                r#"{"remaining":1000000000001}"#,
                RecordError::TooManyCredits {
                    field: "credits.remaining",
                },
            ),
            (
                r#"{"remaining":1,"refill":{"amount":-5,"interval":"daily"}}"#,
                RecordError::NegativeCredits {
                    field: "credits.refill.amount",
                },
            ),
            (
                r#"{"remaining":1,"refill":{"amount":0.5,"interval":"daily"}}"#,
                RecordError::FractionalCredits {
                    field: "credits.refill.amount",
                },
            ),
            (
                r#"{"remaining":1,"refill":{"amount":0,"interval":"daily"}}"#,
                RecordError::EmptyRefill,
            ),
        ];
        for (credits, error) in cases {
            let json = format!(r#"{{"plan":"free","credits":{credits}}}"#);
            assert_eq!(create_error(&json), error, "{json}");
        }
        let whole: CreditsInput = serde_json::from_str(r#"{"remaining":5.0}"#).unwrap();
        assert_eq!(whole.to_credits().unwrap().remaining, 5);
    }

    #[test]
    fn a_refill_day_is_a_day_of_a_monthly_refill() {
        let refill =
            |r: &str| format!(r#"{{"plan":"free","credits":{{"remaining":1,"refill":{r}}}}}"#);
        for day in ["0", "32", "1.5", "-1"] {
            let json = refill(&format!(
                r#"{{"amount":5,"interval":"monthly","day":{day}}}"#
            ));
            assert_eq!(create_error(&json).field(), "credits.refill.day", "{json}");
        }
        let daily = refill(r#"{"amount":5,"interval":"daily","day":3}"#);
        assert_eq!(
            create_error(&daily),
            RecordError::RefillDay("only a monthly refill names a day")
        );
        let ok = refill(r#"{"amount":5,"interval":"monthly","day":31}"#);
        let r = changes(&ok).create(ID, NOW).unwrap();
        assert_eq!(r.credits.unwrap().refill.unwrap().day, Some(31));
        // an interval that does not exist is the parser's error, naming the field
        let hourly = refill(r#"{"amount":5,"interval":"hourly"}"#);
        let e = KeyChanges::from_json(&hourly).unwrap_err();
        assert_eq!(e.field, "credits.refill.interval");
    }

    #[test]
    fn metadata_identity_and_expiry_are_checked_against_their_bounds() {
        assert_eq!(
            create_error(r#"{"plan":"free","metadata":[1]}"#),
            RecordError::MetadataNotObject
        );
        assert_eq!(
            create_error(r#"{"plan":"free","metadata":"x"}"#),
            RecordError::MetadataNotObject
        );
        let big = format!(
            r#"{{"plan":"free","metadata":{{"a":"{}"}}}}"#,
            "x".repeat(MAX_METADATA_BYTES)
        );
        assert_eq!(create_error(&big).field(), "metadata");
        assert_eq!(
            create_error(r#"{"plan":"free","identity":"a b"}"#),
            RecordError::Identity
        );
        let past = format!(r#"{{"plan":"free","expires_at":{NOW}}}"#);
        assert_eq!(
            create_error(&past),
            RecordError::ExpiryInPast {
                expires_at: NOW,
                now: NOW
            }
        );
        assert_eq!(create_error(r#"{"owner":"x"}"#).field(), "plan");
        assert_eq!(create_error(r#"{"plan":"Free"}"#).field(), "plan");
        assert_eq!(
            create_error(r#"{"plan":"free","name":"a\u0007"}"#),
            RecordError::Name
        );
        let unknown = KeyChanges::from_json(r#"{"plan":"free","colour":1}"#).unwrap_err();
        assert_eq!(unknown.field, "colour");
        assert!(unknown.message.contains("colour"), "{unknown}");
    }

    #[test]
    fn a_change_sets_what_it_names_clears_nulls_and_keeps_the_rest() {
        let new = changes(
            r#"{"plan":"free","identity":"cus_1","name":"ci","metadata":{"t":1},"credits":{"remaining":10}}"#,
        );
        let r = new.create(ID, NOW).unwrap();
        assert_eq!((r.created, r.updated, r.plan.as_str()), (NOW, None, "free"));
        assert_eq!(
            KeyRecord::from_json(r.to_json().as_bytes()),
            Some(r.clone())
        );
        let change = changes(r#"{"plan":"pro","metadata":null,"expires_at":1900000000}"#);
        let after = change.apply(&r, NOW + 5).unwrap();
        assert_eq!(
            (after.plan.as_str(), after.metadata.as_ref()),
            ("pro", None)
        );
        assert_eq!(after.expires_at, Some(1_900_000_000));
        assert_eq!(
            after.identity.as_deref(),
            Some("cus_1"),
            "left out: unchanged"
        );
        assert_eq!(after.credits, r.credits);
        assert_eq!(after.updated, Some(NOW + 5));
        assert!(!change.sets_credits() && new.sets_credits());
        let cleared = changes(r#"{"identity":null,"credits":null}"#)
            .apply(&after, NOW)
            .unwrap();
        assert_eq!((cleared.identity, cleared.credits), (None, None));
        // a change that fails changes nothing: the caller keeps `r`
        let bad = changes(r#"{"plan":"pro","expires_at":5}"#);
        assert_eq!(bad.apply(&r, NOW).unwrap_err().field(), "expires_at");
        // changes round-trip, null included
        let json = serde_json::to_string(&change).unwrap();
        assert_eq!(
            json,
            r#"{"plan":"pro","metadata":null,"expires_at":1900000000}"#
        );
        assert_eq!(changes(&json), change);
    }
}
