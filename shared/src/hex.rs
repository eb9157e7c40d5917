//! Lower-case hex, written through a table (not `format!` per byte: a key's hash
//! and a request id are written on every request).

use sha2::{Digest, Sha256};

/// `bytes` as lower-case hex, two digits each (what `format!("{b:02x}")` per
/// byte writes).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = vec![0u8; 2 * bytes.len()];
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// The lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    proptest::proptest! {
        #[test]
        fn hex_writes_what_format_writes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            let want: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            proptest::prop_assert_eq!(super::hex(&bytes), want);
        }
    }
}
