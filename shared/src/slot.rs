//! Redis Cluster key slots: `CRC16(hash tag) mod 16384`, the XMODEM CRC16 Redis
//! uses (polynomial 0x1021, initial value 0, no reflection). A cluster client
//! routes every call to the master serving the slot of its keys; a call whose keys
//! fall in different slots cannot run as one script and is refused.

use crate::keys::hash_tag;

/// Slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM, bit by bit (the hot path hashes one short tag per call).
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `key`, as `CLUSTER KEYSLOT` computes it.
pub fn key_slot(key: &str) -> u16 {
    crc16(hash_tag(key).as_bytes()) % SLOTS
}

/// The keys of one call fall in more than one slot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "keys {first:?} (slot {first_slot}) and {other:?} (slot {other_slot}) are in different \
     Redis Cluster slots: one atomic call needs one hash tag"
)]
pub struct CrossSlot {
    pub first: String,
    pub first_slot: u16,
    pub other: String,
    pub other_slot: u16,
}

/// The one slot all `keys` share (`None` for no keys).
pub fn common_slot<'a>(keys: impl IntoIterator<Item = &'a str>) -> Result<Option<u16>, CrossSlot> {
    let mut first: Option<(&str, u16)> = None;
    for k in keys {
        let s = key_slot(k);
        match first {
            None => first = Some((k, s)),
            Some((f, fs)) if fs != s => {
                return Err(CrossSlot {
                    first: f.to_string(),
                    first_slot: fs,
                    other: k.to_string(),
                    other_slot: s,
                });
            }
            Some(_) => {}
        }
    }
    Ok(first.map(|(_, s)| s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_vectors() {
        // the CRC16/XMODEM check value, and slots from the Redis Cluster spec / redis-cli
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
        assert_eq!(key_slot("123456789"), 12739); // 0x31C3
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("bar"), 5061);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
        assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
    }

    /// A table-driven CRC16, written independently, as the oracle.
    fn crc16_table(bytes: &[u8]) -> u16 {
        let table: Vec<u16> = (0u16..256)
            .map(|i| {
                let mut c = i << 8;
                for _ in 0..8 {
                    c = if c & 0x8000 != 0 {
                        (c << 1) ^ 0x1021
                    } else {
                        c << 1
                    };
                }
                c
            })
            .collect();
        bytes.iter().fold(0u16, |crc, &b| {
            (crc << 8) ^ table[usize::from(((crc >> 8) as u8) ^ b)]
        })
    }

    proptest! {
        #[test]
        fn crc_matches_the_table_form(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(crc16(&bytes), crc16_table(&bytes));
        }

        #[test]
        fn keys_sharing_a_tag_share_a_slot(tag in "[a-z0-9:_-]{1,20}", a in "[a-z:]{0,10}", b in "[a-z:]{0,10}") {
            let k1 = format!("fg:{{{tag}}}:{a}");
            let k2 = format!("x{{{tag}}}{b}");
            prop_assert_eq!(key_slot(&k1), key_slot(&k2));
            prop_assert_eq!(key_slot(&k1), key_slot(&tag));
            prop_assert!(key_slot(&k1) < SLOTS);
            prop_assert_eq!(common_slot([k1.as_str(), k2.as_str()]).unwrap(), Some(key_slot(&tag)));
        }

        #[test]
        fn different_slots_are_refused(a in "[a-z]{1,8}", b in "[a-z]{1,8}") {
            let (k1, k2) = (format!("fg:{{k:{a}}}:p"), format!("fg:{{ip:{b}}}:p"));
            let r = common_slot([k1.as_str(), k2.as_str()]);
            if key_slot(&k1) == key_slot(&k2) {
                prop_assert!(r.is_ok());
            } else {
                prop_assert!(r.is_err());
            }
        }
    }
}
