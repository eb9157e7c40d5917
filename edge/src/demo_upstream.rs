//! A tiny upstream for local runs and tests: answers every request with JSON that
//! echoes what it saw (method, path, query, the identity header, whether an
//! Authorization header arrived) and counts requests per path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// Requests seen, per path (shared with whoever started the upstream).
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<HashMap<String, u64>>>);

impl Seen {
    pub fn total(&self) -> u64 {
        self.0.lock().expect("seen lock").values().sum()
    }
    pub fn path(&self, path: &str) -> u64 {
        self.0
            .lock()
            .expect("seen lock")
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

pub fn router(seen: Seen) -> Router {
    Router::new().fallback(echo).with_state(seen)
}

async fn echo(State(seen): State<Seen>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    *seen
        .0
        .lock()
        .expect("seen lock")
        .entry(path.clone())
        .or_default() += 1;
    let h = req.headers();
    let text = |name: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let echo = serde_json::json!({
        "method": req.method().as_str(),
        "path": path,
        "query": req.uri().query(),
        "key_id": text("x-floodgate-key-id"),
        "authorization_forwarded": h.contains_key(header::AUTHORIZATION),
        "forwarded_for": text("x-forwarded-for"),
    });
    let body = to_bytes(req.into_body(), 16 * 1024 * 1024)
        .await
        .map(|b| b.len())
        .unwrap_or(0);
    let mut v = echo;
    v["body_bytes"] = body.into();
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(v.to_string()),
    )
        .into_response()
}
