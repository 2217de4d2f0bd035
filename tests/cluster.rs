//! The module on a real Redis Cluster (3 masters, 3 replicas, on loopback): buckets spread
//! over the slots, hash tags, MOVED, failover (manual and a killed master) and resharding.
//!
//! Each test builds its own cluster; dropping it kills every node.

mod support;
use redis::cluster::{cluster_pipe, ClusterConnection};
use redis::cluster_routing::{get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionLike, ErrorKind};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};
use support::cluster::*;
use support::*;

/// `RL.LEASE key rate cap n ttl_ms` → (granted, lease_id).
fn lease(
    c: &mut impl ConnectionLike,
    key: &str,
    rate: f64,
    cap: f64,
    n: u64,
    ttl_ms: u64,
) -> (i64, i64) {
    let (granted, id, _, _): (i64, i64, i64, i64) = redis::cmd("RL.LEASE")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(n)
        .arg(ttl_ms)
        .query(c)
        .unwrap();
    (granted, id)
}

/// `RL.RETURN key lease_id unused` → tokens credited.
fn give_back(c: &mut impl ConnectionLike, key: &str, id: i64, unused: u64) -> i64 {
    redis::cmd("RL.RETURN")
        .arg(key)
        .arg(id)
        .arg(unused)
        .query(c)
        .unwrap()
}

fn wait_one_replica(c: &mut Connection) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(c).unwrap();
    assert_eq!(acked, 1, "the replica did not acknowledge the writes");
}

/// Digests of `keys`, each asked of the master that owns it now.
fn digests_at_owners(cluster: &Cluster, keys: &[String]) -> HashMap<String, String> {
    let owners = cluster.slot_owners();
    let mut by_owner: HashMap<usize, Vec<String>> = HashMap::new();
    for k in keys {
        by_owner
            .entry(owners[slot_of(k)])
            .or_default()
            .push(k.clone());
    }
    let mut out = HashMap::new();
    for (m, ks) in by_owner {
        let ds = digests(&mut cluster.conn(m), &ks);
        out.extend(ks.into_iter().zip(ds));
    }
    out
}

const MISSING: &str = "0000000000000000000000000000000000000000";

#[test]
fn ten_thousand_buckets_over_all_shards() {
    let cluster = Cluster::start();
    let mut c = cluster.client();
    let keys: Vec<String> = (0..10_000).map(|i| format!("bucket:{i}")).collect();
    let (rate, cap) = (0.001, 5.0);

    // Three rounds over every bucket, pipelined per node by the client:
    // 3 of 5 granted, 3 of 2 denied, 2 of 2 granted.
    for (n, want) in [(3, 3), (3, 0), (2, 2)] {
        let mut p = cluster_pipe();
        for k in &keys {
            p.cmd("RL.TAKE").arg(k).arg(rate).arg(cap).arg(n);
        }
        let got: Vec<i64> = p.query(&mut c).unwrap();
        let wrong = got.iter().filter(|&&g| g != want).count();
        assert_eq!(
            wrong, 0,
            "round n={n}: {wrong} buckets did not answer {want}"
        );
    }

    // Every master holds its share, and only keys of its own slots.
    let masters = cluster.masters();
    assert_eq!(masters.len(), MASTERS);
    let owners = cluster.slot_owners();
    let slots: BTreeSet<u16> = keys.iter().map(|k| get_slot(k.as_bytes())).collect();
    let mut total = 0;
    let (mut granted, mut denied) = (0, 0);
    let mut shares = Vec::new();
    for &m in &masters {
        let mut mc = cluster.conn(m);
        let held: u64 = redis::cmd("DBSIZE").query(&mut mc).unwrap();
        let expected = keys.iter().filter(|k| owners[slot_of(k)] == m).count() as u64;
        assert_eq!(held, expected, "master {m}");
        assert!(held > 0, "master {m} holds no bucket");
        total += held;
        shares.push(held);
        granted += info_field(&mut mc, "rl", "rl_granted");
        denied += info_field(&mut mc, "rl", "rl_denied");
    }
    assert_eq!(total, keys.len() as u64);
    assert_eq!((granted, denied), (20_000, 10_000));
    eprintln!(
        "10000 buckets over {} slots, per master: {shares:?}",
        slots.len()
    );

    // Each replica holds exactly its master's buckets.
    for &m in &masters {
        let mut mc = cluster.conn(m);
        let r = cluster.replica_of(m);
        // The writes came from the cluster client: wait by offset, not WAIT.
        wait_synced(&cluster.servers[m], &cluster.servers[r]);
        assert_eq!(
            dataset_digest(&mut mc),
            dataset_digest(&mut cluster.conn(r)),
            "master {m} vs replica {r}"
        );
    }

    // A node that does not own a key answers MOVED to the owner; the cluster client follows
    // it, a plain connection sees it.
    let key = &keys[0];
    let owner = owners[slot_of(key)];
    let other = masters.iter().copied().find(|&m| m != owner).unwrap();
    let err = redis::cmd("RL.TAKE")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(1)
        .query::<i64>(&mut cluster.conn(other))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Moved, "{err}");
    let (to, slot) = err.redirect_node().unwrap();
    assert_eq!(slot, get_slot(key.as_bytes()));
    assert_eq!(to, format!("127.0.0.1:{}", cluster.servers[owner].port));
}

