//! API keys: their format, how they are read from a request, and how they are
//! stored — ONLY as SHA-256 hashes, next to the key's record ([`crate::keyrecord`]).
//!
//! A secret looks like `fg_<id>_<32 base62 characters>`: the id (10 base62
//! characters) is not secret and names the key in logs, bucket keys and the
//! dashboard; the `fg_` prefix lets secret scanners find leaked keys. Redis holds
//! `fg:apikey:<sha256 hex of the whole secret>` → the key's record, never the secret.
//! Anything that cannot be a secret (too long, wrong shape) is refused before any
//! lookup, so absurd headers cost nothing.

use sha2::{Digest, Sha256};

/// The record of a key: defined in [`crate::keyrecord`], named here as before.
pub use crate::keyrecord::{KeyRecord, KeyStatus};

pub const SECRET_PREFIX: &str = "fg_";
pub const ID_LEN: usize = 10;
pub const RANDOM_LEN: usize = 32;
/// `fg_` + id + `_` + random part.
pub const SECRET_LEN: usize = SECRET_PREFIX.len() + ID_LEN + 1 + RANDOM_LEN;
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The Redis key holding a key record.
pub fn record_key(hash_hex: &str) -> String {
    format!("fg:apikey:{hash_hex}")
}

/// The lowercase hex SHA-256 of a secret.
pub fn hash_secret(secret: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(secret.as_bytes());
    // a table, not `format!` per byte: this runs on every request
    let mut hex = String::with_capacity(2 * digest.len());
    for b in digest {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    hex
}

/// Builds a secret from random bytes (the caller supplies randomness: this crate
/// does no I/O). Returns (id, secret).
pub fn new_secret(random: &[u8; ID_LEN + RANDOM_LEN]) -> (String, String) {
    let pick = |b: &u8| BASE62[usize::from(*b) % BASE62.len()] as char;
    let id: String = random[..ID_LEN].iter().map(pick).collect();
    let tail: String = random[ID_LEN..].iter().map(pick).collect();
    let secret = format!("{SECRET_PREFIX}{id}_{tail}");
    (id, secret)
}

/// Whether `text` has the shape of a secret (no lookup needed to refuse it).
pub fn looks_like_secret(text: &str) -> bool {
    text.len() == SECRET_LEN
        && text.starts_with(SECRET_PREFIX)
        && text.as_bytes()[SECRET_PREFIX.len() + ID_LEN] == b'_'
        && text[SECRET_PREFIX.len()..]
            .bytes()
            .enumerate()
            .all(|(i, b)| i == ID_LEN || b.is_ascii_alphanumeric())
}

/// Why a request carries no usable key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyProblem {
    /// No credentials at all.
    Missing,
    /// Something that cannot be a Floodgate key.
    Malformed,
}

/// Reads the key from an `Authorization: Bearer <key>` value (or a custom header's
/// raw value when `bearer` is false).
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
    if looks_like_secret(key) {
        Ok(key)
    } else {
        Err(KeyProblem::Malformed)
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
        assert_eq!(s.len(), SECRET_LEN);
        assert!(s.starts_with(&format!("fg_{id}_")));
        assert!(looks_like_secret(&s));
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
}
