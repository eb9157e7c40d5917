//! `floodgate-cli`: administer what the edge reads from Redis, and poke buckets.
//! Usage and behaviour: `floodgate_edge::cli` (`floodgate-cli --help`).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = floodgate_edge::cli::Cli::parse();
    match floodgate_edge::cli::execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // the command's own output, not a log line
            eprintln!("floodgate-cli: {e}");
            ExitCode::from(2)
        }
    }
}