#[test]
fn hash_tagged_buckets_land_together() {
    let cluster = Cluster::start();
    let mut c = cluster.client();
    let kinds = ["api", "login", "search", "upload"];
    for t in 0..50 {
        let keys: Vec<String> = kinds
            .iter()
            .map(|k| format!("{{tenant-{t}}}:{k}"))
            .collect();
        for k in &keys {
            assert_eq!(take(&mut c, k, RATE, CAP, 4), 4);
        }
        let slot = get_slot(format!("tenant-{t}").as_bytes());
        assert!(keys.iter().all(|k| get_slot(k.as_bytes()) == slot));
        let owner = cluster.owner(&keys[0]);
        let held: i64 = redis::cmd("EXISTS")
            .arg(&keys)
            .query(&mut cluster.conn(owner))
            .unwrap();
        assert_eq!(
            held,
            keys.len() as i64,
            "tenant {t}'s buckets are not all on node {owner}"
        );
        let counted: i64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut cluster.conn(owner))
            .unwrap();
        assert!(counted >= keys.len() as i64);
    }

    // One slot is what lets RL.MTAKE debit a tenant's buckets together, atomically. The
    // client routes by the first argument (`n` here, not a key); the node it picks answers
    // MOVED from the command's declared key positions, and the client follows.
    let mtake = |c: &mut ClusterConnection, n: u64, keys: &[String]| {
        let mut cmd = redis::cmd("RL.MTAKE");
        cmd.arg(n);
        for k in keys {
            cmd.arg(k).arg(RATE).arg(CAP);
        }
        cmd.query::<(i64, Option<String>, i64)>(c)
    };
    let tenant = |t: usize| -> Vec<String> {
        kinds
            .iter()
            .map(|k| format!("{{tenant-{t}}}:{k}"))
            .collect()
    };
    for t in 0..50 {
        let (granted, denied_by, _) = mtake(&mut c, 2, &tenant(t)).unwrap();
        assert_eq!((granted, denied_by), (2, None), "tenant {t}");
    }
    // Routed explicitly to the slot of its first key, it goes straight to the owner.
    let mut cmd = redis::cmd("RL.MTAKE");
    cmd.arg(1);
    for k in tenant(4) {
        cmd.arg(k).arg(RATE).arg(CAP);
    }
    let route = Route::new(get_slot(b"tenant-4"), SlotAddr::Master);
    let reply = c
        .route_command(
            &cmd,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
        )
        .unwrap();
    let (granted, _, _): (i64, Option<String>, i64) = redis::from_redis_value(&reply).unwrap();
    assert_eq!(granted, 1);
    // 4 left in each of tenant 3's buckets; empty one and the others are not debited.
    assert_eq!(take(&mut c, "{tenant-3}:search", RATE, CAP, 4), 4);
    let (granted, denied_by, _) = mtake(&mut c, 1, &tenant(3)).unwrap();
    assert_eq!(
        (granted, denied_by.as_deref()),
        (0, Some("{tenant-3}:search"))
    );
    assert_eq!(take(&mut c, "{tenant-3}:api", RATE, CAP, 4), 4);
    // Buckets of two tenants are in two slots: the server refuses.
    let mixed = [tenant(1)[0].clone(), tenant(2)[0].clone()];
    let err = mtake(&mut c, 1, &mixed).unwrap_err();
    assert_eq!(err.code(), Some("CROSSSLOT"), "{err}");

    // Being in one slot is what lets one transaction check several buckets at once...
    let owner = cluster.owner("{tenant-0}:api");
    let mut oc = cluster.conn(owner);
    let (a, b): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("RL.TAKE")
        .arg("{tenant-0}:api")
        .arg(RATE)
        .arg(CAP)
        .arg(1)
        .cmd("RL.TAKE")
        .arg("{tenant-0}:login")
        .arg(RATE)
        .arg(CAP)
        .arg(1)
        .query(&mut oc)
        .unwrap();
    assert_eq!((a, b), (1, 1));
    // ...and buckets in two slots, even on one node, cannot be.
    let owners = cluster.slot_owners();
    let stranger = (0..)
        .map(|i| format!("{{other-{i}}}:api"))
        .find(|k| owners[slot_of(k)] == owner && get_slot(k.as_bytes()) != get_slot(b"tenant-0"))
        .unwrap();
    let before = digest(&mut oc, "{tenant-0}:api");
    let queued: String = redis::cmd("MULTI").query(&mut oc).unwrap();
    assert_eq!(queued, "OK");
    let _: String = redis::cmd("RL.TAKE")
        .arg("{tenant-0}:api")
        .arg(RATE)
        .arg(CAP)
        .arg(1)
        .query(&mut oc)
        .unwrap();
    // Redis queues it and refuses at EXEC; either way nothing of the transaction runs.
    let _ = redis::cmd("RL.TAKE")
        .arg(&stranger)
        .arg(RATE)
        .arg(CAP)
        .arg(1)
        .query::<Value>(&mut oc);
    let err = redis::cmd("EXEC").query::<Value>(&mut oc).unwrap_err();
    assert!(
        matches!(err.code(), Some("CROSSSLOT") | Some("EXECABORT")),
        "{err}"
    );
    assert_eq!(digest(&mut oc, "{tenant-0}:api"), before);
}

