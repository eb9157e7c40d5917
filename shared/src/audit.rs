//! The configuration's version-checked, audited save (`lua/config_cas.lua`), the
//! one the dashboard and `floodgate-cli config set` both use, and the audit
//! record it writes.

use serde::{Deserialize, Serialize};

use crate::script::LuaScript;

mod sha {
    include!(concat!(env!("OUT_DIR"), "/audit_sha1.rs"));
}

/// `lua/config_cas.lua`: saves the configuration if the stored one is still the
/// version the change was based on, and appends the audit record, atomically.
pub const CONFIG_CAS: LuaScript = LuaScript {
    source: sha::CONFIG_CAS_SOURCE,
    sha1: sha::CONFIG_CAS_SHA1,
};

/// The audit log (a list, newest first). Its hash tag is the configuration's key,
/// so both live in one Redis Cluster slot and the save stays one atomic script.
pub const AUDIT_KEY: &str = "{fg:config}:audit";

/// How many audit records are kept.
pub const AUDIT_KEEP: usize = 1000;

/// One audit record: who changed what, when, with the item before and after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: i64,
    pub user: String,
    pub action: String,
    pub target: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl AuditEntry {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an audit entry serializes")
    }
}

/// What a version-checked save did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaveOutcome {
    /// Stored; the new version.
    Saved { version: String },
    /// Someone saved first: nothing was written; the version stored now.
    Conflict { current: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CONFIG_KEY;
    use crate::slot::key_slot;

    #[test]
    fn the_audit_log_shares_the_configurations_cluster_slot() {
        assert_eq!(key_slot(AUDIT_KEY), key_slot(CONFIG_KEY));
    }

    #[test]
    fn entries_round_trip_through_json() {
        let e = AuditEntry {
            at: 1_764_000_000,
            user: "cli:ops".into(),
            action: "config.set".into(),
            target: "config".into(),
            before: None,
            after: Some("{}".into()),
        };
        assert_eq!(serde_json::from_str::<AuditEntry>(&e.to_json()).unwrap(), e);
    }
}
