//! Embeds the SHA-1 of every Lua script next to its source, so EVALSHA needs no
//! run-time hashing and `SCRIPT LOAD` can be checked against a constant.

use std::{env, fs, path::PathBuf};

const SCRIPTS: &[(&str, &str)] = &[
    ("TOKEN_BUCKET", "token_bucket.lua"),
    ("IN_FLIGHT", "in_flight.lua"),
    ("LIMITER", "limiter.lua"),
    ("REFUND", "refund.lua"),
];

/// The lease scripts (`shared/src/lease.rs`), in their own generated file.
const LEASE_SCRIPTS: &[(&str, &str)] = &[
    ("LEASE_TAKE", "lease_take.lua"),
    ("LEASE_RETURN", "lease_return.lua"),
    ("POOL_TAKE", "pool_take.lua"),
    ("POOL_ADD", "pool_add.lua"),
];

/// The configuration's audited save (`shared/src/audit.rs`).
const AUDIT_SCRIPTS: &[(&str, &str)] = &[("CONFIG_CAS", "config_cas.lua")];

/// The key records' compare-and-set (`shared/src/adminapi.rs`).
const ADMIN_API_SCRIPTS: &[(&str, &str)] = &[("KEY_CAS", "key_cas.lua")];

/// The change log of cached records (`shared/src/changes.rs`).
const CHANGES_SCRIPTS: &[(&str, &str)] = &[("CHANGED", "changed.lua")];

/// The statistics flush (`shared/src/stats.rs`).
const STATS_SCRIPTS: &[(&str, &str)] = &[("STATS_FLUSH", "stats_flush.lua")];

fn main() {
    write_shas(STATS_SCRIPTS, "stats_sha1.rs");
    write_shas(SCRIPTS, "script_sha1.rs");
    write_shas(LEASE_SCRIPTS, "lease_sha1.rs");
    write_shas(AUDIT_SCRIPTS, "audit_sha1.rs");
    write_shas(CHANGES_SCRIPTS, "changes_sha1.rs");
    write_shas(ADMIN_API_SCRIPTS, "adminapi_sha1.rs");
}

fn write_shas(scripts: &[(&str, &str)], file: &str) {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let lua_dir = manifest.join("../lua");
    let mut out = String::new();
    for (name, script) in scripts {
        let path = lua_dir.join(script);
        println!("cargo:rerun-if-changed={}", path.display());
        let source = fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let sha = sha1_smol::Sha1::from(&source).digest().to_string();
        out.push_str(&format!("pub const {name}_SHA1: &str = \"{sha}\";\n"));
    }
    let dest = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join(file);
    fs::write(dest, out).expect("writing the SHA-1 file");
}
