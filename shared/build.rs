//! Expands every Lua script's `-- #include NAME` lines with `lua/lib/NAME.lua`
//! (the code the scripts share, written once), and embeds each expanded source
//! with its SHA-1, so EVALSHA needs no run-time hashing and `SCRIPT LOAD` can be
//! checked against a constant.

use std::{env, fs, path::Path, path::PathBuf};

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
];

/// The regional tally (`shared/src/tally.rs`).
const TALLY_SCRIPTS: &[(&str, &str)] = &[
    ("TALLY_TAKE", "tally_take.lua"),
    ("TALLY_DONE", "tally_done.lua"),
    ("TALLY_ADD", "tally_add.lua"),
    ("TALLY_CHARGE", "tally_charge.lua"),
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
    write_scripts(STATS_SCRIPTS, "stats_sha1.rs");
    write_scripts(SCRIPTS, "script_sha1.rs");
    write_scripts(LEASE_SCRIPTS, "lease_sha1.rs");
    write_scripts(TALLY_SCRIPTS, "tally_sha1.rs");
    write_scripts(AUDIT_SCRIPTS, "audit_sha1.rs");
    write_scripts(CHANGES_SCRIPTS, "changes_sha1.rs");
    write_scripts(ADMIN_API_SCRIPTS, "adminapi_sha1.rs");
}

/// `source` with each `-- #include NAME` line replaced by `lib/NAME.lua`.
fn expand(lua_dir: &Path, source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        match line.strip_prefix("-- #include ") {
            Some(name) => {
                let path = lua_dir.join("lib").join(format!("{}.lua", name.trim()));
                println!("cargo:rerun-if-changed={}", path.display());
                let lib = fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                out.push_str(&lib);
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Writes each script's expanded source to `OUT_DIR/lua/`, and `file` with its
/// `<NAME>_SOURCE` (the expanded text) and `<NAME>_SHA1` constants.
fn write_scripts(scripts: &[(&str, &str)], file: &str) {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let lua_dir = manifest.join("../lua");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let expanded_dir = out_dir.join("lua");
    fs::create_dir_all(&expanded_dir).expect("creating OUT_DIR/lua");
    let mut out = String::new();
    for (name, script) in scripts {
        let path = lua_dir.join(script);
        println!("cargo:rerun-if-changed={}", path.display());
        let source =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let full = expand(&lua_dir, &source);
        let dest = expanded_dir.join(script);
        fs::write(&dest, &full).expect("writing an expanded script");
        let sha = sha1_smol::Sha1::from(full.as_bytes()).digest().to_string();
        out.push_str(&format!(
            "pub const {name}_SOURCE: &str = include_str!({:?});\n",
            dest.display().to_string()
        ));
        out.push_str(&format!("pub const {name}_SHA1: &str = \"{sha}\";\n"));
    }
    fs::write(out_dir.join(file), out).expect("writing the SHA-1 file");
}
