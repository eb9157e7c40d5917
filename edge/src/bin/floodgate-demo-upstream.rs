//! `floodgate-demo-upstream [--listen 127.0.0.1:9000]`: the demo upstream of the
//! local stack (echoes each request as JSON).

fn main() {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:9000".to_string();
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--listen", Some(v)) => listen = v,
            _ => {
                eprintln!("usage: floodgate-demo-upstream [--listen ADDR]");
                std::process::exit(2);
            }
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .unwrap_or_else(|e| {
                eprintln!("floodgate-demo-upstream: bind {listen}: {e}");
                std::process::exit(2)
            });
        eprintln!("floodgate-demo-upstream: listening on http://{listen}");
        let app = floodgate_edge::demo_upstream::router(Default::default());
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await;
    });
}
