//! A real Redis Cluster on loopback: 3 masters and 3 replicas, each a [`Server`] with the
//! module loaded, joined by `redis-cli --cluster create`. Dropping the cluster kills every
//! node (also when a test panics).
//!
//! `RL_SERVER` picks the server binary as for single servers; `RL_CLI` picks the cluster
//! tool (default `redis-cli`, which also drives Valkey: the cluster protocol is the same).

use super::*;
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::get_slot;
use std::fs::File;

pub const NODES: usize = 6;
pub const MASTERS: usize = 3;
/// Short, so a killed master is failed over within a few seconds; long enough that a
/// loaded CI machine does not fail over healthy nodes.
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// The cluster tool: `$RL_CLI`, else `redis-cli` from `PATH`.
pub fn cli_binary() -> String {
    std::env::var("RL_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// Runs the cluster tool with `args`, output in a file (reshard prints a line per key),
/// killed after `secs`. Panics with the output unless it exits 0.
pub fn run_cli(args: &[String], secs: u64) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    let out_path = out_dir.path().join("cli.out");
    let out = File::create(&out_path).unwrap();
    let mut child = Command::new(cli_binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", cli_binary()));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    match status {
        Some(s) if s.success() => text,
        Some(s) => panic!("{} {args:?} failed ({s}):\n{text}", cli_binary()),
        None => panic!(
            "{} {args:?} timed out after {secs} s:\n{text}",
            cli_binary()
        ),
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct Node {
    pub id: String,
    pub port: u16,
    pub master: bool,
    pub failed: bool,
    pub myself: bool,
    pub master_id: Option<String>,
    pub slots: Vec<(u16, u16)>,
}

impl Node {
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// Parses `CLUSTER NODES` (slot ranges only; migrating/importing markers are skipped).
pub fn parse_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // ip:port@cport[,hostname...]
            let addr = f[1].split('@').next().unwrap();
            let port = addr.rsplit(':').next().unwrap().parse().unwrap();
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (s.parse().unwrap(), s.parse().unwrap()),
                })
                .collect();
            Node {
                id: f[0].to_string(),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail"),
                myself: flags.contains(&"myself"),
                master_id: (f[3] != "-").then(|| f[3].to_string()),
                slots,
            }
        })
        .collect()
}

pub struct Cluster {
    pub servers: Vec<Server>,
    /// Nodes this test killed on purpose.
    pub down: Vec<bool>,
}

