//! Scripts as Upstash runs them, on stock Redis: Upstash accepts its own shebang
//! flag `allow-key-locking` (`@upstash/ratelimit`'s scripts carry it), which stock
//! Redis rejects. The endpoint strips the flag before Redis sees the script and
//! maps the script's SHA-1 as the client computed it to the SHA-1 of what Redis
//! runs, so `EVALSHA`, `SCRIPT LOAD` and `SCRIPT EXISTS` keep the client's SHA-1.

use std::collections::HashMap;
use std::sync::Mutex;

use floodgate_edge::store::{Value, lock};

/// Script flags only Upstash understands; stock Redis refuses the whole script.
const UPSTASH_ONLY_FLAGS: &[&str] = &["allow-key-locking"];
/// Bound on the SHA-1 map (cleared when full; clients then fall back to EVAL).
const MAX_MAPPED_SCRIPTS: usize = 4096;

fn sha1_hex(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

/// The script without Upstash-only shebang flags, or None when it has none.
fn strip_upstash_flags(script: &[u8]) -> Option<Vec<u8>> {
    let end = script
        .iter()
        .position(|b| *b == b'\n')
        .unwrap_or(script.len());
    let line = std::str::from_utf8(&script[..end]).ok()?;
    let rest = line.strip_prefix("#!lua")?;
    let mut removed = false;
    let mut kept_words = vec!["#!lua".to_string()];
    for word in rest.split_whitespace() {
        match word.strip_prefix("flags=") {
            Some(flags) => {
                let kept: Vec<&str> = flags
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .filter(|f| {
                        let upstash = UPSTASH_ONLY_FLAGS.contains(f);
                        removed |= upstash;
                        !upstash
                    })
                    .collect();
                if !kept.is_empty() {
                    kept_words.push(format!("flags={}", kept.join(",")));
                }
            }
            None => kept_words.push(word.to_string()),
        }
    }
    removed.then(|| [kept_words.join(" ").as_bytes(), &script[end..]].concat())
}

/// SHA-1 of a script as its client sent it → SHA-1 of what Redis runs.
#[derive(Default)]
pub(crate) struct ScriptShas(Mutex<HashMap<String, String>>);

impl ScriptShas {
    fn remember(&self, original: &[u8], local: &[u8]) -> String {
        let (orig, local) = (sha1_hex(original), sha1_hex(local));
        let mut map = lock(&self.0);
        if map.len() >= MAX_MAPPED_SCRIPTS {
            map.clear();
        }
        map.insert(orig.clone(), local);
        orig
    }

    fn local(&self, sha: &[u8]) -> Option<Vec<u8>> {
        let sha = std::str::from_utf8(sha).ok()?.to_ascii_lowercase();
        lock(&self.0).get(&sha).map(|s| s.clone().into_bytes())
    }

    /// Rewrites a command so stock Redis runs what Upstash would. Returns the
    /// command and, for `SCRIPT LOAD`, the SHA-1 the client expects back.
    pub(crate) fn prepare(&self, mut args: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, Option<String>) {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let mut reply_sha = None;
        match name.as_str() {
            "EVAL" | "EVAL_RO" if args.len() > 1 => {
                if let Some(stripped) = strip_upstash_flags(&args[1]) {
                    self.remember(&args[1], &stripped);
                    args[1] = stripped;
                }
            }
            "EVALSHA" | "EVALSHA_RO" if args.len() > 1 => {
                if let Some(local) = self.local(&args[1]) {
                    args[1] = local;
                }
            }
            "SCRIPT" if args.len() == 3 && args[1].eq_ignore_ascii_case(b"LOAD") => {
                if let Some(stripped) = strip_upstash_flags(&args[2]) {
                    reply_sha = Some(self.remember(&args[2], &stripped));
                    args[2] = stripped;
                }
            }
            "SCRIPT" if args.len() > 2 && args[1].eq_ignore_ascii_case(b"EXISTS") => {
                for a in &mut args[2..] {
                    if let Some(local) = self.local(a) {
                        *a = local;
                    }
                }
            }
            _ => {}
        }
        (args, reply_sha)
    }
}

/// A reply, with the SHA-1 the client expects when the script was rewritten.
pub(crate) fn with_clients_sha(reply: Value, sha: Option<String>) -> Value {
    match (reply, sha) {
        (Value::Bulk(_), Some(sha)) => Value::Bulk(sha.into_bytes()),
        (reply, _) => reply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstash_only_script_flags_are_stripped() {
        let s = b"#!lua flags=allow-key-locking\nreturn 1";
        assert_eq!(strip_upstash_flags(s).unwrap(), b"#!lua\nreturn 1");
        let s = b"#!lua flags=no-writes,allow-key-locking name=x\nreturn 1";
        assert_eq!(
            strip_upstash_flags(s).unwrap(),
            b"#!lua flags=no-writes name=x\nreturn 1"
        );
        assert_eq!(
            strip_upstash_flags(b"#!lua flags=no-writes\nreturn 1"),
            None
        );
        assert_eq!(strip_upstash_flags(b"return 1"), None);
        assert_eq!(
            strip_upstash_flags(b"#!lua flags=allow-key-locking"),
            Some(b"#!lua".to_vec())
        );
    }
}
