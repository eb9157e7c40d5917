//! Real gateways in front of the edge's forward-auth mode: Caddy (Debian's `caddy`)
//! and nginx (Debian's `nginx-light`), each run in the foreground on a free
//! loopback port with a generated configuration in its own scratch directory,
//! killed when dropped.

use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// A gateway process owned by a test.
pub struct Gateway {
    pub url: String,
    child: Child,
    dir: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scratch(name: &str, port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("floodgate-{name}-{port}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a scratch dir");
    dir
}

impl Gateway {
    /// Caddy serving `site` (the body of one site block) on a free loopback port.
    pub fn caddy(site: &str) -> Self {
        let port = free_port();
        let dir = scratch("caddy", port);
        let file = dir.join("Caddyfile");
        let config = format!(
            "{{\n\tadmin off\n\tauto_https off\n\tstorage file_system {}\n}}\n\nhttp://127.0.0.1:{port} {{\n\tbind 127.0.0.1\n{site}\n}}\n",
            dir.join("data").display()
        );
        std::fs::write(&file, config).expect("write the Caddyfile");
        let log = std::fs::File::create(dir.join("caddy.log")).expect("create the caddy log");
        let child = Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&file)
            .env("HOME", &dir)
            .env("XDG_CONFIG_HOME", &dir)
            .env("XDG_DATA_HOME", &dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("caddy runs (Debian package caddy; the test command installs it)");
        Self::ready(child, dir, port, "caddy.log")
    }

    /// nginx with `server` (the body of one `server` block) on a free loopback port,
    /// as one process (no master: killing it leaves no worker serving the port).
    pub fn nginx(server: &str) -> Self {
        let port = free_port();
        let dir = scratch("nginx", port);
        let d = dir.display();
        let config = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
             server {{\n  listen 127.0.0.1:{port};\n{server}\n }}\n}}\n"
        );
        let file = dir.join("nginx.conf");
        std::fs::write(&file, config).expect("write nginx.conf");
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&file)
            .args(["-p", dir.to_str().unwrap(), "-e"])
            .arg(dir.join("error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx runs (Debian package nginx-light; the test command installs it)");
        Self::ready(child, dir, port, "error.log")
    }

    fn ready(mut child: Child, dir: PathBuf, port: u16, log: &str) -> Self {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Self {
                    url: format!("http://127.0.0.1:{port}"),
                    child,
                    dir,
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
                panic!("the gateway exited ({status}): {log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        panic!("the gateway did not listen on {port} within 20 s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dropped gateway serves nothing more: nginx's master killed alone left its
    /// worker serving the port after the test (and the bench) had ended.
    #[test]
    fn a_dropped_nginx_leaves_nothing_listening() {
        let nginx = Gateway::nginx("  location / { return 204; }");
        let port: u16 = nginx.url.rsplit(':').next().unwrap().parse().unwrap();
        drop(nginx);
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            assert!(
                Instant::now() < deadline,
                "something still serves port {port} after nginx was dropped"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
