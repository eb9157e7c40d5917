//! Words for operators (pure, tested natively), one file a subject:
//! - `fields`: a validation error's field path as the pages name it
//!   (`routes[0].policies[1]` → `Route "search", limits`);
//! - `changes`: an audit record's before → after as a list of changed fields;
//! - `policy`: a policy's quota, consistency, dimensions and failure mode;
//! - `endpoint`: an endpoint's name, and the request that tries a key on one.
//!
//! Callers name the items through this module (`crate::describe::describe_quota`),
//! as they did when it was one file.

mod changes;
mod endpoint;
mod fields;
mod policy;

pub use changes::{Change, diff};
pub use endpoint::{EDGE_URL_PLACEHOLDER, UNMATCHED, endpoint_label, example_path, try_request};
pub use fields::{describe_field, strip_indexes};
pub(crate) use policy::consistency_label;
pub use policy::{describe_consistency, describe_quota, dimension_name, failure_mode_name};
