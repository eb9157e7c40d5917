//! `floodgate-demo-upstream`: the demo upstream of the local stack (echoes each
//! request as JSON). `--help` lists its flags.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use floodgate_edge::args::{LogArgs, socket_addr};

/// The demo upstream of Floodgate's local stack: answers every request with a JSON
/// echo of it.
#[derive(Debug, Parser)]
#[command(name = "floodgate-demo-upstream", version)]
struct Args {
    /// Where to listen.
    #[arg(long, env = "FLOODGATE_DEMO_LISTEN", default_value = "127.0.0.1:9000", value_parser = socket_addr)]
    listen: SocketAddr,
    #[command(flatten)]
    log: LogArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.log.init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(listen = %args.listen, error = %e, "cannot listen");
                return ExitCode::from(2);
            }
        };
        tracing::info!(listen = %args.listen, "floodgate-demo-upstream: listening on http://{}", args.listen);
        let app = floodgate_edge::demo_upstream::router(Default::default());
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(floodgate_edge::shutdown_signal())
            .await;
        ExitCode::SUCCESS
    })
}
