//! Commands as clients send them: a JSON array of strings and numbers in the body
//! (`POST /`), an array of those (`/pipeline`, `/multi-exec`), or the path's
//! segments (`GET /set/k/v`), the body (`POST /set/k`) and the query string's
//! parameters (`?EX=100`). JSON numbers become the exact text the client sent.

use serde_json::value::RawValue;

use crate::auth::TOKEN_PARAMETER;
use crate::policy::{CommandPolicy, Refusal};

/// One command's arguments, its name first.
pub type Command = Vec<Vec<u8>>;

/// One JSON array element as a command argument: a string, or a number as the
/// exact text the client sent.
fn argument(i: usize, raw: &RawValue) -> Result<Vec<u8>, Refusal> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(text)
            .map(String::into_bytes)
            .map_err(|e| Refusal::Malformed(format!("argument {i}: {e}"))),
        Some(b'-' | b'0'..=b'9') => Ok(text.as_bytes().to_vec()),
        _ => Err(Refusal::Malformed(format!(
            "argument {i} must be a string or a number, got {}",
            match text.as_bytes().first() {
                Some(b'n') => "null",
                Some(b't' | b'f') => "a boolean",
                Some(b'[') => "an array",
                Some(b'{') => "an object",
                _ => "something else",
            }
        ))),
    }
}

/// One command from a JSON array of strings and numbers.
fn command_from_raw(raw: &RawValue) -> Result<Command, Refusal> {
    let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|_| {
        Refusal::Malformed("a command must be a JSON array like [\"SET\",\"key\",\"value\"]".into())
    })?;
    if items.is_empty() {
        return Err(Refusal::Malformed("a command must not be empty".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, a)| argument(i, a))
        .collect()
}

fn parse_raw(body: &[u8]) -> Result<&RawValue, Refusal> {
    if body.is_empty() {
        return Err(Refusal::Malformed(
            "empty request body; send a JSON array command".into(),
        ));
    }
    serde_json::from_slice(body).map_err(|e| Refusal::Malformed(format!("malformed JSON: {e}")))
}

/// The command of `POST /`, if the policy lets it run.
pub fn command_from_json(policy: &CommandPolicy, body: &[u8]) -> Result<Command, Refusal> {
    let args = command_from_raw(parse_raw(body)?)?;
    policy.check(&args)?;
    Ok(args)
}

/// The commands of `/pipeline` and `/multi-exec`, if the policy lets every one
/// run (else why the first refused one may not, by its index).
pub fn commands_from_json(policy: &CommandPolicy, body: &[u8]) -> Result<Vec<Command>, Refusal> {
    let cmds: Vec<&RawValue> = serde_json::from_str(parse_raw(body)?.get()).map_err(|_| {
        Refusal::Malformed(
            "expected a JSON array of commands like [[\"SET\",\"k\",\"v\"],[\"GET\",\"k\"]]".into(),
        )
    })?;
    if cmds.is_empty() {
        return Err(Refusal::Malformed("no commands".into()));
    }
    cmds.iter()
        .enumerate()
        .map(|(index, c)| {
            command_from_raw(c)
                .and_then(|args| policy.check(&args).map(|()| args))
                .map_err(|refusal| Refusal::InBatch {
                    index,
                    refusal: Box::new(refusal),
                })
        })
        .collect()
}

