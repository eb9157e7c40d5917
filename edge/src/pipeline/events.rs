//! What the pipeline reports to its host's log: breaker transitions and
//! configuration reloads. The host chooses the sink ([`super::PipelineConfig::log`]):
//! `tracing` natively ([`trace`]), JSON lines on the console in the Worker (the
//! same `target`, `message` and fields, from [`LogEvent::fields`]).

use floodgate_shared::time::Micros;

use crate::breaker::Transition;

/// Which store's breaker moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreRole {
    /// The global store (every exact decision).
    Global,
    /// The regional store of bounded consistency's pools.
    Regional,
}

impl StoreRole {
    pub fn name(self) -> &'static str {
        match self {
            StoreRole::Global => "global",
            StoreRole::Regional => "regional",
        }
    }
}

/// One event of the pipeline's log.
#[derive(Debug, Clone, Copy)]
pub enum LogEvent<'a> {
    /// The circuit breaker in front of a store changed phase.
    Breaker {
        store: StoreRole,
        transition: &'a Transition,
    },
    /// A configuration different from the one in use was read and is now used.
    ConfigLoaded {
        policies: usize,
        plans: usize,
        routes: usize,
        at: Micros,
    },
    /// The stored configuration is missing or invalid; the last good one (if any)
    /// stays in use.
    ConfigRejected { why: &'a str, at: Micros },
}

/// A field's value, as JSON would carry it.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue<'a> {
    Text(&'a str),
    Number(i64),
}

/// How serious an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
        }
    }
}

/// Breaker transitions' target.
pub const BREAKER_TARGET: &str = "floodgate::breaker";
/// Configuration reloads' target.
pub const CONFIG_TARGET: &str = "floodgate::config";

impl LogEvent<'_> {
    pub fn level(&self) -> Level {
        match self {
            LogEvent::Breaker { transition, .. } => match transition.to {
                crate::breaker::Phase::Closed => Level::Info,
                _ => Level::Warn,
            },
            LogEvent::ConfigLoaded { .. } => Level::Info,
            LogEvent::ConfigRejected { .. } => Level::Warn,
        }
    }

    pub fn target(&self) -> &'static str {
        match self {
            LogEvent::Breaker { .. } => BREAKER_TARGET,
            LogEvent::ConfigLoaded { .. } | LogEvent::ConfigRejected { .. } => CONFIG_TARGET,
        }
    }

    /// The human sentence.
    pub fn message(&self) -> String {
        match self {
            LogEvent::Breaker { store, transition } => {
                format!("{} store: {transition}", store.name())
            }
            LogEvent::ConfigLoaded {
                policies,
                plans,
                routes,
                ..
            } => {
                format!("configuration loaded: {policies} policies, {plans} plans, {routes} routes")
            }
            LogEvent::ConfigRejected { why, .. } => {
                format!("configuration not used: {why}")
            }
        }
    }

    /// The event's fields (besides the message), for structured sinks.
    pub fn fields(&self) -> Vec<(&'static str, FieldValue<'_>)> {
        use FieldValue::{Number, Text};
        match self {
            LogEvent::Breaker { store, transition } => vec![
                ("store", Text(store.name())),
                ("from", Text(transition.from.name())),
                ("to", Text(transition.to.name())),
                ("at_us", Number(transition.at)),
                ("reason", Text(&transition.reason)),
            ],
            LogEvent::ConfigLoaded {
                policies,
                plans,
                routes,
                at,
            } => vec![
                ("policies", Number(*policies as i64)),
                ("plans", Number(*plans as i64)),
                ("routes", Number(*routes as i64)),
                ("at_us", Number(*at)),
            ],
            LogEvent::ConfigRejected { why, at } => {
                vec![("why", Text(why)), ("at_us", Number(*at))]
            }
        }
    }
}

/// The native sink: each event through `tracing` (target, level, fields and
/// message as above; request-scoped when a request's span is current).
#[cfg(feature = "native")]
pub fn trace(event: &LogEvent<'_>) {
    let message = event.message();
    match *event {
        LogEvent::Breaker { store, transition } => {
            let (store, from, to, at_us, reason) = (
                store.name(),
                transition.from.name(),
                transition.to.name(),
                transition.at,
                transition.reason.as_str(),
            );
            if event.level() == Level::Warn {
                tracing::warn!(target: "floodgate::breaker", store, from, to, at_us, reason, "{message}");
            } else {
                tracing::info!(target: "floodgate::breaker", store, from, to, at_us, reason, "{message}");
            }
        }
        LogEvent::ConfigLoaded {
            policies,
            plans,
            routes,
            at,
        } => {
            tracing::info!(target: "floodgate::config", policies, plans, routes, at_us = at, "{message}")
        }
        LogEvent::ConfigRejected { why, at } => {
            tracing::warn!(target: "floodgate::config", why, at_us = at, "{message}")
        }
    }
}

/// Without `native`: nothing (hosts of the pipeline in wasm32 pass their own sink).
#[cfg(not(feature = "native"))]
pub fn trace(_event: &LogEvent<'_>) {}

/// One JSON object per event (the Worker's console line): `timestamp` (given by
/// the host), `level`, `target`, `message` and `fields`, like the native JSON logs.
/// Written by hand (strings escaped by serde_json): no JSON tree in the Worker.
pub fn json_line(event: &LogEvent<'_>, timestamp: &str) -> String {
    let text = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let fields: Vec<String> = event
        .fields()
        .into_iter()
        .map(|(k, v)| match v {
            FieldValue::Text(t) => format!("{}:{}", text(k), text(t)),
            FieldValue::Number(n) => format!("{}:{n}", text(k)),
        })
        .collect();
    format!(
        "{{\"timestamp\":{},\"level\":{},\"target\":{},\"message\":{},\"fields\":{{{}}}}}",
        text(timestamp),
        text(event.level().name()),
        text(event.target()),
        text(&event.message()),
        fields.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::Phase;

    #[test]
    fn a_json_line_carries_the_level_target_message_and_fields() {
        let t = Transition {
            from: Phase::Closed,
            to: Phase::Open,
            at: 1_500_000,
            reason: "5 consecutive failures".into(),
        };
        let line = json_line(
            &LogEvent::Breaker {
                store: StoreRole::Global,
                transition: &t,
            },
            "2026-11-30T20:00:00.000Z",
        );
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["timestamp"], "2026-11-30T20:00:00.000Z");
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["target"], "floodgate::breaker");
        assert_eq!(v["fields"]["from"], "closed");
        assert_eq!(v["fields"]["to"], "open");
        assert_eq!(v["fields"]["at_us"], 1_500_000);
        assert_eq!(v["fields"]["store"], "global");
        assert!(v["message"].as_str().unwrap().contains("5 consecutive"));
        let quoted = Transition {
            reason: "a \"quoted\"\nline".into(),
            ..t
        };
        let line = json_line(
            &LogEvent::Breaker {
                store: StoreRole::Regional,
                transition: &quoted,
            },
            "t",
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["fields"]["reason"], "a \"quoted\"\nline");
        assert!(!line.contains('\n'));
    }
}
