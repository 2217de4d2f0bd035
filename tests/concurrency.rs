//! Many connections hammering one key: the server lets out no more than the bucket allows,
//! and not much less.

mod support;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

#[test]
fn thirty_two_clients_share_one_budget() {
    let s = Server::start(&[]);
    let (rate, cap) = (500.0, 50.0);
    let granted = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut conns: Vec<Connection> = (0..32).map(|_| s.conn()).collect();
    let mut clock = s.conn();
    // Server times: every grant falls within [first, last]; all 32 clients were asking
    // throughout [busy_from, busy_to].
    let first = server_ms(&mut clock);
    let workers: Vec<_> = conns
        .drain(..)
        .map(|mut c| {
            let (granted, stop) = (granted.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    granted.fetch_add(take(&mut c, "shared", rate, cap, 1), Ordering::Relaxed);
                }
            })
        })
        .collect();
    // The bucket is drained (its cap handed out) once every client is running.
    wait_until(30, "the clients to drain the bucket", || {
        granted.load(Ordering::Relaxed) >= cap as i64
    });
    let busy_from = server_ms(&mut clock);
    std::thread::sleep(Duration::from_millis(2500));
    let busy_to = server_ms(&mut clock);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let last = server_ms(&mut clock);
    let got = granted.load(Ordering::Relaxed) as f64;
    // At most the cap plus the refill of the whole run (1 ms each side for rounding).
    let bound = cap + rate * (last - first + 2) as f64 / 1000.0;
    assert!(
        got <= bound,
        "granted {got} > cap + rate * elapsed = {bound}"
    );
    // At least the cap plus 95% of the refill while all were asking: the server lets
    // nothing go to waste.
    let least = 0.95 * (cap + rate * (busy_to - busy_from) as f64 / 1000.0);
    assert!(got >= least, "granted {got} < {least}");
    let mut c = s.conn();
    assert_eq!(info_field(&mut c, "rl", "rl_tokens_granted") as f64, got);
}
