//! The pure bucket arithmetic of `rl-core`, nanoseconds per operation: what `RL.TAKE` and
//! `RL.LEASE` compute between reading and writing the key. `cargo bench --bench bucket`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use rl_core::{Bucket, LeaseTable, Level, Limit, Nanos};

const MS: Nanos = 1_000_000;
const T0: Nanos = 1_732_897_000_000 * MS;

fn take(c: &mut Criterion) {
    let limit = Limit::new(1000.0, 1e9).unwrap();
    // A bucket written under this limit 1 s ago with a deficit: the common update in place.
    let stored = Bucket::from_parts(T0 + 5_000 * MS, 1000.0, 1e9).unwrap();
    let empty = {
        let tight = Limit::new(1e-6, 1.0).unwrap();
        let mut l = Level::new(None, tight, T0);
        assert!(l.try_take(1.0));
        (tight, l.bucket())
    };
    let other = Bucket::from_parts(T0 + 5_000 * MS, 10.0, 100.0).unwrap();

    let mut g = c.benchmark_group("take");
    g.bench_function("limit_new", |b| {
        b.iter(|| Limit::new(black_box(1000.0), black_box(1e9)))
    });
    g.bench_function("grant_existing", |b| {
        b.iter(|| {
            let mut level = Level::new(Some(black_box(&stored)), limit, black_box(T0 + MS));
            let granted = level.try_take(1.0);
            (granted, level.bucket())
        })
    });
    g.bench_function("grant_absent_key", |b| {
        b.iter(|| {
            let mut level = Level::new(None, limit, black_box(T0));
            let granted = level.try_take(1.0);
            (granted, level.bucket())
        })
    });
    g.bench_function("deny_empty", |b| {
        b.iter(|| {
            let mut level = Level::new(Some(black_box(&empty.1)), empty.0, black_box(T0 + MS));
            level.try_take(1.0)
        })
    });
    g.bench_function("withstate_fields", |b| {
        b.iter(|| {
            let mut level = Level::new(Some(black_box(&stored)), limit, black_box(T0 + MS));
            let granted = level.try_take(1.0);
            (
                granted,
                level.tokens(),
                level.wait_for(1.0),
                level.reset_after(),
            )
        })
    });
    g.bench_function("limit_changed", |b| {
        b.iter(|| {
            let mut level = Level::new(Some(black_box(&other)), limit, black_box(T0 + MS));
            let granted = level.try_take(1.0);
            (granted, level.bucket())
        })
    });
    g.finish();
}

fn lease(c: &mut Criterion) {
    let limit = Limit::new(1000.0, 1e9).unwrap();
    let stored = Bucket::from_parts(T0 + 5_000 * MS, 1000.0, 1e9).unwrap();
    // A table with a few live leases, as a key shared by a few holders has.
    let mut table = LeaseTable::default();
    for i in 0..8 {
        table.open(20, 100 * MS, T0 + i * MS).unwrap();
    }
    let held = table.leases()[0].id;

    let mut g = c.benchmark_group("lease");
    g.bench_function("take_up_to_20", |b| {
        b.iter(|| {
            let mut level = Level::new(Some(black_box(&stored)), limit, black_box(T0 + MS));
            let got = level.take_up_to(20, 1);
            (got, level.bucket())
        })
    });
    g.bench_function("open_with_8_live", |b| {
        b.iter_batched_ref(
            || table.clone(),
            |t| {
                t.prune(black_box(T0 + 10 * MS));
                t.open(20, 100 * MS, black_box(T0 + 10 * MS))
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("settle_with_8_live", |b| {
        b.iter_batched_ref(
            || table.clone(),
            |t| t.settle(black_box(held), 5, black_box(T0 + 10 * MS)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("renew_and_return", |b| {
        // RL.LEASE ... RETURN id unused: credit the old lease, debit a new one.
        b.iter_batched_ref(
            || table.clone(),
            |t| {
                let now = black_box(T0 + 10 * MS);
                let mut level = Level::new(Some(&stored), limit, now);
                t.prune(now);
                if let rl_core::Settled::Returned { credited } = t.settle(held, 5, now) {
                    level.credit(credited as f64);
                }
                let got = level.take_up_to(20, 1);
                (t.open(got, 100 * MS, now), level.bucket())
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// The module reads the real-time clock once per command (`SystemTime::now`, a vDSO call
/// to `CLOCK_REALTIME`) that callgrind cannot count (under valgrind it is a system call), so
/// its native cost is measured here.
fn clock(c: &mut Criterion) {
    c.bench_function("clock_realtime", |b| {
        b.iter(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
    });
}

criterion_group!(benches, take, lease, clock);
criterion_main!(benches);
