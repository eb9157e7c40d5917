//! redis-rs types into Floodgate's own ([`Value`], [`StoreError`]): the only place
//! that knows the client's types.

use super::{StoreError, StoreErrorKind, Value};

/// Redis' own text of an error reply: its code and its detail.
fn reply_text(code: &str, detail: Option<&str>) -> String {
    match detail {
        Some(d) if !d.is_empty() => format!("{code} {d}"),
        _ => code.to_string(),
    }
}

/// A reply of the client's as ours. RESP3-only types (never negotiated: the
/// stores speak RESP2) are kept as their nearest RESP2 shape.
pub(crate) fn value(v: redis::Value) -> Value {
    use redis::Value as R;
    match v {
        R::Nil => Value::Nil,
        R::Int(i) => Value::Int(i),
        R::BulkString(b) => Value::Bulk(b),
        R::SimpleString(s) => Value::Status(s),
        R::Okay => Value::Status("OK".into()),
        R::Array(items) | R::Set(items) => Value::Array(items.into_iter().map(value).collect()),
        R::Map(pairs) => Value::Array(
            pairs
                .into_iter()
                .flat_map(|(k, v)| [value(k), value(v)])
                .collect(),
        ),
        R::Attribute { data, .. } => value(*data),
        R::Double(d) => Value::Bulk(d.to_string().into_bytes()),
        R::Boolean(b) => Value::Int(i64::from(b)),
        R::VerbatimString { text, .. } => Value::Bulk(text.into_bytes()),
        R::BigNumber(n) => Value::Bulk(n),
        R::Push { data, .. } => Value::Array(data.into_iter().map(value).collect()),
        R::ServerError(e) => Value::Error(StoreError::reply(reply_text(e.code(), e.details()))),
        other => Value::Bulk(format!("{other:?}").into_bytes()),
    }
}

/// A failure of the client's as ours, with what retrying can do.
pub(crate) fn error(e: redis::RedisError) -> StoreError {
    use redis::ErrorKind as K;
    if let Some(code) = e.code() {
        // an error reply (during the handshake, or one the client raised itself)
        return StoreError::reply(reply_text(code, e.detail()));
    }
    let kind = match e.kind() {
        K::AuthenticationFailed => StoreErrorKind::Auth,
        // the cluster client reports a refused password on its first connections
        // only inside the text of an I/O error: the one place we read its words
        _ if e.to_string().contains("AuthenticationFailed") => StoreErrorKind::Auth,
        K::InvalidClientConfig | K::Client | K::EmptySentinelList => StoreErrorKind::Protocol,
        K::Parse | K::UnexpectedReturnType => StoreErrorKind::Protocol,
        _ if e.is_timeout() => StoreErrorKind::Timeout,
        _ => StoreErrorKind::Connect,
    };
    StoreError::new(kind, e.to_string())
}

/// Whether the connection that produced `e` must be replaced.
pub(crate) fn connection_lost(e: &redis::RedisError) -> bool {
    e.is_unrecoverable_error() || e.is_connection_dropped() || e.is_io_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies_keep_redis_text_and_kind() {
        let e = error(redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )));
        assert_eq!(e.kind, StoreErrorKind::Auth);
        let nested = value(redis::Value::Array(vec![
            redis::Value::Okay,
            redis::Value::Int(3),
            redis::Value::BulkString(b"x".to_vec()),
        ]));
        assert_eq!(
            nested,
            Value::Array(vec![
                Value::Status("OK".into()),
                Value::Int(3),
                Value::Bulk(b"x".to_vec())
            ])
        );
    }
}