/// Waits until the server on `port` stops answering (a `DEBUG SLEEP` elsewhere): a raw
/// socket, since a client would block connecting. A PING left unanswered for a whole
/// second means asleep: a busy machine can delay an awake server's reply by far more than
/// a few ms.
fn wait_asleep(port: u16) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 7];
    loop {
        s.write_all(b"PING\r\n").unwrap();
        if s.read_exact(&mut buf).is_err() {
            return;
        }
        assert_eq!(&buf, b"+PONG\r\n");
        assert!(Instant::now() < deadline, "server on {port} never slept");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Buckets (with tokens taken) and open leases on one master.
struct Fixture {
    keys: Vec<String>,
    leases: Vec<(String, i64)>,
}

const RATE: f64 = 0.001;
const CAP: f64 = 10.0;

/// On each key: 6 of 10 tokens taken and a lease of 2, so 2 are left.
fn fill(c: &mut impl ConnectionLike, keys: Vec<String>) -> Fixture {
    let mut leases = Vec::new();
    for k in &keys {
        assert_eq!(take(c, k, RATE, CAP, 6), 6);
        let (granted, id) = lease(c, k, RATE, CAP, 2, 600_000);
        assert_eq!(granted, 2);
        leases.push((k.clone(), id));
    }
    Fixture { keys, leases }
}

/// The buckets hold what [`fill`] left: 2 tokens (not a reset bucket of 10) and the lease.
fn check_filled(c: &mut impl ConnectionLike, f: &Fixture) {
    for (k, id) in &f.leases {
        assert_eq!(
            take(c, k, RATE, CAP, 3),
            0,
            "{k}: bucket was reset (3 of 2 granted)"
        );
        assert_eq!(give_back(c, k, *id, 2), 2, "{k}: lease {id} lost");
        let (granted, remaining, _, _) = take_state(c, k, RATE, CAP, 4);
        assert_eq!(granted, 4, "{k}");
        assert!(remaining < 0.1, "{k}: {remaining} left");
    }
}

#[test]
fn manual_failover_keeps_buckets_and_leases() {
    let cluster = Cluster::start();
    let mut c = cluster.client();
    let m = cluster.masters()[0];
    let r = cluster.replica_of(m);
    let f = fill(&mut c, cluster.keys_on(m, "acct:", 50));
    let before = digests(&mut cluster.conn(m), &f.keys);

    // No WAIT: a manual failover lets the replica catch up before it takes over.
    cluster.failover(r, None);
    assert_eq!(cluster.masters().iter().filter(|&&x| x == r).count(), 1);
    assert_eq!(
        digests(&mut cluster.conn(r), &f.keys),
        before,
        "promoted replica differs"
    );
    // The same client object, its slot map now stale: MOVED takes it to the new master.
    check_filled(&mut c, &f);
    // The old master now follows the new one.
    assert_eq!(cluster.replica_of(r), m);
}

#[test]
fn killed_master_loses_only_unreplicated_grants() {
    let mut cluster = Cluster::start();
    let m = cluster.masters()[0];
    let r = cluster.replica_of(m);
    let mut mc = cluster.conn(m);

    // Acknowledged by the replica (WAIT): these must survive.
    let f = fill(&mut mc, cluster.keys_on(m, "acct:", 50));
    wait_one_replica(&mut mc);
    let kept = digests(&mut mc, &f.keys);

    // A window in which the master grants but cannot replicate: the replica is asleep and its
    // link dropped, so these grants exist only on the master when it dies. It sleeps 5 s:
    // after the second it takes to be seen asleep, the window's 50 calls must fit on a busy
    // machine (under the 20 s a replica may lag and still be promoted).
    let replica = cluster.servers[r].url();
    let sleeper = std::thread::spawn(move || {
        let mut rc = redis::Client::open(replica)
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(5)
            .query(&mut rc)
            .unwrap();
    });
    wait_asleep(cluster.servers[r].port);
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut mc)
        .unwrap();
    // The first bucket's 2 tokens go in a lease, the others' in plain grants.
    let (window_lease_granted, window_lease) = lease(&mut mc, &f.keys[0], RATE, CAP, 2, 600_000);
    let mut window_grants = window_lease_granted;
    for k in &f.keys[1..] {
        window_grants += take(&mut mc, k, RATE, CAP, 2);
    }
    assert_eq!(window_grants, 2 * f.keys.len() as i64);
    assert_eq!(
        info_field(&mut mc, "replication", "connected_slaves"),
        0,
        "replica came back too early"
    );
    cluster.kill(m);
    sleeper.join().unwrap();

    cluster.wait_promoted(r);
    let promoted = digests(&mut cluster.conn(r), &f.keys);
    assert_eq!(
        promoted, kept,
        "the promoted replica must hold exactly the replicated state"
    );
    // The window's grants are lost: each bucket has its 2 tokens again (an over-grant of
    // exactly the unreplicated grants), the WAITed state and leases are all there.
    let mut c = cluster.client();
    // A lease made in the window is unknown: returning it credits nothing.
    assert_eq!(give_back(&mut c, &f.keys[0], window_lease, 2), 0);
    check_filled(&mut c, &f);
    eprintln!(
        "failover after a kill: {} grants acknowledged but not replicated were lost; {} WAITed grants and {} leases kept",
        window_grants,
        6 * f.keys.len(),
        f.leases.len()
    );
}

