//! `floodgate-docs`: rewrites the generated blocks of `docs/*.md` (flag tables from
//! each binary's `--help`; see `floodgate_tests::docs`) from the binaries next to
//! it. Run by `scripts/docs`, which builds them first.

use std::path::PathBuf;

use floodgate_tests::docs::{doc_files, generate, regenerate};

fn main() {
    let exe = std::env::current_exe().expect("the executable's path");
    let bin_dir: PathBuf = exe.parent().expect("its directory").to_path_buf();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("read a doc");
        let (new, commands) = regenerate(&text, |command| generate(&bin_dir, command));
        if new != text {
            std::fs::write(&file, &new).expect("write a doc");
            println!("{}: regenerated {}", file.display(), commands.join(", "));
        } else if !commands.is_empty() {
            println!("{}: up to date ({})", file.display(), commands.join(", "));
        }
    }
}
