//! The documentation against what it documents: the flag tables of `docs/` against
//! each binary's `--help`, the Worker's variable table against what
//! `edge/worker/src/lib.rs` reads, every relative link against the files and
//! headings it names, and the README's shape (a landing page that starts with the
//! two commands).

use std::collections::{BTreeMap, BTreeSet};

use floodgate_tests::docs::{doc_files, generate, items_table, parse_help, regenerate, repo_root};
use floodgate_tests::process::workspace_binary;

/// Every generated block of `docs/` is what the binaries' `--help` says now.
#[test]
fn flag_tables_match_each_binarys_help() {
    let bin_dir = workspace_binary("floodgate-edge")
        .parent()
        .unwrap()
        .to_path_buf();
    let mut seen = vec![];
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let (expected, commands) = regenerate(&text, |command| generate(&bin_dir, command));
        if expected != text {
            let (have, want) = text
                .lines()
                .zip(expected.lines())
                .find(|(a, b)| a != b)
                .unwrap_or(("(shorter)", "(longer)"));
            panic!(
                "{} is out of date with the binaries' --help ({}).\n  the doc says:  {have}\n  --help says:   {want}\nRegenerate with: scripts/docs",
                file.display(),
                commands.join(", ")
            );
        }
        seen.extend(commands);
    }
    for binary in [
        "floodgate-edge",
        "floodgate-cli",
        "floodgate-dashboard",
        "floodgate-rest",
    ] {
        assert!(
            seen.iter().any(|c| c == binary),
            "docs/ has no table generated from `{binary} --help`: {seen:?}"
        );
    }
}

/// The parser reads both of clap's layouts, the bracketed notes and subcommands.
#[test]
fn help_pages_are_parsed_into_rows() {
    let short = "\
Usage: x [OPTIONS]

Options:
      --listen <LISTEN>  Where to listen [env: FLOODGATE_LISTEN=] [default: 127.0.0.1:8080]
      --mode <MODE>      How [possible values: a, b]
  -h, --help             Print help
";
    let long = "\
Options:
      --upstream <UPSTREAM>
          The upstream's base URL; required
          unless --forward-auth

          [env: FLOODGATE_UPSTREAM=]

  -V, --version
          Print version

Commands:
  config  The limits configuration
  key     API keys
  help    Print this message
";
    let p = parse_help(short);
    let items = &p.sections[0].1;
    assert_eq!(items[0].spec, "--listen <LISTEN>");
    assert_eq!(items[0].env.as_deref(), Some("FLOODGATE_LISTEN"));
    assert_eq!(items[0].default.as_deref(), Some("127.0.0.1:8080"));
    assert_eq!(items[0].what, "Where to listen");
    assert_eq!(items[1].possible.as_deref(), Some("a, b"));
    let table = items_table(&p, &[]);
    assert_eq!(
        table,
        "| flag | variable | default | what |\n|---|---|---|---|\n\
         | `--listen <LISTEN>` | `FLOODGATE_LISTEN` | `127.0.0.1:8080` | Where to listen |\n\
         | `--mode <MODE>` |  |  | How One of: a, b. |\n"
    );
    let listed = "\
Options:
      --log-format <LOG_FORMAT>
          How log lines look

          Possible values:
          - text: Human-readable lines
          - json: One JSON object per line

          [default: text]
";
    let p = parse_help(listed);
    let i = &p.sections[0].1[0];
    assert_eq!(i.what, "How log lines look");
    assert_eq!(
        i.possible.as_deref(),
        Some("text (Human-readable lines), json (One JSON object per line)")
    );
    assert_eq!(i.default.as_deref(), Some("text"));
    let p = parse_help(long);
    let items = &p.sections[0].1;
    assert_eq!(items[0].spec, "--upstream <UPSTREAM>");
    assert_eq!(
        items[0].what,
        "The upstream's base URL; required unless --forward-auth"
    );
    assert_eq!(items[0].env.as_deref(), Some("FLOODGATE_UPSTREAM"));
    assert_eq!(
        p.commands,
        [
            ("config".to_string(), "The limits configuration".to_string()),
            ("key".to_string(), "API keys".to_string())
        ]
    );
}

