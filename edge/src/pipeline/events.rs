//! What the pipeline and its hosts report to the log: breaker transitions,
//! configuration reloads, and (at debug) each answered request. The host chooses
//! the sink ([`super::PipelineConfig::log`]): `tracing` natively ([`trace`]), in the
//! request's span (`request_id`); JSON lines on the console in the Worker
//! ([`json_line`]: the same shape as the native JSON lines, `span.request_id`
//! included).

use floodgate_shared::time::Micros;

use crate::breaker::PhaseChange;

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
        change: &'a PhaseChange,
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
    /// A request's answer head is out (debug).
    Answered {
        method: &'a str,
        status: u16,
        latency_us: u64,
    },
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
    Debug,
    Info,
    Warn,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
        }
    }
}

/// Breaker transitions' target.
pub const BREAKER_TARGET: &str = "floodgate::breaker";
/// Configuration reloads' target.
pub const CONFIG_TARGET: &str = "floodgate::config";
/// Answered requests' target.
pub const REQUEST_TARGET: &str = "floodgate::request";

impl LogEvent<'_> {
    pub fn level(&self) -> Level {
        match self {
            LogEvent::Breaker { change, .. } => match change.to {
                crate::breaker::Phase::Closed => Level::Info,
                _ => Level::Warn,
            },
            LogEvent::ConfigLoaded { .. } => Level::Info,
            LogEvent::ConfigRejected { .. } => Level::Warn,
            LogEvent::Answered { .. } => Level::Debug,
        }
    }

    pub fn target(&self) -> &'static str {
        match self {
            LogEvent::Breaker { .. } => BREAKER_TARGET,
            LogEvent::ConfigLoaded { .. } | LogEvent::ConfigRejected { .. } => CONFIG_TARGET,
            LogEvent::Answered { .. } => REQUEST_TARGET,
        }
    }

    /// The human sentence.
    pub fn message(&self) -> String {
        match self {
            LogEvent::Breaker { store, change } => {
                format!("{} store: {change}", store.name())
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
            LogEvent::Answered { .. } => "answered".to_string(),
        }
    }

    /// The event's fields (besides the message), for structured sinks.
    pub fn fields(&self) -> Vec<(&'static str, FieldValue<'_>)> {
        use FieldValue::{Number, Text};
        match self {
            LogEvent::Breaker { store, change } => vec![
                ("store", Text(store.name())),
                ("from", Text(change.from.name())),
                ("to", Text(change.to.name())),
                ("at_us", Number(change.at)),
                ("reason", Text(&change.reason)),
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
            LogEvent::Answered {
                method,
                status,
                latency_us,
            } => vec![
                ("method", Text(method)),
                ("status", Number(i64::from(*status))),
                (
                    "latency_us",
                    Number(i64::try_from(*latency_us).unwrap_or(i64::MAX)),
                ),
            ],
        }
    }
}

/// The native hosts' request scope: the id of the request whose future is being
/// polled, so that what is logged while deciding or proxying it is logged in a
/// `request` span carrying its `request_id`. The span is made only for an event
/// that is logged: a request that logs nothing (almost all) costs two swaps of a
/// thread-local per poll, where a span per request cost several thousand
/// instructions (`scripts/bench instructions`).
#[cfg(feature = "native")]
pub mod scope {
    use std::cell::RefCell;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    thread_local! {
        /// The current request's id while its future is polled (empty: none).
        static CURRENT: RefCell<String> = const { RefCell::new(String::new()) };
    }

    pin_project_lite::pin_project! {
        /// `fut`, polled as the request `id`'s.
        pub struct InRequest<F> {
            id: String,
            #[pin]
            fut: F,
        }
    }

    impl<F> InRequest<F> {
        pub fn new(id: String, fut: F) -> Self {
            Self { id, fut }
        }
    }

    /// Swaps the request's id into the thread's scope, and back when dropped
    /// (also when the poll panics).
    struct Entered<'a>(&'a mut String);

    impl<'a> Entered<'a> {
        fn new(id: &'a mut String) -> Self {
            CURRENT.with_borrow_mut(|c| std::mem::swap(c, id));
            Self(id)
        }
    }

    impl Drop for Entered<'_> {
        fn drop(&mut self) {
            CURRENT.with_borrow_mut(|c| std::mem::swap(c, self.0));
        }
    }

    impl<F: Future> Future for InRequest<F> {
        type Output = F::Output;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let this = self.project();
            let _entered = Entered::new(this.id);
            this.fut.poll(cx)
        }
    }

    /// Runs `log` in the current request's span (`request`, with its
    /// `request_id`), or outside any when no request is being polled.
    pub fn logged<R>(log: impl FnOnce() -> R) -> R {
        let span = CURRENT.with_borrow(|id| {
            // as Display: the text format writes it as it is (an id is a restricted
            // token: nothing to quote), not escaped character by character
            (!id.is_empty()).then(
                || tracing::info_span!(target: "floodgate::request", "request", request_id = %id),
            )
        });
        match span {
            Some(span) => span.in_scope(log),
            None => log(),
        }
    }
}

/// The native sink: each event through `tracing` (target, level, fields and
/// message as above; in its request's span when a request is being polled,
/// see [`scope`]).
#[cfg(feature = "native")]
pub fn trace(event: &LogEvent<'_>) {
    use tracing::Level as L;
    // at the event's own target and level (a filter at `warn` keeps the warnings)
    macro_rules! enabled {
        ($target:expr) => {
            match event.level() {
                Level::Debug => tracing::enabled!(target: $target, L::DEBUG),
                Level::Info => tracing::enabled!(target: $target, L::INFO),
                Level::Warn => tracing::enabled!(target: $target, L::WARN),
            }
        };
    }
    let enabled = match event.target() {
        BREAKER_TARGET => enabled!(BREAKER_TARGET),
        CONFIG_TARGET => enabled!(CONFIG_TARGET),
        _ => enabled!(REQUEST_TARGET),
    };
    if enabled {
        scope::logged(|| trace_now(event));
    }
}

