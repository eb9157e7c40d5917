//! floodgate-rest's series (`docs/metrics.md`): requests by route kind and status
//! class, Redis round trips' latency and failures, and whether Redis answers.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use floodgate_edge::store::{Store as _, StoreError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::Endpoint;

/// Which of the endpoint's routes a request took (the `kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `POST /`: the command in the body.
    Command,
    Pipeline,
    MultiExec,
    /// `/set/k/v`: the command in the path.
    PathCommand,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Command => "command",
            Kind::Pipeline => "pipeline",
            Kind::MultiExec => "multi_exec",
            Kind::PathCommand => "path_command",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    kind: &'static str,
    status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: &'static str,
}

/// The endpoint's counted series.
pub(crate) struct RestMetrics {
    pub(crate) registry: Registry,
    requests: Family<RequestLabels, Counter>,
    redis_latency: Histogram,
    redis_errors: Family<ErrorLabels, Counter>,
}

impl Default for RestMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("floodgate_rest");
        let requests: Family<RequestLabels, Counter> = Family::default();
        let redis_latency = Histogram::new([
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
        ]);
        let redis_errors: Family<ErrorLabels, Counter> = Family::default();
        registry.register(
            "requests",
            "Requests answered, by kind (command, pipeline, multi_exec, path_command) and status class",
            requests.clone(),
        );
        registry.register_with_unit(
            "redis_latency",
            "Latency of one Redis round trip (a command, pipeline or transaction)",
            Unit::Seconds,
            redis_latency.clone(),
        );
        registry.register(
            "redis_errors",
            "Redis round trips that failed, by error kind",
            redis_errors.clone(),
        );
        Self {
            registry,
            requests,
            redis_latency,
            redis_errors,
        }
    }
}

impl RestMetrics {
    /// One Redis round trip: how long it took, and its failure if it failed.
    pub(crate) fn redis_round_trip(&self, took: Duration, failure: Option<&StoreError>) {
        self.redis_latency.observe(took.as_secs_f64());
        if let Some(e) = failure {
            self.redis_errors
                .get_or_create(&ErrorLabels {
                    kind: e.kind.name(),
                })
                .inc();
        }
    }

    /// One answer of a route of `kind` (the routes' outermost layer counts each).
    pub(crate) fn answered(&self, kind: Kind, status: StatusCode) {
        let status = match status.as_u16() / 100 {
            2 => "2xx",
            4 => "4xx",
            _ => "5xx",
        };
        self.requests
            .get_or_create(&RequestLabels {
                kind: kind.label(),
                status,
            })
            .inc();
    }
}

/// Prometheus text: the counted series, and whether Redis answers a `PING` now
/// (within a second: a scrape during an outage answers, showing it).
pub(crate) async fn scrape(State(ep): State<Arc<Endpoint>>) -> Response {
    let up = matches!(
        tokio::time::timeout(Duration::from_secs(1), ep.store().ping()).await,
        Ok(Ok(()))
    );
    let mut now = Registry::with_prefix("floodgate_rest");
    now.register(
        "redis_up",
        "1 when Redis answered a PING at this scrape (within 1 s)",
        ConstGauge::new(i64::from(up)),
    );
    (
        [(header::CONTENT_TYPE, floodgate_edge::metrics::CONTENT_TYPE)],
        floodgate_edge::metrics::render(&[&ep.metrics.registry, &now]),
    )
        .into_response()
}
