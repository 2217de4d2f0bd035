//! Lease and permit effects (`RL.SETSTATE ... PRUNE/DROP/ADD`, `RL.SETPERMITS`), whose
//! numbers are text made by the module: a replica and an AOF replay end with the master's
//! exact state after many leases, returns, acquires, releases and renewals with mixed
//! TTLs (some expiring in between), and every number in the AOF is plain decimal.

mod support;

use std::time::Duration;
use support::*;

/// Mixed lease / permit traffic on a few keys. Slow refill and one long lease or permit
/// per key keep every key alive while the test compares (no expiry races).
fn workload(m: &mut Connection) -> Vec<String> {
    let mut keys = Vec::new();
    let mut lease_ids: Vec<(String, i64)> = Vec::new();
    let mut permit_ids: Vec<(String, i64)> = Vec::new();
    for k in 0..4 {
        let key = format!("lease:{k}");
        let _: Vec<i64> = query(m, &["RL.LEASE", &key, "0.001", "100000", "1", "600000"]);
        keys.push(key);
        let key = format!("sem:{k}");
        let _: Vec<i64> = query(m, &["RL.ACQUIRE", &key, "1000", "600000"]);
        keys.push(key);
    }
    for i in 0..400u64 {
        let lk = format!("lease:{}", i % 4);
        let sk = format!("sem:{}", i % 4);
        let ttl = ["3", "40", "600000"][(i % 3) as usize];
        match i % 7 {
            0..=2 => {
                let n = (1 + i % 9).to_string();
                let r: Vec<i64> = query(m, &["RL.LEASE", &lk, "0.001", "100000", &n, ttl]);
                if r[0] > 0 {
                    lease_ids.push((lk.clone(), r[1]));
                }
            }
            3 => {
                if let Some((key, id)) = lease_ids.pop() {
                    let unused = (i % 4).to_string();
                    if i % 2 == 0 {
                        let _: i64 = query(m, &["RL.RETURN", &key, &id.to_string(), &unused]);
                    } else {
                        let _: Vec<i64> = query(
                            m,
                            &[
                                "RL.LEASE",
                                &key,
                                "0.001",
                                "100000",
                                "2",
                                ttl,
                                "RETURN",
                                &id.to_string(),
                                &unused,
                            ],
                        );
                    }
                }
            }
            4 | 5 => {
                let r: Vec<i64> = query(m, &["RL.ACQUIRE", &sk, "1000", ttl]);
                if r[0] > 0 {
                    permit_ids.push((sk.clone(), r[1]));
                }
            }
            _ => {
                if let Some((key, id)) = permit_ids.pop() {
                    if i % 2 == 0 {
                        let _: i64 = query(m, &["RL.RELEASE", &key, &id.to_string()]);
                    } else {
                        let _: redis::Value = query(m, &["RL.RENEW", &key, &id.to_string(), ttl]);
                    }
                }
            }
        }
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    keys
}

fn aof_text(s: &Server) -> String {
    let dir = s.dir.path().join("appendonlydir");
    let mut text = String::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "aof") {
            text += &String::from_utf8_lossy(&std::fs::read(p).unwrap());
        }
    }
    text
}

/// The RESP commands in `aof` (arrays of bulk strings).
fn commands(aof: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut lines = aof.split("\r\n");
    while let Some(l) = lines.next() {
        let Some(n) = l.strip_prefix('*') else {
            continue;
        };
        let n: usize = n.parse().unwrap();
        let mut cmd = Vec::new();
        for _ in 0..n {
            lines.next(); // $len
            cmd.push(lines.next().unwrap().to_string());
        }
        out.push(cmd);
    }
    out
}

#[test]
fn lease_and_permit_effects_reach_replica_and_aof_exactly() {
    let master = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    let keys = workload(&mut m);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    let want: Vec<String> = keys.iter().map(|k| digest(&mut m, k)).collect();
    let got: Vec<String> = keys.iter().map(|k| digest(&mut r, k)).collect();
    assert_eq!(got, want, "replica");
    assert_eq!(dataset_digest(&mut r), dataset_digest(&mut m));

    // Every effect in the AOF: its numbers plain decimal, within i64.
    let _: String = query(&mut m, &["CONFIG", "SET", "appendfsync", "always"]);
    let cmds = commands(&aof_text(&master));
    let mut seen = (0, 0);
    for c in &cmds {
        let name = c[0].to_ascii_uppercase();
        let numbers: Vec<&String> = match name.as_str() {
            "RL.SETSTATE" => {
                seen.0 += 1;
                // key full_at rate cap, then keyword/number pairs (ADD has three numbers).
                std::iter::once(&c[2])
                    .chain(c[5..].iter().filter(|a| a.as_bytes()[0].is_ascii_digit()))
                    .collect()
            }
            "RL.SETPERMITS" => {
                seen.1 += 1;
                c[2..]
                    .iter()
                    .filter(|a| !a.as_bytes()[0].is_ascii_alphabetic())
                    .collect()
            }
            _ => continue,
        };
        for n in numbers {
            assert!(
                n.bytes().all(|b| b.is_ascii_digit())
                    && (n == "0" || !n.starts_with('0'))
                    && n.parse::<i64>().is_ok(),
                "{n:?} in {c:?}"
            );
        }
    }
    assert!(seen.0 > 100 && seen.1 > 50, "{seen:?}");

    // The AOF replayed ends with the same state.
    let _: String = query(&mut m, &["DEBUG", "LOADAOF"]);
    let replayed: Vec<String> = keys.iter().map(|k| digest(&mut m, k)).collect();
    assert_eq!(replayed, want, "AOF replay");
}