#[cfg(feature = "native")]
fn trace_now(event: &LogEvent<'_>) {
    /// The message, formatted only by an event that is logged (at `info`, the
    /// `debug` one of every request is not).
    struct Message<'a>(&'a LogEvent<'a>);
    impl std::fmt::Display for Message<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0.message())
        }
    }
    let message = Message(event);
    match *event {
        LogEvent::Breaker { store, change } => {
            let (store, from, to, at_us, reason) = (
                store.name(),
                change.from.name(),
                change.to.name(),
                change.at,
                change.reason.as_str(),
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
        LogEvent::Answered {
            method,
            status,
            latency_us,
        } => {
            tracing::debug!(target: "floodgate::request", method, status, latency_us, "{message}")
        }
    }
}

/// Without `native`: nothing (hosts of the pipeline in wasm32 pass their own sink).
#[cfg(not(feature = "native"))]
pub fn trace(_event: &LogEvent<'_>) {}

/// One JSON object per event (the Worker's console line), shaped like the native
/// `--log-format json` lines: `timestamp` (given by the host), `level`, `target`,
/// `fields` (`message` and the event's own) and, for an event of a request
/// (`request_id`), `span` (`name`, `request_id`). Serialised by serde from
/// borrowed parts, in this order (no JSON tree is built).
pub fn json_line(event: &LogEvent<'_>, timestamp: &str, request_id: Option<&str>) -> String {
    let message = event.message();
    let line = JsonLine {
        timestamp,
        level: event.level().name(),
        target: event.target(),
        fields: Fields {
            message: &message,
            rest: event.fields(),
        },
        span: request_id.map(|request_id| Span {
            name: "request",
            request_id,
        }),
    };
    serde_json::to_string(&line).unwrap_or_default()
}

#[derive(serde::Serialize)]
struct JsonLine<'a> {
    timestamp: &'a str,
    level: &'a str,
    target: &'a str,
    fields: Fields<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    span: Option<Span<'a>>,
}

#[derive(serde::Serialize)]
struct Span<'a> {
    name: &'a str,
    request_id: &'a str,
}

/// `message` first, then the event's own fields.
struct Fields<'a> {
    message: &'a str,
    rest: Vec<(&'static str, FieldValue<'a>)>,
}

impl serde::Serialize for Fields<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1 + self.rest.len()))?;
        map.serialize_entry("message", self.message)?;
        for (k, v) in &self.rest {
            match v {
                FieldValue::Text(t) => map.serialize_entry(k, t)?,
                FieldValue::Number(n) => map.serialize_entry(k, n)?,
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::Phase;

    /// What `trace` writes of `events` under a subscriber logging `max` and up.
    #[cfg(feature = "native")]
    fn traced(max: tracing::Level, events: &[LogEvent<'_>]) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(max)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || events.iter().for_each(trace));
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    /// Each event is logged at its own level: at `warn`, the warnings (a breaker
    /// that opens, a configuration refused) and nothing below.
    #[cfg(feature = "native")]
    #[test]
    fn at_warn_the_warnings_are_logged_and_nothing_below() {
        let change = |to| PhaseChange {
            from: Phase::Closed,
            to,
            at: 1,
            reason: "5 consecutive failures".into(),
        };
        let (opened, closed) = (change(Phase::Open), change(Phase::Closed));
        let events = [
            LogEvent::Breaker {
                store: StoreRole::Global,
                change: &opened,
            },
            LogEvent::ConfigRejected {
                why: "bad json",
                at: 2,
            },
            LogEvent::Breaker {
                store: StoreRole::Global,
                change: &closed,
            },
            LogEvent::ConfigLoaded {
                policies: 1,
                plans: 1,
                routes: 0,
                at: 3,
            },
        ];
        let out = traced(tracing::Level::WARN, &events);
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(out.contains("open") && out.contains("bad json"), "{out}");
        let out = traced(tracing::Level::INFO, &events);
        assert_eq!(out.lines().count(), 4, "{out}");
    }

    #[test]
    fn a_json_line_carries_the_level_target_message_and_fields() {
        let t = PhaseChange {
            from: Phase::Closed,
            to: Phase::Open,
            at: 1_500_000,
            reason: "5 consecutive failures".into(),
        };
        let line = json_line(
            &LogEvent::Breaker {
                store: StoreRole::Global,
                change: &t,
            },
            "2026-11-30T20:00:00.000Z",
            Some("req-1"),
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
        assert!(
            v["fields"]["message"]
                .as_str()
                .unwrap()
                .contains("5 consecutive")
        );
        assert_eq!(v["span"]["request_id"], "req-1");
        let quoted = PhaseChange {
            reason: "a \"quoted\"\nline".into(),
            ..t
        };
        let line = json_line(
            &LogEvent::Breaker {
                store: StoreRole::Regional,
                change: &quoted,
            },
            "t",
            None,
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["fields"]["reason"], "a \"quoted\"\nline");
        assert!(!line.contains('\n'));
        assert!(v.get("span").is_none(), "no request: no span");
        let line = json_line(
            &LogEvent::Answered {
                method: "GET",
                status: 429,
                latency_us: 1_234,
            },
            "t",
            Some("a\"b"),
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "DEBUG");
        assert_eq!(v["target"], "floodgate::request");
        assert_eq!(v["fields"]["message"], "answered");
        assert_eq!(v["fields"]["status"], 429);
        assert_eq!(v["fields"]["latency_us"], 1_234);
        assert_eq!(v["span"]["request_id"], "a\"b");
    }
}
