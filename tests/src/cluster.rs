//! A Redis Cluster owned by a test: `masters × (1 + replicas)` redis-servers with
//! `--cluster-enabled yes` on free loopback ports, slots split evenly over the
//! masters. Three masters or more are joined by `redis-cli --cluster create`; fewer
//! (which redis-cli refuses) by hand (`ADDSLOTSRANGE`, `MEET`, `REPLICATE`), which
//! the benchmark uses for 1 and 2 masters. Killed when dropped.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::RedisServer;

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    pub masters: usize,
    /// Every node's password (`requirepass`, `masterauth`), when set.
    password: Option<String>,
}

fn query<T: redis::FromRedisValue>(c: &mut redis::Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")))
}

impl RedisCluster {
    /// Starts and joins a cluster; waits (bounded) until every node reports
    /// `cluster_state:ok` and knows every other node.
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::start_pinned(masters, replicas, None)
    }

    /// The same, every server pinned to `cpu` (the benchmark).
    pub fn start_pinned(masters: usize, replicas: usize, cpu: Option<usize>) -> Self {
        Self::launch(masters, replicas, cpu, None)
    }

    /// A cluster whose every node requires `password` (replicas and the cluster
    /// bus authenticate with it; so must every client on every node).
    pub fn start_with_password(masters: usize, replicas: usize, password: &str) -> Self {
        Self::launch(masters, replicas, None, Some(password))
    }

    fn launch(masters: usize, replicas: usize, cpu: Option<usize>, password: Option<&str>) -> Self {
        assert!(masters >= 1);
        let total = masters * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..total)
            .map(|_| {
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "3000",
                ];
                if let Some(p) = password {
                    args.extend(["--requirepass", p, "--masterauth", p]);
                }
                RedisServer::start_pinned(cpu, &args)
            })
            .collect();
        let cluster = Self {
            nodes,
            masters,
            password: password.map(str::to_string),
        };
        if masters >= 3 {
            let mut cmd = Command::new("redis-cli");
            if let Some(p) = password {
                cmd.args(["-a", p, "--no-auth-warning"]);
            }
            cmd.args(["--cluster", "create"]);
            for n in &cluster.nodes {
                cmd.arg(format!("127.0.0.1:{}", n.port()));
            }
            let out = cmd
                .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
                .output()
                .expect("redis-cli runs");
            assert!(
                out.status.success(),
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            cluster.join_by_hand(replicas);
        }
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    fn join_by_hand(&self, replicas: usize) {
        let per = 16384 / self.masters;
        for (i, n) in self.nodes.iter().enumerate() {
            let mut c = n.connection();
            let _: String = query(
                &mut c,
                &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()],
            );
            if i < self.masters {
                let start = i * per;
                let end = if i + 1 == self.masters {
                    16383
                } else {
                    start + per - 1
                };
                let _: String = query(
                    &mut c,
                    &[
                        "CLUSTER",
                        "ADDSLOTSRANGE",
                        &start.to_string(),
                        &end.to_string(),
                    ],
                );
            }
            if i > 0 {
                let port = self.nodes[0].port().to_string();
                let _: String = query(&mut c, &["CLUSTER", "MEET", "127.0.0.1", &port]);
            }
        }
        self.wait(
            Duration::from_secs(20),
            "every node knows every node",
            |c| {
                let nodes: String = query(c, &["CLUSTER", "NODES"]);
                nodes.lines().count() == self.nodes.len()
            },
        );
        for r in 0..self.masters * replicas {
            let master = r % self.masters;
            let id = self.id(master);
            let mut c = self.nodes[self.masters + r].connection();
            let _: String = query(&mut c, &["CLUSTER", "REPLICATE", &id]);
        }
    }

    fn wait(&self, limit: Duration, what: &str, ok: impl Fn(&mut redis::Connection) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            let all = self.nodes.iter().all(|n| ok(&mut n.connection()));
            if all {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster: not {what} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_ok(&self, limit: Duration) {
        self.wait(limit, "cluster_state:ok everywhere", |c| {
            let info: String = query(c, &["CLUSTER", "INFO"]);
            let nodes: String = query(c, &["CLUSTER", "NODES"]);
            info.contains("cluster_state:ok") && nodes.lines().count() == self.nodes.len()
        });
    }

    /// The seed URL for `ClusterStore::connect`: every master.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes[..self.masters]
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        match &self.password {
            Some(p) => format!("redis+cluster://:{p}@{}", seeds.join(",")),
            None => format!("redis+cluster://{}", seeds.join(",")),
        }
    }

    /// The node id of node `i`.
    pub fn id(&self, i: usize) -> String {
        query(&mut self.nodes[i].connection(), &["CLUSTER", "MYID"])
    }

    /// The index of the node serving `slot` as master (as node 0 sees it).
    pub fn owner(&self, slot: u16) -> usize {
        let mut c = self.nodes[0].connection();
        let nodes: String = query(&mut c, &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if !f[2].contains("master") {
                continue;
            }
            let serves = f[8..].iter().any(|r| {
                if r.starts_with('[') {
                    return false;
                }
                match r.split_once('-') {
                    Some((a, b)) => {
                        (a.parse::<u16>().unwrap()..=b.parse::<u16>().unwrap()).contains(&slot)
                    }
                    None => r.parse::<u16>().ok() == Some(slot),
                }
            });
            if serves {
                let port: u16 = f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port() == port)
                    .expect("a node of ours");
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// Starts moving `slot` from master `from` to master `to`
    /// (`SETSLOT IMPORTING` on the target, `MIGRATING` on the source).
    pub fn begin_migration(&self, slot: u16, from: usize, to: usize) {
        let s = slot.to_string();
        let (from_id, to_id) = (self.id(from), self.id(to));
        let _: String = query(
            &mut self.nodes[to].connection(),
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id],
        );
        let _: String = query(
            &mut self.nodes[from].connection(),
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id],
        );
    }

    /// Moves up to `count` keys of `slot` from `from` to `to` with one `MIGRATE`;
    /// returns how many it moved.
    pub fn migrate_keys(&self, slot: u16, from: usize, to: usize, count: usize) -> usize {
        let mut c = self.nodes[from].connection();
        let keys: Vec<String> = query(
            &mut c,
            &[
                "CLUSTER",
                "GETKEYSINSLOT",
                &slot.to_string(),
                &count.to_string(),
            ],
        );
        if keys.is_empty() {
            return 0;
        }
        let port = self.nodes[to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000"];
        if let Some(p) = &self.password {
            args.extend(["AUTH", p.as_str()]);
        }
        args.push("KEYS");
        args.extend(keys.iter().map(String::as_str));
        let _: String = query(&mut c, &args);
        keys.len()
    }

    /// Ends the move: the target, then the source, then every other master own it.
    pub fn finish_migration(&self, slot: u16, from: usize, to: usize) {
        let s = slot.to_string();
        let to_id = self.id(to);
        let mut order = vec![to, from];
        order.extend((0..self.masters).filter(|i| *i != to && *i != from));
        for i in order {
            let _: String = query(
                &mut self.nodes[i].connection(),
                &["CLUSTER", "SETSLOT", &s, "NODE", &to_id],
            );
        }
    }

    /// How many error replies with `code` (`MOVED`, `ASK`, `TRYAGAIN`) the
    /// masters have sent so far (`INFO errorstats`): what the cluster asked of its
    /// clients, counted by the servers, whatever the client.
    pub fn errors_sent(&self, code: &str) -> u64 {
        let prefix = format!("errorstat_{code}:count=");
        self.nodes[..self.masters]
            .iter()
            .map(|n| {
                let info: String = query(&mut n.connection(), &["INFO", "errorstats"]);
                info.lines()
                    .find_map(|l| l.strip_prefix(&prefix))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Moves `slot` and every key in it at once.
    pub fn move_slot(&self, slot: u16, from: usize, to: usize) {
        self.begin_migration(slot, from, to);
        while self.migrate_keys(slot, from, to, 100) > 0 {}
        self.finish_migration(slot, from, to);
    }
}
