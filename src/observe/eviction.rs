//! Keys the server's memory limit removed. Under `maxmemory` with an evicting
//! `maxmemory-policy` the server may delete any key, a drained bucket among them; the next
//! call finds no key and starts a full bucket, so its callers get more than their limit
//! (and a share or permit key forgets its holders). The module cannot prevent that, only
//! say it: a warning in the server log at load and whenever the config starts evicting
//! (`rl_eviction_risk` in `INFO rl`), and every evicted `rl` key counted (`rl_keys_evicted`,
//! and `evicted` per namespace in `RL.STATS`).

use crate::ffi::{self, Ctx, MainThread};
use crate::observe::{namespaces, stats};

/// The last `rl` key unlinked while eviction was possible: the server unlinks an evicted
/// key just before it announces the eviction, by name only.
struct LastUnlinked {
    name: Vec<u8>,
    set: bool,
}

static LAST_UNLINKED: MainThread<LastUnlinked> = MainThread::new(LastUnlinked {
    name: Vec::new(),
    set: false,
});

/// What the log last said about eviction: whether it was possible, and when (ms) it last
/// reported evicted keys (one line a minute at most, however many go).
struct Logged {
    risk: Option<bool>,
    reported_ms: u64,
    unreported: u64,
}

static LOGGED: MainThread<Logged> = MainThread::new(Logged {
    risk: None,
    reported_ms: 0,
    unreported: 0,
});

/// An `rl` key of any type leaves the keyspace (expiry, DEL, eviction...): remembered only
/// when the server may evict, so that an eviction announced next can be told to be ours.
pub fn unlinked(key: &[u8]) {
    if !ffi::eviction_possible() {
        return;
    }
    LAST_UNLINKED.with(|last| {
        last.name.clear();
        last.name.extend_from_slice(key);
        last.set = true;
    });
}

/// A command starts (the command filter): an `rl` key unlinked before it was not evicted
/// (the server announces an eviction right after the unlink, before any other command),
/// and a key of another type may take its name, which must not count if evicted later.
pub fn command_started() {
    LAST_UNLINKED.with(|last| last.set = false);
}

/// The server evicted `key` (of any type): counted if it was the `rl` key just unlinked.
pub fn evicted(ctx: Ctx, key: &[u8]) {
    let ours = LAST_UNLINKED.with(|last| {
        let ours = last.set && last.name == key;
        last.set = false;
        ours
    });
    if !ours {
        return;
    }
    stats::KEYS_EVICTED.add(1);
    namespaces::evicted(namespaces::namespace_id(key));
    let now_ms = crate::clock::now() / 1_000_000;
    let report = LOGGED.with(|l| {
        l.unreported += 1;
        if l.reported_ms != 0 && now_ms < l.reported_ms.saturating_add(60_000) {
            return None;
        }
        l.reported_ms = now_ms.max(1);
        Some(std::mem::take(&mut l.unreported))
    });
    if let Some(n) = report {
        ffi::log_warning(
            ctx,
            &format!(
                "redis-rl: the server evicted {n} rate-limit key(s) (the last: '{}'): an \
                 evicted bucket comes back full, so its callers got more than their limit. \
                 Set maxmemory-policy noeviction, or give the limits a Redis of their own \
                 (INFO rl: rl_keys_evicted; at most one such line a minute)",
                String::from_utf8_lossy(&key[..key.len().min(128)])
            ),
        );
    }
}

/// A config changed: warns if the server may now evict keys (once per change of state).
pub fn config_changed(ctx: Ctx) {
    check_policy(ctx);
}

/// Logs the eviction risk when it differs from what the log last said (at load: always
/// when there is a risk).
pub fn check_policy(ctx: Ctx) {
    let risk = ffi::eviction_possible();
    let changed = LOGGED.with(|l| {
        let changed = l.risk != Some(risk);
        l.risk = Some(risk);
        changed
    });
    if !changed {
        return;
    }
    if risk && !ffi::subscribe_evictions(ctx) {
        ffi::log_warning(
            ctx,
            "redis-rl: could not listen to evictions: rl_keys_evicted will not count them",
        );
    }
    if risk {
        let policy = ffi::server_info_text(c"memory", c"maxmemory_policy", |p| {
            p.unwrap_or("?").to_owned()
        })
        .unwrap_or_else(|| "?".into());
        ffi::log_warning(
            ctx,
            &format!(
                "redis-rl: WARNING maxmemory is set with maxmemory-policy {policy}: the \
                 server may evict rate-limit keys, and an evicted bucket comes back full \
                 (its callers get more than their limit; share and permit keys forget \
                 their holders). Run limits with maxmemory-policy noeviction (writes are \
                 refused when memory is full, which the clients treat as an outage) or on \
                 a Redis of their own. INFO rl counts evicted keys in rl_keys_evicted."
            ),
        );
    } else {
        ffi::log_notice(
            ctx,
            "redis-rl: the server no longer evicts keys (noeviction or no maxmemory)",
        );
    }
}

/// `rl_eviction_risk` in `INFO rl`: 1 while the server may evict keys.
pub fn risk() -> u64 {
    ffi::eviction_possible() as u64
}
