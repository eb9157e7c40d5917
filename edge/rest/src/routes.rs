//! The endpoint's routes:
//!
//! | path | GET, POST, PUT | HEAD | other methods |
//! |---|---|---|---|
//! | `/` | the command in the body (`["SET","k","v"]`) | 200, nothing run | 405 |
//! | `/pipeline` | the commands in the body, one outcome each | 200, nothing run | 405 |
//! | `/multi-exec` | the same, atomic (`MULTI`/`EXEC`) | 200, nothing run | 405 |
//! | `/{command}/{args}...` | the path's command (+ the body for POST and PUT, + the query's parameters) | 200, nothing run | 405 |
//! | `/__floodgate/health` (GET, HEAD only; no token) | whether Redis answers | | |
//!
//! Every route but the health check sits behind the auth layer (401 before
//! anything else, whatever the method) and the counting layer; trailing slashes
//! are not part of a route (`/pipeline/` is `/pipeline`, `//` is `/`). The
//! metrics are a router of their own ([`metrics_app`]), served on a listener
//! of their own.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::uri::PathAndQuery;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use floodgate_edge::store::{Store as _, Value};
use serde::Serialize;
use tower::ServiceExt as _;
use tower::util::{MapRequest, MapResponseLayer};

use crate::Endpoint;
use crate::auth::RequireToken;
use crate::body::Sent;
use crate::metrics::{Kind, scrape};
use crate::parse::{Command, command_from_json, command_from_path, commands_from_json};
use crate::reply::{error, failure, outcomes, over_bound, success};
use crate::scripts::with_clients_sha;

/// The path the endpoint answers itself, without a token: whether its Redis
/// answers (`{"redis":"ok"}`, or 503).
pub const HEALTH_PATH: &str = "/__floodgate/health";

/// The path of the endpoint's Prometheus metrics on its metrics listener.
pub const METRICS_PATH: &str = "/metrics";

/// The endpoint's routes behind the trim of trailing slashes: routing sees
/// `/pipeline` for `/pipeline/` (a layer of the routes would run after routing).
pub type App = MapRequest<Router, fn(Request) -> Request>;

/// The endpoint's REST routes over `ep` (see the module's table).
pub fn app(ep: Arc<Endpoint>) -> App {
    let routes = Router::new()
        .route("/", command_route(&ep, Kind::Command, command_in_body))
        .route("/pipeline", command_route(&ep, Kind::Pipeline, pipeline))
        .route(
            "/multi-exec",
            command_route(&ep, Kind::MultiExec, multi_exec),
        )
        .route(
            "/{*command}",
            command_route(&ep, Kind::PathCommand, path_command),
        )
        .route(HEALTH_PATH, get(health))
        .with_state(ep);
    routes.map_request(without_trailing_slashes as fn(Request) -> Request)
}

/// `GET /metrics` over `ep`: served on a listener of its own (`floodgate-rest
/// --metrics-listen`) without the token, which grants every Redis command.
pub fn metrics_app(ep: Arc<Endpoint>) -> Router {
    Router::new()
        .route(METRICS_PATH, get(scrape))
        .with_state(ep)
}

/// One command route: GET, POST and PUT run `handler`, HEAD answers as they would
/// without running anything, other methods are refused; all behind the token,
/// every answer counted as `kind`.
fn command_route<H, T>(ep: &Arc<Endpoint>, kind: Kind, handler: H) -> MethodRouter<Arc<Endpoint>>
where
    H: Handler<T, Arc<Endpoint>>,
    T: 'static,
{
    let counted = ep.clone();
    get(handler.clone())
        .post(handler.clone())
        .put(handler)
        .head(head)
        .fallback(method_not_allowed)
        .layer::<_, Infallible>(RequireToken(ep.clone()))
        // outermost: every answer is counted, 401s and 405s included
        .layer(MapResponseLayer::new(move |response: Response| {
            counted.metrics.answered(kind, response.status());
            response
        }))
}

/// The request with its path's trailing slashes trimmed (`/` stays `/`).
fn without_trailing_slashes(mut req: Request) -> Request {
    let path = req.uri().path();
    if path.len() > 1 && path.ends_with('/') {
        let trimmed = match path.trim_end_matches('/') {
            "" => "/",
            p => p,
        };
        let with_query = match req.uri().query() {
            Some(q) => format!("{trimmed}?{q}"),
            None => trimmed.to_string(),
        };
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query = PathAndQuery::try_from(with_query).ok();
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
    req
}

/// What GET would answer, without its body, and without running anything.
async fn head() -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
    )
        .into_response()
}

