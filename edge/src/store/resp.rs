//! The native store: Redis over RESP with one multiplexed connection, which
//! pipelines concurrent calls from many tasks onto one socket.

use std::time::Duration;

use floodgate_shared::Micros;
use floodgate_shared::script::{
    Check, TOKEN_BUCKET, Verdict, interpret_token_bucket, token_bucket_args,
};
use redis::aio::MultiplexedConnection;

use super::{BucketStore, StoreError, StoreErrorKind};

/// The default per-call deadline: comfortably inside the 5 ms budget on a healthy
/// local store, generous enough for a loaded 2-core test machine.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);

#[derive(Clone)]
pub struct RespStore {
    conn: MultiplexedConnection,
    deadline: Duration,
}

fn classify(e: &redis::RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        StoreErrorKind::Connect
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
    {
        StoreErrorKind::Auth
    } else {
        StoreErrorKind::Redis
    }
}

fn store_error(e: redis::RedisError) -> StoreError {
    StoreError::new(classify(&e), e.to_string())
}

impl RespStore {
    /// Connects to `url` (`redis://127.0.0.1:6379`, `rediss://...`, with credentials).
    pub async fn connect(url: &str, deadline: Duration) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(store_error)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(deadline.max(Duration::from_secs(1))))
            .set_response_timeout(Some(deadline));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(store_error)?;
        Ok(Self { conn, deadline })
    }

    /// The underlying connection, for tests and tools.
    pub fn connection(&self) -> MultiplexedConnection {
        self.conn.clone()
    }

    /// Runs the token-bucket script: `EVALSHA`, and `EVAL` with the source in the
    /// same call when the server does not know the script.
    pub async fn eval_token_bucket(
        &self,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.conn.clone();
        let call = |cmd: &str, first: &str| {
            let mut c = redis::cmd(cmd);
            c.arg(first).arg(keys.len()).arg(keys).arg(args);
            c
        };
        let run = async {
            match call("EVALSHA", TOKEN_BUCKET.sha1)
                .query_async::<Vec<i64>>(&mut conn)
                .await
            {
                Err(e) if e.code() == Some("NOSCRIPT") => {
                    call("EVAL", TOKEN_BUCKET.source)
                        .query_async::<Vec<i64>>(&mut conn)
                        .await
                }
                other => other,
            }
        };
        match tokio::time::timeout(self.deadline, run).await {
            Ok(r) => r.map_err(store_error),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no reply within {:?}", self.deadline),
            )),
        }
    }
}

impl BucketStore for RespStore {
    async fn check(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        let args = token_bucket_args(checks, now)?;
        let keys: Vec<&str> = checks.iter().map(|c| c.key).collect();
        let reply = self.eval_token_bucket(&keys, &args).await?;
        Ok(interpret_token_bucket(checks, &reply)?)
    }
}
