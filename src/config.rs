//! Module configs: `rl.mode` (`enforce` or `shadow`).
//!
//! Settable in redis.conf (`rl.mode shadow`), as a `loadmodule` argument
//! (`loadmodule libredis_rl.so mode shadow`) and at runtime with `CONFIG SET rl.mode shadow`.
//!
//! `loadmodule` arguments are `name value` pairs, names and values case-insensitive
//! (`mode`, or `rl.mode` as in redis.conf); the argument sets `rl.mode`'s default, which an
//! `rl.mode` line in redis.conf overrides. Anything else refuses the load with a log line
//! that names the argument and what is accepted: a typo must not load in enforce mode
//! unnoticed.
//! Commands read it on every call, so it lives in an atomic, not behind a lock.

use crate::bucket::adopt;
use crate::ffi::{Config, Kind};
use crate::observe::{namespaces, top};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// What a denial does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Denials are denials (the default).
    Enforce = 0,
    /// Every call answers as granted; buckets evolve exactly as if enforcing and
    /// `rl_shadow_denied` counts what would have been denied. For rolling out.
    Shadow = 1,
}

/// The current mode.
pub struct ModeSetting(AtomicU8);

pub static MODE: ModeSetting = ModeSetting(AtomicU8::new(Mode::Enforce as u8));

impl ModeSetting {
    pub fn get(&self) -> Mode {
        if self.0.load(Relaxed) == Mode::Shadow as u8 {
            Mode::Shadow
        } else {
            Mode::Enforce
        }
    }

    fn set(&self, m: Mode) {
        self.0.store(m as u8, Relaxed);
    }
}

/// Every `rl.*` config, as Redis is told about it.
pub static CONFIGS: &[Config] = &[
    Config {
        name: c"max-namespaces",
        kind: Kind::Number {
            default: 64,
            min: 0,
            max: 1024,
            get: namespaces::max_namespaces,
            set: namespaces::set_max_namespaces,
        },
    },
    Config {
        name: c"top-keys",
        kind: Kind::Number {
            default: 128,
            min: 0,
            max: 65536,
            get: top::top_keys,
            set: top::set_top_keys,
        },
    },
    Config {
        name: c"namespace-separator",
        kind: Kind::Bytes {
            default: c":",
            get: namespaces::separator_bytes,
            set: namespaces::set_separator,
        },
    },
    Config {
        name: c"adopt-script-keys",
        kind: Kind::Bool {
            default: false,
            get: adopt::adopt,
            set: adopt::set_adopt,
        },
    },
    Config {
        name: c"mode",
        kind: Kind::Enum {
            default: Mode::Enforce as i32,
            names: &[c"enforce", c"shadow"],
            values: &[Mode::Enforce as i32, Mode::Shadow as i32],
            get: || MODE.get() as i32,
            set: |v| {
                MODE.set(match v {
                    0 => Mode::Enforce,
                    1 => Mode::Shadow,
                    _ => return Err("rl.mode must be enforce or shadow"),
                });
                Ok(())
            },
        },
    },
];

/// Whether calls answer as granted whatever the buckets say.
pub fn shadow() -> bool {
    MODE.get() == Mode::Shadow
}

/// The mode the `loadmodule` arguments ask for (`None`: none). It becomes `rl.mode`'s
/// default, so an `rl.mode` line in redis.conf (one `CONFIG REWRITE` wrote, say) wins over
/// it and a rewrite keeps exactly what differs from it. `Err` is the one log line that says
/// what was wrong.
pub fn module_args_mode(args: &[&[u8]]) -> Result<Option<Mode>, String> {
    let show = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(64)]).into_owned();
    let mut mode = None;
    let mut rest = args;
    while let [name, tail @ ..] = rest {
        let is = |want: &str| name.eq_ignore_ascii_case(want.as_bytes());
        if !(is("mode") || is("rl.mode")) {
            return Err(format!(
                "unknown argument '{}' (accepted: mode enforce|shadow)",
                show(name)
            ));
        }
        let [value, tail @ ..] = tail else {
            return Err(format!(
                "argument '{}' needs a value: enforce or shadow",
                show(name)
            ));
        };
        mode = Some(if value.eq_ignore_ascii_case(b"enforce") {
            Mode::Enforce
        } else if value.eq_ignore_ascii_case(b"shadow") {
            Mode::Shadow
        } else {
            return Err(format!(
                "invalid value '{}' for mode (accepted: enforce, shadow)",
                show(value)
            ));
        });
        rest = tail;
    }
    Ok(mode)
}

/// The mode's name, for the log and INFO.
pub fn mode_name() -> &'static str {
    match MODE.get() {
        Mode::Enforce => "enforce",
        Mode::Shadow => "shadow",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_args() {
        assert_eq!(module_args_mode(&[]), Ok(None));
        assert_eq!(
            module_args_mode(&[b"MODE", b"SHADOW"]),
            Ok(Some(Mode::Shadow))
        );
        assert_eq!(
            module_args_mode(&[b"rl.mode", b"Enforce"]),
            Ok(Some(Mode::Enforce))
        );
        for bad in [
            &[&b"mdoe"[..], b"shadow"][..],
            &[b"shadow"],
            &[b"mode"],
            &[b"mode", b"shadw"],
            &[b"mode", b"shadow", b"extra"],
        ] {
            let e = module_args_mode(bad).unwrap_err();
            assert!(e.contains("accepted") || e.contains("needs a value"), "{e}");
        }
    }
}
