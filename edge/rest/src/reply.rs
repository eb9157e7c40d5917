//! Answers as Upstash writes them, serialized by serde: `{"result": <reply>}` or
//! `{"error": <message>}`, one such object per command for `/pipeline` and
//! `/multi-exec`. A reply renders as JSON null, an integer, a string (base64 when
//! the client asked, except `"OK"`) or an array of those.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use floodgate_edge::store::{StoreErrorKind, Value};
use serde::{Serialize, Serializer};

use crate::kill::CallFailure;

/// One command's outcome, as its object in the answer.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome<'a> {
    Result(Rendered<'a>),
    Error(&'a str),
}

impl<'a> Outcome<'a> {
    /// A Redis reply: its error's message, or the reply rendered.
    pub fn of(reply: &'a Value, base64: bool) -> Self {
        match reply {
            Value::Error(e) => Outcome::Error(&e.message),
            reply => Outcome::Result(Rendered { reply, base64 }),
        }
    }
}

/// A Redis reply rendered as Upstash renders it.
pub struct Rendered<'a> {
    pub reply: &'a Value,
    /// Strings base64, except `"OK"` (`Upstash-Encoding: base64`).
    pub base64: bool,
}

impl Rendered<'_> {
    fn string<S: Serializer>(&self, bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if self.base64 {
            s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
        } else {
            s.serialize_str(&String::from_utf8_lossy(bytes))
        }
    }
}

impl Serialize for Rendered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.reply {
            Value::Status(text) if text == "OK" => s.serialize_str(text),
            Value::Status(text) => self.string(text.as_bytes(), s),
            Value::Bulk(bytes) => self.string(bytes, s),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Nil => s.serialize_unit(),
            Value::Array(items) => s.collect_seq(items.iter().map(|reply| Rendered {
                reply,
                base64: self.base64,
            })),
            // an error inside an array (a script's, or one of a transaction's)
            Value::Error(e) => Outcome::Error(&e.message).serialize(s),
        }
    }
}

/// `200 {"result": ...}`.
pub fn success(reply: &Value, base64: bool) -> Response {
    Json(Outcome::Result(Rendered { reply, base64 })).into_response()
}

/// `200 [{"result": ...} or {"error": ...}, ...]`, one per reply.
pub fn outcomes(replies: &[Value], base64: bool) -> Response {
    let each: Vec<Outcome> = replies.iter().map(|r| Outcome::of(r, base64)).collect();
    Json(each).into_response()
}

/// `{"error": message}` with `status`.
pub fn error(status: StatusCode, message: impl AsRef<str>) -> Response {
    (status, Json(Outcome::Error(message.as_ref()))).into_response()
}

