//! The prefetch ledger against its golden cases (`protocol/client-cases/prefetch.json`):
//! every step's lease call, landing, leases to return, decision and counters, as every shell
//! must see them (the Rust client and the Python extension run the same file).

mod common;

#[test]
fn the_prefetch_ledger_follows_its_golden_cases() {
    let steps = common::prefetch_cases::run(&common::reply);
    assert!(steps >= 100, "only {steps} steps");
}