/// Grants hammering a master when it is killed, without any induced lag: how many
/// acknowledged grants the promoted replica lacks (what a real crash over-grants), and that
/// grants confirmed with `WAIT 1 0` lose nothing.
#[test]
fn killed_master_under_load_overgrants_at_most_replication_lag() {
    let mut cluster = Cluster::start();
    let m = cluster.masters()[1];
    let r = cluster.replica_of(m);
    let keys = cluster.keys_on(m, "load:", 2);
    let (plain, waited) = (keys[0].clone(), keys[1].clone());
    // One token per 1000 s: refill is negligible, and 10^5 tokens are a 10^8 s deficit.
    let (rate, cap) = (0.001, 1_000_000.0);
    let url = cluster.servers[m].url();

    // Sequential grants until the master dies (bounded: at most 200k, or 20 s).
    let grants = |key: String, wait: bool| {
        let url = url.clone();
        std::thread::spawn(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            let (mut acked, deadline) = (0u64, Instant::now() + Duration::from_secs(20));
            while acked < 200_000 && Instant::now() < deadline {
                if redis::cmd("RL.TAKE")
                    .arg(&key)
                    .arg(rate)
                    .arg(cap)
                    .arg(1)
                    .query::<i64>(&mut c)
                    .is_err()
                {
                    break;
                }
                if wait
                    && redis::cmd("WAIT")
                        .arg(1)
                        .arg(0)
                        .query::<i64>(&mut c)
                        .is_err()
                {
                    break;
                }
                acked += 1;
            }
            acked
        })
    };
    let plain_thread = grants(plain.clone(), false);
    let waited_thread = grants(waited.clone(), true);
    wait_until(20, "grants under way", || {
        let mut c = cluster.conn(m);
        info_field(&mut c, "rl", "rl_granted") > 2_000
    });
    cluster.kill(m);
    let plain_acked = plain_thread.join().unwrap();
    let waited_acked = waited_thread.join().unwrap();

    cluster.wait_promoted(r);
    let mut rc = cluster.conn(r);
    // Taking 1 more shows what the promoted bucket holds; refill is negligible at this rate.
    let consumed = |rc: &mut Connection, key: &str| {
        let (granted, remaining, _, _) = take_state(rc, key, rate, cap, 1);
        assert_eq!(granted, 1);
        (cap - remaining - 1.0).round() as u64
    };
    let plain_kept = consumed(&mut rc, &plain);
    let waited_kept = consumed(&mut rc, &waited);
    assert!(
        plain_acked > 0 && waited_acked > 0,
        "no grants: {plain_acked}, {waited_acked}"
    );
    // At most one grant was applied but not acknowledged (the one in flight at the kill).
    assert!(
        plain_kept <= plain_acked + 1,
        "{plain_kept} kept > {plain_acked} acked"
    );
    assert!(
        waited_kept <= waited_acked + 1,
        "{waited_kept} kept > {waited_acked} acked"
    );
    assert!(
        waited_kept >= waited_acked,
        "WAITed grants lost: {waited_kept} kept of {waited_acked}"
    );
    eprintln!(
        "kill under load: no WAIT: {plain_acked} acked, {plain_kept} on the promoted replica, {} lost; \
         WAIT 1 0: {waited_acked} acked, {waited_kept} kept",
        plain_acked.saturating_sub(plain_kept)
    );
}

