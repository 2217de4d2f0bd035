//! Many connections hammering one key: the server lets out no more than the bucket allows,
//! and not much less.

mod support;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;

#[test]
fn thirty_two_clients_share_one_budget() {
    let s = Server::start(&[]);
    let (rate, cap) = (500.0, 50.0);
    let granted = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut conns: Vec<Connection> = (0..32).map(|_| s.conn()).collect();
    let start = Instant::now();
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
    std::thread::sleep(Duration::from_millis(2500));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = cap + rate * elapsed;
    let got = granted.load(Ordering::Relaxed) as f64;
    assert!(
        got <= bound,
        "granted {got} > cap + rate * elapsed = {bound}"
    );
    assert!(got >= 0.95 * bound, "granted {got} < 95% of {bound}");
    let mut c = s.conn();
    assert_eq!(info_field(&mut c, "rl", "rl_tokens_granted") as f64, got);
}
