//! The bounded and `auto` policies' consistency figures (pure): what the edges
//! counted of each ([`PolicyLeasing`]), the shares and savings worked out from it,
//! and those as the traffic page words them.

use floodgate_shared::policy::Consistency;
use serde::{Deserialize, Serialize};

use crate::describe::consistency_label;

/// The traffic page's consistency figures: each configured bounded or `auto`
/// policy over the range, by name (per minute: the edges count them per minute
/// only). Rendered on the server, outside the page's island, so the browser
/// bundle carries none of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasingFigures {
    pub policies: Vec<PolicyLeasing>,
    /// The configuration's `regions` (regional tallies holding credit).
    pub regions: u32,
}

/// A bounded or `auto` policy's consistency figures over the traffic page's range:
/// the edges' `policy:<name>|local|exact|refills|outstanding` counters
/// ([`floodgate_shared::stats::Leasing`]) summed, with the policy's bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyLeasing {
    pub policy: String,
    pub consistency: Consistency,
    /// The policy's `max_overshoot`.
    pub bound: u64,
    /// What the global store leases of the bound: the bound less what the regions'
    /// tallies may admit on credit (the edge's own `LeaseSettings::for_policy`
    /// computes it).
    pub leasable: u64,
    /// Requests decided from tokens at hand, and on the exact path.
    pub local: u64,
    pub exact: u64,
    /// Global calls that refilled a lease or topped a regional tally up.
    pub refills: u64,
    /// Tokens outstanding at those refills, summed.
    pub outstanding: u64,
}

impl PolicyLeasing {
    /// Share of the policy's decisions taken locally (0-1); `None` without any.
    pub fn local_share(&self) -> Option<f64> {
        let all = self.local.saturating_add(self.exact);
        (all > 0).then(|| self.local as f64 / all as f64)
    }

    /// Global Redis calls saved: one per local decision, less one per refill
    /// (negative when refills cost more than the local decisions saved).
    pub fn calls_saved(&self) -> i128 {
        i128::from(self.local) - i128::from(self.refills)
    }

    /// Mean tokens outstanding at a refill; `None` without refills.
    pub fn mean_outstanding(&self) -> Option<f64> {
        (self.refills > 0).then(|| self.outstanding as f64 / self.refills as f64)
    }

    /// `bounded, at most 50 over`.
    pub fn label(&self) -> String {
        consistency_label(self.consistency, Some(self.bound))
    }

    pub fn local_text(&self) -> String {
        match self.local_share() {
            None => "no decisions in this range".to_string(),
            Some(s) => format!(
                "{:.1} % ({} of {} decisions)",
                s * 100.0,
                self.local,
                self.local + self.exact
            ),
        }
    }

    pub fn saved_text(&self) -> String {
        let (local, refills) = (self.local, self.refills);
        match self.calls_saved() {
            n if n > 0 => format!("{n} ({local} local decisions, less {refills} refills)"),
            _ if local == 0 && refills == 0 => {
                "none yet (no local decisions or refills in this range)".to_string()
            }
            0 => format!(
                "none: {refills} refills cost as many global calls as the {local} local decisions saved"
            ),
            n => format!(
                "none: {refills} refills cost {} more global calls than the {local} local decisions saved (keys too cold for leases to pay)",
                -n
            ),
        }
    }

    pub fn budget_text(&self) -> String {
        match self.mean_outstanding() {
            None => "no refills in this range".to_string(),
            Some(mean) => format!(
                "{mean:.1} of {} tokens ({:.0} %), the mean outstanding at {} refills",
                self.leasable,
                100.0 * mean / self.leasable.max(1) as f64,
                self.refills
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consistency_figures_read_as_shares_calls_and_tokens() {
        let l = PolicyLeasing {
            policy: "search".into(),
            consistency: Consistency::Bounded,
            bound: 50,
            leasable: 26,
            local: 930,
            exact: 70,
            refills: 20,
            outstanding: 260,
        };
        assert_eq!(l.label(), "bounded, at most 50 over");
        assert_eq!(l.local_text(), "93.0 % (930 of 1000 decisions)");
        assert_eq!(l.saved_text(), "910 (930 local decisions, less 20 refills)");
        assert_eq!(
            l.budget_text(),
            "13.0 of 26 tokens (50 %), the mean outstanding at 20 refills"
        );
        // refills costing more than they saved are explained, never negative
        let cold = PolicyLeasing {
            local: 3,
            refills: 12,
            ..l.clone()
        };
        assert_eq!(cold.calls_saved(), -9);
        assert!(
            cold.saved_text()
                .starts_with("none: 12 refills cost 9 more"),
            "{}",
            cold.saved_text()
        );
        let even = PolicyLeasing {
            local: 12,
            refills: 12,
            ..l.clone()
        };
        assert!(
            even.saved_text()
                .starts_with("none: 12 refills cost as many")
        );
        let idle = PolicyLeasing {
            local: 0,
            exact: 0,
            refills: 0,
            outstanding: 0,
            ..l
        };
        assert_eq!(idle.local_text(), "no decisions in this range");
        assert!(idle.saved_text().starts_with("none yet"));
        assert_eq!(idle.budget_text(), "no refills in this range");
    }
}