#[test]
fn resharding_moves_buckets_with_their_state() {
    let cluster = Cluster::start();
    let mut c: ClusterConnection = cluster.client();
    let keys: Vec<String> = (0..2_000).map(|i| format!("res:{i}")).collect();
    // Every 10th bucket also has a lease of 1 open: 6 or 5 tokens left.
    let mut p = cluster_pipe();
    for (i, k) in keys.iter().enumerate() {
        p.cmd("RL.TAKE").arg(k).arg(RATE).arg(CAP).arg(4);
        if i % 10 == 0 {
            p.cmd("RL.LEASE")
                .arg(k)
                .arg(RATE)
                .arg(CAP)
                .arg(1)
                .arg(600_000);
        }
    }
    p.query::<Vec<Value>>(&mut c).unwrap();
    let before = digests_at_owners(&cluster, &keys);
    let owners_before = cluster.slot_owners();

    let masters = cluster.masters();
    let (from, to) = (masters[0], masters[1]);
    cluster.reshard(from, to, 1000);

    let after = digests_at_owners(&cluster, &keys);
    let owners_after = cluster.slot_owners();
    let moved: Vec<&String> = keys
        .iter()
        .filter(|k| owners_after[slot_of(k)] != owners_before[slot_of(k)])
        .collect();
    assert!(moved.len() > 50, "only {} buckets moved", moved.len());
    assert!(moved.iter().all(|k| owners_after[slot_of(k)] == to));
    for k in &keys {
        assert_ne!(after[k], MISSING, "{k} vanished");
        assert_eq!(after[k], before[k], "{k} changed");
    }
    // The old owner no longer has them; the new owner's replica got them too.
    let moved: Vec<String> = moved.into_iter().cloned().collect();
    assert!(digests(&mut cluster.conn(from), &moved)
        .iter()
        .all(|d| d == MISSING));
    let to_replica = cluster.replica_of(to);
    wait_synced(&cluster.servers[to], &cluster.servers[to_replica]);
    let on_replica = digests(&mut cluster.conn(to_replica), &moved);
    assert_eq!(
        on_replica,
        moved.iter().map(|k| before[k].clone()).collect::<Vec<_>>()
    );
    for k in &moved {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(k)
            .query(&mut cluster.conn(to))
            .unwrap();
        assert!(pttl > 0, "{k} lost its expiry: {pttl}");
    }

    // The client made before the move follows MOVED and finds the buckets as they were.
    for (i, k) in keys.iter().enumerate() {
        let left = if i % 10 == 0 { 5 } else { 6 };
        assert_eq!(take(&mut c, k, RATE, CAP, left + 1), 0, "{k}");
        assert_eq!(take(&mut c, k, RATE, CAP, left), left as i64, "{k}");
    }
}

