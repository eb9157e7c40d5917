//! The shape the code keeps (issue 21): no non-test function longer than 80 lines
//! in the production crates and the benchmark, counted from `fn` to its closing
//! brace. Tests (`#[test]`, `#[tokio::test]`, `#[cfg(test)]` modules, the
//! `tests/` directories) are not counted. And every file of `tests/tests/` is a
//! module of the one integration-test binary (`main.rs`), so none is left unrun.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

const MAX_LINES: usize = 80;

/// The source trees held to the limit.
const TREES: [&str; 6] = [
    "shared/src",
    "edge/src",
    "edge/worker/src",
    "edge/rest/src",
    "dashboard/src",
    "tests/src/bin",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        let last = path.segments.last().map(|s| s.ident.to_string());
        matches!(last.as_deref(), Some("test"))
            || (path.is_ident("cfg")
                && a.parse_args::<syn::Meta>()
                    .is_ok_and(|m| m.path().is_ident("test")))
    })
}

#[derive(Default)]
struct Long {
    file: String,
    found: Vec<(String, usize, usize)>,
}

impl Long {
    fn check(&mut self, name: &syn::Ident, from: proc_macro2::Span, to: proc_macro2::Span) {
        let (start, end) = (from.start().line, to.end().line);
        let lines = end + 1 - start;
        if lines > MAX_LINES {
            let at = format!("{}:{start} {name}", self.file);
            self.found.push((at, lines, start));
        }
    }
}

impl<'ast> Visit<'ast> for Long {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        let close = f.block.brace_token.span.close();
        self.check(&f.sig.ident, f.sig.fn_token.span, close);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        let close = f.block.brace_token.span.close();
        self.check(&f.sig.ident, f.sig.fn_token.span, close);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.check(
                &f.sig.ident,
                f.sig.fn_token.span,
                body.brace_token.span.close(),
            );
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// Every function of `source` longer than the limit: (where, lines).
fn long_functions(file: &str, source: &str) -> Vec<(String, usize)> {
    let parsed = syn::parse_file(source).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut long = Long {
        file: file.to_string(),
        ..Long::default()
    };
    long.visit_file(&parsed);
    long.found.into_iter().map(|(at, n, _)| (at, n)).collect()
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![];
    for tree in TREES {
        rust_files(&root.join(tree), &mut files);
    }
    assert!(
        files.len() > 50,
        "the trees were found: {} files",
        files.len()
    );
    let mut long = vec![];
    for f in &files {
        let source = std::fs::read_to_string(f).unwrap();
        let name = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        long.extend(long_functions(&name, &source));
    }
    let list: Vec<String> = long
        .iter()
        .map(|(at, n)| format!("{at}: {n} lines"))
        .collect();
    assert!(
        list.is_empty(),
        "functions over {MAX_LINES} lines:\n{}",
        list.join("\n")
    );
}

#[test]
fn the_counter_counts_from_fn_to_its_closing_brace_and_skips_tests() {
    let body = "    let x = 1;\n".repeat(79);
    let source = format!(
        "fn ok() {{\n{}}}\nfn long() {{\n{body}    let y = 2;\n}}\n#[test]\nfn t() {{\n{body}{body}}}\n#[cfg(test)]\nmod tests {{ fn helper() {{\n{body}{body}}} }}\nstruct S;\nimpl S {{ fn m(&self) {{\n{body}{body}}} }}\n",
        "    let x = 1;\n".repeat(78)
    );
    let found = long_functions("x.rs", &source);
    let names: Vec<&str> = found
        .iter()
        .map(|(at, _)| at.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(names, ["long", "m"], "{found:?}");
    assert_eq!(found[0].1, 82);
}

/// The modules `tests/tests/main.rs` declares, by name.
fn declared_modules(main_rs: &str) -> Vec<String> {
    let file = syn::parse_file(main_rs).expect("main.rs parses");
    let mut names: Vec<String> = file
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(m) if m.content.is_none() => Some(m.ident.to_string()),
            _ => None,
        })
        .collect();
    names.sort();
    names
}

/// The integration tests are ONE binary (`autotests = false`): a file of
/// `tests/tests/` that `main.rs` does not declare would never be compiled or run.
#[test]
fn every_integration_test_file_is_a_module_of_the_one_binary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_owned()))
        .filter(|stem| stem != "main")
        .collect();
    files.sort();
    assert!(files.len() > 40, "the test files were found: {files:?}");
    let main_rs = std::fs::read_to_string(dir.join("main.rs")).unwrap();
    assert_eq!(
        declared_modules(&main_rs),
        files,
        "tests/tests/main.rs declares exactly the files of tests/tests/"
    );
    assert_eq!(
        declared_modules("mod a;\nmod b { }\nmod c;\n"),
        ["a", "c"],
        "inline modules are not files"
    );
}
