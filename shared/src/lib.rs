//! Floodgate's pure core, shared by the edge, the dashboard and the tests.
//!
//! No I/O and no runtime: policy types and their validation ([`policy`]), the
//! token-bucket transition ([`bucket`]), the response contract ([`contract`]),
//! bucket key naming ([`keys`]), the traffic counters and decision sample the edge
//! writes and the dashboard reads ([`stats`]), and the Lua scripts with the pure
//! halves of calling them ([`script`]); API keys: their secrets ([`apikeys`]),
//! records ([`keyrecord`]), operators' changes of them ([`keychanges`]) and
//! credits ([`credits`]); UTC calendar windows ([`calendar`]). Builds for native
//! targets and for wasm32.

pub mod adminapi;
pub mod apikeys;
pub mod audit;
pub mod bucket;
pub mod calendar;
pub mod changes;
pub mod config;
pub mod contract;
pub mod credits;
pub mod deny;
pub mod hex;
pub mod keychanges;
pub mod keyrecord;
pub mod keys;
pub mod lease;
pub mod policy;
#[cfg(any(test, feature = "twins"))]
pub mod reference;
pub mod routes;
pub mod script;
pub mod simulate;
pub mod slot;
pub mod stats;
pub mod tally;
pub mod time;
pub mod windows;

pub use bucket::{Admission, BucketState, Decision, Transition, decide};
pub use policy::{Dimension, FailureMode, Policy, PolicyError, Quota};
pub use time::{Clock, FakeClock, Micros};