/// The names the Worker reads itself (`var(env, "X")` in `edge/worker/src/lib.rs`):
/// its secrets, the upstream, the regions and the log level; every other
/// variable is a setting of `EdgeSettings`, read by name through it.
fn worker_reads() -> BTreeSet<String> {
    let src = std::fs::read_to_string(repo_root().join("edge/worker/src/lib.rs")).unwrap();
    let call = "var(env, \"";
    src.match_indices(call)
        .map(|(i, _)| {
            let rest = &src[i + call.len()..];
            rest[..rest.find('"').unwrap()].to_string()
        })
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect()
}

/// The rows of the Worker's table in `docs/configuration.md`: name → default.
fn worker_table() -> BTreeMap<String, String> {
    let doc = std::fs::read_to_string(repo_root().join("docs/configuration.md")).unwrap();
    let start = doc
        .find("## The Worker's variables")
        .expect("docs/configuration.md has the Worker's variables");
    doc[start..]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_string(), cells[3].to_string())
        })
        .collect()
}

/// The Worker's variable table names exactly what the Worker reads: its own
/// variables (written by hand) and every shared setting (generated, checked by
/// `flag_tables_match_each_binarys_help`); serve.mjs binds them all through
/// WORKER_VARS; wrangler.toml sets only variables the Worker reads.
#[test]
fn the_workers_variable_table_is_what_it_reads() {
    let own = worker_reads();
    let table = worker_table();
    assert!(own.len() >= 6, "the scan found too few names: {own:?}");
    let settings: BTreeSet<String> = floodgate_tests::docs::worker_settings_table()
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.split('`').nth(1).unwrap().to_string())
        .collect();
    assert!(settings.contains("DEADLINE_MS") && settings.contains("MAX_BODY_BYTES"));
    let reads: BTreeSet<String> = own.union(&settings).cloned().collect();
    let table_names: BTreeSet<String> = table.keys().cloned().collect();
    assert_eq!(
        reads, table_names,
        "docs/configuration.md's Worker tables and what the Worker reads differ: add or remove rows"
    );
    let serve = std::fs::read_to_string(repo_root().join("edge/worker/serve.mjs")).unwrap();
    assert!(
        serve.contains("WORKER_VARS"),
        "serve.mjs binds the optional variables"
    );
    let toml = std::fs::read_to_string(repo_root().join("wrangler.toml")).unwrap();
    for line in toml
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(" = \""))
    {
        let name = line.split(' ').next().unwrap();
        if name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            assert!(
                reads.contains(name),
                "wrangler.toml sets {name}, which the Worker never reads"
            );
        }
    }
}

fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file: its headings' and its `<a id="...">`s.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
        for (i, _) in line.match_indices("<a id=\"") {
            let rest = &line[i + 7..];
            out.insert(rest[..rest.find('"').unwrap()].to_string());
        }
    }
    out
}

/// Every relative link of the README and docs/ names a file that exists, and a
/// heading or anchor in it.
#[test]
fn every_relative_link_resolves() {
    let root = repo_root();
    let mut files = doc_files();
    files.push(root.join("README.md"));
    let mut broken = vec![];
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find(')').unwrap_or(0)];
            if target.starts_with("http") || target.is_empty() {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let Ok(dest_text) = std::fs::read_to_string(&dest) else {
                broken.push(format!("{}: {target} (no such file)", file.display()));
                continue;
            };
            if !anchor.is_empty() && !anchors(&dest_text).contains(anchor) {
                broken.push(format!("{}: {target} (no such heading)", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The README is a landing page: at most 200 lines, opening with the two commands.
#[test]
fn the_readme_is_a_landing_page() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    assert!(lines.len() <= 200, "README.md has {} lines", lines.len());
    let first_block: Vec<&str> = lines
        .iter()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .copied()
        .collect();
    assert_eq!(first_block.len(), 2, "{first_block:?}");
    assert!(
        first_block[0].starts_with("scripts/run "),
        "{first_block:?}"
    );
    assert!(
        first_block[1].starts_with("scripts/test "),
        "{first_block:?}"
    );
    let ci = std::fs::read_to_string(repo_root().join(".ci/run")).unwrap();
    assert!(
        ci.contains("scripts/test\""),
        ".ci/run runs scripts/test: {ci}"
    );
}