async fn method_not_allowed(method: Method) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("ERR method {method} not allowed"),
    )
}

/// `POST /`: the command in the body.
async fn command_in_body(State(ep): State<Arc<Endpoint>>, sent: Sent) -> Response {
    match command_from_json(&ep.policy, &sent.body) {
        Ok(args) => single(&ep, args, sent.base64).await,
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// `/set/k/v`: the command in the path (its value in the body for POST and PUT).
async fn path_command(
    State(ep): State<Arc<Endpoint>>,
    method: Method,
    uri: Uri,
    sent: Sent,
) -> Response {
    let with_body = matches!(method, Method::POST | Method::PUT);
    let args = command_from_path(uri.path(), uri.query(), &sent.body, with_body);
    match ep.policy.check(&args) {
        Ok(()) => single(&ep, args, sent.base64).await,
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// `/pipeline`: the commands in one Redis round trip, not atomic; one outcome
/// each, HTTP 200 even when some fail.
async fn pipeline(State(ep): State<Arc<Endpoint>>, sent: Sent) -> Response {
    let cmds = match commands_from_json(&ep.policy, &sent.body) {
        Ok(cmds) => cmds,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (cmds, shas): (Vec<_>, Vec<_>) = cmds.into_iter().map(|c| ep.scripts.prepare(c)).unzip();
    match ep.run(&cmds).await {
        Ok(replies) => answer_each(&ep, replies, shas, sent.base64),
        Err(f) => failure(f),
    }
}

/// `/multi-exec`: the commands inside `MULTI`/`EXEC`; a discarded transaction is
/// one `{"error"}`.
async fn multi_exec(State(ep): State<Arc<Endpoint>>, sent: Sent) -> Response {
    let cmds = match commands_from_json(&ep.policy, &sent.body) {
        Ok(cmds) => cmds,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (cmds, shas): (Vec<_>, Vec<_>) = cmds.into_iter().map(|c| ep.scripts.prepare(c)).unzip();
    let n = cmds.len();
    let mut batch = Vec::with_capacity(n + 2);
    batch.push(vec![b"MULTI".to_vec()]);
    batch.extend(cmds);
    batch.push(vec![b"EXEC".to_vec()]);
    match ep.run(&batch).await {
        Ok(mut replies) => match replies.pop() {
            Some(Value::Array(results)) if results.len() == n => {
                answer_each(&ep, results, shas, sent.base64)
            }
            Some(Value::Error(e)) => error(StatusCode::BAD_REQUEST, e.message),
            other => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("ERR unexpected EXEC reply {other:?}"),
            ),
        },
        Err(f) => failure(f),
    }
}

/// One command's answer: its reply, or Redis' error as a 400.
async fn single(ep: &Endpoint, args: Command, base64: bool) -> Response {
    let (args, sha) = ep.scripts.prepare(args);
    let reply = match ep.run(&[args]).await {
        Ok(mut replies) => replies.pop().map(|r| with_clients_sha(r, sha)),
        Err(f) => return failure(f),
    };
    match reply {
        Some(Value::Error(e)) => error(StatusCode::BAD_REQUEST, e.message),
        Some(r) => over_bound(&r, ep.max_reply).unwrap_or_else(|| success(&r, base64)),
        None => error(StatusCode::INTERNAL_SERVER_ERROR, "ERR no reply"),
    }
}

/// One `{"result"}` or `{"error"}` per command, all within the reply bound.
fn answer_each(
    ep: &Endpoint,
    replies: Vec<Value>,
    shas: Vec<Option<String>>,
    base64: bool,
) -> Response {
    let all = Value::Array(
        replies
            .into_iter()
            .zip(shas)
            .map(|(r, sha)| with_clients_sha(r, sha))
            .collect(),
    );
    if let Some(refusal) = over_bound(&all, ep.max_reply) {
        return refusal;
    }
    let Value::Array(replies) = &all else {
        unreachable!("built as an array")
    };
    outcomes(replies, base64)
}

#[derive(Serialize)]
struct Health {
    redis: &'static str,
}

async fn health(State(ep): State<Arc<Endpoint>>) -> Response {
    match ep.store().ping().await {
        Ok(()) => axum::Json(Health { redis: "ok" }).into_response(),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("ERR redis unavailable: {}", e.message),
        ),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http_body_util::BodyExt as _;

    use super::*;

    /// Sends one request to the routes of an endpoint without Redis (so only
    /// what is answered before Redis is asked): status, `Allow`, JSON body.
    async fn send(
        ep: &Arc<Endpoint>,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: &'static str,
    ) -> (u16, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let resp = app(ep.clone())
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let json = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (status, json)
    }

    fn endpoint() -> Arc<Endpoint> {
        Arc::new(Endpoint::unconnected(&[]))
    }

    #[tokio::test]
    async fn every_command_route_needs_the_token_before_anything_else() {
        let ep = endpoint();
        for path in [
            "/",
            "/pipeline",
            "/multi-exec",
            "/get/k",
            "/pipeline/",
            "//",
        ] {
            for method in ["GET", "POST", "PUT", "HEAD", "DELETE", "PATCH", "OPTIONS"] {
                let (status, body) = send(&ep, method, path, None, "").await;
                assert_eq!(status, 401, "{method} {path}");
                if method != "HEAD" {
                    assert_eq!(body, serde_json::json!({"error": "Unauthorized"}));
                }
                let (status, _) = send(&ep, method, path, Some("wrong"), "").await;
                assert_eq!(status, 401, "{method} {path} with a wrong token");
            }
        }
        let (status, _) = send(&ep, "POST", "/?_token=t", None, "").await;
        assert_eq!(status, 400, "the query's token admits (then: no command)");
    }

    #[tokio::test]
    async fn other_methods_are_405_and_head_runs_nothing() {
        let ep = endpoint();
        for path in ["/", "/pipeline", "/multi-exec", "/incr/k"] {
            for method in ["DELETE", "PATCH", "OPTIONS", "TRACE"] {
                let (status, body) = send(&ep, method, path, Some("t"), "").await;
                assert_eq!(status, 405, "{method} {path}");
                assert_eq!(body["error"], format!("ERR method {method} not allowed"));
            }
            // an endpoint without Redis would fail anything that reached it
            let (status, body) = send(&ep, "HEAD", path, Some("t"), "[\"INCR\",\"k\"]").await;
            assert_eq!(
                (status, body),
                (200, serde_json::Value::Null),
                "HEAD {path}"
            );
        }
    }

    #[tokio::test]
    async fn routes_ignore_trailing_slashes() {
        let ep = endpoint();
        // a batch's refusal names the command
        for path in ["/pipeline", "/pipeline/", "/pipeline//", "/multi-exec/"] {
            let (status, body) = send(&ep, "POST", path, Some("t"), r#"["GET","k"]"#).await;
            assert_eq!(status, 400, "{path}");
            assert!(
                body["error"].as_str().unwrap().ends_with("(command 0)"),
                "{path}: {body}"
            );
        }
        for path in ["/", "//", "/?x=1", "//?x=1"] {
            let (status, body) = send(&ep, "POST", path, Some("t"), "").await;
            assert_eq!(status, 400, "{path}");
            assert!(
                body["error"]
                    .as_str()
                    .unwrap()
                    .contains("empty request body"),
                "{path}: {body}"
            );
        }
        // a path command keeps its segments; a refused one never reaches Redis
        let (status, body) = send(&ep, "GET", "/select/1/", Some("t"), "").await;
        assert_eq!(status, 400);
        assert!(body["error"].as_str().unwrap().contains("SELECT"), "{body}");
        // leading slashes are not segments
        let (status, body) = send(&ep, "GET", "//select/1?_token=t", None, "").await;
        assert_eq!(status, 400);
        assert!(body["error"].as_str().unwrap().contains("SELECT"), "{body}");
    }

    #[tokio::test]
    async fn answers_are_counted_by_route_kind_and_status_class() {
        let ep = endpoint();
        send(&ep, "POST", "/pipeline/", None, "").await;
        send(&ep, "DELETE", "/", Some("t"), "").await;
        send(&ep, "GET", "/select/1", Some("t"), "").await;
        let text = floodgate_edge::metrics::render(&[&ep.metrics.registry]);
        for line in [
            r#"floodgate_rest_requests_total{kind="pipeline",status="4xx"} 1"#,
            r#"floodgate_rest_requests_total{kind="command",status="4xx"} 1"#,
            r#"floodgate_rest_requests_total{kind="path_command",status="4xx"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }

    #[tokio::test]
    async fn only_the_json_response_format_is_served() {
        let ep = endpoint();
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .header(header::AUTHORIZATION, "Bearer t")
            .header("upstash-response-format", "resp2")
            .body(Body::from(r#"["PING"]"#))
            .unwrap();
        let resp = app(ep).oneshot(req).await.unwrap();
        assert_eq!(resp.status().as_u16(), 400);
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            HeaderValue::from_static("application/json")
        );
    }
}
