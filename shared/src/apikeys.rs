//! API keys: their format, how they are read from a request, and how they are
//! stored — ONLY as SHA-256 hashes, next to the key's record ([`crate::keyrecord`]).
//!
//! Two shapes of secret are read:
//! - **v1** `fg_<id>_<32 base62>` (46 characters): every key minted before
//!   checksums. It has no checksum and is looked up as it always was.
//! - **v2** `fg_<id>_<32 base62><6 base62>` (52 characters): a v1 shape followed by
//!   its checksum, the CRC-32 (IEEE, as zlib computes it) of the 46 characters
//!   before it, written as 6 base62 digits, most significant first ([`checksum`]).
//!   [`new_secret`] mints v2 secrets only.
//!
//! A v2-length secret whose checksum does not match is refused before any lookup
//! ([`check_secret`]), so a mistyped or randomly forged key costs no store call.
//! A CRC-32 detects every error confined to 32 consecutive bits, hence EVERY
//! single-character substitution and every swap of two adjacent characters of a
//! secret (a change in the checksum digits themselves too: the digits of a value
//! are unique). A random string of the v2 shape passes with a chance of 62^-6
//! (one in 5.7 × 10^10): its last six characters must be the one checksum.
//! The checksum is not a signature: whoever knows this format can compute one,
//! so the unknown-key lookup budgets stay the second line (and v1-shaped strings
//! are still looked up while v1 keys are accepted).
//!
//! The id (10 base62 characters) is not secret and names the key in logs, bucket
//! keys and the dashboard; the `fg_` prefix lets secret scanners find leaked keys.
//! Redis holds `fg:apikey:<sha256 hex of the whole secret>` → the key's record,
//! never the secret. Anything that cannot be a secret (too long, wrong shape, a
//! wrong checksum) is refused before any lookup, so absurd headers cost nothing.

/// The record of a key: defined in [`crate::keyrecord`], named here as before.
pub use crate::keyrecord::{KeyRecord, KeyStatus};

pub const SECRET_PREFIX: &str = "fg_";
pub const ID_LEN: usize = 10;
pub const RANDOM_LEN: usize = 32;
/// A v1 secret's length: `fg_` + id + `_` + random part.
pub const SECRET_LEN: usize = SECRET_PREFIX.len() + ID_LEN + 1 + RANDOM_LEN;
/// The checksum's length: 6 base62 digits hold any 32-bit value (62^6 > 2^32).
pub const CHECK_LEN: usize = 6;
/// A v2 secret's length: a v1 shape followed by its checksum.
pub const SECRET_V2_LEN: usize = SECRET_LEN + CHECK_LEN;
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The Redis key holding a key record.
pub fn record_key(hash_hex: &str) -> String {
    format!("{RECORD_PREFIX}{hash_hex}")
}

const RECORD_PREFIX: &str = "fg:apikey:";

/// The hash of the key whose record is stored at `name` ([`record_key`]'s
/// inverse), or `None` for a name that is not a key record's.
pub fn record_hash(name: &str) -> Option<&str> {
    name.strip_prefix(RECORD_PREFIX)
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The lowercase hex SHA-256 of a secret.
pub fn hash_secret(secret: &str) -> String {
    crate::hex::sha256_hex(secret.as_bytes())
}

fn base62(random: &[u8]) -> String {
    random
        .iter()
        .map(|b| char::from(BASE62[usize::from(*b) % BASE62.len()]))
        .collect()
}

/// The checksum of a v2 secret's first [`SECRET_LEN`] characters: their CRC-32,
/// as [`CHECK_LEN`] base62 digits, most significant first.
pub fn checksum(body: &str) -> [u8; CHECK_LEN] {
    let mut n = crc32fast::hash(body.as_bytes());
    let mut out = [b'0'; CHECK_LEN];
    for digit in out.iter_mut().rev() {
        *digit = BASE62[(n % 62) as usize];
        n /= 62;
    }
    out
}

/// Builds a v2 secret from random bytes (the caller supplies randomness: this
/// crate does no I/O). Returns (id, secret).
pub fn new_secret(random: &[u8; ID_LEN + RANDOM_LEN]) -> (String, String) {
    let id = base62(&random[..ID_LEN]);
    let mut tail = [0u8; RANDOM_LEN];
    tail.copy_from_slice(&random[ID_LEN..]);
    let secret = secret_for(&id, &tail);
    (id, secret)
}

/// A new v2 secret for the key `id` (a rotation keeps the key's id). `id` must
/// be [`ID_LEN`] base62 characters for the secret to be readable.
pub fn secret_for(id: &str, random: &[u8; RANDOM_LEN]) -> String {
    let mut secret = format!("{SECRET_PREFIX}{id}_{}", base62(random));
    let check = checksum(&secret);
    secret.extend(check.iter().map(|b| char::from(*b)));
    secret
}

/// Whether `text` has the shape of a secret of either version. The checksum of
/// a v2 shape is not checked: [`check_secret`] does.
pub fn looks_like_secret(text: &str) -> bool {
    (text.len() == SECRET_LEN || text.len() == SECRET_V2_LEN)
        && text.starts_with(SECRET_PREFIX)
        && text.as_bytes()[SECRET_PREFIX.len() + ID_LEN] == b'_'
        && {
            // the id, then the random part (and a v2's checksum), without the `_`
            let (id, rest) = text.as_bytes()[SECRET_PREFIX.len()..].split_at(ID_LEN);
            id.iter().chain(&rest[1..]).all(u8::is_ascii_alphanumeric)
        }
}

/// The shape of a readable secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretVersion {
    /// Minted before checksums: looked up on its shape alone.
    V1,
    /// Its checksum matched.
    V2,
}