/// An error after which the connection closes (its request was not read whole).
pub fn error_closing(status: StatusCode, message: impl AsRef<str>) -> Response {
    let mut r = error(status, message);
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Redis gave no reply: 504 when it did not answer in time (a script past the
/// deadline, stopped or not, included), 502 when it cannot be reached, 500
/// otherwise.
pub(crate) fn failure(f: CallFailure) -> Response {
    let status = match &f {
        CallFailure::Store(e) => match e.kind {
            StoreErrorKind::Timeout | StoreErrorKind::Stale => StatusCode::GATEWAY_TIMEOUT,
            StoreErrorKind::Connect => StatusCode::BAD_GATEWAY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
        CallFailure::Stopped { .. } | CallFailure::Unkillable { .. } => StatusCode::GATEWAY_TIMEOUT,
    };
    error(status, f.to_string())
}

/// The answer instead of a reply over `max_reply` bytes (which fails its own
/// request only), if it is.
pub fn over_bound(reply: &Value, max_reply: usize) -> Option<Response> {
    (reply_size(reply, max_reply) > max_reply).then(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!(
                "ERR reply larger than this endpoint's limit of {max_reply} bytes (floodgate-rest --max-reply)"
            ),
        )
    })
}

/// The size a reply takes (its strings' bytes, 16 per element), stopping early
/// once past `limit`.
fn reply_size(v: &Value, limit: usize) -> usize {
    fn walk(v: &Value, total: &mut usize, limit: usize) {
        *total += 16;
        if *total > limit {
            return;
        }
        match v {
            Value::Bulk(b) => *total += b.len(),
            Value::Status(s) => *total += s.len(),
            Value::Error(e) => *total += e.message.len(),
            Value::Array(items) => {
                for i in items {
                    walk(i, total, limit);
                    if *total > limit {
                        return;
                    }
                }
            }
            Value::Nil | Value::Int(_) => {}
        }
    }
    let mut total = 0;
    walk(v, &mut total, limit);
    total
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use floodgate_edge::store::StoreError;
    use serde_json::{Value as Json, json};

    use super::*;

    fn rendered(reply: Value, base64: bool) -> Json {
        serde_json::to_value(Rendered {
            reply: &reply,
            base64,
        })
        .unwrap()
    }

    #[test]
    fn replies_render_like_upstash() {
        assert_eq!(rendered(Value::Status("OK".into()), true), json!("OK"));
        assert_eq!(
            rendered(Value::Status("PONG".into()), true),
            json!("UE9ORw==")
        );
        assert_eq!(rendered(Value::Bulk(b"bar".to_vec()), true), json!("YmFy"));
        assert_eq!(rendered(Value::Bulk(b"bar".to_vec()), false), json!("bar"));
        assert_eq!(rendered(Value::Nil, true), Json::Null);
        assert_eq!(
            rendered(Value::Array(vec![Value::Int(3), Value::Nil]), false),
            json!([3, null])
        );
        assert_eq!(
            rendered(
                Value::Array(vec![
                    Value::Int(-1),
                    Value::Error(StoreError::new(StoreErrorKind::Protocol, "ERR x")),
                    Value::Array(vec![Value::Status("OK".into())]),
                ]),
                true
            ),
            json!([-1, {"error": "ERR x"}, ["OK"]])
        );
    }

    #[test]
    fn outcomes_are_result_or_error_objects() {
        let ok = Value::Bulk(b"v".to_vec());
        let failed = Value::Error(StoreError::new(StoreErrorKind::Protocol, "WRONGTYPE no"));
        assert_eq!(
            serde_json::to_string(&[Outcome::of(&ok, false), Outcome::of(&failed, false)]).unwrap(),
            r#"[{"result":"v"},{"error":"WRONGTYPE no"}]"#
        );
        assert_eq!(
            serde_json::to_string(&Outcome::of(&Value::Nil, false)).unwrap(),
            r#"{"result":null}"#
        );
    }

    #[test]
    fn reply_sizes_stop_counting_past_the_limit() {
        let big = Value::Array(vec![Value::Bulk(vec![0; 600]); 100]);
        assert!(reply_size(&big, 1024) > 1024);
        assert!(reply_size(&big, usize::MAX) >= 60_000);
        assert_eq!(reply_size(&Value::Int(1), 1024), 16);
        assert!(over_bound(&big, 1024).is_some());
        assert!(over_bound(&Value::Int(1), 1024).is_none());
    }

    #[test]
    fn failures_are_504_502_or_500_and_say_what_became_of_a_script() {
        let status = |f| failure(f).status().as_u16();
        let store = |kind| CallFailure::Store(StoreError::new(kind, "x"));
        assert_eq!(status(store(StoreErrorKind::Timeout)), 504);
        assert_eq!(status(store(StoreErrorKind::Connect)), 502);
        assert_eq!(status(store(StoreErrorKind::Protocol)), 500);
        let deadline = Duration::from_millis(1500);
        let runner = crate::kill::Runner::Script;
        let stopped = CallFailure::Stopped { deadline, runner };
        assert!(stopped.to_string().contains("1500 ms"), "{stopped}");
        assert!(stopped.to_string().contains("SCRIPT KILL"), "{stopped}");
        assert_eq!(status(stopped), 504);
        let unkillable = CallFailure::Unkillable { deadline, runner };
        assert!(
            unkillable.to_string().contains("UNKILLABLE"),
            "{unkillable}"
        );
        assert_eq!(status(unkillable), 504);
    }
}
