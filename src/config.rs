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

/// What is wrong with the `rl.*` lines of a redis.conf text, one log line each naming the
/// line, the config and the value: an unknown `rl.` name (Redis 7.0 names neither, and
/// stops after the module loaded) or a word `rl.mode` / `rl.adopt-script-keys` does not take
/// (Redis names the config, not the value). Numbers and the separator are refused, value
/// quoted, by the configs' setters. Words are split at blanks and unquoted: close enough to
/// Redis's own split for names and these values.
pub fn conf_problems(text: &[u8]) -> Vec<String> {
    let show = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(64)]).into_owned();
    let mut out = Vec::new();
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let words: Vec<&[u8]> = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty())
            .map(|w| match w {
                [b'"', inner @ .., b'"'] | [b'\'', inner @ .., b'\''] => inner,
                _ => w,
            })
            .collect();
        let Some((name, values)) = words.split_first() else {
            continue;
        };
        let lower = name.to_ascii_lowercase();
        let Some(short) = lower.strip_prefix(b"rl.") else {
            continue;
        };
        let value = values.iter().map(|v| show(v)).collect::<Vec<_>>().join(" ");
        let at = format!("redis.conf line {}", n + 1);
        let Some(c) = CONFIGS.iter().find(|c| c.name.to_bytes() == short) else {
            let known: Vec<String> = CONFIGS
                .iter()
                .map(|c| format!("rl.{}", c.name.to_string_lossy()))
                .collect();
            out.push(format!(
                "{at}: unknown config '{}' (value '{value}'); the rl.* configs are {}",
                show(name),
                known.join(", ")
            ));
            continue;
        };
        let words: Vec<&[u8]> = match &c.kind {
            Kind::Bool { .. } => vec![b"yes", b"no"],
            Kind::Enum { names, .. } => names.iter().map(|n| n.to_bytes()).collect(),
            Kind::Number { .. } | Kind::Bytes { .. } => continue,
        };
        if !matches!(values, [v] if words.iter().any(|w| v.eq_ignore_ascii_case(w))) {
            let words: Vec<String> = words.iter().map(|w| show(w)).collect();
            out.push(format!(
                "{at}: invalid value '{value}' for rl.{} (accepted: {})",
                c.name.to_string_lossy(),
                words.join(", ")
            ));
        }
    }
    out
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

    #[test]
    fn conf_problems_name_the_line_the_config_and_the_value() {
        let conf = b"port 6379\n# rl.nothing here\nrl.mode shadow\nRL.MODE \"Enforce\"\n\
            rl.adopt-script-keys YES\nrl.max-namespaces 99999\nrl.modee shadow\n\
            rl.mode shadw\nrl.adopt-script-keys maybe\nrl.mode\n";
        let got = conf_problems(conf);
        assert_eq!(got.len(), 4, "{got:#?}");
        assert!(
            got[0].starts_with("redis.conf line 7: unknown config 'rl.modee' (value 'shadow')"),
            "{}",
            got[0]
        );
        assert!(got[0].ends_with(", rl.mode"), "{}", got[0]);
        assert_eq!(
            got[1],
            "redis.conf line 8: invalid value 'shadw' for rl.mode (accepted: enforce, shadow)"
        );
        assert_eq!(
            got[2],
            "redis.conf line 9: invalid value 'maybe' for rl.adopt-script-keys \
             (accepted: yes, no)"
        );
        assert!(got[3].starts_with("redis.conf line 10: invalid value ''"));
    }
}