/// Why a string is not a readable secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("not the shape of a Floodgate API key")]
    Shape,
    #[error("the API key's checksum does not match (mistyped or forged)")]
    Checksum,
}

/// The shape and, for v2, the checksum of a secret: what is checked before any
/// lookup. Pure and allocation-free.
pub fn check_secret(text: &str) -> Result<SecretVersion, SecretError> {
    if !looks_like_secret(text) {
        return Err(SecretError::Shape);
    }
    if text.len() == SECRET_LEN {
        return Ok(SecretVersion::V1);
    }
    let (body, check) = text.split_at(SECRET_LEN);
    if checksum(body) == check.as_bytes() {
        Ok(SecretVersion::V2)
    } else {
        Err(SecretError::Checksum)
    }
}

/// The key id a readable secret names.
pub fn secret_id(secret: &str) -> Option<&str> {
    check_secret(secret)
        .ok()
        .map(|_| &secret[SECRET_PREFIX.len()..SECRET_PREFIX.len() + ID_LEN])
}

/// Why a request carries no usable key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyProblem {
    /// No credentials at all.
    Missing,
    /// Something that cannot be a Floodgate key: a wrong shape, or a v2 shape
    /// whose checksum does not match ([`check_secret`] tells which).
    Malformed,
}

/// Reads the key from an `Authorization: Bearer <key>` value (or a custom header's
/// raw value when `bearer` is false), its shape and checksum checked.
pub fn key_from_header(value: Option<&[u8]>, bearer: bool) -> Result<&str, KeyProblem> {
    let value = value.ok_or(KeyProblem::Missing)?;
    let value = std::str::from_utf8(value)
        .map_err(|_| KeyProblem::Malformed)?
        .trim();
    let key = if bearer {
        if value.eq_ignore_ascii_case("bearer") {
            return Err(KeyProblem::Missing);
        }
        let (scheme, rest) = value.split_once(' ').ok_or(KeyProblem::Malformed)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(KeyProblem::Malformed);
        }
        rest.trim()
    } else {
        value
    };
    if key.is_empty() {
        return Err(KeyProblem::Missing);
    }
    match check_secret(key) {
        Ok(_) => Ok(key),
        Err(_) => Err(KeyProblem::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> (String, String) {
        let mut random = [0u8; ID_LEN + RANDOM_LEN];
        for (i, b) in random.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        new_secret(&random)
    }

    #[test]
    fn secrets_have_the_documented_shape_and_hash_to_hex() {
        let (id, s) = secret();
        assert_eq!(id.len(), ID_LEN);
        assert_eq!(s.len(), SECRET_V2_LEN);
        assert!(s.starts_with(&format!("fg_{id}_")));
        assert!(looks_like_secret(&s));
        assert_eq!(check_secret(&s), Ok(SecretVersion::V2));
        assert_eq!(secret_id(&s), Some(id.as_str()));
        let h = hash_secret(&s);
        assert_eq!(h.len(), 64);
        assert!(
            h.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(hash_secret(&s), hash_secret(&s.replace('A', "B")));
    }

    #[test]
    fn a_record_name_gives_back_its_hash_and_other_names_none() {
        let h = hash_secret(&secret().1);
        assert_eq!(record_hash(&record_key(&h)), Some(h.as_str()));
        for other in [
            "fg:apikey:",
            "fg:apikey:xyz",
            "fg:config",
            "rev",
            "fg:apikeys:ab",
        ] {
            assert_eq!(record_hash(other), None, "{other}");
        }
    }

    #[test]
    fn keys_are_read_from_bearer_headers_and_absurd_values_refused() {
        let (_, s) = secret();
        let h = format!("Bearer {s}");
        assert_eq!(key_from_header(Some(h.as_bytes()), true), Ok(s.as_str()));
        assert_eq!(
            key_from_header(Some(format!("bearer  {s} ").as_bytes()), true),
            Ok(s.as_str())
        );
        assert_eq!(key_from_header(Some(s.as_bytes()), false), Ok(s.as_str()));
        assert_eq!(key_from_header(None, true), Err(KeyProblem::Missing));
        assert_eq!(
            key_from_header(Some(b"Bearer "), true),
            Err(KeyProblem::Missing)
        );
        let long = format!("Bearer {}", "x".repeat(64 * 1024));
        let wrong_prefix = format!("Bearer xx_{}", &s[3..]);
        let bad_char = format!("Bearer {}!", &s[..s.len() - 1]);
        let basic = format!("Basic {s}");
        for bad in [
            long.as_bytes(),
            wrong_prefix.as_bytes(),
            bad_char.as_bytes(),
            basic.as_bytes(),
            b"Bearer \xff\xfe",
            b"Bearer a'; DROP TABLE",
        ] {
            assert_eq!(
                key_from_header(Some(bad), true),
                Err(KeyProblem::Malformed),
                "{:?}",
                String::from_utf8_lossy(&bad[..bad.len().min(40)])
            );
        }
    }

    /// A v1 secret as keys were minted before checksums (the old `new_secret`).
    fn v1_secret(random: &[u8; ID_LEN + RANDOM_LEN]) -> String {
        format!(
            "{SECRET_PREFIX}{}_{}",
            base62(&random[..ID_LEN]),
            base62(&random[ID_LEN..])
        )
    }

    #[test]
    fn the_checksum_is_the_ieee_crc32_in_six_base62_digits() {
        // the CRC-32 check value: crc32("123456789") = 0xCBF43926 = 3421780262
        assert_eq!(&checksum("123456789"), b"3jZRME");
        // computed independently: python3 zlib.crc32 and base62
        let body = format!("fg_Ab3dE5gH1j_{}", "x".repeat(32));
        let random = [b'x'; RANDOM_LEN];
        assert_eq!(
            secret_for("Ab3dE5gH1j", &random.map(|_| 59)),
            format!("{body}2Dx6E5")
        );
        assert_eq!(
            &checksum("").map(char::from).iter().collect::<String>(),
            "000000"
        );
    }

    #[test]
    fn a_stored_v1_secret_is_still_read_and_named_by_its_id() {
        // the shape of every key minted before v2 (46 characters, no checksum)
        let v1 = "fg_Ab3dE5gH1j_0123456789abcdefghijABCDEFGHIJ01";
        assert_eq!(v1.len(), SECRET_LEN);
        assert_eq!(check_secret(v1), Ok(SecretVersion::V1));
        assert_eq!(key_from_header(Some(v1.as_bytes()), false), Ok(v1));
        assert_eq!(secret_id(v1), Some("Ab3dE5gH1j"));
        // lengths between and beyond the two shapes are malformed
        for n in 1..=CHECK_LEN + 1 {
            let odd = format!("{v1}{}", "a".repeat(n));
            let expected = if n == CHECK_LEN {
                Err(SecretError::Checksum)
            } else {
                Err(SecretError::Shape)
            };
            assert_eq!(check_secret(&odd), expected, "{odd}");
            assert_eq!(
                key_from_header(Some(odd.as_bytes()), false),
                Err(KeyProblem::Malformed)
            );
        }
    }

    #[test]
    fn a_wrong_checksum_is_refused_as_malformed_before_any_lookup() {
        let (_, s) = secret();
        let mut forged = s.clone().into_bytes();
        let last = forged.len() - 1;
        forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
        let forged = String::from_utf8(forged).unwrap();
        assert!(looks_like_secret(&forged));
        assert_eq!(check_secret(&forged), Err(SecretError::Checksum));
        assert_eq!(secret_id(&forged), None);
        let header = format!("Bearer {forged}");
        assert_eq!(
            key_from_header(Some(header.as_bytes()), true),
            Err(KeyProblem::Malformed)
        );
    }

    #[test]
    fn random_strings_of_the_v2_shape_are_refused() {
        // a fixed xorshift stream: deterministic; each passes with chance 62^-6
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            BASE62[(x % 62) as usize]
        };
        let mut passed = 0;
        for _ in 0..200_000 {
            let mut s = b"fg_".to_vec();
            s.extend((0..ID_LEN).map(|_| next()));
            s.push(b'_');
            s.extend((0..RANDOM_LEN + CHECK_LEN).map(|_| next()));
            let s = String::from_utf8(s).unwrap();
            assert!(looks_like_secret(&s));
            passed += usize::from(check_secret(&s).is_ok());
        }
        assert_eq!(passed, 0);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn randoms() -> impl Strategy<Value = [u8; ID_LEN + RANDOM_LEN]> {
            proptest::collection::vec(any::<u8>(), ID_LEN + RANDOM_LEN)
                .prop_map(|v| v.try_into().expect("the length asked"))
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn every_minted_secret_verifies(random in randoms()) {
                let (id, s) = new_secret(&random);
                prop_assert_eq!(check_secret(&s), Ok(SecretVersion::V2));
                prop_assert_eq!(secret_id(&s), Some(id.as_str()));
                let header = format!("Bearer {s}");
                prop_assert_eq!(key_from_header(Some(header.as_bytes()), true), Ok(s.as_str()));
            }

            /// All of them: a CRC-32 detects every error within 32 bits.
            #[test]
            fn every_single_character_change_is_refused(random in randoms()) {
                let (_, s) = new_secret(&random);
                let mut tried = 0;
                for i in 0..s.len() {
                    for &c in BASE62.iter().chain(b"_-.!") {
                        let mut b = s.clone().into_bytes();
                        if b[i] == c {
                            continue;
                        }
                        b[i] = c;
                        let changed = String::from_utf8(b).unwrap();
                        prop_assert!(check_secret(&changed).is_err(), "{} accepted", changed);
                        tried += 1;
                    }
                }
                prop_assert!(tried >= SECRET_V2_LEN * 62);
            }

            /// The shape alone, at every position of v1 and v2 secrets: a
            /// foreign character in the prefix, the id or the rest is not a
            /// secret's shape, and neither is a letter in the `_`'s place.
            #[test]
            fn the_shape_refuses_any_foreign_character(
                random in randoms(),
                foreign in prop::sample::select(b"_-.! ~/+=\x7f".to_vec()),
                v1 in any::<bool>(),
            ) {
                let (_, s) = new_secret(&random);
                let s = if v1 { &s[..SECRET_LEN] } else { s.as_str() };
                prop_assert!(looks_like_secret(s));
                let underscore = SECRET_PREFIX.len() + ID_LEN;
                for at in 0..s.len() {
                    let mut b = s.as_bytes().to_vec();
                    b[at] = if at == underscore { b'a' } else { foreign };
                    let changed = String::from_utf8(b).unwrap();
                    // (the prefix's own `_` replaced by `_` is the secret unchanged)
                    prop_assert_eq!(looks_like_secret(&changed), changed == s, "{}", changed);
                }
            }

            #[test]
            fn every_swap_of_two_adjacent_characters_is_refused(random in randoms()) {
                let (_, s) = new_secret(&random);
                for i in 0..s.len() - 1 {
                    let mut b = s.clone().into_bytes();
                    if b[i] == b[i + 1] {
                        continue;
                    }
                    b.swap(i, i + 1);
                    let swapped = String::from_utf8(b).unwrap();
                    prop_assert!(check_secret(&swapped).is_err(), "{} accepted", swapped);
                }
            }

            #[test]
            fn v1_secrets_are_still_accepted_for_lookup(random in randoms()) {
                let v1 = v1_secret(&random);
                prop_assert_eq!(check_secret(&v1), Ok(SecretVersion::V1));
                prop_assert_eq!(key_from_header(Some(v1.as_bytes()), false), Ok(v1.as_str()));
                // and minting from the same bytes extends exactly that v1 shape
                let (_, v2) = new_secret(&random);
                prop_assert_eq!(&v2[..SECRET_LEN], v1.as_str());
            }
        }
    }
}
