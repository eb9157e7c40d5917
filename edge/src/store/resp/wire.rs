//! RESP2 on the wire: encoding commands and parsing replies, incrementally and
//! defensively (bounded sizes and depth; garbage is an error, never a panic).

use std::fmt;

/// A parsed reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// The stream is not RESP (or exceeds our bounds): the connection must be dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed RESP: {}", self.0)
    }
}

/// Largest bulk string we accept (replies here are small; this bounds memory).
pub const MAX_BULK: usize = 16 * 1024 * 1024;
/// Largest array we accept.
pub const MAX_ARRAY: usize = 1024 * 1024;
/// Deepest nesting we accept.
pub const MAX_DEPTH: usize = 8;

/// Appends `args` as a RESP array of bulk strings.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        out.extend_from_slice(a.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses one reply from the front of `buf`: `Ok(Some((reply, bytes used)))`,
/// `Ok(None)` when more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, WireError> {
    parse_at(buf, 0, 0)
}

fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, WireError> {
    let Some(rel) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
        if buf.len() - at > 64 * 1024 {
            return Err(WireError("header line longer than 64 KiB".into()));
        }
        return Ok(None);
    };
    Ok(Some((&buf[at..at + rel], at + rel + 2)))
}

fn int(text: &[u8]) -> Result<i64, WireError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            WireError(format!(
                "bad integer {:?}",
                String::from_utf8_lossy(&text[..text.len().min(32)])
            ))
        })
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Reply, usize)>, WireError> {
    if depth > MAX_DEPTH {
        return Err(WireError("nesting deeper than 8".into()));
    }
    if at >= buf.len() {
        return Ok(None);
    }
    let kind = buf[at];
    let Some((text, next)) = line(buf, at + 1)? else {
        return Ok(None);
    };
    let utf8 = |t: &[u8]| String::from_utf8_lossy(t).into_owned();
    match kind {
        b'+' => Ok(Some((Reply::Simple(utf8(text)), next))),
        b'-' => Ok(Some((Reply::Error(utf8(text)), next))),
        b':' => Ok(Some((Reply::Int(int(text)?), next))),
        b'$' => {
            let len = int(text)?;
            if len == -1 {
                return Ok(Some((Reply::Bulk(None), next)));
            }
            let len = usize::try_from(len)
                .ok()
                .filter(|l| *l <= MAX_BULK)
                .ok_or_else(|| WireError(format!("bulk length {len}")))?;
            if buf.len() < next + len + 2 {
                return Ok(None);
            }
            if &buf[next + len..next + len + 2] != b"\r\n" {
                return Err(WireError("bulk string not followed by CRLF".into()));
            }
            Ok(Some((
                Reply::Bulk(Some(buf[next..next + len].to_vec())),
                next + len + 2,
            )))
        }
        b'*' => {
            let count = int(text)?;
            if count == -1 {
                return Ok(Some((Reply::Array(None), next)));
            }
            let count = usize::try_from(count)
                .ok()
                .filter(|c| *c <= MAX_ARRAY)
                .ok_or_else(|| WireError(format!("array length {count}")))?;
            let mut items = Vec::with_capacity(count.min(64));
            let mut at = next;
            for _ in 0..count {
                let Some((item, after)) = parse_at(buf, at, depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                at = after;
            }
            Ok(Some((Reply::Array(Some(items)), at)))
        }
        other => Err(WireError(format!("unexpected type byte 0x{other:02x}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_reply_type_and_waits_for_more_bytes() {
        let wire = b"+OK\r\n-ERR bad\r\n:-42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n$0\r\n\r\n*-1\r\n";
        let mut at = 0;
        let mut got = vec![];
        while let Some((r, used)) = parse(&wire[at..]).unwrap() {
            got.push(r);
            at += used;
        }
        assert_eq!(at, wire.len());
        assert_eq!(
            got,
            vec![
                Reply::Simple("OK".into()),
                Reply::Error("ERR bad".into()),
                Reply::Int(-42),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Bulk(None),
                Reply::Array(Some(vec![Reply::Int(1), Reply::Bulk(Some(vec![]))])),
                Reply::Array(None),
            ]
        );
        // every strict prefix of a reply is "need more"
        let one = b"*3\r\n:1\r\n:1764000000000000\r\n$2\r\nab\r\n";
        for cut in 0..one.len() {
            assert_eq!(parse(&one[..cut]).unwrap(), None, "prefix of {cut} bytes");
        }
    }

    #[test]
    fn hostile_streams_are_errors() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$-5\r\n",
            b"$99999999999\r\n",
            b"*-7\r\n",
            b"$3\r\nabcXY",
            b"*99999999\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep: Vec<u8> = b"*1\r\n".repeat(20);
        assert!(parse(&deep).is_err());
        let long = vec![b'+'; 70 * 1024];
        assert!(parse(&long).is_err());
    }

    #[test]
    fn encodes_commands_as_bulk_arrays() {
        let mut out = vec![];
        encode(&mut out, &[b"EVALSHA", b"", b"k"]);
        assert_eq!(out, b"*3\r\n$7\r\nEVALSHA\r\n$0\r\n\r\n$1\r\nk\r\n");
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn encoded_arrays_parse_back(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..8)) {
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let mut out = vec![];
            encode(&mut out, &refs);
            let (reply, used) = parse(&out).unwrap().unwrap();
            prop_assert_eq!(used, out.len());
            prop_assert_eq!(reply, Reply::Array(Some(args.into_iter().map(|a| Reply::Bulk(Some(a))).collect())));
        }
    }
}