/// COMMAND GETKEYS for RL.MTAKE with options in every order, keys named like options, and
/// the most buckets.
#[test]
fn mtake_getkeys_with_options() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys = |c: &mut Connection, args: &[&str]| -> redis::RedisResult<Vec<String>> {
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg("RL.MTAKE")
            .arg(args)
            .query(c)
    };
    assert_eq!(
        keys(
            &mut c,
            &["1", "a", "1", "1", "b", "2", "2", "INIT", "1", "WITHSTATE"]
        )
        .unwrap(),
        ["a", "b"]
    );
    assert_eq!(
        keys(&mut c, &["1", "a", "1", "1", "WITHSTATE", "INIT", "1"]).unwrap(),
        ["a"]
    );
    assert_eq!(
        keys(&mut c, &["1", "INIT", "1", "1", "WITHSTATE", "2", "2"]).unwrap(),
        ["INIT", "WITHSTATE"]
    );
    assert!(keys(&mut c, &["1", "a", "1", "1", "WITHSTATE", "WITHSTATE"]).is_err());
    let mut many = vec!["1".to_string()];
    for i in 0..64 {
        many.extend([format!("k{i}"), "1".into(), "1".into()]);
    }
    many.push("WITHSTATE".into());
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(keys(&mut c, &refs).unwrap().len(), 64);
    // The command agrees with GETKEYS: a key named INIT is a key.
    let v: Vec<Value> = redis::cmd("RL.MTAKE")
        .arg(&[
            "1",
            "INIT",
            "1",
            "1",
            "WITHSTATE",
            "2",
            "2",
            "INIT",
            "1",
            "WITHSTATE",
        ])
        .query(&mut c)
        .unwrap();
    assert_eq!(v.len(), 4);
    let e: i64 = c.exists(&["INIT", "WITHSTATE"]).unwrap();
    assert_eq!(e, 2);
}
