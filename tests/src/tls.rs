//! A TLS-only `redis-server` whose only user is an ACL user without the
//! administrative commands (`+@all -@admin`; the default user is off), as managed
//! Redis runs (ElastiCache with in-transit encryption, Redis
//! Cloud, Upstash's RESP endpoint): `rediss://user:password@127.0.0.1:port`, its
//! certificate signed by a test CA made here with `openssl`. Killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// A throwaway certificate authority and a server certificate for 127.0.0.1.
pub struct TestCa {
    pub dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestCa {
    /// `ca.pem` (the CA), `server.pem` + `server.key` (for IP 127.0.0.1 and
    /// `localhost`) in `dir`.
    pub fn create(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("create the CA dir");
        openssl(
            dir,
            &[
                "ecparam",
                "-genkey",
                "-name",
                "prime256v1",
                "-out",
                "ca.key",
            ],
        );
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                "ca.key",
                "-subj",
                "/CN=floodgate-test-ca",
                "-days",
                "2",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-out",
                "ca.pem",
            ],
        );
        openssl(
            dir,
            &[
                "ecparam",
                "-genkey",
                "-name",
                "prime256v1",
                "-out",
                "server.key",
            ],
        );
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                "server.key",
                "-subj",
                "/CN=127.0.0.1",
                "-out",
                "server.csr",
            ],
        );
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write server.ext");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.pem",
            ],
        );
        Self {
            dir: dir.to_path_buf(),
        }
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
}

/// A TLS-only redis-server with one ACL user.
pub struct TlsRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
    pub user: String,
    pub password: String,
    pub ca: TestCa,
}

impl TlsRedis {
    pub fn start(user: &str, password: &str) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir =
                std::env::temp_dir().join(format!("floodgate-tls-{port}-{}", std::process::id()));
            let ca = TestCa::create(&dir);
            let conf = dir.join("redis.conf");
            std::fs::write(
                &conf,
                format!(
                    "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {dir}\nsave \"\"\nappendonly no\n\
                     tls-cert-file {dir}/server.pem\ntls-key-file {dir}/server.key\n\
                     tls-ca-cert-file {dir}/ca.pem\ntls-auth-clients no\n\
                     user default off\nuser {user} on >{password} ~* &* +@all -@admin\n",
                    dir = dir.display()
                ),
            )
            .expect("write redis.conf");
            let child = Command::new("redis-server")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts (scripts/test installs it)");
            let mut server = TlsRedis {
                child,
                port,
                dir,
                user: user.to_string(),
                password: password.to_string(),
                ca,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = server.child.try_wait() {
                    break;
                }
                if server.try_connection().is_some() {
                    return server;
                }
                std::thread::sleep(Duration::from_millis(30));
            }
            last = format!("TLS redis-server on port {port} did not become ready");
            drop(server);
        }
        panic!("{last}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `rediss://user:password@127.0.0.1:port/`.
    pub fn url(&self) -> String {
        format!(
            "rediss://{}:{}@127.0.0.1:{}/",
            self.user, self.password, self.port
        )
    }

    pub fn ca_file(&self) -> PathBuf {
        self.ca.ca_file()
    }

    fn try_connection(&self) -> Option<redis::Connection> {
        let pem = std::fs::read(self.ca_file()).ok()?;
        let client = redis::Client::build_with_tls(
            self.url(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            },
        )
        .ok()?;
        let mut c = client.get_connection().ok()?;
        redis::cmd("PING").query::<String>(&mut c).ok()?;
        Some(c)
    }

    /// A plain blocking connection (TLS, as the ACL user) for assertions.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection()
            .expect("connect to the TLS redis as its ACL user")
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
