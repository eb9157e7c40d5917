//! What the pages and the server functions exchange (serialized both ways) for
//! every page but the traffic page ([`crate::stats`] holds its data): the session,
//! the configuration, keys, identities, backtests, audit records.

use std::collections::BTreeMap;

use floodgate_shared::config::{ConfigSpec, Source};
use floodgate_shared::stats::Endpoint;
use serde::{Deserialize, Serialize};

/// The signed-in operator, and the token every mutation must carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub user: String,
    pub csrf: String,
    /// The edge's address as the dashboard was told (`--edge-url`), for the
    /// pages' example requests.
    pub edge_url: Option<String>,
}

/// The stored configuration and its version (the SHA-1 of its text; empty when
/// nothing is stored yet). A save names the version it was based on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigView {
    pub version: String,
    pub spec: Option<ConfigSpec>,
}

/// What a form answers when it is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Saved {
    /// Saved (the message says what).
    Ok(String),
    /// A backtest of the form's proposal (nothing saved).
    Preview(Backtest),
}

/// The edge's recent decisions replayed against the current configuration and
/// against a proposal, with what the replay cannot see.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backtest {
    /// Decisions in the sample, and the period they span (Unix ms).
    pub sampled: u64,
    pub from_ms: i64,
    pub to_ms: i64,
    /// Decisions the edges made in that period but could not add to the sample.
    pub dropped: u64,
    /// Sampled decisions taken without Redis: replayed as if Redis had answered.
    pub degraded: u64,
    /// Policies keyed by client address, which the sample cannot replay.
    pub ip_policies: Vec<String>,
    pub rows: Vec<BacktestRow>,
    /// Route name → its path pattern (of the stored configuration).
    pub patterns: BTreeMap<String, String>,
}

/// One endpoint of a backtest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BacktestRow {
    pub endpoint: Endpoint,
    pub requests: u64,
    /// 429s the edge answered these requests (its own record).
    pub observed: u64,
    /// 429s the current configuration gives these requests when replayed.
    pub throttled_now: u64,
    /// 429s the proposal would give, and to how many of the keys seen.
    pub throttled: u64,
    pub keys: u64,
    pub keys_seen: u64,
    /// Requests a shadow policy of the proposal would have throttled.
    pub shadow: u64,
}

/// A key as the dashboard lists it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRow {
    pub id: String,
    pub label: String,
    pub plan: String,
    pub revoked: bool,
    /// Unix seconds.
    pub created: i64,
    /// Unix seconds of the key's latest decision at any edge.
    pub last_used: Option<i64>,
    /// Decisions over the last hour.
    pub allowed: u64,
    pub throttled: u64,
    pub degraded: u64,
}

/// One identity on the identities page: its keys, their decisions over the last
/// hour together (they share the buckets of `identity` policies), and the
/// configuration's override of their plans, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityRow {
    pub identity: String,
    pub keys: Vec<KeyRow>,
    pub allowed: u64,
    pub throttled: u64,
    pub degraded: u64,
    pub plan: Option<String>,
    pub policies: Option<Vec<String>>,
}

/// The identities page: every identity some key holds, and what the forms need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentitiesView {
    pub identities: Vec<IdentityRow>,
    pub plans: Vec<String>,
}

/// One key in detail (never its secret): the key page's fields, its rotation's
/// overlap, and the version its forms change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDetailView {
    pub row: KeyRow,
    pub identity: Option<String>,
    pub name: Option<String>,
    /// Compact JSON.
    pub metadata: Option<String>,
    /// Unix seconds.
    pub expires_at: Option<i64>,
    /// Compact JSON, as set (the live count is in Redis).
    pub credits: Option<String>,
    /// Unix seconds until which the secret a rotation replaced still works.
    pub previous_secret_until: Option<i64>,
    pub version: String,
}

/// A key just created: the only time its secret is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedKey {
    pub id: String,
    pub secret: String,
}

/// One policy applying to a key on an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectiveRow {
    pub policy: String,
    pub source: Source,
    pub limit: String,
    pub cost: u32,
    pub failure_mode: String,
}

/// An audit record as the page shows it: the fields the change touched, or, when
/// the item's text was cut for the log (not JSON any more), the texts as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRow {
    pub at: i64,
    pub user: String,
    pub action: String,
    pub target: String,
    pub changes: Option<Vec<crate::describe::Change>>,
    /// The item was created (nothing before) or removed (nothing after).
    pub created: bool,
    pub removed: bool,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl From<AuditEntry> for AuditRow {
    fn from(e: AuditEntry) -> Self {
        let changes = crate::describe::diff(e.before.as_deref(), e.after.as_deref());
        let raw = changes.is_none();
        AuditRow {
            at: e.at,
            user: e.user,
            action: e.action,
            target: e.target,
            changes,
            created: e.before.is_none(),
            removed: e.after.is_none(),
            before: e.before.filter(|_| raw),
            after: e.after.filter(|_| raw),
        }
    }
}

/// One audit record (the type the CLI's audited saves write too).
pub use floodgate_shared::audit::AuditEntry;