/// A path-style command: the path's segments (percent-decoded, byte for byte),
/// the body (POST/PUT), then the query string's parameters (`?EX=100` → `EX 100`,
/// `?NX` → `NX`; `_token` is not one).
pub fn command_from_path(path: &str, query: Option<&str>, body: &[u8], with_body: bool) -> Command {
    let mut args: Command = path
        .trim_start_matches('/')
        .split('/')
        .map(|segment| floodgate_shared::routes::percent_decode(segment.as_bytes()))
        .collect();
    if with_body && !body.is_empty() {
        args.push(body.to_vec());
    }
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if name == TOKEN_PARAMETER {
            continue;
        }
        args.push(name.into_owned().into_bytes());
        if !value.is_empty() {
            args.push(value.into_owned().into_bytes());
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(v: &[&str]) -> Command {
        v.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    fn policy(allow: &[&str]) -> CommandPolicy {
        CommandPolicy::new(&allow.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn json_commands_take_strings_and_numbers_as_sent() {
        let p = policy(&[]);
        assert_eq!(
            command_from_json(&p, br#"["SET", "k", 10, 1.5, 1e-07, 18446744073709551616]"#)
                .unwrap(),
            words(&["SET", "k", "10", "1.5", "1e-07", "18446744073709551616"])
        );
        for bad in [
            &br#"[]"#[..],
            br#""GET""#,
            br#"["GET", ["k"]]"#,
            br#"["GET", null]"#,
            br#"["GET", true]"#,
            br#"["GET", {"a": 1}]"#,
            br#"{"cmd": "GET"}"#,
            b"",
        ] {
            assert!(
                command_from_json(&p, bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        for blocked in [
            &br#"["multi"]"#[..],
            br#"["BLPOP", "k", 0]"#,
            br#"["xread", "block", 0, "streams", "s", "$"]"#,
            br#"["select", 1]"#,
            br#"["client", "kill"]"#,
            br#"["config", "get", "maxmemory"]"#,
            br#"["Script", "Flush"]"#,
            br#"["acl", "setuser", "x"]"#,
            br#"["cluster", "reset"]"#,
        ] {
            assert!(
                command_from_json(&p, blocked)
                    .unwrap_err()
                    .to_string()
                    .contains("not allowed"),
                "{}",
                String::from_utf8_lossy(blocked)
            );
        }
        for fine in [
            &br#"["SCRIPT", "LOAD", "return 1"]"#[..],
            br#"["acl", "whoami"]"#,
            br#"["CLUSTER", "KEYSLOT", "k"]"#,
            br#"["FUNCTION", "LIST"]"#,
        ] {
            assert!(
                command_from_json(&p, fine).is_ok(),
                "{}",
                String::from_utf8_lossy(fine)
            );
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_what_it_names() {
        let p = policy(&["flushdb", "script  flush"]);
        assert!(command_from_json(&p, br#"["FLUSHDB"]"#).is_ok());
        assert!(command_from_json(&p, br#"["SCRIPT", "flush"]"#).is_ok());
        assert!(command_from_json(&p, br#"["SCRIPT", "KILL"]"#).is_err());
        assert!(command_from_json(&p, br#"["FLUSHALL"]"#).is_err());
        // connection state can never be allowed
        let p = policy(&["MULTI", "SELECT"]);
        assert!(command_from_json(&p, br#"["MULTI"]"#).is_err());
        assert!(command_from_json(&p, br#"["SELECT", 1]"#).is_err());
    }

    #[test]
    fn a_refused_command_of_a_batch_is_named_by_its_index() {
        let p = policy(&[]);
        let e = commands_from_json(&p, br#"[["GET","k"],["FLUSHALL"]]"#).unwrap_err();
        assert!(matches!(e, Refusal::InBatch { index: 1, .. }), "{e:?}");
        assert!(e.to_string().ends_with("(command 1)"), "{e}");
        assert_eq!(
            commands_from_json(&p, br#"[["GET","k"],["SET","k",1]]"#).unwrap(),
            vec![words(&["GET", "k"]), words(&["SET", "k", "1"])]
        );
    }

    #[test]
    fn path_commands_take_the_body_then_the_query_arguments() {
        assert_eq!(
            command_from_path("/set/foo", Some("EX=100&_token=t"), b"bar", true),
            words(&["set", "foo", "bar", "EX", "100"])
        );
        assert_eq!(
            command_from_path("/set/a%20b/v", Some("NX&PX=5"), b"", false),
            words(&["set", "a b", "v", "NX", "PX", "5"])
        );
        assert_eq!(
            command_from_path("/get/k", None, b"ignored", false),
            words(&["get", "k"])
        );
        // the query's parameters are percent-decoded (`+` is a space there)
        assert_eq!(
            command_from_path("/set/k", Some("&&KEEPTTL&x=a%2Bb+c"), b"v", true),
            words(&["set", "k", "v", "KEEPTTL", "x", "a+b c"])
        );
    }

    #[test]
    fn path_segments_are_percent_decoded_byte_for_byte() {
        assert_eq!(
            command_from_path("/set/a%2Fb/%FF%00+", None, b"", false),
            vec![b"set".to_vec(), b"a/b".to_vec(), vec![0xff, 0, b'+']]
        );
        assert_eq!(
            command_from_path("/echo/100%/%zz", None, b"", false),
            words(&["echo", "100%", "%zz"])
        );
    }
}