impl Cluster {
    /// Six nodes, three masters with one replica each, every slot covered, every replica in
    /// sync, every node agreeing on who owns what.
    pub fn start() -> Cluster {
        let timeout = NODE_TIMEOUT_MS.to_string();
        let servers: Vec<Server> = (0..NODES)
            .map(|_| {
                Server::start_with(|| {
                    // The bus port is set, not port + 10000, which may not exist.
                    let bus = free_port().to_string();
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &timeout,
                        "--cluster-port",
                        &bus,
                        // Replicas sync at once, not after the default 5 s wait for more.
                        "--repl-diskless-sync-delay",
                        "0",
                    ]
                    .map(String::from)
                    .to_vec()
                })
            })
            .collect();
        let cluster = Cluster {
            down: vec![false; servers.len()],
            servers,
        };
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(
            cluster
                .servers
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port)),
        );
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        run_cli(&args, 60);
        cluster.wait_stable();
        cluster
    }

    pub fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.servers.len()).filter(|&i| !self.down[i])
    }

    pub fn conn(&self, i: usize) -> Connection {
        self.servers[i].conn()
    }

    pub fn index_of_port(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|s| s.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// `CLUSTER NODES` as node `i` sees it.
    pub fn nodes_seen_by(&self, i: usize) -> Vec<Node> {
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut self.conn(i))
            .unwrap();
        parse_nodes(&text)
    }

    /// `CLUSTER NODES` as the first live node sees it.
    pub fn nodes(&self) -> Vec<Node> {
        self.nodes_seen_by(self.live().next().unwrap())
    }

    pub fn id(&self, i: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.conn(i))
            .unwrap()
    }

    /// Indexes of the live masters that own slots, in slot order.
    pub fn masters(&self) -> Vec<usize> {
        let mut owners: Vec<(u16, usize)> = self
            .nodes()
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| (n.slots[0].0, self.index_of_port(n.port)))
            .collect();
        owners.sort();
        owners.into_iter().map(|(_, i)| i).collect()
    }

    /// The live replica of master `m`.
    pub fn replica_of(&self, m: usize) -> usize {
        let id = self.id(m);
        let nodes = self.nodes();
        let n = nodes
            .iter()
            .find(|n| n.master_id.as_deref() == Some(id.as_str()) && !n.failed)
            .unwrap_or_else(|| panic!("no replica of node {m}: {nodes:?}"));
        self.index_of_port(n.port)
    }

    /// For each of the 16384 slots, the index of the master that owns it.
    pub fn slot_owners(&self) -> Vec<usize> {
        let mut owners = vec![usize::MAX; 16384];
        for n in self.nodes().into_iter().filter(|n| n.master && !n.failed) {
            let i = self.index_of_port(n.port);
            for &(a, b) in &n.slots {
                owners[usize::from(a)..=usize::from(b)].fill(i);
            }
        }
        owners
    }

    /// The master that owns `key`'s slot (one `CLUSTER NODES`: for many keys, index
    /// [`Cluster::slot_owners`] with [`slot_of`]).
    pub fn owner(&self, key: &str) -> usize {
        self.slot_owners()[slot_of(key)]
    }

    /// `count` keys `prefix0`, `prefix1`, ... that live on master `m`.
    pub fn keys_on(&self, m: usize, prefix: &str, count: usize) -> Vec<String> {
        let me = self
            .nodes()
            .into_iter()
            .find(|n| n.port == self.servers[m].port)
            .unwrap();
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .filter(|k| me.owns(get_slot(k.as_bytes())))
            .take(count)
            .collect()
    }

    /// A cluster-aware client seeded with every live node.
    pub fn client(&self) -> ClusterConnection {
        let urls: Vec<String> = self.live().map(|i| self.servers[i].url()).collect();
        let client = ClusterClient::builder(urls)
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        client.get_connection().unwrap()
    }

    /// Kills node `i` hard (a crash); the others will notice after the node timeout.
    pub fn kill(&mut self, i: usize) {
        self.servers[i].kill();
        self.down[i] = true;
    }

    /// Waits until every live node says `cluster_state:ok`, all of them agree on which
    /// master owns which slots (16384 in all), and every live replica is linked and synced.
    pub fn wait_stable(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Some(why) = self.unstable() {
            assert!(Instant::now() < deadline, "cluster not stable: {why}");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.probe_replication();
    }

    /// A write on every master with a replica, acknowledged by it (`WAIT`), then removed.
    /// After a full sync, Redis 7.0 marks the replica online at once but streams writes to
    /// it only from the replica's next ACK, up to a second later: a master killed in that
    /// second loses everything written since. This waits that second out.
    fn probe_replication(&self) {
        let nodes = self.nodes();
        for n in nodes
            .iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
        {
            if !nodes
                .iter()
                .any(|r| r.master_id.as_deref() == Some(n.id.as_str()) && !r.failed)
            {
                continue;
            }
            let m = self.index_of_port(n.port);
            let key = self.keys_on(m, "rl-test-probe:", 1).remove(0);
            let mut c = self.conn(m);
            let _: () = redis::cmd("SET").arg(&key).arg(1).query(&mut c).unwrap();
            let _: i64 = redis::cmd("DEL").arg(&key).query(&mut c).unwrap();
            let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut c).unwrap();
            assert_eq!(
                acked, 1,
                "master {m}: its replica does not acknowledge writes"
            );
        }
    }

    /// Why the cluster is not yet stable, or `None`.
    fn unstable(&self) -> Option<String> {
        let mut views = Vec::new();
        for i in self.live() {
            let mut c = self.conn(i);
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
            if !info.contains("cluster_state:ok") {
                return Some(format!("node {i} not ok"));
            }
            let nodes = self.nodes_seen_by(i);
            let mut owners: Vec<(String, Vec<(u16, u16)>)> = nodes
                .iter()
                .filter(|n| n.master && !n.failed && !n.slots.is_empty())
                .map(|n| (n.id.clone(), n.slots.clone()))
                .collect();
            owners.sort();
            let covered: u32 = owners
                .iter()
                .flat_map(|(_, s)| s)
                .map(|&(a, b)| u32::from(b - a) + 1)
                .sum();
            if covered != 16384 {
                return Some(format!("node {i} sees {covered} slots"));
            }
            // Every live node is a master with slots or a replica of one (after `create`,
            // replicas first show up as empty masters until CLUSTER REPLICATE reaches them).
            let mut replicas: Vec<(String, String)> = Vec::new();
            for n in nodes.iter().filter(|n| !n.failed) {
                match &n.master_id {
                    _ if n.master && !n.slots.is_empty() => {}
                    Some(m) if !n.master && owners.iter().any(|(id, _)| id == m) => {
                        replicas.push((n.id.clone(), m.clone()))
                    }
                    _ => {
                        return Some(format!(
                            "node {i} sees {} neither serving nor replicating",
                            n.port
                        ))
                    }
                }
            }
            replicas.sort();
            views.push((owners, replicas.clone()));
            let me = nodes.iter().find(|n| n.myself).unwrap();
            if me.master {
                // A master sends its writes to a replica only once the replica is online on
                // its side (after the replica's first ACK, up to a second after the sync).
                let repl: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
                let expected = replicas.iter().filter(|(_, m)| *m == me.id).count();
                let online = repl
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count();
                if online != expected {
                    return Some(format!(
                        "master {i}: {online} of {expected} replicas online"
                    ));
                }
            } else {
                let repl: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
                if !repl.contains("master_link_status:up")
                    || !repl.contains("master_sync_in_progress:0")
                {
                    return Some(format!("replica {i} not synced"));
                }
            }
        }
        if views.windows(2).any(|w| w[0] != w[1]) {
            return Some("nodes disagree on slot owners".into());
        }
        None
    }

    /// Waits until replica `r` has become a master that owns slots and the cluster is stable.
    pub fn wait_promoted(&self, r: usize) {
        wait_until(60, "replica promoted", || {
            let role: Vec<Value> = redis::cmd("ROLE").query(&mut self.conn(r)).unwrap();
            matches!(&role[0], Value::BulkString(b) if b == b"master")
                && self
                    .nodes_seen_by(r)
                    .iter()
                    .any(|n| n.myself && !n.slots.is_empty())
        });
        self.wait_stable();
    }

    /// `CLUSTER FAILOVER [mode]` on replica `r`, then waits until it is the master.
    pub fn failover(&self, r: usize, mode: Option<&str>) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER");
        if let Some(m) = mode {
            cmd.arg(m);
        }
        let _: () = cmd.query(&mut self.conn(r)).unwrap();
        self.wait_promoted(r);
    }

    /// `redis-cli --cluster reshard`: moves `slots` slots from master `from` to master `to`
    /// (MIGRATE, so DUMP/RESTORE of every key in them), then waits until stable.
    pub fn reshard(&self, from: usize, to: usize, slots: usize) -> String {
        let args: Vec<String> = vec![
            "--cluster".into(),
            "reshard".into(),
            format!("127.0.0.1:{}", self.servers[from].port),
            "--cluster-from".into(),
            self.id(from),
            "--cluster-to".into(),
            self.id(to),
            "--cluster-slots".into(),
            slots.to_string(),
            "--cluster-yes".into(),
        ];
        let out = run_cli(&args, 120);
        self.wait_stable();
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Killed, not shut down: nothing to save, and a master would wait for its replicas.
        for i in 0..self.servers.len() {
            if !self.down[i] {
                self.servers[i].kill();
            }
        }
    }
}

/// The slot of `key`, as an index.
pub fn slot_of(key: &str) -> usize {
    usize::from(get_slot(key.as_bytes()))
}

/// `DEBUG DIGEST-VALUE k1 k2 ...` on one connection.
pub fn digests(c: &mut Connection, keys: &[String]) -> Vec<String> {
    if keys.is_empty() {
        return Vec::new();
    }
    redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(keys)
        .query(c)
        .unwrap()
}
