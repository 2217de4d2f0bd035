//! Module configs: `rl.mode` (`enforce` or `shadow`).
//!
//! Settable in redis.conf (`rl.mode shadow`), as a `loadmodule` argument
//! (`loadmodule libredis_rl.so mode shadow`) and at runtime with `CONFIG SET rl.mode shadow`.
//! Commands read it on every call, so it lives in an atomic, not behind a lock.

use redis_module::configuration::{
    ConfigurationContext, ConfigurationValue, EnumConfigurationValue,
};
use redis_module::RedisError;
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

impl TryFrom<i32> for Mode {
    type Error = RedisError;
    fn try_from(v: i32) -> Result<Mode, RedisError> {
        match v {
            0 => Ok(Mode::Enforce),
            1 => Ok(Mode::Shadow),
            _ => Err(RedisError::Str("rl.mode must be enforce or shadow")),
        }
    }
}

impl From<Mode> for i32 {
    fn from(m: Mode) -> i32 {
        m as i32
    }
}

impl EnumConfigurationValue for Mode {
    fn get_options(&self) -> (Vec<String>, Vec<i32>) {
        (vec!["enforce".into(), "shadow".into()], vec![0, 1])
    }
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
}

impl ConfigurationValue<Mode> for ModeSetting {
    fn get(&self, _: &ConfigurationContext) -> Mode {
        ModeSetting::get(self)
    }

    fn set(&self, _: &ConfigurationContext, val: Mode) -> Result<(), RedisError> {
        self.0.store(val as u8, Relaxed);
        Ok(())
    }
}

/// Whether calls answer as granted whatever the buckets say.
pub fn shadow() -> bool {
    MODE.get() == Mode::Shadow
}
