//! Every cross-crate integration and end-to-end test, in ONE test binary: each
//! file below is a module (its opening comment says what it tests). One binary,
//! not one per file: each links the whole workspace (this one is ~140 MB), and
//! one per file — 47 links — made a clean `scripts/test` leave 13 GB in
//! `target/debug` (now 2.4 GB) and take 20 minutes (now 12).
//!
//! One file's tests: `cargo test -p floodgate-tests --test integration -- NAME::`
//! (after `cargo build --workspace --bins --locked`: the tests run the binaries as
//! processes).

mod adaptive_deadline;
mod admin_api;
mod bounded;
mod cli_flags;
mod cluster;
mod code_shape;
mod cost;
mod credits_edge;
mod credits_script;
mod dashboard_api;
mod dashboard_browser;
mod dashboard_identities;
mod dashboard_operator;
mod deny;
mod deploy_recipe;
mod docs;
mod edge_connections;
mod edge_e2e;
mod edge_hardening;
mod exactness;
mod far_store;
mod fault;
mod forward_auth;
mod graceful;
mod healthy_burst;
mod identity_overrides;
mod in_flight;
mod keys_edge;
mod lease_script;
mod limiter_parity;
mod logs;
mod lua_parity;
mod lua_script;
mod merged_decisions;
mod meta_headers;
mod metrics;
mod operator_changes;
mod policy_depth;
mod resp_store;
mod rest_conformance;
mod rest_hardening;
mod rest_outage;
mod scale;
mod sentinel_auth;
mod silent_peer;
mod stale_and_refund;
mod start_in_outage;
mod stateful;
mod stats_script;
mod store_contract;
mod tally_script;
mod tls_acl;
mod unseen_keys;
