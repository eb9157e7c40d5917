//! `floodgate-cli`: administer what the edge reads from Redis, and poke buckets.
//! Usage and behaviour: `floodgate_edge::cli`.

use std::process::ExitCode;

fn main() -> ExitCode {
    match floodgate_edge::cli::run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floodgate-cli: {e}");
            ExitCode::from(2)
        }
    }
}
